// The bounds proof (bounds.h). Per INDEX: its facts (what holds wherever it executes),
// narrowed to a fixed point by stepping forwards (ValueRange) and backwards (FactSolver)
// through the ops that relate them; then the three ways of bounding the index. Every
// backward step states why it is exact under eval.h's wrapping semantics.
#include "compiler/passes/bounds.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/ir/printer.h"
#include "compiler/passes/expand.h"
#include "compiler/passes/symbolic.h"
#include "compiler/support/status_macros.h"
#include "compiler/ir/value_range.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

using Bounds = ValueRange::Bounds;
using i128 = __int128;
using Facts = absl::flat_hash_map<const UOp*, Bounds>;

constexpr i128 kMin = INT64_MIN, kMax = INT64_MAX;
constexpr Bounds kNone{1, 0};  // no value: the facts contradict each other

bool is_empty(Bounds b) { return b.first > b.second; }
bool singleton(Bounds b) { return b.first == b.second; }

i128 floor_div(i128 a, i128 b) {  // b > 0
  i128 q = a / b;
  return a % b < 0 ? q - 1 : q;
}
i128 ceil_div(i128 a, i128 b) { return -floor_div(-a, b); }  // b > 0

// cur intersected with [lo, hi], computed in 128 bits.
Bounds within(Bounds cur, i128 lo, i128 hi) {
  i128 l = std::max<i128>(cur.first, lo), h = std::min<i128>(cur.second, hi);
  if (l > h) return kNone;
  return {static_cast<int64_t>(l), static_cast<int64_t>(h)};
}

// The values in cur that are congruent modulo 2^bits(d) to some value in [lo, hi]: what
// x op y = t in [lo, hi] says about x when op is a bijection modulo 2^bits (x + y, x - y,
// -x, a cast to d). The preimage is [lo, hi] shifted by multiples of 2^bits; when it meets
// cur in more than a few pieces there is nothing to learn.
Bounds congruent(const DType& d, Bounds cur, i128 lo, i128 hi) {
  const i128 m = i128{1} << scalar_bits(d.scalar);
  if (hi - lo + 1 >= m) return cur;
  i128 jlo = ceil_div(cur.first - hi, m), jhi = floor_div(cur.second - lo, m);
  if (jhi - jlo > 4) return cur;
  i128 l = kMax, h = kMin;
  for (i128 j = jlo; j <= jhi; ++j) {
    Bounds piece = within(cur, lo + j * m, hi + j * m);
    if (is_empty(piece)) continue;
    l = std::min<i128>(l, piece.first);
    h = std::max<i128>(h, piece.second);
  }
  return l > h ? kNone : Bounds{static_cast<int64_t>(l), static_cast<int64_t>(h)};
}

// A scalar of a dtype whose ranges are exact (no uint64, no vectors, no pointers).
bool exact_scalar(const DType& d) { return d.count == 1 && !d.ptr && ValueRange::bounded(d); }
bool exact_int(const DType& d) { return exact_scalar(d) && d.is_int(); }

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

// The vector width of the elements a buffer holds.
uint32_t buffer_elem_count(const UOp* buf) {
  if (buf->op() == Op::AFTER) return buffer_elem_count(buf->src(0));
  return buf->dtype().ptr ? buf->dtype().count : 1;
}

// The loop and launch indices (RANGE, SPECIAL) an access reads through its index and gate:
// it executes only inside each of their loops. The walk follows values only (ALU ops,
// casts, vectors, integer loads and the indices they read, loop ends); an END, a STORE or
// an AFTER's dependencies order but say nothing about where a value is computed (a value
// read after a loop that never ran depends on that loop, yet runs).
std::vector<const UOp*> open_indices(std::initializer_list<const UOp*> roots) {
  std::vector<const UOp*> out, stack;
  absl::flat_hash_set<const UOp*> seen;
  auto integral = [](const UOp* u) { return !u->dtype().ptr && (u->dtype().is_int() || u->dtype().is_bool()); };
  auto visit = [&](const UOp* u) {
    if (u && integral(u) && seen.insert(u).second) stack.push_back(u);
  };
  for (const UOp* r : roots) visit(r);
  while (!stack.empty()) {
    const UOp* u = stack.back();
    stack.pop_back();
    const Op op = u->op();
    if (op == Op::RANGE || op == Op::SPECIAL) {
      out.push_back(u);
      visit(u->src(0));
    } else if (op == Op::LOAD) {
      const UOp* at = u->src(1);
      if (at->op() == Op::INDEX)
        for (size_t i = 1; i < at->num_src(); ++i) visit(at->src(i));
    } else if (is_alu(op) || op == Op::CAST || op == Op::BITCAST || op == Op::VECTORIZE || op == Op::GEP) {
      for (const UOp* s : u->src()) visit(s);
    }
  }
  return out;
}

// Narrows the ranges of nodes from facts about others, to a fixed point (bounded). Each
// round computes every range forwards under what is known (ValueRange intersects), then
// steps backwards from each known node to its sources; a round that learns nothing ends it.
class FactSolver {
 public:
  void assume(const UOp* x, Bounds b) { learn(x, b); }

  // The facts, or nullopt when they contradict each other (the access never executes).
  std::optional<Facts> solve() {
    for (int round = 0; round < kRounds && !contradiction_; ++round) {
      vr_ = std::make_unique<ValueRange>(known_);
      for (const UOp* x : order_) (*vr_)(x);
      if (vr_->contradiction()) return std::nullopt;
      changed_ = false;
      todo_ = order_;
      for (size_t steps = 0; !todo_.empty() && steps < kSteps && !contradiction_; ++steps) {
        const UOp* x = todo_.back();
        todo_.pop_back();
        back(x);
      }
      if (!changed_) break;
    }
    if (contradiction_) return std::nullopt;
    ValueRange last(known_);
    for (const UOp* x : order_) last(x);
    if (last.contradiction()) return std::nullopt;
    return known_;
  }

  // Known nodes in the order they became known (deterministic, unlike the map).
  const std::vector<const UOp*>& order() const { return order_; }

 private:
  static constexpr int kRounds = 8;
  static constexpr size_t kSteps = 4096;

  Bounds cur(const UOp* x) {
    Bounds b = vr_ ? (*vr_)(x) : ValueRange::full(x->dtype());
    if (auto it = known_.find(x); it != known_.end())
      b = {std::max(b.first, it->second.first), std::min(b.second, it->second.second)};
    return b;
  }

  // x lies in [lo, hi] (128-bit; outside x's dtype is simply no value).
  void narrow(const UOp* x, i128 lo, i128 hi) {
    if (!exact_scalar(x->dtype())) return;
    Bounds c = cur(x);
    Bounds n = within(c, lo, hi);
    if (n != c) learn(x, n);
  }
  void narrow(const UOp* x, Bounds b) { narrow(x, b.first, b.second); }
  // x is congruent modulo 2^bits(d) to a value in [lo, hi].
  void narrow_mod(const UOp* x, const DType& d, i128 lo, i128 hi) {
    if (!exact_scalar(x->dtype())) return;
    Bounds c = cur(x);
    Bounds n = congruent(d, c, lo, hi);
    if (n != c) learn(x, within(c, n.first, n.second));
  }

  void learn(const UOp* x, Bounds b) {
    auto [it, inserted] = known_.try_emplace(x, b);
    if (inserted) order_.push_back(x);
    else it->second = {std::max(it->second.first, b.first), std::min(it->second.second, b.second)};
    contradiction_ |= is_empty(it->second);
    changed_ = true;
    todo_.push_back(x);
  }

  // What x in cur(x) says about its sources.
  void back(const UOp* x) {
    const Bounds b = cur(x);
    if (is_empty(b)) {
      contradiction_ = true;
      return;
    }
    if (!exact_scalar(x->dtype())) return;
    const Op op = x->op();
    const DType& d = x->dtype();
    auto src = [&](size_t i) { return x->src(i); };
    if (op == Op::RANGE || op == Op::SPECIAL) {
      // The index counts up from 0 to below its end: end > every value it takes.
      if (!vr_->may_wrap(x)) narrow(src(0), i128{b.first} + 1, kMax);
      return;
    }
    if (!is_alu(op) && op != Op::CAST) return;
    if (op == Op::WHERE) {  // the value is the chosen side's
      Bounds c = cur(src(0));
      if (c == Bounds{1, 1}) narrow(src(1), b);
      if (c == Bounds{0, 0}) narrow(src(2), b);
      return;
    }
    if (op == Op::CAST) {
      const UOp* s = src(0);
      if (!exact_scalar(s->dtype())) return;
      if (d.is_bool()) {  // x != 0
        Bounds c = cur(s);
        if (b == Bounds{0, 0}) narrow(s, 0, 0);
        if (b == Bounds{1, 1} && c.first == 0) narrow(s, 1, kMax);
        if (b == Bounds{1, 1} && c.second == 0) narrow(s, kMin, -1);
        return;
      }
      // A cast that keeps the value says the source is the value; one that wraps, that
      // the source is congruent to it modulo 2^bits.
      if (!vr_->may_wrap(x)) narrow(s, b);
      else narrow_mod(s, d, b.first, b.second);
      return;
    }
    if (x->num_src() == 1) {
      if (op == Op::NEG && d.is_int()) narrow_mod(src(0), d, -i128{b.second}, -i128{b.first});  // x = -t
      return;
    }
    const UOp *s0 = src(0), *s1 = src(1);
    if (!exact_scalar(s0->dtype()) || !exact_scalar(s1->dtype())) return;
    const Bounds c0 = cur(s0), c1 = cur(s1);
    if (s0->dtype().is_bool()) {
      back_bool(op, b, s0, s1, c0, c1);
      return;
    }
    switch (op) {
      case Op::CMPLT:
        if (b == Bounds{1, 1}) {  // s0 < s1
          narrow(s0, kMin, i128{c1.second} - 1);
          narrow(s1, i128{c0.first} + 1, kMax);
        } else if (b == Bounds{0, 0}) {  // s0 >= s1
          narrow(s0, c1.first, kMax);
          narrow(s1, kMin, c0.second);
        }
        return;
      case Op::CMPNE:
      case Op::CMPEQ: {
        if (!singleton(b)) return;
        bool equal = (op == Op::CMPEQ) == (b.first == 1);
        if (equal) {
          narrow(s0, c1);
          narrow(s1, c0);
          return;
        }
        // s0 != s1: a known s1 trims that value off the ends of s0's range.
        for (int i = 0; i < 2; ++i) {
          const UOp* s = i ? s1 : s0;
          Bounds c = i ? c1 : c0, o = i ? c0 : c1;
          if (!singleton(o)) continue;
          if (c.first == o.first) narrow(s, i128{o.first} + 1, kMax);
          if (c.second == o.first) narrow(s, kMin, i128{o.first} - 1);
        }
        return;
      }
      default: break;
    }
    if (!d.is_int()) return;
    switch (op) {
      // x + y = t modulo 2^bits: x = t - y modulo 2^bits, for any wrapping.
      case Op::ADD:
        narrow_mod(s0, d, i128{b.first} - c1.second, i128{b.second} - c1.first);
        narrow_mod(s1, d, i128{b.first} - c0.second, i128{b.second} - c0.first);
        return;
      case Op::SUB:  // x - y = t: x = t + y, y = x - t
        narrow_mod(s0, d, i128{b.first} + c1.first, i128{b.second} + c1.second);
        narrow_mod(s1, d, i128{c0.first} - b.second, i128{c0.second} - b.first);
        return;
      case Op::MUL:
      case Op::SHL: {
        // x * k = t divides back only where the product cannot wrap: modulo 2^bits, t has
        // many preimages (x * INT32_MIN is 0 for every even x).
        if (vr_->may_wrap(x)) return;
        for (int i = 0; i < (op == Op::MUL ? 2 : 1); ++i) {
          Bounds k = i ? c0 : c1;
          if (!singleton(k)) continue;
          i128 v = k.first;
          if (op == Op::SHL) v = i128{1} << (static_cast<uint64_t>(k.first) % scalar_bits(d.scalar));
          const UOp* s = i ? s1 : s0;
          if (v > 0) narrow(s, ceil_div(b.first, v), floor_div(b.second, v));
          if (v < 0) narrow(s, ceil_div(-i128{b.second}, -v), floor_div(-i128{b.first}, -v));
        }
        return;
      }
      case Op::SHR: {  // floor(x / 2^s) for both signed (arithmetic) and unsigned values
        if (!singleton(c1)) return;
        i128 p = i128{1} << (static_cast<uint64_t>(c1.first) % scalar_bits(d.scalar));
        narrow(s0, i128{b.first} * p, i128{b.second} * p + p - 1);
        return;
      }
      case Op::IDIV: {
        if (!singleton(c1) || c1.first == 0) return;
        i128 k = c1.first, lo = b.first, hi = b.second;
        if (k == -1) {  // x / -1 = -x modulo 2^bits (MIN / -1 = MIN)
          narrow_mod(s0, d, -hi, -lo);
          return;
        }
        if (k < 0) {  // trunc(x / k) = -trunc(x / -k)
          std::tie(lo, hi) = std::pair<i128, i128>{-hi, -lo};
          k = -k;
        }
        // trunc(x / k) = q for x in [q*k, q*k + k-1] (q > 0), [-(k-1), k-1] (q = 0),
        // [q*k - (k-1), q*k] (q < 0).
        narrow(s0, lo > 0 ? lo * k : lo * k - (k - 1), hi < 0 ? hi * k : hi * k + (k - 1));
        return;
      }
      case Op::MAX:  // max(x, y) = t: both are <= t, and one that is always < t is not it
        narrow(s0, kMin, b.second);
        narrow(s1, kMin, b.second);
        if (c1.second < b.first) narrow(s0, b.first, kMax);
        if (c0.second < b.first) narrow(s1, b.first, kMax);
        return;
      case Op::MIN:
        narrow(s0, b.first, kMax);
        narrow(s1, b.first, kMax);
        if (c1.first > b.second) narrow(s0, kMin, b.second);
        if (c0.first > b.second) narrow(s1, kMin, b.second);
        return;
      default: return;
    }
  }

  // The same for an op on two bools.
  void back_bool(Op op, Bounds b, const UOp* s0, const UOp* s1, Bounds c0, Bounds c1) {
    if (!singleton(b)) return;
    const bool t = b.first == 1;
    switch (op) {
      case Op::AND: case Op::MIN:
      case Op::OR: case Op::MAX: {
        // AND is k = 1, OR k = 0: t == k needs both to be k; otherwise, a side that is k
        // leaves the other to make t.
        const int64_t k = op == Op::AND || op == Op::MIN ? 1 : 0;
        if (t == (k == 1)) {
          narrow(s0, k, k);
          narrow(s1, k, k);
        } else {
          if (c1 == Bounds{k, k}) narrow(s0, 1 - k, 1 - k);
          if (c0 == Bounds{k, k}) narrow(s1, 1 - k, 1 - k);
        }
        return;
      }
      case Op::XOR: case Op::CMPNE: case Op::CMPEQ: {
        bool differ = (op == Op::CMPEQ) != t;  // s0 != s1
        if (singleton(c1)) narrow(s0, differ != (c1.first == 1), differ != (c1.first == 1));
        if (singleton(c0)) narrow(s1, differ != (c0.first == 1), differ != (c0.first == 1));
        return;
      }
      case Op::CMPLT:  // !s0 && s1
        if (t) {
          narrow(s0, 0, 0);
          narrow(s1, 1, 1);
        }
        return;
      default: return;
    }
  }

  Facts known_;
  std::vector<const UOp*> order_;
  std::unique_ptr<ValueRange> vr_;  // ranges under known_ as of this round's start
  std::vector<const UOp*> todo_;
  bool changed_ = false;
  bool contradiction_ = false;
};

// The loop and launch indices an expression reads (RANGE, SPECIAL) and the clamps
// min(x, y) of x, y >= 0 (a GPU grid split's min(b*L + t, n - 1)), each with the largest
// value it takes as an expression: end - 1, or y (the side with fewer loop indices).
// Inner atoms first: clamps, then later nodes before earlier ones. The walk does not look
// inside an atom.
std::vector<std::pair<const UOp*, const UOp*>> atoms_of(Graph& g, const UOp* e, ValueRange& vr) {
  auto loops = [](const UOp* x) {
    size_t n = 0;
    for (const UOp* v : toposort(x)) n += v->op() == Op::RANGE || v->op() == Op::SPECIAL;
    return n;
  };
  std::vector<std::pair<const UOp*, const UOp*>> clamps, indices;
  absl::flat_hash_set<const UOp*> seen{e};
  std::vector<const UOp*> stack{e};
  while (!stack.empty()) {
    const UOp* u = stack.back();
    stack.pop_back();
    if (exact_int(u->dtype())) {
      if ((u->op() == Op::RANGE || u->op() == Op::SPECIAL) && u->src(0)->dtype() == u->dtype() && !vr.may_wrap(u)) {
        indices.push_back({u, g.alu(Op::ADD, {u->src(0), g.cnst_int(u->dtype(), -1)})});
        continue;
      }
      if (u->op() == Op::MIN && vr.vmin(u->src(0)) >= 0 && vr.vmin(u->src(1)) >= 0) {
        clamps.push_back({u, loops(u->src(0)) < loops(u->src(1)) ? u->src(0) : u->src(1)});
        continue;
      }
    }
    for (const UOp* s : u->src())
      if (seen.insert(s).second) stack.push_back(s);
  }
  clamps.insert(clamps.end(), indices.begin(), indices.end());
  return clamps;
}

// Whether no node of e that depends on `on` (`on` included) may wrap under vr.
bool exact_on_the_way(const UOp* e, const UOp* on, ValueRange& vr) {
  absl::flat_hash_set<const UOp*> dep{on};
  for (const UOp* u : toposort(e)) {
    bool d = dep.contains(u);
    for (const UOp* s : u->src()) d |= dep.contains(s);
    if (!d) continue;
    dep.insert(u);
    if (vr.may_wrap(u)) return false;
  }
  return true;
}

// A lower (upper) bound of an index, by putting each atom (atoms_of) that it is affine in
// at the end of its range that minimizes (maximizes) it, one atom at a time, inner atoms
// first: a triangular loop's end r0 + 1 brings r0 in, which goes next. The ends may be
// expressions over DEFINE_VARs, which then cancel against the index's own terms.
//
// Why a step is sound: at any point where the access executes, e is an affine function
// of the atom a over [0, last(a)] (with everything else fixed) wherever nothing on the way
// from a to e wraps. It does not at a's actual value (checked for e under vr) nor at the
// corner (checked for e with the corner put in), so, every node being affine in a, nowhere
// between; an affine function is smallest at a corner. The result bounds e from below at
// every such point, and the next step bounds that.
int64_t corner_bound(Graph& g, const UOp* idx, ValueRange& vr, bool upper, bool& moved_any) {
  const UOp* e = idx;
  for (int step = 0; step < 16; ++step) {
    auto atoms = atoms_of(g, e, vr);
    bool moved = false;
    for (auto& [a, last] : atoms) {
      // Another atom's end reads this one: that atom goes first.
      bool read = false;
      for (auto& [b, bl] : atoms)
        if (b != a) {
          auto t = toposort(bl);
          read |= std::find(t.begin(), t.end(), a) != t.end();
        }
      if (read) continue;
      auto c = affine_coeff(e, a);
      if (!c || *c == 0 || !exact_on_the_way(e, a, vr)) continue;
      const UOp* corner = (*c > 0) == upper ? last : g.cnst_int(a->dtype(), 0);
      const UOp* put = substitute(g, e, {{a, corner}});
      if (!exact_on_the_way(put, corner, vr)) continue;
      auto s = simplify(g, put);
      if (!s.ok()) continue;
      e = *s;
      moved = moved_any = true;
      break;
    }
    if (!moved) break;
  }
  return upper ? vr.vmax(e) : vr.vmin(e);
}

std::optional<Bounds> affine_bounds(Graph& g, const UOp* idx, ValueRange& vr) {
  // Index arithmetic is small; a huge expression is not worth a simplify per step.
  if (!exact_int(idx->dtype()) || toposort(idx).size() > 1024) return std::nullopt;
  bool moved = false;
  Bounds b{corner_bound(g, idx, vr, false, moved), corner_bound(g, idx, vr, true, moved)};
  if (!moved) return std::nullopt;
  return b;
}

// Bounds of `idx` through gated expressions g_i in [lo_i, hi_i]: when idx = a*g + rest
// for a constant a (found through the loop indices' coefficients, e.g. idx = 8*r1 + 48*r2
// and g = r1 + 6*r2 give a = 8), idx lies in a*[lo, hi] + bounds(rest); rest may go on
// through the next g (a padded 2-D window's row and column gates both bound its flat
// index, one from below and one from above). rest is idx - sum a_i*g_i in idx's dtype, so
// idx = sum a_i*g_i + rest modulo 2^bits; a result inside the dtype is idx itself.
std::optional<Bounds> bounds_through(Graph& g, const UOp* idx, std::span<const UOp* const> gexprs,
                                     ValueRange& vr) {
  if (!exact_int(idx->dtype())) return std::nullopt;
  const UOp* rest = idx;
  i128 lo = 0, hi = 0;
  bool any = false;
  for (const UOp* gexpr : gexprs) {
    if (gexpr->dtype() != idx->dtype() || gexpr == rest) continue;
    std::optional<int64_t> a;
    for (const UOp* r : toposort(gexpr)) {
      if (r->op() != Op::RANGE && r->op() != Op::SPECIAL) continue;
      auto gc = affine_coeff(gexpr, r), ic = affine_coeff(rest, r);
      if (gc && ic && *gc != 0 && *ic % *gc == 0) {
        a = *ic / *gc;
        break;
      }
    }
    Bounds range = vr(gexpr);
    if (!a || *a == 0 || range.first < -(int64_t{1} << 40) || range.second > (int64_t{1} << 40) ||
        *a < -(int64_t{1} << 20) || *a > (int64_t{1} << 20))
      continue;
    auto r = simplify(g, g.alu(Op::ADD, {rest, g.alu(Op::MUL, {gexpr, g.cnst_int(gexpr->dtype(), -*a)})}));
    if (!r.ok()) continue;
    rest = *r;
    i128 x = i128{*a} * range.first, y = i128{*a} * range.second;
    lo += std::min(x, y);
    hi += std::max(x, y);
    any = true;
  }
  if (!any) return std::nullopt;
  Bounds rb = vr(rest);
  if (rb.first < -(int64_t{1} << 60) || rb.second > (int64_t{1} << 60)) return std::nullopt;
  lo += rb.first;
  hi += rb.second;
  if (lo < kMin || hi > kMax) return std::nullopt;
  return Bounds{static_cast<int64_t>(lo), static_cast<int64_t>(hi)};
}

// Lane k of a vector value as a scalar expression (a per-lane gate's lane: the facts of
// that lane's access), or nullptr where a node is not one this walks through: VECTORIZE,
// VCONST, GEP, CAT and the lane-wise ops (ALU, casts). A scalar is every lane's value.
const UOp* lane_of(Graph& g, const UOp* v, uint32_t k, int depth = 0) {
  const DType& d = v->dtype();
  if (d.count == 1) return v;
  if (depth > 64 || d.ptr || k >= d.count) return nullptr;
  const DType e = d.element();
  switch (v->op()) {
    case Op::VECTORIZE: return v->num_src() == d.count ? v->src(k) : nullptr;
    case Op::VCONST: {
      const auto& values = v->arg_as<VConstArg>().values;
      return k < values.size() ? g.cnst(e, values[k]) : nullptr;
    }
    case Op::GEP: {
      const auto* lanes = v->arg_if<IntsArg>();
      if (!lanes || k >= lanes->values.size() || lanes->values[k] < 0) return nullptr;
      return lane_of(g, v->src(0), static_cast<uint32_t>(lanes->values[k]), depth + 1);
    }
    case Op::CAT: {
      uint32_t at = k;
      for (const UOp* s : v->src()) {
        if (at < s->dtype().count) return lane_of(g, s, at, depth + 1);
        at -= s->dtype().count;
      }
      return nullptr;
    }
    default: break;
  }
  if (!is_alu(v->op()) && v->op() != Op::CAST && v->op() != Op::BITCAST) return nullptr;
  std::vector<const UOp*> src;
  for (const UOp* s : v->src()) {
    const UOp* l = lane_of(g, s, k, depth + 1);
    if (!l) return nullptr;
    src.push_back(l);
  }
  return g.make(v->op(), e, src, v->arg());
}

// Whether INDEX(buf, idx [, gate]) covering `width` elements from idx is inside a buffer
// of `size` elements wherever it executes, gate a scalar or none (bounds.h); else the
// bounds it was found in, for the message.
// `plain`: ranges without facts, shared by a kernel's accesses.
bool proven(Graph& g, const UOp* idx, const UOp* gate, int64_t width, int64_t size, ValueRange& plain, Bounds& shown) {
  auto fits = [&](Bounds x) { return x.first >= 0 && x.second <= size - width; };
  Bounds b = plain(idx);
  shown = b;
  if (fits(b)) return true;
  FactSolver solver;
  for (const UOp* r : open_indices({idx, gate})) solver.assume(r, {0, INT64_MAX});
  if (gate) solver.assume(gate, {1, 1});
  std::optional<Facts> facts = solver.solve();
  if (!facts) return true;  // it never executes
  ValueRange ctx(*facts);
  b = ctx(idx);
  shown = b;
  if (fits(b)) return true;
  if (auto a = affine_bounds(g, idx, ctx); a && fits(*a)) return true;
  const std::vector<const UOp*>& gexprs = solver.order();
  for (const UOp* gexpr : gexprs)
    if (auto t = bounds_through(g, idx, {&gexpr, 1}, ctx); t && fits(*t)) return true;
  std::vector<const UOp*> composite;  // a loop index alone would take its terms first
  for (const UOp* x : gexprs)
    if (x->op() != Op::RANGE && x->op() != Op::SPECIAL) composite.push_back(x);
  if (composite.size() > 1)
    if (auto t = bounds_through(g, idx, composite, ctx); t && fits(*t)) return true;
  return false;
}

absl::Status check_index_in(Graph& g, const UOp* u, ValueRange& plain) {
  const UOp* buf = u->src(0);
  int64_t size = buffer_size(buf);
  if (size < 0) return absl::OkStatus();  // not memory (a tensor-level INDEX never reaches this stage)
  size_t n = u->num_src();
  const UOp* gate = n > 2 && u->src(n - 1)->dtype().is_bool() ? u->src(n - 1) : nullptr;
  if (n - (gate ? 1 : 0) != 2)
    return absl::InvalidArgumentError(cat("bounds: ", print_node(u), ": a buffer access takes one index [bounds.index]"));
  const UOp* idx = u->src(1);
  // Elements one access covers: a vector access to a buffer of scalars reads several,
  // an access to a buffer of vectors (an accumulator) one.
  int64_t width = std::max<int64_t>(u->dtype().count / std::max<uint32_t>(buffer_elem_count(buf), 1), 1);
  const bool per_lane = gate && gate->dtype().count > 1;
  Bounds shown;
  // A per-lane gate (a vector) is first no fact: the whole access may be in bounds anyway.
  if (proven(g, idx, per_lane ? nullptr : gate, width, size, plain, shown)) return absl::OkStatus();
  // Else lane k of a vector access to a buffer of scalars, element idx + k, under its own
  // lane of the gate (the lanes that are off touch no memory: a masked load, or a store
  // per lane).
  bool lanes = per_lane && gate->dtype().count == width && exact_int(idx->dtype());
  for (uint32_t k = 0; lanes && k < width; ++k) {
    const UOp* gk = lane_of(g, gate, k);
    const UOp* ik = k == 0 ? idx : g.alu(Op::ADD, {idx, g.cnst_int(idx->dtype(), k)});
    Bounds lane_shown;
    lanes = gk && proven(g, ik, gk, 1, size, plain, lane_shown);
  }
  if (lanes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      cat("bounds: ", print_node(u), ": index in [", shown.first, ", ", shown.second, "] may fall outside ",
          op_name(buf->op()), " of ", size, " elements", gate ? " even under its gate" : "",
          "; the kernel is refused [bounds.unproven]"));
}

}  // namespace

int64_t buffer_elements(const UOp* buf) { return buffer_size(buf); }

absl::Status check_index(Graph& g, const UOp* index) {
  ValueRange plain;
  return check_index_in(g, index, plain);
}

absl::Status check_bounds(Graph& g, const UOp* kernel) {
  ValueRange plain;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::INDEX) RETURN_IF_ERROR(check_index_in(g, u, plain));
  return absl::OkStatus();
}

}  // namespace uop
