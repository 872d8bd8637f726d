#include "compiler/passes/bounds.h"

#include <algorithm>

#include "compiler/ir/printer.h"
#include "compiler/passes/expand.h"
#include "compiler/passes/symbolic.h"
#include "compiler/passes/value_range.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

using Bounds = ValueRange::Bounds;

// The elements behind a buffer, or -1 if unknown.
int64_t buffer_size(const UOp* buf) {
  switch (buf->op()) {
    case Op::PARAM: return buf->arg_as<ParamArg>().size;
    case Op::BUFFER: return buf->arg_as<BufferArg>().size;
    case Op::DEFINE_REG: return buf->arg_as<DefineRegArg>().size;
    case Op::DEFINE_LOCAL: return buf->dtype().size;
    case Op::AFTER: return buffer_size(buf->src(0));
    default: return -1;
  }
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// The vector width of the elements a buffer holds.
uint32_t buffer_elem_count(const UOp* buf) {
  if (buf->op() == Op::AFTER) return buffer_elem_count(buf->src(0));
  return buf->dtype().ptr ? buf->dtype().count : 1;
}

// What holding `gate` tells about the values it compares with constants. A narrowed
// value also narrows what it is a linear function of (x + c, x * c, x + y with y's bounds
// known), so a gate on `i - 1 < 3` bounds i itself wherever i is used.
absl::flat_hash_map<const UOp*, Bounds> assumptions(const UOp* gate) {
  absl::flat_hash_map<const UOp*, Bounds> out;
  ValueRange vr;
  auto current = [&](const UOp* x) { auto it = out.find(x); return it != out.end() ? it->second : vr(x); };
  std::vector<std::pair<const UOp*, Bounds>> pending;
  auto narrow = [&](const UOp* x, int64_t lo, int64_t hi) { pending.push_back({x, {lo, hi}}); };
  std::vector<const UOp*> todo{gate};
  while (!todo.empty()) {
    const UOp* c = todo.back();
    todo.pop_back();
    if (c->op() == Op::AND) {
      todo.push_back(c->src(0));
      todo.push_back(c->src(1));
    } else if (c->op() == Op::CMPLT) {
      const UOp *a = c->src(0), *b = c->src(1);
      if (!a->dtype().is_int() || !ValueRange::bounded(a->dtype())) continue;
      if (auto* k = b->const_value(); k && k->to_int() > INT64_MIN) narrow(a, INT64_MIN, k->to_int() - 1);
      if (auto* k = a->const_value(); k && k->to_int() < INT64_MAX) narrow(b, k->to_int() + 1, INT64_MAX);
    }
  }
  // Propagate each narrowing down through linear index arithmetic (bounded depth: each
  // step moves to a source).
  for (size_t steps = 0; !pending.empty() && steps < 4096; ++steps) {
    auto [x, b] = pending.back();
    pending.pop_back();
    Bounds cur = current(x);
    Bounds nb{std::max(cur.first, b.first), std::min(cur.second, b.second)};
    if (nb == cur && out.contains(x)) continue;
    out[x] = nb;
    if (!x->dtype().is_int() || nb.first > nb.second) continue;
    bool big = nb.first <= INT64_MIN / 4 || nb.second >= INT64_MAX / 4;
    if (big) continue;  // keep the arithmetic below far from overflow
    if (x->op() == Op::ADD || x->op() == Op::SUB) {
      for (int i = 0; i < 2; ++i) {
        const UOp* self = x->src(i);
        Bounds other = current(x->src(1 - i));
        if (other.first <= INT64_MIN / 4 || other.second >= INT64_MAX / 4) continue;
        if (x->op() == Op::ADD) narrow(self, nb.first - other.second, nb.second - other.first);
        else if (i == 0) narrow(self, nb.first + other.first, nb.second + other.second);   // x = s - o
        else narrow(self, other.first - nb.second, other.second - nb.first);                // x = o - s
      }
    } else if (x->op() == Op::MUL) {
      for (int i = 0; i < 2; ++i) {
        const ConstValue* k = x->src(1 - i)->const_value();
        if (!k || k->to_int() == 0) continue;
        int64_t c = k->to_int();
        if (c > 0) narrow(x->src(i), ceil_div(nb.first, c), floor_div(nb.second, c));
        else narrow(x->src(i), ceil_div(nb.second, c), floor_div(nb.first, c));
      }
    } else if (x->op() == Op::NEG) {
      narrow(x->src(0), -nb.second, -nb.first);
    } else if (x->op() == Op::IDIV) {
      // For x >= 0 and c > 0, x // c in [lo, hi] means x in [lo*c, hi*c + c - 1].
      const ConstValue* k = x->src(1)->const_value();
      if (k && k->to_int() > 0 && k->to_int() < (int64_t{1} << 20) && current(x->src(0)).first >= 0 && nb.first >= 0) {
        int64_t c = k->to_int();
        narrow(x->src(0), nb.first * c, nb.second * c + c - 1);
      }
    }
  }
  return out;
}

// Whether `u` only runs inside a loop that never runs (a zero-size dim).
bool unreachable(const UOp* u, ValueRange& vr) {
  for (const UOp* x : toposort(u))
    if (x->op() == Op::RANGE && vr.vmax(x->src(0)) <= 0) return true;
  return false;
}

}  // namespace

// Bounds of an index that is affine in its loop variables, with each variable at the end
// of its range that minimizes (for the lower bound) or maximizes the index. The ends may
// be expressions over DEFINE_VARs, which then cancel against the index's own terms.
std::optional<Bounds> affine_bounds(Graph& g, const UOp* idx) {
  absl::flat_hash_map<const UOp*, const UOp*> low, high;
  for (const UOp* r : toposort(idx)) {
    if (r->op() != Op::RANGE) continue;
    auto c = affine_coeff(idx, r);
    if (!c) return std::nullopt;
    const UOp* last = g.alu(Op::ADD, {r->src(0), g.idx(-1)});
    low[r] = *c >= 0 ? g.idx(0) : last;
    high[r] = *c >= 0 ? last : g.idx(0);
  }
  if (low.empty()) return std::nullopt;
  auto lo = simplify(g, substitute(g, idx, low));
  auto hi = simplify(g, substitute(g, idx, high));
  if (!lo.ok() || !hi.ok()) return std::nullopt;
  ValueRange vr;
  return Bounds{vr.vmin(*lo), vr.vmax(*hi)};
}

// Bounds of `idx` through a gated expression g in [lo, hi]: when idx = a*g + rest for a
// constant a (checked through the loop variables' coefficients, e.g. idx = 8*r1 + 48*r2
// and g = r1 + 6*r2 give a = 8), idx lies in a*[lo, hi] + bounds(rest). This keeps the
// relation a RESHAPE makes between a padded axis and the flat index.
std::optional<Bounds> bounds_through(Graph& g, const UOp* idx, const UOp* gexpr, Bounds range,
                                     ValueRange& under_gate) {
  std::optional<int64_t> a;
  for (const UOp* r : toposort(gexpr)) {
    if (r->op() != Op::RANGE) continue;
    auto gc = affine_coeff(gexpr, r), ic = affine_coeff(idx, r);
    if (gc && ic && *gc != 0 && *ic % *gc == 0) {
      a = *ic / *gc;
      break;
    }
  }
  if (!a || *a == 0 || range.first < -(int64_t{1} << 40) || range.second > (int64_t{1} << 40) ||
      *a < -(int64_t{1} << 20) || *a > (int64_t{1} << 20))
    return std::nullopt;
  auto rest = simplify(g, g.alu(Op::ADD, {idx, g.alu(Op::MUL, {gexpr, g.cnst_int(gexpr->dtype(), -*a)})}));
  if (!rest.ok()) return std::nullopt;
  Bounds rb = under_gate(*rest);
  if (rb.first < -(int64_t{1} << 60) || rb.second > (int64_t{1} << 60)) return std::nullopt;
  int64_t x = *a * range.first, y = *a * range.second;
  return Bounds{rb.first + std::min(x, y), rb.second + std::max(x, y)};
}

absl::Status check_bounds(Graph& g, const UOp* kernel) {
  ValueRange plain;
  for (const UOp* u : toposort(kernel)) {
    if (u->op() != Op::INDEX) continue;
    const UOp* buf = u->src(0);
    int64_t size = buffer_size(buf);
    if (size < 0) continue;  // not memory (a tensor-level INDEX never reaches this stage)
    size_t n = u->num_src();
    const UOp* gate = n > 2 && u->src(n - 1)->dtype().is_bool() ? u->src(n - 1) : nullptr;
    if (n - (gate ? 1 : 0) != 2)
      return absl::InvalidArgumentError(cat("bounds: ", print_node(u), ": a buffer access takes one index [bounds.index]"));
    const UOp* idx = u->src(1);
    // Elements one access covers: a vector access to a buffer of scalars reads several,
    // an access to a buffer of vectors (an accumulator) one.
    int64_t width = std::max<int64_t>(u->dtype().count / std::max<uint32_t>(buffer_elem_count(buf), 1), 1);
    Bounds b = plain(idx);
    if (unreachable(idx, plain)) continue;
    auto fits = [&](Bounds x) { return x.first >= 0 && x.second <= size - width; };
    if (!fits(b)) {
      if (auto a = affine_bounds(g, idx); a && fits(*a)) continue;
    }
    if (gate && !fits(b)) {
      // A gate that can never hold guards an access that never happens.
      if (const ConstValue* k = gate->const_value(); k && !k->as_bool()) continue;
      auto assumed = assumptions(gate);
      bool impossible = false;
      for (auto& [x, range] : assumed) impossible |= range.first > range.second;
      if (impossible) continue;
      ValueRange under_gate(assumed);
      b = under_gate(idx);
      if (!fits(b)) {
        bool proven = false;
        for (auto& [gexpr, range] : assumed)
          if (auto t = bounds_through(g, idx, gexpr, range, under_gate); t && fits(*t)) proven = true;
        if (proven) continue;
      }
    }
    if (b.first < 0 || b.second > size - width)
      return absl::InvalidArgumentError(
          cat("bounds: ", print_node(u), ": index in [", b.first, ", ", b.second, "] may fall outside ",
              op_name(buf->op()), " of ", size, " elements", gate ? " even under its gate" : "",
              "; the kernel is refused [bounds.unproven]"));
  }
  return absl::OkStatus();
}

}  // namespace uop
