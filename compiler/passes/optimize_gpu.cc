#include "compiler/passes/optimize_gpu.h"

#include <algorithm>
#include <optional>
#include <span>
#include <string_view>

#include "compiler/ir/value_range.h"
#include "compiler/passes/expand.h"
#include "compiler/passes/gemm_tiles.h"
#include "compiler/passes/optimize.h"
#include "compiler/passes/tensor_cores.h"
#include "compiler/support/status_macros.h"

namespace uop {
namespace {

LoopStep split_step(int64_t axis, int64_t factor, AxisType type) {
  return LoopStep{.kind = LoopStep::Kind::Split, .axis = axis, .factor = factor, .type = type};
}

// The kernel as the chooser sees it: its canonical axes (loop_schedule.h) and the facts
// the rules ask about.
struct Plan {
  const UOp* kernel = nullptr;
  const UOp* store = nullptr;
  const UOp* idx = nullptr;              // the store's linear index
  std::vector<const UOp*> axes;          // schedule_axes
  size_t outputs = 0;                    // axes 0 .. outputs-1 are the STORE's, outermost first
  std::vector<bool> contiguous;          // per output axis: the store walks it with stride 1
  std::vector<const UOp*> reduces;       // REDUCE nodes that close ranges
  std::vector<const UOp*> load_indices;  // every LOAD's linear index
  int64_t axis_of(const UOp* r) const { return std::find(axes.begin(), axes.end(), r) - axes.begin(); }
};

// --- tile --------------------------------------------------------------------------------

// The block tiles tried, largest first: the first that fits and leaves enough blocks to
// fill a GPU (256), else the fitting one with the most blocks.
std::optional<GemmTile> pick_tile(const UOp* kernel, const GpuOptimizeOptions& o, bool tensor_cores) {
  static constexpr GemmTile kTiles[] = {{128, 128, 8, 8, 8}, {64, 64, 8, 4, 4}, {32, 32, 8, 4, 4}};
  static constexpr GemmTile kWarpTiles[] = {
      {128, 128, 32, 64, 32, true}, {64, 64, 32, 32, 32, true}, {32, 32, 16, 16, 16, true}};
  std::optional<GemmTile> best;
  int64_t best_blocks = 0;
  auto mt = match_matmul(kernel, [](const MatmulMatch&) { return true; });
  if (!mt) return std::nullopt;
  for (const GemmTile& t : tensor_cores ? std::span<const GemmTile>(kWarpTiles) : std::span<const GemmTile>(kTiles)) {
    if (t.threads() > o.max_threads || !gemm_tile_misfit(kernel, t).empty()) continue;
    // Either orientation may be the one that fits: count blocks on the extents' product.
    const int64_t blocks = const_end(mt->m) * const_end(mt->n) / (t.bm * t.bn);
    if (blocks >= 256) return t;
    if (blocks > best_blocks) best = t, best_blocks = blocks;
  }
  return best;
}

LoopSchedule tile_schedule(const GemmTile& t) {
  return LoopSchedule{{LoopStep{.kind = t.tensor_cores ? LoopStep::Kind::TensorCoreTile : LoopStep::Kind::Tile,
                                .order = {t.bm, t.bn, t.bk, t.tm, t.tn}}}};
}

// --- group_reduce ----------------------------------------------------------------------

// The reduce loop to spread over a block: one that some load walks contiguously, else the
// innermost. nullptr when the kernel is not one plain reduction over constant loops.
const UOp* group_loop(const Plan& p, bool* contiguous) {
  if (p.reduces.size() != 1) return nullptr;
  std::vector<const UOp*> own = closed_ranges(p.reduces[0]);
  const UOp* pick = own.back();
  *contiguous = false;
  for (const UOp* r : own)
    for (const UOp* li : p.load_indices)
      if (affine_coeff(li, r) == 1) pick = r, *contiguous = true;
  return const_end(pick) > 0 ? pick : nullptr;
}

// The steps that spread the reduction over a block's threads; none when it stays per
// thread.
std::vector<LoopStep> group_reduce_steps(const Plan& p, const GpuOptimizeOptions& o) {
  bool contiguous = false;
  const UOp* rk = group_loop(p, &contiguous);
  if (!rk || !can_mask(p.kernel, rk)) return {};
  ValueRange vr;
  __int128 outputs = 1;
  for (size_t i = 0; i < p.outputs; ++i)
    outputs = std::min<__int128>(outputs * std::max<int64_t>(vr.vmax(p.axes[i]->src(0)), 1), __int128{1} << 62);
  const int64_t K = const_end(rk);
  const bool few = outputs <= o.max_group_outputs && K >= o.min_group_reduce;
  // Many short contiguous rows: a warp per row, several rows per block.
  const bool rows = !few && contiguous && K >= 32 && K < 256 && o.max_threads >= 64;
  if (!few && !(contiguous && K >= 256) && !rows) return {};
  std::vector<LoopStep> steps;
  const int64_t r = p.axis_of(rk);
  if (rows) {
    // The innermost output loop (the row) split into rows of threads (Local, threadIdx.y).
    const int64_t P = o.max_threads / 32;
    for (size_t i = p.outputs; i-- > 0;) {
      const int64_t n = const_end(p.axes[i]);
      if (n >= P && (n % P == 0 || can_mask(p.kernel, p.axes[i]))) {
        steps.push_back(split_step(static_cast<int64_t>(i), P, AxisType::Local));
        break;
      }
    }
    steps.push_back(split_step(r, 32, AxisType::GroupReduce));
    return steps;
  }
  // A long contiguous row: each thread loads 16-byte vectors (the reduce loop's lanes an
  // Upcast, when the lanes and a warp divide it), neighbouring threads neighbouring ones.
  int64_t n = K;
  const int64_t w = std::min<int64_t>(8, o.vector_bytes / std::max(1, p.reduces[0]->dtype().itemsize()));
  if (contiguous && w >= 2 && K % (32 * w) == 0 && !p.reduces[0]->dtype().is_vector()) {
    steps.push_back(split_step(r, w, AxisType::Upcast));
    n = K / w;
  }
  // r = ro * L + T: thread T of the block takes every L-th value (or vector), so
  // neighbouring threads read neighbouring elements. No L divides it: ceil(n / L) x L,
  // the tail masked to the identity (split_range).
  int64_t L = 0;
  for (int64_t c = o.max_threads; c >= 32 && !L; c /= 2)
    if (c <= n && n % c == 0) L = c;
  if (!L)
    for (L = 32; L * 2 <= std::min<int64_t>(n, o.max_threads); L *= 2) {}
  steps.push_back(split_step(r, L, AxisType::GroupReduce));
  return steps;
}

// --- upcast ----------------------------------------------------------------------------

std::optional<LoopStep> upcast_step(const Plan& p, const GpuOptimizeOptions& o) {
  const DType vt = p.store->src(1)->dtype();
  if (vt.is_vector()) return std::nullopt;
  int64_t w = std::min<int64_t>(8, o.vector_bytes / std::max(1, vt.itemsize()));
  if (w < 2) return std::nullopt;
  for (size_t i = p.outputs; i-- > 0;) {
    int64_t n = const_end(p.axes[i]);
    if (p.contiguous[i] && n > 0 && n % w == 0 && n / w >= 64) return split_step(static_cast<int64_t>(i), w, AxisType::Upcast);
  }
  return std::nullopt;
}

// --- grid ------------------------------------------------------------------------------

// The output loops become Global (x: the contiguous one, or the innermost; then y, z).
std::optional<LoopStep> grid_step(const Plan& p) {
  std::vector<int64_t> loops;
  for (size_t i = p.outputs; i-- > 0;) {
    const UOp* r = p.axes[i];
    bool nested = false;
    for (const UOp* x : toposort(r->src(0))) nested |= x->op() == Op::RANGE;
    if (r->arg_as<RangeArg>().type == AxisType::Loop && !nested) loops.push_back(static_cast<int64_t>(i));
  }
  if (loops.empty()) return std::nullopt;
  auto x = std::find_if(loops.begin(), loops.end(), [&](int64_t a) { return p.contiguous[a]; });
  if (x != loops.end()) std::rotate(loops.begin(), x, x + 1);
  ValueRange vr;
  LoopStep st{.kind = LoopStep::Kind::Grid};
  for (int64_t a : loops) {
    if (st.order.size() == 3) break;
    if (!st.order.empty() && vr.vmax(p.axes[a]->src(0)) > 65535) continue;  // blockIdx.y / z are 16-bit
    st.order.push_back(a);
  }
  return st;
}

}  // namespace

ScheduleLimits gpu_schedule_limits(const GpuOptimizeOptions& opts) {
  ScheduleLimits l;
  l.output_types = {AxisType::Loop, AxisType::Upcast, AxisType::Local};
  l.reduce_types = {AxisType::Reduce, AxisType::Upcast, AxisType::GroupReduce};
  l.thread = false;
  l.gpu = true;
  l.sm = opts.tensor_cores ? opts.sm : 0;
  l.max_lanes = 256;
  return l;
}

LoopSchedule gpu_heuristic_schedule(const UOp* kernel, const GpuOptimizeOptions& opts) {
  Plan p;
  p.kernel = kernel;
  p.axes = schedule_axes(kernel);
  if (p.axes.empty()) return {};  // not one STORE: every loop stays serial, in one thread
  p.store = kernel->src(0);
  if (p.store->src(0)->op() != Op::INDEX || p.store->src(0)->num_src() < 2) return {};
  p.idx = p.store->src(0)->src(1);
  if (opts.tensor_cores && opts.sm >= 80) {
    if (opts.smem_tiles)
      if (auto t = pick_tile(kernel, opts, true)) return tile_schedule(*t);
    if (fits_tensor_cores(kernel))
      return LoopSchedule{{LoopStep{.kind = LoopStep::Kind::TensorCores, .factor = tensor_core_warps(kernel)}}};
  }
  if (opts.smem_tiles)
    if (auto t = pick_tile(kernel, opts, false)) return tile_schedule(*t);
  p.outputs = closed_ranges(p.store).size();
  for (size_t i = 0; i < p.outputs; ++i) p.contiguous.push_back(affine_coeff(p.idx, p.axes[i]) == 1);
  for (const UOp* u : toposort(kernel)) {
    if (u->op() == Op::REDUCE && !closed_ranges(u).empty()) p.reduces.push_back(u);
    if (u->op() == Op::LOAD && u->src(1)->op() == Op::INDEX && u->src(1)->num_src() >= 2) p.load_indices.push_back(u->src(1)->src(1));
  }
  // The shaping rules: the first that applies wins; then the grid.
  LoopSchedule s;
  if (std::vector<LoopStep> group = group_reduce_steps(p, opts); !group.empty()) {
    for (const LoopStep& st : group) {
      s.steps.push_back(st);
      if (st.axis < static_cast<int64_t>(p.outputs)) p.contiguous[st.axis] = false;  // rows of threads
    }
  } else if (auto up = upcast_step(p, opts)) {
    s.steps.push_back(*up);
    p.contiguous[up->axis] = false;  // its outer part strides by the lanes
  }
  if (auto grid = grid_step(p)) s.steps.push_back(*grid);
  return s;
}

absl::StatusOr<const UOp*> optimize_gpu(Graph& g, const UOp* kernel, const GpuOptimizeOptions& opts,
                                        std::string_view schedule, std::string* applied) {
  LoopSchedule s;
  if (schedule.empty()) {
    s = gpu_heuristic_schedule(kernel, opts);
  } else {
    ASSIGN_OR_RETURN(s, parse_loop_schedule(schedule));
  }
  ASSIGN_OR_RETURN(const UOp* k, apply_schedule(g, kernel, s, gpu_schedule_limits(opts)));
  if (applied) *applied = s.str();
  return k;
}

}  // namespace uop
