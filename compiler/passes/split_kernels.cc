#include "compiler/passes/split_kernels.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/ir/dim.h"
#include "compiler/ir/shape.h"
#include "compiler/passes/multi.h"
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
  const UOp* default_dev = g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{device}});
  Schedule sched;
  sched.var_values = r.var_values;

  // Every step, after the ones it reads (toposort puts sources first): BUFFERIZEs become
  // kernels, ALLREDUCEs of buffers collectives, COPYs of buffers copies.
  std::vector<const UOp*> order;
  for (const UOp* u : toposort(r.sink)) {
    bool step = u->op() == Op::BUFFERIZE ||
                (u->op() == Op::ALLREDUCE && u->src(0)->op() == Op::MULTI && u->src(0)->src(0)->op() == Op::BUFFERIZE) ||
                (u->op() == Op::COPY && u->src(0)->op() == Op::BUFFERIZE);
    if (step) order.push_back(u);
  }

  absl::flat_hash_map<const UOp*, const UOp*> buffer_of;  // BUFFERIZE or COPY -> its BUFFER
  int64_t next_unique = 0;
  auto new_buffer = [&](DType dt, std::span<const UOp* const> ranges_of, const UOp* dev, std::string_view what)
      -> absl::StatusOr<const UOp*> {
    int64_t numel = 1;  // at every variable's maximum: buffers are allocated for the largest run
    for (const UOp* e : ranges_of) {
      int64_t d = dim_max(e);
      if (d < 0 || (d > 0 && numel > (int64_t{1} << 40) / d))
        return absl::InvalidArgumentError(cat("split_kernels: the buffer of ", what, " is too large"));
      numel *= d;
    }
    const UOp* unique = g.make(Op::LUNIQUE, dtypes::void_, {}, IntArg{next_unique++});
    return g.make(Op::BUFFER, dt, {unique, dev}, BufferArg{numel});
  };
  for (const UOp* b : order) {
    if (b->op() == Op::ALLREDUCE) continue;  // in place: no buffer of its own
    absl::StatusOr<const UOp*> buf;
    if (b->op() == Op::COPY) {
      buf = new_buffer(b->dtype(), range_ends(b->src(0)), b->src(1), "a copy");
    } else {
      const UOp* dev = device_of(b->src(0));
      buf = new_buffer(b->dtype(), range_ends(b), dev ? dev : default_dev, kernel_name(b));
    }
    if (!buf.ok()) return buf.status();
    buffer_of[b] = *buf;
  }

  // A read of a realized value becomes a load of its buffer: INDEX(BUFFERIZE, i...),
  // INDEX(MSELECT(ALLREDUCE(MULTI(BUFFERIZE...)), k), i...) (device k's copy of a
  // collective's result, which is its own partial's buffer, reduced in place) and
  // INDEX(COPY(BUFFERIZE), i...). This is a substitution keyed by node rather than a rule:
  // a rule would see the BUFFERIZE only after its own body was rewritten, and re-walk
  // every earlier kernel.
  absl::flat_hash_map<const UOp*, const UOp*> reads;
  for (const UOp* u : toposort(r.sink)) {
    if (u->op() != Op::INDEX) continue;
    const UOp* src = u->src(0);
    const UOp* shaped = nullptr;  // the BUFFERIZE whose ranges give the dims
    const UOp* buf = nullptr;
    if (src->op() == Op::BUFFERIZE) {
      shaped = src;
      buf = buffer_of.at(src);
    } else if (src->op() == Op::MSELECT && src->src(0)->op() == Op::ALLREDUCE) {
      shaped = src->src(0)->src(0)->src(src->arg_as<IntArg>().value);
      buf = buffer_of.at(shaped);
    } else if (src->op() == Op::COPY && src->src(0)->op() == Op::BUFFERIZE) {
      shaped = src->src(0);
      buf = buffer_of.at(src);
    } else {
      continue;
    }
    size_t n = u->num_src();
    const UOp* gate = n > 1 && u->src(n - 1)->dtype().is_bool() ? u->src(--n) : nullptr;
    const UOp* flat = flat_index(g, u->src().subspan(1, n - 1), range_ends(shaped));
    std::vector<const UOp*> at{buf, flat};
    if (gate) at.push_back(gate);
    const UOp* index = g.make(Op::INDEX, buf->dtype(), at);
    reads[u] = gate ? g.make(Op::LOAD, buf->dtype(), {buf, index, g.cnst(buf->dtype(), ConstValue::Int(0))})
                    : g.make(Op::LOAD, buf->dtype(), {buf, index});
  }

  absl::flat_hash_set<const UOp*> outputs(r.sink->src().begin(), r.sink->src().end());
  std::vector<const UOp*> calls;
  for (const UOp* b : order) {
    if (b->op() == Op::ALLREDUCE) {
      CollectiveStep cs;
      cs.op = b->arg_as<ReduceOpArg>().op;
      cs.dtype = b->dtype().scalar;
      for (const UOp* p : b->src(0)->src()) cs.buffers.push_back(buffer_of.at(p));
      sched.steps.push_back({ScheduleStep::Kind::Collective, sched.collectives.size()});
      sched.collectives.push_back(std::move(cs));
      continue;
    }
    if (b->op() == Op::COPY) {
      sched.steps.push_back({ScheduleStep::Kind::Copy, sched.copies.size()});
      sched.copies.push_back({buffer_of.at(b->src(0)), buffer_of.at(b)});
      sched.intermediates.push_back(buffer_of.at(b));
      continue;
    }
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
    for (const UOp* u : toposort(body)) {
      if (u->op() != Op::BUFFER) continue;
      if (u->src(1) != buf->src(1))
        return absl::InvalidArgumentError(
            cat("split_kernels: kernel ", name, " would read a buffer on ", arg_str(u->src(1)->arg()), " while it runs on ",
                arg_str(buf->src(1)->arg()), "; move data between devices with COPY (Tensor::to) [split.device]"));
      kc.buffers.push_back(u);
    }
    std::vector<const UOp*> call_src{body};
    call_src.insert(call_src.end(), kc.buffers.begin(), kc.buffers.end());
    kc.call = g.make(Op::CALL, dtypes::void_, call_src, CallInfoArg{name, "", {}, false, false});
    calls.push_back(kc.call);
    sched.steps.push_back({ScheduleStep::Kind::Kernel, sched.calls.size()});
    sched.calls.push_back(std::move(kc));
    if (!outputs.contains(b)) sched.intermediates.push_back(buf);
  }
  for (const UOp* b : r.sink->src()) sched.outputs.push_back(buffer_of.at(b));
  sched.root = g.make(Op::SINK, dtypes::void_, calls);
  return sched;
}

}  // namespace uop
