#include "compiler/passes/optimize.h"

#include <algorithm>

#include "compiler/ir/value_range.h"
#include "compiler/passes/expand.h"
#include "compiler/support/status_macros.h"

namespace uop {
namespace {

// The lanes for a loop of n iterations and vectors of w lanes: w when it divides n; else a
// divisor of n above w / 2 (no mask, nearly full vectors); else w with the tail masked
// where the loop may be masked (can_mask), the largest divisor of n below w where not;
// n itself when it is shorter than w. 0: no split.
int64_t lanes_for(int64_t n, int64_t w, bool maskable) {
  if (n % w == 0) return w;
  for (int64_t d = w - 1; d > w / 2; --d)
    if (n % d == 0) return d;
  if (n < w) return n >= 2 ? n : 0;
  if (maskable) return w;
  for (int64_t d = w / 2; d >= 2; --d)
    if (n % d == 0) return d;
  return 0;
}

// The kernel as heuristic_schedule sees it, and the schedule it has chosen so far: each
// axis's trip count (its largest, for a variable one) and whether it is Upcast, and the
// order the STORE closes the output axes in, kept as the steps would leave them.
struct Plan {
  const UOp* store = nullptr;
  const UOp* idx = nullptr;              // the STORE's linear index
  std::vector<const UOp*> axes;          // schedule_axes: the kernel's, then the splits'
  std::vector<int64_t> trip;
  std::vector<bool> upcast;
  std::vector<int64_t> store_order;      // output axes, outermost first
  std::vector<bool> maskable;            // can_mask, per axis of the kernel
  size_t outputs = 0;                    // axes 0 .. outputs-1 are the STORE's
  bool reduces = false;
  int64_t width = 0;                     // lanes of one vector register, 0: no upcasting
  LoopSchedule out;

  void split(int64_t a, int64_t f) {
    if (f < 2) return;
    out.steps.push_back(LoopStep{.kind = LoopStep::Kind::Split, .axis = a, .factor = f, .type = AxisType::Upcast});
    trip[a] = (trip[a] + f - 1) / f;
    trip.push_back(f);
    upcast.push_back(true);
    auto at = std::find(store_order.begin(), store_order.end(), a);
    if (at != store_order.end()) store_order.insert(at + 1, static_cast<int64_t>(trip.size()) - 1);
  }
  void outermost(int64_t a) {
    std::vector<int64_t> order{a};
    for (int64_t b : store_order)
      if (b != a) order.push_back(b);
    if (order == store_order) return;
    store_order = order;
    out.steps.push_back(LoopStep{.kind = LoopStep::Kind::Reorder, .order = order});
  }
  bool contiguous(int64_t a) const { return idx && affine_coeff(idx, axes[a]) == 1; }
  int64_t lanes(int64_t a, int64_t w) const { return lanes_for(trip[a], w, maskable[a]); }
};

// The output loop whose lanes are contiguous in memory: the innermost one the width
// divides, else the innermost contiguous one. -1 when none has two iterations.
int64_t lane_axis(const Plan& p) {
  int64_t any = -1;
  for (size_t i = p.outputs; i-- > 0;) {
    int64_t n = const_end(p.axes[i]);
    if (!p.contiguous(static_cast<int64_t>(i)) || n < 2) continue;
    if (n % p.width == 0) return static_cast<int64_t>(i);
    if (any < 0) any = static_cast<int64_t>(i);
  }
  return any;
}

void elementwise(Plan& p, const OptimizeOptions&) {
  int64_t a = lane_axis(p);
  if (a >= 0) p.split(a, p.lanes(a, p.width));
}

// Outputs and a reduction: a tile of accumulators, rows of the lane loop's vectors.
void tiled_reduction(Plan& p, const OptimizeOptions& o) {
  int64_t a = lane_axis(p);
  if (a < 0) return;
  const int64_t n = p.trip[a];
  const int64_t w = n % (2 * p.width) == 0 && 2 * p.width <= o.max_lanes ? 2 * p.width : p.lanes(a, p.width);
  if (w < 2) return;
  // A second output loop (a row of the tile) shares each loaded vector of the first. It
  // is split first so that its lanes come first (lane = row * w + column): each row of
  // the tile is then one run of contiguous lanes.
  int64_t row = -1;
  if (4 * w <= o.max_lanes)
    for (size_t i = 0; i < p.outputs; ++i)
      if (static_cast<int64_t>(i) != a && const_end(p.axes[i]) > 0 && const_end(p.axes[i]) % 4 == 0) row = static_cast<int64_t>(i);
  if (row >= 0) p.split(row, 4);
  p.split(a, w);
  // The column-panel loop outermost: each panel of B then stays in cache while every row
  // block of A streams past it, instead of all of B streaming past each row block.
  if (row >= 0) p.outermost(a);
}

// No output loop: the reduce loop's lanes become vector accumulators.
void full_reduction(Plan& p, const OptimizeOptions& o) {
  const int64_t a = static_cast<int64_t>(p.axes.size()) - 1;  // the innermost reduce loop
  const int64_t n = const_end(p.axes[a]);
  if (n < 2 || !p.reduces) return;
  for (int64_t m : {4, 2, 1}) {
    int64_t w = std::min<int64_t>(m * p.width, o.max_lanes);
    if (n % w == 0) return p.split(a, w);
  }
  p.split(a, p.lanes(a, std::min<int64_t>(p.width, o.max_lanes)));
}

// The outermost output loop on threads, if the whole kernel is worth several.
void threads(Plan& p, const OptimizeOptions& o) {
  if (p.store_order.empty()) return;
  const int64_t a = p.store_order[0];
  __int128 work = 1;
  for (size_t i = 0; i < p.trip.size(); ++i)
    if (!p.upcast[i]) work = std::min<__int128>(work * std::max<int64_t>(p.trip[i], 1), __int128{1} << 62);
  if (p.upcast[a] || p.trip[a] < 2 || work < o.min_parallel_work) return;
  p.out.steps.push_back(LoopStep{.kind = LoopStep::Kind::Thread, .axis = a});
}

}  // namespace

ScheduleLimits cpu_schedule_limits(const OptimizeOptions& opts) {
  ScheduleLimits l;
  l.output_types = {AxisType::Loop, AxisType::Upcast};
  l.reduce_types = {AxisType::Reduce, AxisType::Upcast};
  l.thread = true;
  l.max_lanes = opts.max_lanes;
  return l;
}

LoopSchedule heuristic_schedule(const UOp* kernel, const OptimizeOptions& opts) {
  Plan p;
  p.axes = schedule_axes(kernel);
  if (p.axes.empty()) return {};
  p.store = kernel->src(0);
  p.idx = p.store->src(0)->num_src() >= 2 ? p.store->src(0)->src(1) : nullptr;
  ValueRange vr;
  for (const UOp* r : p.axes) {
    p.maskable.push_back(can_mask(kernel, r));
    p.trip.push_back(vr.vmax(r->src(0)));
    p.upcast.push_back(r->arg_as<RangeArg>().type == AxisType::Upcast);
  }
  // A CUSTOM op is a call of a C function on scalars (llvm_cpu.custom): a kernel with one
  // gets no vector lanes, whatever its trip counts.
  bool custom = false;
  for (const UOp* u : toposort(kernel)) {
    if (u->op() == Op::REDUCE && u->num_src() > 1) p.reduces = true;
    if (u->op() == Op::CUSTOM || u->op() == Op::CUSTOMI) custom = true;
  }
  for (const UOp* u : p.store->src().subspan(2))
    if (u->op() == Op::RANGE) p.store_order.push_back(static_cast<int64_t>(p.outputs++));

  const DType vt = p.store->src(1)->dtype();
  p.width = opts.vector_bits / (8 * std::max(vt.itemsize(), 1));
  if (p.width >= 2 && p.idx && !vt.is_bool() && !custom) {
    if (!p.reduces) elementwise(p, opts);
    else if (p.outputs > 0) tiled_reduction(p, opts);
    else full_reduction(p, opts);
  }
  threads(p, opts);
  return p.out;
}

absl::StatusOr<const UOp*> optimize_cpu(Graph& g, const UOp* kernel, const OptimizeOptions& opts,
                                        std::string_view schedule, std::string* applied) {
  LoopSchedule s;
  if (schedule.empty()) {
    s = heuristic_schedule(kernel, opts);
  } else {
    ASSIGN_OR_RETURN(s, parse_loop_schedule(schedule));
  }
  ASSIGN_OR_RETURN(const UOp* k, apply_schedule(g, kernel, s, cpu_schedule_limits(opts)));
  if (applied) *applied = s.str();
  return k;
}

}  // namespace uop
