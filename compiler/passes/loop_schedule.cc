#include "compiler/passes/loop_schedule.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/value_range.h"
#include "compiler/passes/gemm_tiles.h"
#include "compiler/passes/optimize.h"
#include "compiler/passes/tensor_cores.h"
#include "compiler/rewrite/graph_rewrite.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

// The split step's names, by AxisType (Placeholder has none: no range is split into one).
constexpr std::array<std::pair<AxisType, std::string_view>, 9> kTypeNames{{
    {AxisType::Loop, "loop"},
    {AxisType::Global, "global"},
    {AxisType::Thread, "thread"},
    {AxisType::Warp, "warp"},
    {AxisType::Local, "local"},
    {AxisType::GroupReduce, "group_reduce"},
    {AxisType::Upcast, "upcast"},
    {AxisType::Reduce, "reduce"},
    {AxisType::Unroll, "unroll"},
}};

bool one_store(const UOp* kernel) {
  return kernel->op() == Op::SINK && kernel->num_src() == 1 && kernel->src(0)->op() == Op::STORE;
}

// --- text --------------------------------------------------------------------------------

// A decimal integer in [0, kMaxNumber]: digits only, no sign, no leading zero.
bool parse_number(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 10 || (s.size() > 1 && s[0] == '0')) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > LoopSchedule::kMaxNumber) return false;
  *out = v;
  return true;
}

std::vector<std::string_view> split_on(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

absl::StatusOr<LoopStep> parse_step(std::string_view text, size_t index) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(cat("schedule step ", index, " \"", text, "\": ", why));
  };
  size_t open = text.find('(');
  if (open == std::string_view::npos || text.back() != ')')
    return bad("a step is NAME(ARGS): split(A,F,TYPE), reorder(A,B,...), thread(A), grid(X,Y,Z), tc(W), "
               "tile(BM,BN,BK,TM,TN) or tc_tile(BM,BN,BK,WM,WN)");
  std::string_view name = text.substr(0, open);
  std::vector<std::string_view> args = split_on(text.substr(open + 1, text.size() - open - 2), ',');
  auto number = [&](std::string_view what, std::string_view s, int64_t* v) -> absl::Status {
    if (parse_number(s, v)) return absl::OkStatus();
    return bad(cat(what, " \"", s, "\" is not a decimal number in [0, ", LoopSchedule::kMaxNumber, "]"));
  };
  LoopStep st;
  if (name == "split") {
    st.kind = LoopStep::Kind::Split;
    if (args.size() != 3) return bad(cat("split takes 3 arguments (axis, factor, type), not ", args.size()));
    RETURN_IF_ERROR(number("axis", args[0], &st.axis));
    RETURN_IF_ERROR(number("factor", args[1], &st.factor));
    auto t = std::find_if(kTypeNames.begin(), kTypeNames.end(), [&](const auto& p) { return p.second == args[2]; });
    if (t == kTypeNames.end()) {
      std::vector<std::string_view> names;
      for (const auto& p : kTypeNames) names.push_back(p.second);
      return bad(cat("type \"", args[2], "\" is not one of ", join(names, ", ")));
    }
    st.type = t->first;
  } else if (name == "reorder") {
    st.kind = LoopStep::Kind::Reorder;
    for (std::string_view a : args) {
      int64_t v = 0;
      RETURN_IF_ERROR(number("axis", a, &v));
      st.order.push_back(v);
    }
  } else if (name == "thread") {
    st.kind = LoopStep::Kind::Thread;
    if (args.size() != 1) return bad(cat("thread takes 1 argument (axis), not ", args.size()));
    RETURN_IF_ERROR(number("axis", args[0], &st.axis));
  } else if (name == "grid" || name == "tile" || name == "tc_tile") {
    const bool grid = name == "grid";
    st.kind = grid ? LoopStep::Kind::Grid : name == "tile" ? LoopStep::Kind::Tile : LoopStep::Kind::TensorCoreTile;
    if (grid ? args.empty() || args.size() > 3 : args.size() != 5)
      return bad(grid ? cat("grid takes 1 to 3 axes (x, y, z), not ", args.size())
                      : cat(name, " takes 5 arguments (BM, BN, BK, ", name == "tile" ? "TM, TN" : "WM, WN", "), not ",
                            args.size()));
    for (std::string_view a : args) {
      int64_t v = 0;
      RETURN_IF_ERROR(number(grid ? "axis" : "extent", a, &v));
      st.order.push_back(v);
    }
  } else if (name == "tc") {
    st.kind = LoopStep::Kind::TensorCores;
    if (args.size() != 1) return bad(cat("tc takes 1 argument (warps per block), not ", args.size()));
    RETURN_IF_ERROR(number("warps", args[0], &st.factor));
  } else {
    return bad(cat("unknown step \"", name, "\" (split, reorder, thread, grid, tc, tile, tc_tile)"));
  }
  return st;
}

// --- split_range -------------------------------------------------------------------------

struct SplitCtx {
  const UOp* target = nullptr;  // the RANGE being split
  const UOp* outer = nullptr;   // r0
  const UOp* inner = nullptr;   // r1
  const UOp* expr = nullptr;    // what r becomes: r0 * factor + r1, clamped below n
  const UOp* valid = nullptr;   // r0 * factor + r1 < n where the factor does not divide n
  bool gate_accesses = false;   // valid gates every access that reads r1 (r not clamped)
};

const rw::RuleSet& split_rules() {
  static const rw::RuleSet rs = [] {
    rw::RuleSet rs("split_range");
    rs.add(rw::op(Op::RANGE).named("r"), [](const rw::Match& m) -> const UOp* {
      auto* c = m.ctx<SplitCtx>();
      return m["r"] == c->target ? c->expr : nullptr;
    }, "range.split");
    // Unclamped, an access that reads r1 is in bounds only where r0 * factor + r1 < n.
    rs.add(rw::op(Op::INDEX).named("i"), [](const rw::Match& m) -> const UOp* {
      auto* c = m.ctx<SplitCtx>();
      const UOp* index = m["i"];
      if (!c->gate_accesses || index->num_src() < 2) return nullptr;
      bool reads = false, gated = false;
      for (size_t s = 1; s < index->num_src(); ++s)
        for (const UOp* u : toposort(index->src(s))) {
          reads |= u == c->inner;
          gated |= u == c->valid;
        }
      if (!reads || gated) return nullptr;
      std::vector<const UOp*> src(index->src().begin(), index->src().end());
      if (src.size() > 2) src.back() = m.g.alu(Op::AND, {src.back(), c->valid});
      else src.push_back(c->valid);
      return m.g.make(Op::INDEX, index->dtype(), src, index->arg());
    }, "index.split_valid");
    // Where the range was closed, close both halves instead of the expression; past the
    // end (a factor that does not divide) a STORE does not store and a REDUCE folds in
    // its identity.
    rs.add(rw::op({Op::STORE, Op::REDUCE, Op::END}).named("x"), [](const rw::Match& m) -> const UOp* {
      auto* c = m.ctx<SplitCtx>();
      Graph& g = m.g;
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
      if (!changed) return nullptr;
      // (Unclamped, index.split_valid has gated the STORE's INDEX where it reads r1; one
      // that does not is gated here all the same.)
      auto gated_by_valid = [&](const UOp* index) {
        if (index->num_src() < 3) return false;
        for (const UOp* u : toposort(index->src(2)))
          if (u == c->valid) return true;
        return false;
      };
      if (c->valid && x->op() == Op::STORE && !gated_by_valid(src[0])) {
        const UOp* index = src[0];
        std::vector<const UOp*> isrc(index->src().begin(), index->src().end());
        if (isrc.size() > 2 && isrc.back()->dtype().is_bool()) isrc.back() = g.alu(Op::AND, {isrc.back(), c->valid});
        else isrc.push_back(c->valid);
        src[0] = g.make(Op::INDEX, index->dtype(), isrc, index->arg());
      } else if (c->valid && x->op() == Op::REDUCE) {
        ReduceOp op = x->arg_as<ReduceOpArg>().op;
        src[0] = g.alu(Op::WHERE, {c->valid, src[0], g.cnst(x->dtype(), reduce_identity(op, x->dtype().scalar))});
      }
      return g.make(x->op(), x->dtype(), src, x->arg());
    }, "closed.split");
    return rs;
  }();
  return rs;
}

// The RANGEs that the gate of some INDEX of `kernel` reads.
absl::flat_hash_set<const UOp*> gated_ranges(const UOp* kernel) {
  absl::flat_hash_set<const UOp*> out;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::INDEX && u->num_src() > 2)
      for (const UOp* x : toposort(u->src(2)))
        if (x->op() == Op::RANGE) out.insert(x);
  return out;
}

struct Split {
  const UOp* kernel;
  const UOp* outer;
  const UOp* inner;
};

// `clamp`: whether r's uses may be clamped where the factor does not divide it (can_mask of
// the kernel the schedule started from: the gates a split adds prove nothing, its clamps
// do). Where not, they are not clamped and every access that reads r gets the tail's gate.
absl::StatusOr<Split> split_impl(Graph& g, const UOp* kernel, const UOp* r, int64_t factor, AxisType type,
                                 bool clamp) {
  const int64_t end = const_end(r);
  if (end < 1 || factor < 2 || factor > end)
    return absl::InvalidArgumentError(cat("split_range: a constant trip count n >= 2 and a factor in [2, n] are needed (n ",
                                          end, ", factor ", factor, ")"));
  int64_t next_id = 0;
  for (const UOp* u : toposort(kernel)) {
    if (u->op() == Op::RANGE) next_id = std::max(next_id, u->arg_as<RangeArg>().axis_id + 1);
    if (u->op() == Op::END && std::find(u->src().begin() + 1, u->src().end(), r) != u->src().end() && end % factor)
      return absl::InvalidArgumentError("split_range: a range an END closes is split only by a factor that divides it");
  }
  if (end % factor != 0 && !clamp && type != AxisType::Upcast)
    return absl::InvalidArgumentError(cat("split_range: a factor (", factor, ") that does not divide the trip count (", end,
                                          ") of a range an access's gate reads splits it only into upcast lanes: the gate "
                                          "is what proves the access in bounds, and it narrows a lane, not a loop"));
  SplitCtx c;
  c.target = r;
  const int64_t outer_end = end / factor + (end % factor != 0);  // ceil, without overflow near INT64_MAX
  c.outer = g.make(Op::RANGE, dtypes::index, {g.idx(outer_end)}, r->arg_as<RangeArg>());
  c.inner = g.make(Op::RANGE, dtypes::index, {g.idx(factor)}, RangeArg{next_id, type, true});
  const UOp* flat = g.alu(Op::ADD, {g.alu(Op::MUL, {c.outer, g.idx(factor)}), c.inner});
  c.expr = flat;
  if (end % factor != 0) {
    // A masked tail rather than a remainder loop: the kernel keeps one STORE over one loop
    // nest, which expand vectorizes (a gated access becomes one access per lane, each
    // under its lane's gate) and the bounds proof reads directly: every index of r is
    // now min(flat, n - 1), inside r's old range wherever it is computed, so each access
    // is proven as it was before the split, gate or no gate; the gate only stops the
    // iterations past n from storing. A remainder loop would need a second STORE (and,
    // for a reduction, a second REDUCE folded into the first), which neither the
    // one-STORE shapes of optimize nor expand's lanes handle.
    // Where an access's gate reads r (a pad), a clamp would hide r from the gate that
    // proves the access; there r stays r0 * factor + r1 and every access that reads it
    // is gated by the tail's valid, which bounds each lane as r's range did.
    c.valid = g.alu(Op::CMPLT, {flat, g.idx(end)});
    if (clamp) c.expr = g.alu(Op::MIN, {flat, g.idx(end - 1)});
    else c.gate_accesses = true;
  }
  ASSIGN_OR_RETURN(const UOp* k, rw::graph_rewrite(g, kernel, split_rules(), &c));
  return Split{k, c.outer, c.inner};
}

}  // namespace

int64_t const_end(const UOp* r) {
  const ConstValue* c = r->src(0)->const_value();
  return c ? c->to_int() : -1;
}

std::vector<const UOp*> closed_ranges(const UOp* x) {
  std::vector<const UOp*> out;
  int rs = op_info(x->op()).range_start;
  if (rs < 0) return out;
  for (const UOp* r : x->src().subspan(static_cast<size_t>(rs)))
    if (r->op() == Op::RANGE) out.push_back(r);
  return out;
}

std::string axis_type_step_name(AxisType t) {
  for (const auto& [type, name] : kTypeNames)
    if (type == t) return std::string(name);
  return std::string(axis_type_name(t));
}

std::string LoopStep::str() const {
  switch (kind) {
    case Kind::Split: return cat("split(", axis, ",", factor, ",", axis_type_step_name(type), ")");
    case Kind::Reorder: return cat("reorder(", join(order, ","), ")");
    case Kind::Thread: return cat("thread(", axis, ")");
    case Kind::Grid: return cat("grid(", join(order, ","), ")");
    case Kind::TensorCores: return cat("tc(", factor, ")");
    case Kind::Tile: return cat("tile(", join(order, ","), ")");
    case Kind::TensorCoreTile: return cat("tc_tile(", join(order, ","), ")");
  }
  return "";
}

std::string LoopSchedule::str() const {
  std::vector<std::string> parts;
  for (const LoopStep& s : steps) parts.push_back(s.str());
  return join(parts, ";");
}

absl::StatusOr<LoopSchedule> parse_loop_schedule(std::string_view text) {
  LoopSchedule out;
  if (text.empty()) return out;
  if (text.size() > LoopSchedule::kMaxText)
    return absl::InvalidArgumentError(cat("schedule: ", text.size(), " characters, at most ", LoopSchedule::kMaxText));
  std::vector<std::string_view> steps = split_on(text, ';');
  if (steps.size() > LoopSchedule::kMaxSteps)
    return absl::InvalidArgumentError(cat("schedule: ", steps.size(), " steps, at most ", LoopSchedule::kMaxSteps));
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].empty()) return absl::InvalidArgumentError(cat("schedule step ", i, " is empty (steps are joined by one ';')"));
    ASSIGN_OR_RETURN(LoopStep st, parse_step(steps[i], i));
    out.steps.push_back(std::move(st));
  }
  return out;
}

std::vector<const UOp*> schedule_axes(const UOp* kernel) {
  if (!one_store(kernel)) return {};
  std::vector<const UOp*> axes = closed_ranges(kernel->src(0));
  absl::flat_hash_set<const UOp*> seen(axes.begin(), axes.end());
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::REDUCE)
      for (const UOp* r : closed_ranges(u))
        if (seen.insert(r).second) axes.push_back(r);
  return axes;
}

bool can_mask(const UOp* kernel, const UOp* r) { return !gated_ranges(kernel).contains(r); }

absl::StatusOr<const UOp*> split_range(Graph& g, const UOp* kernel, const UOp* r, int64_t factor, AxisType type) {
  ASSIGN_OR_RETURN(Split s, split_impl(g, kernel, r, factor, type, can_mask(kernel, r)));
  return s.kernel;
}

std::vector<LoopStep> candidate_steps(const UOp* kernel, const LoopSchedule& schedule, const ScheduleLimits& limits) {
  std::vector<const UOp*> axes = schedule_axes(kernel);
  if (axes.empty()) return {};
  // Each axis's trip count (-1: not a constant), type and side, and the STORE's loops,
  // outermost first, as the steps of `schedule` leave them.
  const size_t outputs = closed_ranges(kernel->src(0)).size();
  std::vector<int64_t> trip;
  std::vector<AxisType> type;
  std::vector<bool> output;
  std::vector<int64_t> order;
  for (size_t i = 0; i < axes.size(); ++i) {
    trip.push_back(const_end(axes[i]));
    type.push_back(axes[i]->arg_as<RangeArg>().type);
    output.push_back(i < outputs);
    if (i < outputs) order.push_back(static_cast<int64_t>(i));
  }
  bool threaded = std::find(type.begin(), type.end(), AxisType::Thread) != type.end();
  for (const LoopStep& st : schedule.steps) {
    const auto a = static_cast<size_t>(st.axis);
    switch (st.kind) {
      case LoopStep::Kind::Split: {
        if (a >= trip.size() || trip[a] < 1 || st.factor < 1) return {};
        trip[a] = trip[a] / st.factor + (trip[a] % st.factor != 0);
        trip.push_back(st.factor);
        type.push_back(st.type);
        output.push_back(output[a]);
        if (auto at = std::find(order.begin(), order.end(), st.axis); at != order.end())
          order.insert(at + 1, static_cast<int64_t>(trip.size()) - 1);
        break;
      }
      case LoopStep::Kind::Reorder: order = st.order; break;
      case LoopStep::Kind::Thread:
        if (a >= type.size()) return {};
        type[a] = AxisType::Thread;
        threaded = true;
        break;
    }
  }
  std::vector<LoopStep> out;
  for (size_t a = 0; a < trip.size(); ++a) {
    if (trip[a] < 2 || type[a] == AxisType::Upcast || type[a] == AxisType::Unroll) continue;
    const std::vector<AxisType>& allowed = output[a] ? limits.output_types : limits.reduce_types;
    for (AxisType t : {AxisType::Upcast, AxisType::Unroll}) {
      if (std::find(allowed.begin(), allowed.end(), t) == allowed.end()) continue;
      for (int64_t f : {2, 3, 4, 8, 16})
        if (f < trip[a])
          out.push_back(LoopStep{.kind = LoopStep::Kind::Split, .axis = static_cast<int64_t>(a), .factor = f, .type = t});
    }
  }
  // The Thread loop stays outermost: with one, no reorder moves another past it.
  for (size_t i = threaded ? order.size() : 1; i < order.size(); ++i) {
    if (type[static_cast<size_t>(order[i])] == AxisType::Upcast || type[static_cast<size_t>(order[i])] == AxisType::Unroll)
      continue;  // lanes, not a loop
    std::vector<int64_t> o{order[i]};
    for (int64_t b : order)
      if (b != order[i]) o.push_back(b);
    out.push_back(LoopStep{.kind = LoopStep::Kind::Reorder, .order = std::move(o)});
  }
  if (limits.thread && !threaded && !order.empty())
    out.push_back(LoopStep{.kind = LoopStep::Kind::Thread, .axis = order[0]});
  return out;
}

std::vector<LoopSchedule> schedule_neighbours(const LoopSchedule& schedule) {
  std::vector<LoopSchedule> out;
  for (size_t i = 0; i < schedule.steps.size(); ++i) {
    const LoopStep& st = schedule.steps[i];
    if (st.kind != LoopStep::Kind::Split) continue;
    for (int64_t f : {st.factor / 2, st.factor * 2}) {
      if (f < 2 || f > LoopSchedule::kMaxNumber) continue;
      LoopSchedule s = schedule;
      s.steps[i].factor = f;
      out.push_back(std::move(s));
    }
  }
  if (!schedule.steps.empty()) {
    LoopSchedule s = schedule;
    s.steps.pop_back();
    out.push_back(std::move(s));
  }
  return out;
}

// The lanes of the kernel's widest value once expanded: a value is a vector over the
// Upcast ranges it depends on (expand.h), less those a REDUCE it passes through folds, so
// sibling reductions' lanes do not multiply (a GRU step's three gates, each 4 outputs x 16
// lanes of its own reduce loop, are vectors of 64, not 4 x 16 x 16 x 16).
namespace {
int64_t widest_lanes(const UOp* kernel) {
  absl::flat_hash_map<const UOp*, std::vector<const UOp*>> over;  // sorted, by address
  int64_t widest = 1;
  for (const UOp* u : toposort(kernel)) {
    std::vector<const UOp*> d;
    if (u->op() == Op::RANGE && u->arg_as<RangeArg>().type == AxisType::Upcast) d.push_back(u);
    for (const UOp* s : u->src()) {
      const std::vector<const UOp*>& o = over[s];
      std::vector<const UOp*> m;
      std::set_union(d.begin(), d.end(), o.begin(), o.end(), std::back_inserter(m));
      d = std::move(m);
    }
    if (u->op() == Op::REDUCE)
      for (const UOp* r : u->src().subspan(1)) d.erase(std::remove(d.begin(), d.end(), r), d.end());
    __int128 n = 1;
    for (const UOp* r : d) n = std::min<__int128>(n * std::max<int64_t>(const_end(r), 1), __int128{1} << 62);
    widest = std::max<int64_t>(widest, static_cast<int64_t>(n));
    over[u] = std::move(d);
  }
  return widest;
}
}  // namespace

absl::StatusOr<const UOp*> apply_schedule(Graph& g, const UOp* kernel, const LoopSchedule& schedule,
                                          const ScheduleLimits& limits) {
  if (schedule.empty()) return kernel;
  std::vector<const UOp*> axes = schedule_axes(kernel);
  if (axes.empty() && !one_store(kernel))
    return absl::InvalidArgumentError("schedule: the kernel is not one STORE, the only shape a schedule applies to");
  const size_t outputs = closed_ranges(kernel->src(0)).size();
  std::vector<bool> is_output(axes.size()), maskable(axes.size());
  const absl::flat_hash_set<const UOp*> gated = gated_ranges(kernel);
  for (size_t i = 0; i < axes.size(); ++i) {
    is_output[i] = i < outputs;
    maskable[i] = !gated.contains(axes[i]);
  }

  const UOp* k = kernel;
  for (size_t i = 0; i < schedule.steps.size(); ++i) {
    const LoopStep& st = schedule.steps[i];
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(cat("schedule step ", i, " \"", st.str(), "\": ", why));
    };
    auto axis_of = [&](int64_t a) -> absl::StatusOr<size_t> {
      if (a < 0 || static_cast<size_t>(a) >= axes.size()) return bad(cat("the kernel has no axis ", a, " (it has ", axes.size(), ")"));
      return static_cast<size_t>(a);
    };
    auto rebuilds = [](LoopStep::Kind k) {
      return k == LoopStep::Kind::TensorCores || k == LoopStep::Kind::Tile || k == LoopStep::Kind::TensorCoreTile;
    };
    if (i > 0 && rebuilds(schedule.steps[i - 1].kind))
      return bad(cat("step ", i - 1, " (", schedule.steps[i - 1].str(), ") rebuilt the kernel: it is the schedule's last"));
    if ((st.kind == LoopStep::Kind::Grid || rebuilds(st.kind)) && !limits.gpu)
      return bad("this target has no GPU: grid, tc, tile and tc_tile are GPU steps");
    const UOp* store = k->src(0);
    switch (st.kind) {
      case LoopStep::Kind::Split: {
        ASSIGN_OR_RETURN(size_t a, axis_of(st.axis));
        const UOp* r = axes[a];
        const int64_t n = const_end(r);
        if (n < 0) return bad(cat("axis ", a, "'s trip count is not a constant"));
        if (st.factor < 2 || st.factor > n) return bad(cat("the factor must be in [2, ", n, "], axis ", a, "'s trip count"));
        const std::vector<AxisType>& allowed = is_output[a] ? limits.output_types : limits.reduce_types;
        if (std::find(allowed.begin(), allowed.end(), st.type) == allowed.end()) {
          std::vector<std::string> names;
          for (AxisType t : allowed) names.push_back(axis_type_step_name(t));
          return bad(cat(is_output[a] ? "an output" : "a reduce", " axis splits into ", join(names, ", "),
                         " on this target, not ", axis_type_step_name(st.type)));
        }
        // An access whose gate reads the axis is proven in bounds through that gate, which
        // narrows the axis exactly where it is a range, or a range times a constant plus a
        // constant (an Upcast lane, once expanded), and not where it is a sum of two loops,
        // nor clamped (a tail past the trip count is gated instead: split_impl).
        if (!maskable[a] && st.type != AxisType::Upcast)
          return bad(cat("an access's gate reads axis ", a, ": it splits only into upcast lanes"
                         " (the gate proves the access in bounds)"));
        const int64_t outer = n / st.factor + (n % st.factor != 0);  // ceil, without overflow
        if (r->arg_as<RangeArg>().type == AxisType::Thread && outer < 2)
          return bad(cat("axis ", a, " runs on threads: it would keep one iteration"));
        auto s = split_impl(g, k, r, st.factor, st.type, maskable[a]);
        if (!s.ok()) return bad(std::string(s.status().message()));
        if (const int64_t after = widest_lanes(s->kernel); after > limits.max_lanes)
          return bad(cat("the Upcast ranges would make ", after, " lanes, at most ", limits.max_lanes));
        k = s->kernel;
        axes[a] = s->outer;
        axes.push_back(s->inner);
        is_output.push_back(is_output[a]);
        maskable.push_back(maskable[a]);
        break;
      }
      case LoopStep::Kind::Reorder: {
        std::vector<const UOp*> closes = closed_ranges(store);
        std::vector<int64_t> have;
        for (const UOp* r : closes) have.push_back(std::find(axes.begin(), axes.end(), r) - axes.begin());
        std::vector<int64_t> want = st.order, sorted_have = have;
        std::sort(want.begin(), want.end());
        std::sort(sorted_have.begin(), sorted_have.end());
        if (want != sorted_have)
          return bad(cat("the STORE closes axes (", join(have, ","), "): a reorder lists each of them once"));
        if (!closes.empty() && closes[0]->arg_as<RangeArg>().type == AxisType::Thread && st.order[0] != have[0])
          return bad(cat("axis ", have[0], " runs on threads: it stays the outermost loop"));
        std::vector<const UOp*> src{store->src(0), store->src(1)};
        for (int64_t a : st.order) src.push_back(axes[static_cast<size_t>(a)]);
        k = g.make(Op::SINK, k->dtype(), {g.make(Op::STORE, store->dtype(), src, store->arg())}, k->arg());
        break;
      }
      case LoopStep::Kind::Thread: {
        if (!limits.thread) return bad("this target has no thread pool");
        ASSIGN_OR_RETURN(size_t a, axis_of(st.axis));
        const UOp* r = axes[a];
        if (!is_output[a]) return bad(cat("axis ", a, " is a reduce axis: only an output loop runs on threads"));
        for (size_t b = 0; b < axes.size(); ++b)
          if (axes[b]->arg_as<RangeArg>().type == AxisType::Thread)
            return bad(cat("axis ", b, " runs on threads already: a kernel has one Thread loop"));
        if (r->arg_as<RangeArg>().type == AxisType::Upcast) return bad(cat("axis ", a, " is Upcast: its lanes are one vector"));
        if (const int64_t n = const_end(r); n >= 0 && n < 2)
          return bad(cat("axis ", a, " has ", n, " iteration", n == 1 ? "" : "s", ": nothing to share among threads"));
        std::vector<const UOp*> closes = closed_ranges(store);
        if (closes.empty() || closes[0] != r)
          return bad(cat("axis ", a, " is not the STORE's outermost loop (reorder first): the Thread loop is outermost"));
        RangeArg arg = r->arg_as<RangeArg>();
        arg.type = AxisType::Thread;
        const UOp* threaded = g.make(Op::RANGE, r->dtype(), r->src(), arg);
        k = substitute(g, k, {{r, threaded}});
        axes[a] = threaded;
        break;
      }
      case LoopStep::Kind::Grid: {
        ValueRange vr;
        for (const UOp* r : axes)
          if (r->arg_as<RangeArg>().type == AxisType::Global) return bad("the kernel has its grid already: one grid step");
        std::vector<std::pair<const UOp*, const UOp*>> to;
        int64_t id = 0;
        for (const UOp* u : toposort(k))
          if (u->op() == Op::RANGE) id = std::max(id, u->arg_as<RangeArg>().axis_id + 1);
        id += 3;  // x gets the largest id: gpu_dims maps Global ranges in decreasing id
        for (size_t d = 0; d < st.order.size(); ++d) {
          ASSIGN_OR_RETURN(size_t a, axis_of(st.order[d]));
          const UOp* r = axes[a];
          const char* dim = d == 0 ? "x" : d == 1 ? "y" : "z";
          if (!is_output[a]) return bad(cat("axis ", a, " is a reduce axis: only output loops make the grid"));
          if (r->arg_as<RangeArg>().type != AxisType::Loop)
            return bad(cat("axis ", a, " is ", axis_type_step_name(r->arg_as<RangeArg>().type), ", not a plain loop"));
          for (const UOp* x : toposort(r->src(0)))
            if (x->op() == Op::RANGE) return bad(cat("axis ", a, "'s trip count depends on another loop"));
          for (size_t e = 0; e < d; ++e)
            if (st.order[e] == st.order[d]) return bad(cat("axis ", a, " is named twice"));
          if (d > 0 && vr.vmax(r->src(0)) > 65535)
            return bad(cat("axis ", a, " has up to ", vr.vmax(r->src(0)), " iterations: blockIdx.", dim, " takes 65535"));
          RangeArg arg = r->arg_as<RangeArg>();
          arg.type = AxisType::Global;
          arg.axis_id = id - static_cast<int64_t>(d);
          to.push_back({r, g.make(Op::RANGE, r->dtype(), r->src(), arg)});
        }
        absl::flat_hash_map<const UOp*, const UOp*> repl;
        for (auto& [from, into] : to) {
          repl[from] = into;
          *std::find(axes.begin(), axes.end(), from) = into;
        }
        k = substitute(g, k, repl);
        break;
      }
      case LoopStep::Kind::TensorCores: {
        if (limits.sm < 80) return bad(cat("sm_", limits.sm, " has no mma.sync m16n8k16 (sm_80 and later)"));
        if (!fits_tensor_cores(k))
          return bad("the kernel is no float16 / bfloat16 matmul with M % 16, N % 8 and K % 16 == 0 (tensor_cores.h)");
        auto tc = use_tensor_cores(g, k, st.factor);
        if (!tc.ok()) return bad(std::string(tc.status().message()));
        k = *tc;
        break;
      }
      case LoopStep::Kind::Tile:
      case LoopStep::Kind::TensorCoreTile: {
        GemmTile t{.bm = st.order[0], .bn = st.order[1], .bk = st.order[2], .tm = st.order[3], .tn = st.order[4],
                   .tensor_cores = st.kind == LoopStep::Kind::TensorCoreTile};
        if (t.tensor_cores && limits.sm < 80)
          return bad(cat("sm_", limits.sm, " has no mma.sync m16n8k16 (sm_80 and later)"));
        auto tiled = tile_gemm(g, k, t);
        if (!tiled.ok()) return bad(std::string(tiled.status().message()));
        k = *tiled;
        break;
      }
    }
  }
  // What a block may hold: at most three thread ranges of at most 1024 threads in all.
  // Upcast lanes beside a GroupReduce range are not lowered (group_reduce folds one scalar
  // per thread; expand does not finish on its shared array's accesses).
  if (limits.gpu) {
    int64_t threads = 1, ranges = 0;
    bool upcast = false, grouped = false;
    absl::flat_hash_set<const UOp*> reduce_lanes;
    for (const UOp* u : toposort(k))
      if (u->op() == Op::REDUCE)
        for (const UOp* r : closed_ranges(u)) reduce_lanes.insert(r);
    for (const UOp* u : toposort(k))
      if (u->op() == Op::RANGE) {
        AxisType t = u->arg_as<RangeArg>().type;
        // Upcast lanes of a reduce loop fold into the thread's partial; an output's would
        // make it a vector.
        upcast |= t == AxisType::Upcast && !reduce_lanes.contains(u);
        grouped |= t == AxisType::GroupReduce;
        if (upcast && grouped)
          return absl::InvalidArgumentError(
              "schedule: upcast lanes of an output and a group_reduce range in one kernel are not supported on the GPU");
        if (t != AxisType::Local && t != AxisType::GroupReduce) continue;
        ++ranges;
        threads *= std::max<int64_t>(const_end(u), 1);
        if (const_end(u) < 1 || threads > 1024 || ranges > 3)
          return absl::InvalidArgumentError(cat("schedule: the block would have more than 1024 threads or 3 thread ranges (",
                                                ranges, " ranges, ", threads, " threads so far)"));
      }
  }
  return k;
}

}  // namespace uop
