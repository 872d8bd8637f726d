#include "compiler/passes/optimize.h"

#include "compiler/passes/value_range.h"
#include "compiler/rewrite/graph_rewrite.h"

namespace uop {
namespace {

struct Ctx {
  const UOp* thread = nullptr;  // the range to run in parallel
};

const rw::RuleSet& rules() {
  static const rw::RuleSet rs = [] {
    rw::RuleSet rs("optimize_cpu");
    rs.add(rw::op(Op::RANGE).named("r"), [](const rw::Match& m) -> const UOp* {
      const UOp* r = m["r"];
      if (r != m.ctx<Ctx>()->thread) return nullptr;
      RangeArg a = r->arg_as<RangeArg>();
      a.type = AxisType::Thread;
      return m.g.make(Op::RANGE, r->dtype(), r->src(), a);
    }, "range.thread");
    return rs;
  }();
  return rs;
}

}  // namespace

absl::StatusOr<const UOp*> optimize_cpu(Graph& g, const UOp* kernel, const OptimizeOptions& opts) {
  Ctx ctx;
  // One STORE closing loops: its first range is the outermost loop.
  if (kernel->op() == Op::SINK && kernel->num_src() == 1 && kernel->src(0)->op() == Op::STORE &&
      kernel->src(0)->num_src() > 2) {
    const UOp* outer = kernel->src(0)->src(2);
    ValueRange vr;
    // Work: the product of every loop's trip count, at the variables' maxima.
    __int128 work = 1;
    for (const UOp* u : toposort(kernel))
      if (u->op() == Op::RANGE) work = std::min<__int128>(work * std::max<int64_t>(vr.vmax(u->src(0)), 1), __int128{1} << 62);
    if (outer->op() == Op::RANGE && vr.vmax(outer->src(0)) >= 2 && work >= opts.min_parallel_work)
      ctx.thread = outer;
  }
  if (!ctx.thread) return kernel;
  return rw::graph_rewrite(g, kernel, rules(), &ctx);
}

}  // namespace uop
