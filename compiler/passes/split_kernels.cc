#include "compiler/passes/split_kernels.h"

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/shape.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

// Row-major flat index of `idx` in a buffer whose dims are `ends`.
const UOp* flat_index(Graph& g, std::span<const UOp* const> idx, std::span<const UOp* const> ends) {
  const UOp* flat = g.idx(0);
  const UOp* stride = g.idx(1);
  for (size_t i = idx.size(); i-- > 0;) {
    flat = dim_add(g, flat, dim_mul(g, idx[i], stride));
    stride = dim_mul(g, stride, ends[i]);
  }
  return flat;
}

std::vector<const UOp*> range_ends(const UOp* bufferize) {
  std::vector<const UOp*> ends;
  for (const UOp* r : bufferize->src().subspan(1)) ends.push_back(r->src(0));
  return ends;
}

// A name for people reading schedules: E (elementwise) or r (has a reduction), then the
// output dims, e.g. r_4_5 for a 4x5 matmul.
std::string kernel_name(const UOp* bufferize) {
  bool reduces = false;
  for (const UOp* u : toposort(bufferize->src(0))) reduces |= u->op() == Op::REDUCE;
  std::string name = reduces ? "r" : "E";
  for (const UOp* e : range_ends(bufferize)) {
    auto d = const_dim(e);
    name += d ? cat("_", *d) : std::string("_n");
  }
  return name;
}

}  // namespace

absl::StatusOr<Schedule> split_kernels(Graph& g, const Rangeified& r, const std::string& device) {
  const UOp* dev = g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{device}});
  Schedule sched;
  sched.var_values = r.var_values;

  // Every BUFFERIZE, after the ones it reads (toposort puts sources first).
  std::vector<const UOp*> order;
  for (const UOp* u : toposort(r.sink))
    if (u->op() == Op::BUFFERIZE) order.push_back(u);

  absl::flat_hash_map<const UOp*, const UOp*> buffer_of;
  for (size_t i = 0; i < order.size(); ++i) {
    const UOp* b = order[i];
    int64_t numel = 1;  // at every variable's maximum: buffers are allocated for the largest run
    for (const UOp* e : range_ends(b)) {
      int64_t d = dim_max(e);
      if (d < 0 || (d > 0 && numel > (int64_t{1} << 40) / d))
        return absl::InvalidArgumentError(cat("split_kernels: buffer of kernel ", kernel_name(b), " is too large"));
      numel *= d;
    }
    const UOp* unique = g.make(Op::LUNIQUE, dtypes::void_, {}, IntArg{static_cast<int64_t>(i)});
    buffer_of[b] = g.make(Op::BUFFER, b->dtype(), {unique, dev}, BufferArg{numel});
  }

  // A read of a realized value, INDEX(BUFFERIZE, i... [, gate]), becomes a load of its
  // buffer. This is a substitution keyed by node rather than a rule: a rule would see the
  // BUFFERIZE only after its own body was rewritten, and re-walk every earlier kernel.
  absl::flat_hash_map<const UOp*, const UOp*> reads;
  for (const UOp* u : toposort(r.sink)) {
    if (u->op() != Op::INDEX || u->src(0)->op() != Op::BUFFERIZE) continue;
    const UOp* buf = buffer_of.at(u->src(0));
    size_t n = u->num_src();
    const UOp* gate = n > 1 && u->src(n - 1)->dtype().is_bool() ? u->src(--n) : nullptr;
    const UOp* flat = flat_index(g, u->src().subspan(1, n - 1), range_ends(u->src(0)));
    std::vector<const UOp*> at{buf, flat};
    if (gate) at.push_back(gate);
    const UOp* index = g.make(Op::INDEX, buf->dtype(), at);
    reads[u] = gate ? g.make(Op::LOAD, buf->dtype(), {buf, index, g.cnst(buf->dtype(), ConstValue::Int(0))})
                    : g.make(Op::LOAD, buf->dtype(), {buf, index});
  }

  absl::flat_hash_map<const UOp*, size_t> output_index;
  for (const UOp* b : r.sink->src()) output_index.emplace(b, output_index.size());
  std::vector<const UOp*> calls;
  for (const UOp* b : order) {
    const UOp* buf = buffer_of.at(b);
    auto ranges = b->src().subspan(1);
    const UOp* value = substitute(g, b->src(0), reads);
    const UOp* at = g.make(Op::INDEX, buf->dtype(), {buf, flat_index(g, ranges, range_ends(b))});
    std::vector<const UOp*> store_src{at, value};
    store_src.insert(store_src.end(), ranges.begin(), ranges.end());
    const UOp* store = g.make(Op::STORE, dtypes::void_, store_src);
    std::string name = kernel_name(b);
    const UOp* body = g.make(Op::SINK, dtypes::void_, {store}, KernelInfoArg{true, name});

    KernelCall kc;
    kc.body = body;
    for (const UOp* u : toposort(body))
      if (u->op() == Op::BUFFER) kc.buffers.push_back(u);
    std::vector<const UOp*> call_src{body};
    call_src.insert(call_src.end(), kc.buffers.begin(), kc.buffers.end());
    kc.call = g.make(Op::CALL, dtypes::void_, call_src, CallInfoArg{name, "", {}, false, false});
    calls.push_back(kc.call);
    sched.calls.push_back(std::move(kc));
    if (!output_index.contains(b)) sched.intermediates.push_back(buf);
  }
  for (const UOp* b : r.sink->src()) sched.outputs.push_back(buffer_of.at(b));
  sched.root = g.make(Op::SINK, dtypes::void_, calls);
  return sched;
}

}  // namespace uop
