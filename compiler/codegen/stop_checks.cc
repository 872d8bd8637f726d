// One pass over the LINEAR in its own order, keeping the open loops on a stack: each op
// adds its work to the innermost open loop; an END decides the loops it closes and hands
// their work to the loop around them. Work saturates instead of overflowing.
#include "compiler/codegen/stop_checks.h"

#include <algorithm>
#include <vector>

namespace uop {
namespace {

constexpr int64_t kHuge = int64_t{1} << 62;

int64_t sat_add(int64_t a, int64_t b) { return std::min(kHuge, a + b); }
int64_t sat_mul(int64_t a, int64_t b) { return b != 0 && a > kHuge / b ? kHuge : std::min(kHuge, a * b); }

// Ops that cost nothing where they are listed: definitions made once, scope markers.
bool free_op(const UOp* u) {
  switch (u->op()) {
    case Op::CONST: case Op::VCONST: case Op::PARAM: case Op::DEFINE_VAR: case Op::DEFINE_REG:
    case Op::DEFINE_LOCAL: case Op::SINK: case Op::GROUP: case Op::DEVICE: case Op::AFTER:
      return true;
    default:
      return false;
  }
}

// Iterations of one run of the loop, or -1 when they are not a constant. A Thread
// range's task runs a part of it, never more.
int64_t trip_count(const UOp* range) {
  if (range->num_src() < 1) return -1;
  const ConstValue* c = range->src(0)->const_value();
  if (!c) return -1;
  return std::max<int64_t>(0, c->to_int());
}

}  // namespace

StopCheckPlan plan_stop_checks(const UOp* linear, const StopCheckOptions& options) {
  const int64_t budget = std::max<int64_t>(1, options.work_between_checks);
  struct Open {
    const UOp* range;
    int64_t work = 0;  // one iteration's
  };
  std::vector<Open> open{{nullptr, 0}};  // the kernel's top level first
  StopCheckPlan plan;
  for (const UOp* u : linear->src()) {
    if (u->is(Op::RANGE)) {
      open.push_back({u, 0});
      continue;
    }
    // An op on a wide vector is several instructions.
    if (!free_op(u)) open.back().work = sat_add(open.back().work, 1 + u->dtype().count / 8);
    if (!u->is(Op::END)) continue;
    for (size_t closing = u->num_src() > 1 ? u->num_src() - 1 : 0; closing > 0; --closing) {
      if (open.size() < 2 || std::find(u->src().begin() + 1, u->src().end(), open.back().range) == u->src().end())
        return plan;
      const Open loop = open.back();
      open.pop_back();
      const int64_t work = std::max<int64_t>(1, loop.work);
      const int64_t trips = trip_count(loop.range);
      int64_t handed_up;  // what the parent's iteration runs of this loop without a check
      if (trips >= 0 && sat_mul(trips, work) <= budget) {
        handed_up = sat_mul(trips, work);
      } else {
        // Heavy iterations: a check each (at most one check per budget / 64 ops). Light
        // ones: one per chunk of budget / work iterations.
        const int64_t every = work * 64 >= budget ? 1 : budget / work;
        plan[loop.range] = every;
        handed_up = sat_mul(every, work);
      }
      open.back().work = sat_add(open.back().work, handed_up);
    }
  }
  return plan;
}

}  // namespace uop
