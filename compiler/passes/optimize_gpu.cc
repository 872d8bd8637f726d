#include "compiler/passes/optimize_gpu.h"

#include <algorithm>
#include <functional>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/eval.h"
#include "compiler/passes/expand.h"
#include "compiler/passes/optimize.h"
#include "compiler/passes/tensor_cores.h"
#include "compiler/ir/value_range.h"

namespace uop {
namespace {

bool has_range(const UOp* x) {
  for (const UOp* u : toposort(x))
    if (u->op() == Op::RANGE || u->op() == Op::SPECIAL) return true;
  return false;
}

int64_t next_axis_id(const UOp* kernel) {
  int64_t id = 0;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::RANGE) id = std::max(id, u->arg_as<RangeArg>().axis_id + 1);
  return id;
}

// The ranges closed by the kernel's one STORE and the facts the rules ask about.
struct Shape {
  const UOp* kernel = nullptr;
  const UOp* store = nullptr;
  const UOp* idx = nullptr;                  // the store's linear index
  std::vector<const UOp*> outputs;           // closed by the store, outermost first
  std::vector<const UOp*> reduces;           // REDUCE nodes that close ranges
  std::vector<const UOp*> load_indices;      // every LOAD's linear index
};

std::optional<Shape> shape_of(const UOp* kernel) {
  if (!(kernel->op() == Op::SINK && kernel->num_src() == 1 && kernel->src(0)->op() == Op::STORE)) return std::nullopt;
  Shape s;
  s.kernel = kernel;
  s.store = kernel->src(0);
  if (s.store->src(0)->op() != Op::INDEX || s.store->src(0)->num_src() < 2) return std::nullopt;
  s.idx = s.store->src(0)->src(1);
  s.outputs = closed_ranges(s.store);
  for (const UOp* u : toposort(kernel)) {
    if (u->op() == Op::REDUCE && !closed_ranges(u).empty()) s.reduces.push_back(u);
    if (u->op() == Op::LOAD && u->src(1)->op() == Op::INDEX && u->src(1)->num_src() >= 2) s.load_indices.push_back(u->src(1)->src(1));
  }
  return s;
}

// `k` with each range in `to` replaced by the same range under a new arg.
const UOp* retype(Graph& g, const UOp* k, const std::vector<std::pair<const UOp*, RangeArg>>& to) {
  absl::flat_hash_map<const UOp*, const UOp*> repl;
  for (auto& [r, a] : to) repl[r] = g.make(Op::RANGE, r->dtype(), r->src(), a);
  return substitute(g, k, repl);
}

// --- group_reduce ----------------------------------------------------------------------

// The reduce loop to spread over a block: one that some load walks contiguously, else the
// innermost. nullptr when the kernel is not one plain reduction over constant loops.
const UOp* group_loop(const Shape& s, bool* contiguous) {
  if (s.reduces.size() != 1) return nullptr;
  std::vector<const UOp*> own = closed_ranges(s.reduces[0]);
  const UOp* pick = own.back();
  *contiguous = false;
  for (const UOp* r : own)
    for (const UOp* li : s.load_indices)
      if (affine_coeff(li, r) == 1) pick = r, *contiguous = true;
  return const_end(pick) > 0 ? pick : nullptr;
}

absl::StatusOr<const UOp*> rule_group_reduce(Graph& g, const Shape& s, const GpuOptimizeOptions& o) {
  bool contiguous = false;
  const UOp* rk = group_loop(s, &contiguous);
  if (!rk) return nullptr;
  ValueRange vr;
  __int128 outputs = 1;
  for (const UOp* r : s.outputs) outputs = std::min<__int128>(outputs * std::max<int64_t>(vr.vmax(r->src(0)), 1), __int128{1} << 62);
  const int64_t K = const_end(rk);
  if (!((outputs <= o.max_group_outputs && K >= o.min_group_reduce) || (contiguous && K >= 256))) return nullptr;
  int64_t L = 0;
  for (int64_t c = o.max_threads; c >= 32 && !L; c /= 2)
    if (c <= K && K % c == 0) L = c;
  if (L) {
    // rk = ro * L + T: thread T of the block takes every L-th value, so neighbouring
    // threads read neighbouring elements.
    return split_range(g, s.kernel, rk, L, AxisType::GroupReduce);
  }
  for (L = 32; L * 2 <= std::min<int64_t>(K, o.max_threads); L *= 2) {}
  // No L divides K: ceil(K / L) x L, the tail reads a clamped (in-bounds) element and
  // contributes the identity.
  const UOp* R = s.reduces[0];
  int64_t id = next_axis_id(s.kernel);
  RangeArg ra = rk->arg_as<RangeArg>();
  const UOp* ro = g.make(Op::RANGE, dtypes::index, {g.idx((K + L - 1) / L)}, ra);
  const UOp* t = g.make(Op::RANGE, dtypes::index, {g.idx(L)}, RangeArg{id, AxisType::GroupReduce, true});
  const UOp* flat = g.alu(Op::ADD, {g.alu(Op::MUL, {ro, g.idx(L)}), t});
  const UOp* v = substitute(g, R->src(0), {{rk, g.alu(Op::MIN, {flat, g.idx(K - 1)})}});
  ReduceOp op = R->arg_as<ReduceOpArg>().op;
  v = g.alu(Op::WHERE, {g.alu(Op::CMPLT, {flat, g.idx(K)}), v, g.cnst(R->dtype(), reduce_identity(op, R->dtype().scalar))});
  std::vector<const UOp*> src{v};
  for (const UOp* r : R->src().subspan(1)) {
    if (r != rk) src.push_back(r);
    else src.push_back(ro), src.push_back(t);
  }
  return substitute(g, s.kernel, {{R, g.make(Op::REDUCE, R->dtype(), src, R->arg())}});
}

// --- upcast ----------------------------------------------------------------------------

absl::StatusOr<const UOp*> rule_upcast(Graph& g, const Shape& s, const GpuOptimizeOptions& o) {
  const DType vt = s.store->src(1)->dtype();
  if (vt.is_vector()) return nullptr;
  int64_t w = std::min<int64_t>(8, o.vector_bytes / std::max(1, vt.itemsize()));
  if (w < 2) return nullptr;
  for (auto it = s.outputs.rbegin(); it != s.outputs.rend(); ++it) {
    int64_t n = const_end(*it);
    if (affine_coeff(s.idx, *it) == 1 && n > 0 && n % w == 0 && n / w >= 64)
      return split_range(g, s.kernel, *it, w, AxisType::Upcast);
  }
  return nullptr;
}

// --- grid ------------------------------------------------------------------------------

// The output loops become Global (x: the contiguous one, or the innermost; then y, z),
// numbered for gpu_dims: the larger the axis id, the earlier the dim.
absl::StatusOr<const UOp*> rule_grid(Graph& g, const Shape& s, const GpuOptimizeOptions&) {
  std::vector<const UOp*> loops;
  for (auto it = s.outputs.rbegin(); it != s.outputs.rend(); ++it) {
    AxisType t = (*it)->arg_as<RangeArg>().type;
    if (t != AxisType::Upcast && !has_range((*it)->src(0))) loops.push_back(*it);
  }
  if (loops.empty()) return s.kernel;
  auto x = std::find_if(loops.begin(), loops.end(), [&](const UOp* r) { return affine_coeff(s.idx, r) == 1; });
  if (x != loops.end()) std::rotate(loops.begin(), x, x + 1);
  ValueRange vr;
  std::vector<std::pair<const UOp*, RangeArg>> to;
  int64_t id = next_axis_id(s.kernel) + 3;
  for (const UOp* r : loops) {
    if (to.size() == 3) break;
    if (!to.empty() && vr.vmax(r->src(0)) > 65535) continue;  // blockIdx.y / z are 16-bit
    to.push_back({r, RangeArg{id--, AxisType::Global, true}});
  }
  return retype(g, s.kernel, to);
}

struct Rule {
  std::string_view name;
  std::function<absl::StatusOr<const UOp*>(Graph&, const Shape&, const GpuOptimizeOptions&)> apply;
};

}  // namespace

absl::StatusOr<const UOp*> optimize_gpu(Graph& g, const UOp* kernel, const GpuOptimizeOptions& opts) {
  auto shape = shape_of(kernel);
  if (!shape) return kernel;  // not one STORE: every loop stays serial, in one thread
  if (opts.tensor_cores && opts.sm >= 80) {
    auto k = use_tensor_cores(g, kernel);
    if (!k.ok() || *k != kernel) return k;
  }
  // The shaping rules: the first that applies wins; then the grid.
  static const Rule kRules[] = {{"group_reduce", rule_group_reduce}, {"upcast", rule_upcast}};
  const UOp* k = kernel;
  for (const Rule& r : kRules) {
    auto out = r.apply(g, *shape, opts);
    if (!out.ok()) return out.status();
    if (*out && *out != kernel) {
      k = *out;
      break;
    }
  }
  shape = shape_of(k);
  if (!shape) return absl::InternalError("optimize_gpu: a rule broke the kernel's shape");
  return rule_grid(g, *shape, opts);
}

}  // namespace uop
