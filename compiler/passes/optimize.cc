#include "compiler/passes/optimize.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "compiler/passes/expand.h"
#include "compiler/ir/value_range.h"
#include "compiler/rewrite/graph_rewrite.h"

namespace uop {
namespace {

struct SplitCtx {
  const UOp* target = nullptr;  // the RANGE being split
  const UOp* outer = nullptr;   // r0
  const UOp* inner = nullptr;   // r1
  const UOp* expr = nullptr;    // r0 * factor + r1, what r becomes
};

const rw::RuleSet& split_rules() {
  static const rw::RuleSet rs = [] {
    rw::RuleSet rs("split_range");
    rs.add(rw::op(Op::RANGE).named("r"), [](const rw::Match& m) -> const UOp* {
      auto* c = m.ctx<SplitCtx>();
      return m["r"] == c->target ? c->expr : nullptr;
    }, "range.split");
    // Where the range was closed, close both halves instead of the expression.
    rs.add(rw::op({Op::STORE, Op::REDUCE, Op::END}).named("x"), [](const rw::Match& m) -> const UOp* {
      auto* c = m.ctx<SplitCtx>();
      const UOp* x = m["x"];
      size_t start = static_cast<size_t>(op_info(x->op()).range_start);
      std::vector<const UOp*> src(x->src().begin(), x->src().begin() + start);
      bool changed = false;
      for (const UOp* r : x->src().subspan(start)) {
        if (r == c->expr) {
          src.push_back(c->outer);
          src.push_back(c->inner);
          changed = true;
        } else {
          src.push_back(r);
        }
      }
      return changed ? m.g.make(x->op(), x->dtype(), src, x->arg()) : nullptr;
    }, "closed.split");
    return rs;
  }();
  return rs;
}

int64_t const_end(const UOp* r) {
  const ConstValue* c = r->src(0)->const_value();
  return c ? c->to_int() : -1;
}

// The RANGEs `x` closes, outermost first.
std::vector<const UOp*> closed_ranges(const UOp* x) {
  std::vector<const UOp*> out;
  for (const UOp* r : x->src().subspan(static_cast<size_t>(op_info(x->op()).range_start)))
    if (r->op() == Op::RANGE) out.push_back(r);
  return out;
}

// The kernel with the loop `axis_id` moved outermost among its STORE's loops. For a
// tiled matmul that is the column-panel loop: each panel of B then stays in cache while
// every row block of A streams past it, instead of all of B streaming past each row block.
const UOp* outermost_first(Graph& g, const UOp* kernel, int64_t axis_id) {
  const UOp* store = kernel->src(0);
  std::vector<const UOp*> src{store->src(0), store->src(1)};
  std::vector<const UOp*> rest;
  for (const UOp* r : store->src().subspan(2)) {
    if (r->op() == Op::RANGE && r->arg_as<RangeArg>().axis_id == axis_id) src.push_back(r);
    else rest.push_back(r);
  }
  src.insert(src.end(), rest.begin(), rest.end());
  return g.make(Op::SINK, kernel->dtype(), {g.make(Op::STORE, dtypes::void_, src)}, kernel->arg());
}

}  // namespace

absl::StatusOr<const UOp*> split_range(Graph& g, const UOp* kernel, const UOp* r, int64_t factor, AxisType type) {
  int64_t end = const_end(r);
  if (end <= 0 || factor <= 0 || end % factor != 0)
    return absl::InternalError("split_range: the factor must divide a constant trip count");
  int64_t next_id = 0;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::RANGE) next_id = std::max(next_id, u->arg_as<RangeArg>().axis_id + 1);
  SplitCtx c;
  c.target = r;
  RangeArg outer = r->arg_as<RangeArg>();
  c.outer = g.make(Op::RANGE, dtypes::index, {g.idx(end / factor)}, outer);
  c.inner = g.make(Op::RANGE, dtypes::index, {g.idx(factor)}, RangeArg{next_id, type, true});
  c.expr = g.alu(Op::ADD, {g.alu(Op::MUL, {c.outer, g.idx(factor)}), c.inner});
  return rw::graph_rewrite(g, kernel, split_rules(), &c);
}

absl::StatusOr<const UOp*> optimize_cpu(Graph& g, const UOp* kernel, const OptimizeOptions& opts) {
  if (!(kernel->op() == Op::SINK && kernel->num_src() == 1 && kernel->src(0)->op() == Op::STORE)) return kernel;
  const UOp* store = kernel->src(0);
  std::vector<const UOp*> outputs = closed_ranges(store);
  const UOp* reduce = nullptr;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::REDUCE && !closed_ranges(u).empty()) reduce = u;
  const UOp* idx = store->src(0)->num_src() >= 2 ? store->src(0)->src(1) : nullptr;
  const UOp* k = kernel;

  // Upcasts: vector lanes for the loops that store (or, failing that, reduce) contiguously.
  int itemsize = std::max(store->src(1)->dtype().itemsize(), 1);
  int64_t width = opts.vector_bits / (8 * itemsize);
  if (width >= 2 && idx && !store->src(1)->dtype().is_bool()) {
    const UOp* lane_loop = nullptr;
    for (auto it = outputs.rbegin(); it != outputs.rend() && !lane_loop; ++it)
      if (affine_coeff(idx, *it) == 1 && const_end(*it) > 0 && const_end(*it) % width == 0) lane_loop = *it;
    if (lane_loop) {
      int64_t w = reduce && const_end(lane_loop) % (2 * width) == 0 && 2 * width <= opts.max_lanes ? 2 * width : width;
      // A second output loop (a row of the tile) shares each loaded vector of the first.
      // It is split first so that its lanes come first (lane = row * w + column): each
      // row of the tile is then one run of contiguous lanes.
      const UOp* row = nullptr;
      if (reduce && 4 * w <= opts.max_lanes)
        for (const UOp* r : outputs)
          if (r != lane_loop && const_end(r) > 0 && const_end(r) % 4 == 0) row = r;
      if (row) {
        auto s = split_range(g, k, row, 4, AxisType::Upcast);
        if (!s.ok()) return s.status();
        k = *s;
      }
      auto s = split_range(g, k, lane_loop, w, AxisType::Upcast);
      if (!s.ok()) return s.status();
      k = *s;
      if (row) k = outermost_first(g, k, lane_loop->arg_as<RangeArg>().axis_id);
    } else if (reduce && outputs.empty()) {
      const UOp* kr = closed_ranges(reduce).back();
      int64_t w = std::min<int64_t>(4 * width, opts.max_lanes);
      if (const_end(kr) > 0 && const_end(kr) % w == 0) {
        auto s = split_range(g, k, kr, w, AxisType::Upcast);
        if (!s.ok()) return s.status();
        k = *s;
      }
    }
  }

  // Thread: the outermost output loop, if the whole kernel is worth several threads.
  store = k->src(0);
  outputs = closed_ranges(store);
  ValueRange vr;
  __int128 work = 1;
  for (const UOp* u : toposort(k))
    if (u->op() == Op::RANGE && u->arg_as<RangeArg>().type != AxisType::Upcast)
      work = std::min<__int128>(work * std::max<int64_t>(vr.vmax(u->src(0)), 1), __int128{1} << 62);
  if (outputs.empty() || outputs[0]->arg_as<RangeArg>().type == AxisType::Upcast) return k;
  const UOp* outer = outputs[0];
  if (vr.vmax(outer->src(0)) < 2 || work < opts.min_parallel_work) return k;
  RangeArg a = outer->arg_as<RangeArg>();
  a.type = AxisType::Thread;
  absl::flat_hash_map<const UOp*, const UOp*> repl{{outer, g.make(Op::RANGE, outer->dtype(), outer->src(), a)}};
  return substitute(g, k, repl);
}

}  // namespace uop
