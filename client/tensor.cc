// The Tensor handle, its context, creation, and the ops: elementwise with NumPy
// broadcasting, reductions, movement, and the composites (softmax, matmul, cross-entropy)
// built from them. Placement decisions (what to reshard, when to gather) are in
// tensor_placement.cc; every op here goes through it, so autograd's gradient graphs, which
// are built from these same ops, follow the same rules.
#include "client/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "client/tensor_internal.h"

namespace uop::client {

using detail::fail;

// ---------------------------------------------------------------- placement

Placement Placement::shard(std::vector<std::string> devices, int64_t axis, int64_t dim) {
  const int64_t n = static_cast<int64_t>(devices.size());
  UOP_TENSOR_CHECK(n >= 1 && dim >= n, "cannot shard a dim of ", dim, " over ", n, " devices");
  Placement p{std::move(devices), axis, {}};
  for (int64_t i = 0; i < n; ++i) p.splits.push_back(dim / n + (i < dim % n ? 1 : 0));
  return p;
}

int64_t Placement::offset(size_t i) const {
  return std::accumulate(splits.begin(), splits.begin() + static_cast<std::ptrdiff_t>(i), int64_t{0});
}

std::string Placement::str() const {
  if (constant()) return "const";
  if (single()) return devices[0];
  std::string s = cat("{", join(devices, ", "), "}");
  return axis < 0 ? cat(s, " replicated") : cat(s, " axis ", axis, " [", join(splits, ", "), "]");
}

// ---------------------------------------------------------------- context

std::shared_ptr<TensorContext> TensorContext::make() { return std::shared_ptr<TensorContext>(new TensorContext()); }

const ContextPtr& default_context() {
  thread_local ContextPtr ctx = TensorContext::make();
  return ctx;
}

const NodeInfo* TensorContext::find(const UOp* u) const {
  auto it = info_.find(u);
  return it == info_.end() ? nullptr : &it->second;
}

const NodeInfo& TensorContext::info(const UOp* u) const {
  const NodeInfo* i = find(u);
  UOP_TENSOR_CHECK(i != nullptr, "node ", op_name(u->op()), " was not made by this tensor context");
  return *i;
}

std::shared_ptr<LeafStorage> TensorContext::storage(const UOp* buffer) const {
  auto it = storage_.find(buffer);
  return it == storage_.end() ? nullptr : it->second.lock();
}

const UOp* TensorContext::device_node(const std::string& device) {
  auto [it, fresh] = devices_.try_emplace(device, nullptr);
  if (fresh) it->second = graph_->make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{device}});
  return it->second;
}

const UOp* TensorContext::record(const UOp* u, NodeInfo info) {
  auto [it, fresh] = info_.try_emplace(u, info);
  if (!fresh) {
    // Hash consing hands back an existing node for an equal structure: its shape and
    // placement are the same by construction; a relayout or leaf mark only adds to it.
    UOP_TENSOR_CHECK(it->second.shape == info.shape, "node ", op_name(u->op()), " recorded with two shapes");
    if (info.relayout_of && !it->second.relayout_of) it->second.relayout_of = info.relayout_of;
    it->second.leaf |= info.leaf;
  }
  return u;
}

const UOp* TensorContext::leaf_node(const std::shared_ptr<LeafStorage>& data) {
  const auto n = checked_numel(data->shape);
  UOP_TENSOR_CHECK(n.has_value(), "bad leaf shape ", shape_str(data->shape));
  const UOp* unique = graph_->make(Op::UNIQUE, dtypes::void_, {}, IntArg{next_unique_++});
  const UOp* buf = graph_->make(Op::BUFFER, DType(data->dtype), {unique, device_node(data->device)}, BufferArg{*n});
  const Placement on = Placement::on(data->device);
  record(buf, NodeInfo{{*n}, on, nullptr, true});
  storage_[buf] = data;
  if (data->shape == std::vector<int64_t>{*n}) return buf;
  const UOp* view = graph_->make(Op::RESHAPE, buf->dtype(), {buf, detail::shape_operand(*graph_, data->shape)});
  return record(view, NodeInfo{data->shape, on, nullptr, true});
}

void TensorContext::watch(const std::shared_ptr<TensorImpl>& t) {
  auto& list = watched_[t->node];
  std::erase_if(list, [](const std::weak_ptr<TensorImpl>& w) { return w.expired(); });
  for (const auto& w : list)
    if (w.lock() == t) return;
  list.push_back(t);
}

void TensorContext::adopt(const std::shared_ptr<TensorImpl>& t) {
  // Pruned here too, so that a loop whose graph never grows (every node hash-consed to
  // one made before) does not grow this list either.
  if (tensors_.size() > 2 * tensors_kept_ + 1024) {
    std::erase_if(tensors_, [](const std::weak_ptr<TensorImpl>& w) { return w.expired(); });
    tensors_kept_ = tensors_.size();
  }
  tensors_.push_back(t);
}

void TensorContext::compact_if_grown() {
  if (graph_->size() > kCompactNodes && graph_->size() > 2 * nodes_kept_) compact();
}

void TensorContext::compact() {
  std::vector<std::shared_ptr<TensorImpl>> live;
  for (const auto& w : tensors_)
    if (auto t = w.lock()) live.push_back(std::move(t));
  tensors_.assign(live.begin(), live.end());
  tensors_kept_ = tensors_.size();
  auto fresh = std::make_unique<Graph>();
  absl::flat_hash_map<const UOp*, const UOp*> moved;
  auto keep = [&](std::vector<const UOp*> roots) {
    std::erase_if(roots, [&](const UOp* u) { return moved.contains(u); });
    for (const UOp* u : toposort(roots)) {
      if (moved.contains(u)) continue;
      std::vector<const UOp*> src;
      src.reserve(u->num_src());
      for (const UOp* s : u->src()) src.push_back(moved.at(s));
      moved.emplace(u, fresh->make(u->op(), u->dtype(), src, u->arg()));
    }
  };
  std::vector<const UOp*> roots;
  for (const auto& t : live)
    if (t->node) roots.push_back(t->node);
  for (const auto& [device, node] : devices_) roots.push_back(node);
  keep(roots);
  // A record may name another node (a relayout's source): kept too, until none is new.
  for (;;) {
    std::vector<const UOp*> named;
    for (const auto& [old, now] : moved)
      if (auto it = info_.find(old); it != info_.end() && it->second.relayout_of && !moved.contains(it->second.relayout_of))
        named.push_back(it->second.relayout_of);
    if (named.empty()) break;
    keep(named);
  }
  absl::node_hash_map<const UOp*, NodeInfo> info;
  absl::flat_hash_map<const UOp*, std::weak_ptr<LeafStorage>> storage;
  absl::flat_hash_map<const UOp*, std::vector<std::weak_ptr<TensorImpl>>> watched;
  for (const auto& [old, now] : moved) {
    if (auto it = info_.find(old); it != info_.end()) {
      NodeInfo i = it->second;
      if (i.relayout_of) i.relayout_of = moved.at(i.relayout_of);
      info.emplace(now, std::move(i));
    }
    if (auto it = storage_.find(old); it != storage_.end() && !it->second.expired()) storage.emplace(now, it->second);
    if (auto it = watched_.find(old); it != watched_.end()) {
      std::vector<std::weak_ptr<TensorImpl>> alive;
      for (const auto& w : it->second)
        if (!w.expired()) alive.push_back(w);
      if (!alive.empty()) watched.emplace(now, std::move(alive));
    }
  }
  for (auto& [device, node] : devices_) node = moved.at(node);
  for (const auto& t : live)
    if (t->node) t->node = moved.at(t->node);
  info_ = std::move(info);
  storage_ = std::move(storage);
  watched_ = std::move(watched);
  graph_ = std::move(fresh);
  nodes_kept_ = graph_->size();
}

std::vector<std::shared_ptr<TensorImpl>> TensorContext::watchers(const UOp* u) const {
  std::vector<std::shared_ptr<TensorImpl>> out;
  auto it = watched_.find(u);
  if (it == watched_.end()) return out;
  for (const auto& w : it->second)
    if (auto t = w.lock(); t && t->node == u && t->requires_grad) out.push_back(std::move(t));
  return out;
}

// ---------------------------------------------------------------- helpers

namespace detail {

void fail(const std::string& message) {
  std::fprintf(stderr, "uop tensor: %s\n", message.c_str());
  std::abort();
}

const UOp* shape_operand(Graph& g, const std::vector<int64_t>& dims) {
  std::vector<ConstValue> v;
  for (int64_t d : dims) v.push_back(ConstValue::Int(d));
  return g.make(Op::VCONST, dtypes::index.vec(static_cast<uint32_t>(dims.size())), {}, VConstArg{v});
}

int64_t normalize_axis(int64_t axis, int64_t rank) {
  int64_t a = axis < 0 ? axis + rank : axis;
  UOP_TENSOR_CHECK(a >= 0 && a < rank, "axis ", axis, " out of range for rank ", rank);
  return a;
}

std::vector<int64_t> shard_shape(const std::vector<int64_t>& shape, const Placement& p, size_t i) {
  std::vector<int64_t> s = shape;
  if (p.sharded()) s[p.axis] = p.splits[i];
  return s;
}

Tensor make(const ContextPtr& ctx, const UOp* node, NodeInfo info, std::shared_ptr<const LeafSet> leaves) {
  ctx->record(node, std::move(info));
  return wrap(ctx, node, std::move(leaves));
}

Tensor wrap(const ContextPtr& ctx, const UOp* node, std::shared_ptr<const LeafSet> leaves) {
  auto impl = std::make_shared<TensorImpl>();
  impl->ctx = ctx;
  impl->node = node;
  impl->leaves = leaves ? std::move(leaves) : std::make_shared<const LeafSet>();
  ctx->adopt(impl);
  return Tensor(std::move(impl));
}

std::shared_ptr<const LeafSet> merge_leaves(std::span<const Tensor> xs) {
  std::shared_ptr<const LeafSet> biggest;
  for (const Tensor& x : xs)
    if (!biggest || x.impl()->leaves->size() > biggest->size()) biggest = x.impl()->leaves;
  LeafSet all(biggest->begin(), biggest->end());
  for (const Tensor& x : xs)
    for (const auto& l : *x.impl()->leaves)
      if (std::find(all.begin(), all.end(), l) == all.end()) all.push_back(l);
  if (all.size() == biggest->size()) return biggest;
  return std::make_shared<const LeafSet>(std::move(all));
}

Tensor leaf(const ContextPtr& ctx, LeafSet data, const Placement& placement, std::vector<int64_t> shape) {
  const UOp* node;
  if (!placement.multi()) {
    node = ctx->leaf_node(data.at(0));
  } else {
    std::vector<const UOp*> shards;
    for (const auto& d : data) shards.push_back(ctx->leaf_node(d));
    node = ctx->graph().make(Op::MULTI, shards[0]->dtype(), shards, IntArg{placement.axis});
  }
  Tensor t = make(ctx, node, NodeInfo{std::move(shape), placement, nullptr, true}, std::make_shared<const LeafSet>(data));
  t.impl()->data = std::move(data);
  return t;
}

}  // namespace detail

using namespace detail;

namespace {

const ContextPtr& ctx_or_default(const ContextPtr& ctx) { return ctx ? ctx : default_context(); }

// NumPy broadcasting: trailing dims aligned, 1s stretched.
std::vector<int64_t> broadcast_shape(std::span<const Tensor> xs) {
  std::vector<int64_t> out;
  for (const Tensor& x : xs) {
    const auto& s = x.shape();
    if (s.size() > out.size()) out.insert(out.begin(), s.size() - out.size(), 1);
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[out.size() - s.size() + i];
      UOP_TENSOR_CHECK(o == 1 || s[i] == 1 || o == s[i], "shapes ", shape_str(out), " and ", shape_str(s),
                       " do not broadcast");
      if (o == 1) o = s[i];
    }
  }
  return out;
}

// An ALU op over operands brought to one shape and placement.
Tensor elementwise(Op op, std::vector<Tensor> xs) {
  for (const Tensor& x : xs) UOP_TENSOR_CHECK(x.defined(), op_name(op), " of an undefined tensor");
  const ContextPtr& ctx = xs[0].context();
  for (size_t i = 0; i < xs.size(); ++i) {
    UOP_TENSOR_CHECK(xs[i].context() == ctx, op_name(op), ": operands from different tensor contexts");
    const size_t ref = op == Op::WHERE ? 1 : 0;  // WHERE's condition is bool
    if (i != 0 || op != Op::WHERE)
      UOP_TENSOR_CHECK(xs[i].dtype() == xs[ref].dtype(), op_name(op), ": dtypes ", scalar_name(xs[i].dtype()),
                       " and ", scalar_name(xs[ref].dtype()), " differ (cast first)");
  }
  std::vector<int64_t> out = broadcast_shape(xs);
  for (Tensor& x : xs) {
    if (x.ndim() == static_cast<int64_t>(out.size())) continue;
    std::vector<int64_t> s(out.size() - x.shape().size(), 1);
    s.insert(s.end(), x.shape().begin(), x.shape().end());
    x = x.reshape(s);
  }
  Placement target = common_placement(xs);
  std::vector<const UOp*> src;
  for (Tensor& x : xs) {
    x = to_placement(x, out, target);
    src.push_back(x.node());
  }
  const UOp* u = ctx->graph().alu(op, src);
  return make(ctx, u, NodeInfo{out, target}, merge_leaves(xs));
}

Tensor unary(Op op, const Tensor& x) { return elementwise(op, {x}); }

Tensor scalar_like(const Tensor& x, double v) { return Tensor::full({}, v, x.dtype(), x.context()); }

Tensor reduce(const Tensor& x, ReduceOp op, std::vector<int64_t> axes, bool keepdim) {
  const int64_t rank = x.ndim();
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
  }
  for (int64_t& a : axes) a = normalize_axis(a, rank);
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  if (axes.empty()) return x;  // rank 0: the identity
  std::vector<int64_t> out = x.shape(), squeezed;
  for (int64_t a : axes) out[a] = 1;
  for (int64_t i = 0; i < rank; ++i)
    if (!std::binary_search(axes.begin(), axes.end(), i)) squeezed.push_back(x.shape()[i]);
  Placement p = x.placement();
  // Over the shard axis each shard reduces its part and the multi pass adds the ALLREDUCE.
  if (p.sharded() && std::binary_search(axes.begin(), axes.end(), p.axis)) p = Placement::replicate(p.devices);
  const UOp* u = x.context()->graph().make(Op::REDUCE_AXIS, x.node()->dtype(), {x.node()}, ReduceAxisArg{op, axes});
  Tensor r = make(x.context(), u, NodeInfo{out, p}, x.impl()->leaves);
  return keepdim ? r : r.reshape(squeezed);
}

double ln2() { return std::log(2.0); }

}  // namespace

// ---------------------------------------------------------------- creation

Tensor Tensor::from(HostTensor data, const std::string& device, ContextPtr ctx) {
  auto s = std::make_shared<LeafStorage>();
  s->dtype = data.dtype;
  s->shape = data.shape;
  s->device = device;
  s->host = std::move(data);
  std::vector<int64_t> shape = s->shape;
  return leaf(ctx_or_default(ctx), {s}, Placement::on(device), std::move(shape));
}

Tensor Tensor::full(std::vector<int64_t> shape, double value, Scalar dtype, ContextPtr ctx) {
  const ContextPtr& c = ctx_or_default(ctx);
  const UOp* k = c->graph().cnst(DType(dtype), value);
  Tensor t = make(c, k, NodeInfo{{}, Placement{}}, nullptr);
  return shape.empty() ? t : t.expand(std::move(shape));
}

Tensor Tensor::zeros(std::vector<int64_t> shape, Scalar dtype, ContextPtr ctx) { return full(std::move(shape), 0, dtype, ctx); }
Tensor Tensor::ones(std::vector<int64_t> shape, Scalar dtype, ContextPtr ctx) { return full(std::move(shape), 1, dtype, ctx); }

Tensor Tensor::rand(std::vector<int64_t> shape, uint64_t seed, Scalar dtype, const std::string& device, ContextPtr ctx) {
  return uniform(std::move(shape), 0, 1, seed, dtype, device, ctx);
}

Tensor Tensor::uniform(std::vector<int64_t> shape, double low, double high, uint64_t seed, Scalar dtype,
                       const std::string& device, ContextPtr ctx) {
  HostTensor h = HostTensor::zeros(dtype, std::move(shape));
  uint64_t state = seed;
  for (int64_t i = 0; i < h.numel(); ++i) {
    // splitmix64: the same values on every machine; 53 bits make a double in [0, 1).
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
    h.set(i, ConstValue::Float(low + (high - low) * u));
  }
  return from(std::move(h), device, ctx);
}

Tensor Tensor::arange(int64_t n, Scalar dtype, const std::string& device, ContextPtr ctx) {
  HostTensor h = HostTensor::zeros(dtype, {n});
  for (int64_t i = 0; i < n; ++i) h.set(i, ConstValue::Int(i));
  return from(std::move(h), device, ctx);
}

// ---------------------------------------------------------------- accessors

const UOp* Tensor::node() const { return impl_->node; }
const std::vector<int64_t>& Tensor::shape() const { return impl_->ctx->info(impl_->node).shape; }
int64_t Tensor::numel() const { return checked_numel(shape()).value_or(0); }
Scalar Tensor::dtype() const { return impl_->node->dtype().scalar; }
const Placement& Tensor::placement() const { return impl_->ctx->info(impl_->node).placement; }
const ContextPtr& Tensor::context() const { return impl_->ctx; }
bool Tensor::realized() const { return !impl_->data.empty(); }
bool Tensor::requires_grad() const { return impl_->requires_grad; }
Tensor Tensor::grad() const { return impl_->grad ? Tensor(impl_->grad) : Tensor(); }
void Tensor::set_grad(Tensor g) { impl_->grad = g.impl(); }

Tensor& Tensor::requires_grad_(bool on) {
  impl_->requires_grad = on;
  if (on) impl_->ctx->watch(impl_);
  return *this;
}

// ---------------------------------------------------------------- elementwise

Tensor operator+(const Tensor& a, const Tensor& b) { return elementwise(Op::ADD, {a, b}); }
Tensor operator-(const Tensor& a, const Tensor& b) { return elementwise(Op::SUB, {a, b}); }
Tensor operator*(const Tensor& a, const Tensor& b) { return elementwise(Op::MUL, {a, b}); }
Tensor operator/(const Tensor& a, const Tensor& b) {
  return elementwise(scalar_is_float(a.dtype()) ? Op::FDIV : Op::IDIV, {a, b});
}
Tensor operator+(const Tensor& a, double b) { return a + scalar_like(a, b); }
Tensor operator-(const Tensor& a, double b) { return a - scalar_like(a, b); }
Tensor operator*(const Tensor& a, double b) { return a * scalar_like(a, b); }
Tensor operator/(const Tensor& a, double b) { return a / scalar_like(a, b); }
Tensor operator+(double a, const Tensor& b) { return scalar_like(b, a) + b; }
Tensor operator-(double a, const Tensor& b) { return scalar_like(b, a) - b; }
Tensor operator*(double a, const Tensor& b) { return scalar_like(b, a) * b; }
Tensor operator/(double a, const Tensor& b) { return scalar_like(b, a) / b; }

Tensor Tensor::operator-() const { return unary(Op::NEG, *this); }
Tensor Tensor::exp2() const { return unary(Op::EXP2, *this); }
Tensor Tensor::square() const { return *this * *this; }
Tensor Tensor::log2() const { return unary(Op::LOG2, *this); }
Tensor Tensor::exp() const { return (*this * (1.0 / ln2())).exp2(); }
Tensor Tensor::log() const { return log2() * ln2(); }
Tensor Tensor::sqrt() const { return unary(Op::SQRT, *this); }
Tensor Tensor::reciprocal() const { return unary(Op::RECIPROCAL, *this); }
Tensor Tensor::relu() const { return maximum(scalar_like(*this, 0)); }
// 1 / (1 + e^-x): for very negative x, e^-x is inf and the result 0, never NaN.
Tensor Tensor::sigmoid() const { return (1.0 + (-*this).exp()).reciprocal(); }
Tensor Tensor::tanh() const { return 2.0 * (*this * 2.0).sigmoid() - 1.0; }
Tensor Tensor::maximum(const Tensor& o) const { return elementwise(Op::MAX, {*this, o}); }
Tensor Tensor::minimum(const Tensor& o) const { return elementwise(Op::MIN, {*this, o}); }
Tensor Tensor::lt(const Tensor& o) const { return elementwise(Op::CMPLT, {*this, o}); }
Tensor Tensor::gt(const Tensor& o) const { return o.lt(*this); }
Tensor Tensor::eq(const Tensor& o) const { return elementwise(Op::CMPEQ, {*this, o}); }
Tensor Tensor::ne(const Tensor& o) const { return elementwise(Op::CMPNE, {*this, o}); }
// a <= b is not (b < a); IEEE would say false for NaN, this says true: fine for masks.
Tensor Tensor::le(const Tensor& o) const {
  return elementwise(Op::XOR, {gt(o), Tensor::full({}, 1, Scalar::Bool, context())});
}
Tensor Tensor::ge(const Tensor& o) const {
  return elementwise(Op::XOR, {lt(o), Tensor::full({}, 1, Scalar::Bool, context())});
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  UOP_TENSOR_CHECK(cond.dtype() == Scalar::Bool, "where: the condition is ", scalar_name(cond.dtype()), ", not bool");
  return elementwise(Op::WHERE, {cond, a, b});
}

Tensor Tensor::cast(Scalar to) const {
  if (to == dtype()) return *this;
  const UOp* u = context()->graph().make(Op::CAST, DType(to), {node()});
  const NodeInfo& i = context()->info(node());
  return make(context(), u, NodeInfo{i.shape, i.placement}, impl_->leaves);
}

Tensor Tensor::detach() const {
  const UOp* u = context()->graph().make(Op::DETACH, node()->dtype(), {node()});
  const NodeInfo& i = context()->info(node());
  return make(context(), u, NodeInfo{i.shape, i.placement}, impl_->leaves);
}

Tensor Tensor::contiguous() const {
  const UOp* u = context()->graph().make(Op::CONTIGUOUS, node()->dtype(), {node()});
  const NodeInfo& i = context()->info(node());
  return make(context(), u, NodeInfo{i.shape, i.placement}, impl_->leaves);
}

// ---------------------------------------------------------------- reductions

Tensor Tensor::sum(std::vector<int64_t> axes, bool keepdim) const { return reduce(*this, ReduceOp::Add, std::move(axes), keepdim); }
Tensor Tensor::max(std::vector<int64_t> axes, bool keepdim) const { return reduce(*this, ReduceOp::Max, std::move(axes), keepdim); }

Tensor Tensor::mean(std::vector<int64_t> axes, bool keepdim) const {
  UOP_TENSOR_CHECK(scalar_is_float(dtype()), "mean of ", scalar_name(dtype()));
  Tensor s = sum(axes, keepdim);
  const int64_t n = numel() / std::max<int64_t>(1, s.numel());
  return s * (1.0 / static_cast<double>(n));
}

// The max is detached: it only keeps exp in range, and softmax does not depend on it.
Tensor Tensor::softmax(int64_t axis) const {
  Tensor e = (*this - max({axis}, true).detach()).exp();
  return e / e.sum({axis}, true);
}

Tensor Tensor::log_softmax(int64_t axis) const {
  Tensor s = *this - max({axis}, true).detach();
  return s - s.exp().sum({axis}, true).log();
}

Tensor Tensor::matmul(const Tensor& o) const {
  UOP_TENSOR_CHECK(ndim() >= 2 && o.ndim() >= 2, "matmul of ", shape_str(shape()), " and ", shape_str(o.shape()));
  const int64_t k = shape().back();
  UOP_TENSOR_CHECK(o.shape()[o.ndim() - 2] == k, "matmul of ", shape_str(shape()), " and ", shape_str(o.shape()));
  // [.., m, k, 1] * [.., 1, k, n] summed over k.
  std::vector<int64_t> a = shape(), b = o.shape();
  a.push_back(1);
  b.insert(b.end() - 2, 1);
  return (reshape(a) * o.reshape(b)).sum({-2});
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  UOP_TENSOR_CHECK(logits.ndim() == 2, "cross_entropy: logits ", shape_str(logits.shape()), " are not [N, C]");
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  Tensor onehot = labels;
  if (labels.ndim() == 1) {
    UOP_TENSOR_CHECK(scalar_is_int(labels.dtype()) && labels.shape()[0] == n, "cross_entropy: labels ",
                     scalar_name(labels.dtype()), shape_str(labels.shape()), " are not [", n, "] class indices");
    const Placement& p = labels.placement();
    const std::string device = p.constant() ? "CPU:0" : p.devices[0];
    Tensor classes = Tensor::arange(c, labels.dtype(), device, labels.context());
    onehot = labels.reshape({n, 1}).eq(classes.reshape({1, c})).cast(logits.dtype());
  }
  UOP_TENSOR_CHECK(onehot.shape() == logits.shape() && onehot.dtype() == logits.dtype(), "cross_entropy: labels ",
                   scalar_name(labels.dtype()), shape_str(labels.shape()), " do not match logits ",
                   shape_str(logits.shape()));
  return -(onehot * logits.log_softmax(1)).sum({1}).mean();
}

// ---------------------------------------------------------------- movement

Tensor Tensor::reshape(std::vector<int64_t> to) const {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i] == -1) {
      UOP_TENSOR_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(to));
      infer = static_cast<int64_t>(i);
    } else {
      known *= to[i];
    }
  }
  if (infer >= 0) to[infer] = known == 0 ? 0 : numel() / known;
  UOP_TENSOR_CHECK(checked_numel(to) == numel(), "reshape of ", shape_str(shape()), " to ", shape_str(to));
  if (to == shape()) return *this;
  const Placement& p = placement();
  // Per shard only when the dims up to and including the shard axis stay (README).
  if (p.sharded() && (p.axis >= static_cast<int64_t>(to.size()) ||
                      !std::equal(to.begin(), to.begin() + p.axis + 1, shape().begin())))
    return raw_reshape(replicated_for_movement(*this), to);
  return raw_reshape(*this, to);
}

Tensor Tensor::permute(std::vector<int64_t> axes) const {
  const int64_t rank = ndim();
  UOP_TENSOR_CHECK(static_cast<int64_t>(axes.size()) == rank, "permute: ", axes.size(), " axes for rank ", rank);
  std::vector<bool> seen(rank, false);
  std::vector<int64_t> out;
  for (int64_t& a : axes) {
    a = normalize_axis(a, rank);
    UOP_TENSOR_CHECK(!seen[a], "permute: axis ", a, " twice");
    seen[a] = true;
    out.push_back(shape()[a]);
  }
  Placement p = placement();
  if (p.sharded()) p.axis = std::find(axes.begin(), axes.end(), p.axis) - axes.begin();  // the axis moves along
  const UOp* u = context()->graph().make(Op::PERMUTE, node()->dtype(), {node()}, IntsArg{axes});
  return make(context(), u, NodeInfo{out, p}, impl_->leaves);
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  std::vector<int64_t> axes(ndim());
  std::iota(axes.begin(), axes.end(), 0);
  std::swap(axes[normalize_axis(a, ndim())], axes[normalize_axis(b, ndim())]);
  return permute(axes);
}

Tensor Tensor::expand(std::vector<int64_t> to) const {
  UOP_TENSOR_CHECK(to.size() >= shape().size(), "expand of ", shape_str(shape()), " to ", shape_str(to));
  std::vector<int64_t> s(to.size() - shape().size(), 1);
  s.insert(s.end(), shape().begin(), shape().end());
  for (size_t i = 0; i < to.size(); ++i)
    UOP_TENSOR_CHECK(s[i] == to[i] || s[i] == 1, "expand of ", shape_str(shape()), " to ", shape_str(to));
  return raw_expand(reshape(s), to);  // a shard axis is never 1 wide, so never expanded
}

Tensor Tensor::pad(std::vector<int64_t> begins, std::vector<int64_t> ends) const {
  UOP_TENSOR_CHECK(begins.size() == shape().size() && ends.size() == shape().size(), "pad: ", begins.size(), " / ",
                   ends.size(), " widths for rank ", ndim());
  for (size_t i = 0; i < begins.size(); ++i) UOP_TENSOR_CHECK(begins[i] >= 0 && ends[i] >= 0, "pad: negative width");
  const Placement& p = placement();
  if (p.sharded() && (begins[p.axis] != 0 || ends[p.axis] != 0))
    return raw_pad(replicated_for_movement(*this), std::move(begins), std::move(ends));
  return raw_pad(*this, std::move(begins), std::move(ends));
}

Tensor Tensor::shrink(std::vector<int64_t> begins, std::vector<int64_t> ends) const {
  UOP_TENSOR_CHECK(begins.size() == shape().size() && ends.size() == shape().size(), "shrink: ", begins.size(),
                   " / ", ends.size(), " bounds for rank ", ndim());
  for (size_t i = 0; i < begins.size(); ++i)
    UOP_TENSOR_CHECK(0 <= begins[i] && begins[i] <= ends[i] && ends[i] <= shape()[i], "shrink: [", begins[i], ", ",
                     ends[i], ") out of dim ", shape()[i]);
  const Placement& p = placement();
  if (p.sharded() && (begins[p.axis] != 0 || ends[p.axis] != shape()[p.axis]))
    return raw_shrink(replicated_for_movement(*this), std::move(begins), std::move(ends));
  return raw_shrink(*this, std::move(begins), std::move(ends));
}

Tensor Tensor::flip(std::vector<int64_t> axes) const {
  std::vector<bool> f(ndim(), false);
  for (int64_t a : axes) f[normalize_axis(a, ndim())] = true;
  if (std::none_of(f.begin(), f.end(), [](bool b) { return b; })) return *this;
  Tensor x = *this;
  if (placement().sharded() && f[placement().axis]) x = replicated_for_movement(x);
  const UOp* u = context()->graph().make(Op::FLIP, node()->dtype(), {x.node()}, BoolsArg{f});
  const NodeInfo& i = context()->info(x.node());
  return make(context(), u, NodeInfo{i.shape, i.placement}, x.impl()->leaves);
}

}  // namespace uop::client
