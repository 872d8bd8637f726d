// Canonical graphs, realize_all, the remote and interpreter realizers, and reading a
// realized tensor back (realize.h).
#include "client/realize.h"

#include "absl/container/flat_hash_set.h"
#include "compiler/interp/interp.h"
#include "client/tensor_internal.h"

namespace uop::client {

using detail::shard_shape;

size_t CanonicalGraph::results() const {
  size_t n = 0;
  for (const Tensor& t : outputs) n += t.placement().multi() ? t.placement().devices.size() : 1;
  return n;
}

CanonicalGraph canonical_graph(const std::vector<Tensor>& tensors) {
  CanonicalGraph cg;
  std::vector<const UOp*> roots;
  absl::flat_hash_set<const UOp*> seen;
  for (const Tensor& t : tensors) {
    UOP_TENSOR_CHECK(t.defined(), "realize of an undefined tensor");
    UOP_TENSOR_CHECK(t.context() == tensors[0].context(), "realize of tensors from different contexts");
    if (t.realized() || !seen.insert(t.node()).second) continue;
    roots.push_back(t.node());
    cg.outputs.push_back(t);
  }
  if (roots.empty()) return cg;
  TensorContext& ctx = *tensors[0].context();
  Graph& g = ctx.graph();
  const UOp* sink = g.make(Op::SINK, dtypes::void_, roots);
  // Buffers numbered by position, so the same structure is the same graph (realize.h).
  absl::flat_hash_map<const UOp*, const UOp*> renumber;
  for (const UOp* u : toposort(sink)) {
    if (!u->is(Op::BUFFER)) continue;
    std::shared_ptr<LeafStorage> data = ctx.storage(u);
    UOP_TENSOR_CHECK(data != nullptr, "a BUFFER in the graph has no data behind it");
    const UOp* unique = g.make(Op::UNIQUE, dtypes::void_, {}, IntArg{static_cast<int64_t>(cg.inputs.size())});
    const UOp* canonical = g.make(Op::BUFFER, u->dtype(), {unique, u->src(1)}, u->arg());
    renumber.emplace(u, canonical);
    cg.inputs.push_back({canonical, std::move(data)});
  }
  cg.sink = substitute(g, sink, renumber);
  return cg;
}

namespace {

// cg.into from RealizeOptions::into: each result's destination, checked to be the
// storage of a realized tensor of the output's dtype, shape and placement.
absl::Status bind_into(const std::vector<Tensor>& tensors, const std::vector<Tensor>& into, CanonicalGraph& cg) {
  cg.into.assign(cg.results(), nullptr);
  if (into.empty()) return absl::OkStatus();
  if (into.size() != tensors.size())
    return absl::InvalidArgumentError(cat("realize: ", into.size(), " destinations for ", tensors.size(), " tensors"));
  absl::flat_hash_map<const UOp*, const Tensor*> into_of;
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (!into[k].defined()) continue;
    auto [it, added] = into_of.emplace(tensors[k].node(), &into[k]);
    if (!added && it->second->impl() != into[k].impl())
      return absl::InvalidArgumentError(cat("realize: tensor ", k, " is realized into two tensors"));
  }
  absl::flat_hash_set<const LeafStorage*> used;
  size_t r = 0;
  for (const Tensor& out : cg.outputs) {
    const size_t shards = out.placement().multi() ? out.placement().devices.size() : 1;
    auto it = into_of.find(out.node());
    if (it != into_of.end()) {
      const Tensor& dst = *it->second;
      if (!dst.realized() || dst.dtype() != out.dtype() || dst.shape() != out.shape() || !(dst.placement() == out.placement()) ||
          dst.impl()->data.size() != shards)
        return absl::InvalidArgumentError(cat("realize: a ", scalar_name(out.dtype()), shape_str(out.shape()), " on ",
                                              out.placement().str(), " cannot be written into a ",
                                              dst.realized() ? "" : "not realized ", scalar_name(dst.dtype()),
                                              shape_str(dst.shape()), " on ", dst.placement().str()));
      for (size_t i = 0; i < shards; ++i) {
        if (!used.insert(dst.impl()->data[i].get()).second)
          return absl::InvalidArgumentError("realize: two results are written into one tensor's storage");
        cg.into[r + i] = dst.impl()->data[i];
      }
    }
    r += shards;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status realize_all(const std::vector<Tensor>& tensors, Realizer& r, const RealizeOptions& opts) {
  CanonicalGraph cg = canonical_graph(tensors);
  if (!cg.sink) return absl::OkStatus();
  if (absl::Status s = bind_into(tensors, opts.into, cg); !s.ok()) return s;
  const ContextPtr ctx = tensors[0].context();
  auto results = r.run(ctx->graph(), cg, opts);
  if (!results.ok()) return results.status();
  if (results->size() != cg.results())
    return absl::InternalError(cat("the run gave ", results->size(), " results for ", cg.results(), " expected"));
  absl::flat_hash_map<const UOp*, Tensor> made;  // an output's node -> the leaf it becomes
  size_t k = 0;
  for (const Tensor& out : cg.outputs) {
    Placement p = out.placement();
    if (p.constant()) p = Placement::on(r.default_device());
    LeafSet data;
    for (size_t i = 0; i < (p.multi() ? p.devices.size() : 1); ++i) {
      std::shared_ptr<LeafStorage> s = cg.into[k];
      if (s) *s = std::move((*results)[k++]);  // in place: every tensor holding it sees the result
      else s = std::make_shared<LeafStorage>(std::move((*results)[k++]));
      std::vector<int64_t> shape = shard_shape(out.shape(), p, i);
      if (s->dtype != out.dtype() || checked_numel(s->shape) != checked_numel(shape))
        return absl::InternalError(cat("result ", k - 1, " is ", scalar_name(s->dtype), shape_str(s->shape), ", not ",
                                       scalar_name(out.dtype()), shape_str(shape)));
      s->shape = shape;
      s->device = p.devices[i];
      if (s->host) s->host->shape = shape;
      data.push_back(std::move(s));
    }
    made.emplace(out.node(), detail::leaf(ctx, std::move(data), p, out.shape()));
  }
  for (const Tensor& t : tensors) {
    auto it = made.find(t.node());
    if (it == made.end()) continue;
    TensorImpl& impl = *t.impl();
    impl.node = it->second.node();
    impl.leaves = it->second.impl()->leaves;
    impl.data = it->second.impl()->data;
    if (impl.requires_grad) ctx->watch(t.impl());
  }
  made.clear();
  cg = CanonicalGraph();
  ctx->compact_if_grown();
  return absl::OkStatus();
}

absl::Status Tensor::realize(Realizer& r) const { return realize_all({*this}, r); }
absl::Status Tensor::realize(Realizer& r, const RealizeOptions& opts) const { return realize_all({*this}, r, opts); }

// ---------------------------------------------------------------- reading back

namespace {

absl::StatusOr<HostTensor> fetch(const LeafStorage& s) {
  if (s.host) return *s.host;
  if (s.server) return s.server->download(s.dtype, s.shape);
  return absl::InternalError("a leaf with neither host data nor a server buffer");
}

}  // namespace

absl::StatusOr<HostTensor> Tensor::to_host() const {
  if (!realized()) return absl::FailedPreconditionError("the tensor is not realized: realize it first");
  const Placement& p = placement();
  if (!p.sharded()) {
    auto h = fetch(*impl_->data[0]);
    if (h.ok()) h->shape = shape();
    return h;
  }
  // Shards side by side along the axis: rows of `inner` bytes, `outer` times.
  HostTensor out = HostTensor::zeros(dtype(), shape());
  int64_t outer = 1, inner = out.itemsize();
  for (int64_t i = 0; i < p.axis; ++i) outer *= shape()[i];
  for (int64_t i = p.axis + 1; i < ndim(); ++i) inner *= shape()[i];
  const int64_t dim = shape()[p.axis];
  for (size_t i = 0; i < p.devices.size(); ++i) {
    auto h = fetch(*impl_->data[i]);
    if (!h.ok()) return h.status();
    const int64_t rows = p.splits[i] * inner;
    for (int64_t o = 0; o < outer; ++o)
      out.data.replace((o * dim + p.offset(i)) * inner, rows, h->data, o * rows, rows);
  }
  return out;
}

// ---------------------------------------------------------------- remote

ServerBuffer::~ServerBuffer() {
  if (link_->session) link_->unused.push_back(id_);
}

absl::StatusOr<HostTensor> ServerBuffer::download(Scalar dtype, const std::vector<int64_t>& shape) const {
  if (!link_->session) return absl::FailedPreconditionError(cat("buffer ", id_, ": its session's realizer is gone"));
  RunOutput o;
  o.tensor.dtype = dtype;
  o.tensor.shape = shape;
  o.buffer_id = id_;
  return link_->session->download_tensor(o);
}

RemoteRealizer::RemoteRealizer(Session& session) : session_(session), link_(std::make_shared<detail::SessionLink>()) {
  link_->session = &session;
}

RemoteRealizer::~RemoteRealizer() {
  (void)flush();  // best effort: closing the session frees whatever is left
  link_->session = nullptr;
}

absl::Status RemoteRealizer::flush() {
  std::vector<std::string> ids;
  ids.swap(link_->unused);
  if (ids.empty()) return absl::OkStatus();
  return session_.free_buffers(ids);
}

std::string RemoteRealizer::default_device() const {
  return session_.devices().empty() ? "CPU:0" : session_.devices()[0];
}

absl::StatusOr<std::string> RemoteRealizer::ensure_uploaded(LeafStorage& s) {
  if (s.server && s.server->link() == link_.get()) return s.server->id();
  if (!s.host) {
    if (!s.server) return absl::InternalError("a leaf with neither host data nor a server buffer");
    auto h = s.server->download(s.dtype, s.shape);  // from another session
    if (!h.ok()) return h.status();
    s.host = std::move(*h);
  }
  auto id = session_.upload_tensor(*s.host, s.device);
  if (!id.ok()) return id.status();
  s.server = std::make_shared<ServerBuffer>(link_, *id);
  return *id;
}

absl::StatusOr<std::vector<LeafStorage>> RemoteRealizer::run(Graph&, const CanonicalGraph& graph,
                                                             const RealizeOptions& opts) {
  (void)flush();  // a buffer that fails to free stays until the session closes
  RunOptions ro;
  ro.keep_outputs = opts.keep_outputs;
  ro.hold_graph = opts.hold_graph;
  absl::flat_hash_set<const LeafStorage*> destinations;
  for (size_t r = 0; r < graph.into.size(); ++r) {
    if (!graph.into[r]) continue;
    auto id = ensure_uploaded(*graph.into[r]);
    if (!id.ok()) return id.status();
    ro.assign.emplace_back(r, *id);
    destinations.insert(graph.into[r].get());
  }
  std::vector<Input> inputs;
  for (const RealizeInput& in : graph.inputs) {
    Input b;
    b.node = in.buffer;
    const bool held = in.data->server && in.data->server->link() == link_.get();
    if (opts.inline_host_inputs && !held && in.data->host && !destinations.contains(in.data.get())) {
      b.value = *in.data->host;
    } else {
      auto id = ensure_uploaded(*in.data);
      if (!id.ok()) return id.status();
      b.value = *id;
    }
    inputs.push_back(std::move(b));
  }
  auto res = session_.run(graph.sink, {}, inputs, ro);
  if (!res.ok()) return res.status();
  std::vector<LeafStorage> out;
  for (const RunOutput& o : res->outputs) {
    LeafStorage s;
    s.dtype = o.tensor.dtype;
    s.shape = o.tensor.shape;
    const size_t r = out.size();
    if (r < graph.into.size() && graph.into[r]) {
      s.server = graph.into[r]->server;  // the same buffer, now holding the result
    } else if (o.kept()) {
      s.server = std::make_shared<ServerBuffer>(link_, o.buffer_id);
    } else {
      s.host = o.tensor;
    }
    out.push_back(std::move(s));
  }
  last_ = std::move(*res);
  return out;
}

// ---------------------------------------------------------------- interpreter

namespace detail {

absl::StatusOr<std::vector<HostTensor>> host_inputs(const CanonicalGraph& graph) {
  std::vector<HostTensor> out;
  for (const RealizeInput& in : graph.inputs) {
    auto h = fetch(*in.data);
    if (!h.ok()) return h.status();
    out.push_back(std::move(*h));
  }
  return out;
}

const UOp* clone_graph(Graph& dst, const CanonicalGraph& graph, std::vector<const UOp*>& buffers) {
  const UOp* sink = clone_into(dst, graph.sink);
  buffers.assign(graph.inputs.size(), nullptr);
  for (const UOp* u : toposort(sink))
    if (u->is(Op::BUFFER)) buffers.at(u->src(0)->arg_as<IntArg>().value) = u;
  return sink;
}

absl::StatusOr<std::vector<LeafStorage>> host_results(const CanonicalGraph& graph, std::vector<HostTensor> logical) {
  if (logical.size() != graph.outputs.size())
    return absl::InternalError(cat("the run gave ", logical.size(), " values for ", graph.outputs.size(), " outputs"));
  std::vector<LeafStorage> out;
  auto push = [&](HostTensor h) {
    LeafStorage s;
    s.dtype = h.dtype;
    s.shape = h.shape;
    s.host = std::move(h);
    out.push_back(std::move(s));
  };
  for (size_t k = 0; k < logical.size(); ++k) {
    const Placement& p = graph.outputs[k].placement();
    HostTensor& h = logical[k];
    if (!p.multi()) {
      push(std::move(h));
      continue;
    }
    if (!p.sharded()) {
      for (size_t i = 0; i < p.devices.size(); ++i) push(h);
      continue;
    }
    if (h.shape.size() <= static_cast<size_t>(p.axis) || h.shape[p.axis] != p.offset(p.devices.size()))
      return absl::InternalError(cat("output ", k, " of shape ", shape_str(h.shape), " does not match its placement ",
                                     p.str()));
    for (size_t i = 0; i < p.devices.size(); ++i) push(host_slice(h, p.axis, p.offset(i), p.splits[i]));
  }
  return out;
}

absl::StatusOr<std::vector<LeafStorage>> realize_on_host(const CanonicalGraph& graph, const HostCompute& compute) {
  auto hosts = host_inputs(graph);
  if (!hosts.ok()) return hosts.status();
  Graph g;
  std::vector<const UOp*> buffers;
  const UOp* sink = clone_graph(g, graph, buffers);
  absl::flat_hash_map<const UOp*, HostTensor> inputs;
  for (size_t k = 0; k < buffers.size(); ++k) inputs.emplace(buffers[k], std::move((*hosts)[k]));
  auto outs = compute(g, sink, inputs);
  if (!outs.ok()) return outs.status();
  return host_results(graph, *std::move(outs));
}

}  // namespace detail

absl::StatusOr<std::vector<LeafStorage>> InterpRealizer::run(Graph&, const CanonicalGraph& graph, const RealizeOptions&) {
  return detail::realize_on_host(graph, [](Graph& g, const UOp* sink, const absl::flat_hash_map<const UOp*, HostTensor>& inputs) {
    return interpret(g, sink, inputs);
  });
}

}  // namespace uop::client
