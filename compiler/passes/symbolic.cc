// The symbolic rule table. Rules are grouped as symbolic.h lists them; within a root op
// they are tried in the order written. Each rule's comment (where it is not obvious) says
// why it is exact under eval.h: integer ADD / MUL / NEG form a ring modulo 2^bits, so
// reassociating them is exact even when they wrap; IDIV / MOD / comparisons are not ring
// operations, so rules over them first prove from value bounds that nothing wraps.
#include "compiler/passes/symbolic.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "compiler/ir/eval.h"
#include "compiler/ir/value_range.h"
#include "compiler/rewrite/graph_rewrite.h"

namespace uop {
namespace {

using namespace rw;  // NOLINT: the rule table reads as a DSL
using i128 = __int128;

// --- values and bounds -------------------------------------------------------------------

i128 ival(const ConstValue& c) {
  return c.kind() == ConstValue::Kind::UInt ? i128(c.as_uint()) : i128(c.to_int());
}
i128 ival(const UOp* u) { return ival(*u->const_value()); }

bool fits(const DType& d, i128 v) {
  int n = scalar_bits(d.scalar);
  if (d.is_unsigned()) return v >= 0 && v < (i128{1} << n);
  return v >= -(i128{1} << (n - 1)) && v < (i128{1} << (n - 1));
}

const UOp* iconst(Graph& g, const DType& d, i128 v) {
  return g.cnst(d, d.is_unsigned() ? ConstValue::UInt(static_cast<uint64_t>(v))
                                   : ConstValue::Int(static_cast<int64_t>(v)));
}
const UOp* zero_of(Graph& g, const DType& d) { return g.cnst(d, ConstValue::Int(0)); }

i128 floor_div(i128 a, i128 b) {  // b > 0
  i128 q = a / b;
  return (a % b < 0) ? q - 1 : q;
}

// Integer dtypes whose ValueRange bounds are exact (not bool, not uint64).
bool int_bounded(const DType& d) { return d.is_int() && ValueRange::bounded(d); }

struct Interval {
  i128 lo, hi;
  bool within(const DType& d) const { return fits(d, lo) && fits(d, hi); }
};

// Bounds from the rewrite's ValueRange (ctx), or a fresh one when there is none.
class Ranges {
 public:
  explicit Ranges(const Match& m) : vr_(m.ctx<ValueRange>()) {
    if (!vr_) vr_ = &local_.emplace();
  }
  Interval operator()(const UOp* u) {
    auto [lo, hi] = (*vr_)(u);
    return {lo, hi};
  }
  // The range of x * k as a mathematical product; its dtype must be int_bounded.
  Interval times(const UOp* x, i128 k) {
    Interval r = (*this)(x);
    i128 a = r.lo * k, b = r.hi * k;
    return {std::min(a, b), std::max(a, b)};
  }
  ValueRange& vr() { return *vr_; }

 private:
  ValueRange* vr_;
  std::optional<ValueRange> local_;
};

// --- building ----------------------------------------------------------------------------

const UOp* alu(const Match& m, Op op, const UOp* a, const UOp* b) { return m.g.alu(op, {a, b}); }

// op(a, b) on two CONSTs of one dtype.
const UOp* fold(const Match& m, Op op, const UOp* a, const UOp* b) {
  ConstValue v[2] = {*a->const_value(), *b->const_value()};
  auto r = eval_alu(op, a->dtype().scalar, v);
  return r ? m.g.make(Op::CONST, a->dtype(), {}, *r) : nullptr;
}

// A callback that returns a capture.
RewriteFn ret(const char* name) {
  return [name](const Match& m) { return m[name]; };
}
const UOp* ret_zero(const Match& m) { return zero_of(m.g, m.root->dtype()); }

// --- predicates --------------------------------------------------------------------------

bool is_const(const UOp* u) { return u->op() == Op::CONST; }
bool int_or_bool(const DType& d) { return d.is_int() || d.is_bool(); }

// +0.0, int 0, false: the bits are zero.
Pat pzero() { return zero().where([](const UOp* u) { return u->const_value()->bits() == 0; }); }
Pat nzero() {
  return zero().where([](const UOp* u) { return u->const_value()->kind() == ConstValue::Kind::Float && std::signbit(u->const_value()->as_float()); });
}
// Every bit set: int -1, uint max, bool true.
Pat ones() {
  return op(Op::CONST).where([](const UOp* u) {
    const ConstValue& c = *u->const_value();
    if (c.kind() == ConstValue::Kind::Float) return false;
    if (c.kind() == ConstValue::Kind::Bool) return c.as_bool();
    return c == cast_value(ConstValue::Int(-1), u->dtype().scalar);
  });
}

// Whether every value of `a` is exactly a value of `b`.
bool value_preserving(Scalar a, Scalar b) {
  auto precision = [](Scalar s) {
    switch (s) {
      case Scalar::Float16: return 11;
      case Scalar::BFloat16: return 8;
      case Scalar::Float32: return 24;
      default: return 53;
    }
  };
  if (a == b) return true;
  if (a == Scalar::Bool) return b != Scalar::Void;
  if (scalar_is_int(a) && scalar_is_int(b)) {
    if (scalar_is_signed_int(a) == scalar_is_signed_int(b)) return scalar_bits(b) >= scalar_bits(a);
    return scalar_is_unsigned_int(a) && scalar_bits(b) > scalar_bits(a);
  }
  if (scalar_is_int(a) && scalar_is_float(b))
    return precision(b) >= scalar_bits(a) - (scalar_is_signed_int(a) ? 1 : 0);
  if (scalar_is_float(a) && scalar_is_float(b))
    return precision(b) >= precision(a) && scalar_bits(b) > scalar_bits(a);
  return false;
}

// cast(cast(x, B), C) is cast(x, C) when B holds x exactly and converting that value from
// B behaves as converting it from x's dtype: not float -> int (saturates) against int ->
// int (wraps), unless C holds x exactly too.
const UOp* cast_chain(const Match& m) {
  const UOp* x = m["x"];
  Scalar a = x->dtype().scalar, b = m["mid"]->dtype().scalar, c = m.root->dtype().scalar;
  if (x->dtype().count != 1 || !value_preserving(a, b)) return nullptr;
  if (scalar_is_int(a) && scalar_is_float(b) && scalar_is_int(c) && !value_preserving(a, c)) return nullptr;
  if (x->dtype() == m.root->dtype()) return x;
  return m.g.make(Op::CAST, m.root->dtype(), {x});
}

// --- sums --------------------------------------------------------------------------------

// The terms of an ADD chain, left to right; false if there are more than `limit` (a long
// sum is not index math, and flattening every prefix of it would be quadratic).
bool flatten_sum(const UOp* root, size_t limit, std::vector<const UOp*>& terms) {
  std::vector<const UOp*> stack{root};
  while (!stack.empty()) {
    const UOp* n = stack.back();
    stack.pop_back();
    if (n->op() == Op::ADD) {
      stack.push_back(n->src(1));
      stack.push_back(n->src(0));
    } else {
      terms.push_back(n);
    }
    if (terms.size() + stack.size() > limit) return false;
  }
  return true;
}

// Like terms anywhere in a sum meet: a*2 + b + a*3 + 1 + 4 -> a*5 + b + 5. Coefficients
// add modulo 2^bits (a ring identity). Fires only when two terms share a factor or two
// constants meet, so its own result is left alone.
const UOp* collect_terms(const Match& m) {
  const DType& T = m.root->dtype();
  std::vector<const UOp*> terms;
  if (!flatten_sum(m.root, 32, terms)) return nullptr;
  struct Term { const UOp* factor; const UOp* coeff; };
  std::vector<Term> out;
  const UOp* konst = nullptr;
  bool changed = false;
  for (const UOp* t : terms) {
    if (is_const(t)) {
      changed |= konst != nullptr;
      konst = konst ? fold(m, Op::ADD, konst, t) : t;
      continue;
    }
    bool scaled = t->op() == Op::MUL && is_const(t->src(1));
    Term term{scaled ? t->src(0) : t, scaled ? t->src(1) : m.g.cnst_int(T, 1)};
    auto it = std::find_if(out.begin(), out.end(), [&](const Term& o) { return o.factor == term.factor; });
    if (it == out.end()) {
      out.push_back(term);
    } else {
      it->coeff = fold(m, Op::ADD, it->coeff, term.coeff);
      changed = true;
    }
  }
  if (!changed) return nullptr;
  const UOp* sum = nullptr;
  for (const Term& t : out) {
    if (t.coeff->const_value()->bits() == 0) continue;
    const UOp* term = t.coeff->const_value()->bits() == 1 ? t.factor : alu(m, Op::MUL, t.factor, t.coeff);
    sum = sum ? alu(m, Op::ADD, sum, term) : term;
  }
  if (konst && (konst->const_value()->bits() != 0 || !sum)) sum = sum ? alu(m, Op::ADD, sum, konst) : konst;
  return sum ? sum : zero_of(m.g, T);
}

// x % n + (x / n % m) * n = x % (n*m), and x % n + (x / n) * n = x, anywhere in a sum and
// scaled alike by any k: a flat index split into its axes by a reshape and joined again by
// the next one. With q = x / n: x % n = x - n*q and q % m = q - m*(q / m), so the left side
// is x - n*m*(q / m) as an integer, and q / m = x / (n*m) for n, m > 0 (trunc and floor
// alike). Each part is exact, so the ring identity holds however the operands wrap; a pad's
// index, which leaves the buffer where its gate is false, is rejoined as well.
const UOp* divmod_refold(const Match& m) {
  const DType& T = m.root->dtype();
  if (!int_bounded(T)) return nullptr;
  std::vector<const UOp*> terms;
  if (!flatten_sum(m.root, 32, terms)) return nullptr;
  struct Term { const UOp* factor; i128 coeff; };
  std::vector<Term> ts;
  for (const UOp* t : terms) {
    bool scaled = t->op() == Op::MUL && is_const(t->src(1));
    ts.push_back({scaled ? t->src(0) : t, scaled ? ival(t->src(1)) : 1});
  }
  auto positive_const = [](const UOp* u) { return is_const(u) && ival(u) > 0; };
  bool changed = false;
  for (bool again = true; again;) {
    again = false;
    for (size_t a = 0; a < ts.size() && !again; ++a) {
      const UOp* fa = ts[a].factor;
      if (fa->op() != Op::MOD || !positive_const(fa->src(1))) continue;
      const UOp* x = fa->src(0);
      i128 n = ival(fa->src(1)), want = n * ts[a].coeff;
      for (size_t b = 0; b < ts.size() && !again; ++b) {
        const UOp* fb = ts[b].factor;
        if (b == a || ts[b].coeff != want) continue;
        const UOp* joined = nullptr;
        if (fb->op() == Op::IDIV && fb->src(0) == x && fb->src(1) == fa->src(1)) {
          joined = x;  // x % n + (x / n) * n
        } else if (fb->op() == Op::MOD && positive_const(fb->src(1)) && fb->src(0)->op() == Op::IDIV &&
                   fb->src(0)->src(0) == x && fb->src(0)->src(1) == fa->src(1) && fits(T, n * ival(fb->src(1)))) {
          joined = m.g.alu(Op::MOD, {x, iconst(m.g, T, n * ival(fb->src(1)))});
        }
        if (!joined) continue;
        ts[a].factor = joined;
        ts.erase(ts.begin() + static_cast<std::ptrdiff_t>(b));
        again = changed = true;
      }
    }
  }
  if (!changed) return nullptr;
  const UOp* sum = nullptr;
  for (const Term& t : ts) {
    const UOp* term = t.coeff == 1 ? t.factor : alu(m, Op::MUL, t.factor, iconst(m.g, T, t.coeff));
    sum = sum ? alu(m, Op::ADD, sum, term) : term;
  }
  return sum;
}

// --- div / mod by a positive constant: split the dividend's terms ---------------------

// x = Q*c + R, where Q collects the terms whose coefficient c divides and R the rest. If
// nothing wraps and x and R have one sign, trunc(x/c) = Q + trunc(R/c) and x%c = R%c
// (trunc(q + t) = q + trunc(t) when t and q + t have one sign; here t = R/c). For x%c a
// term f * k of a non-negative f whose coefficient exceeds c splits too: f * (k div c)
// into Q, f * (k mod c) into R (not for x/c, where Q + R/c would bound the quotient more
// loosely than x/c does, and the bounds proof with it). A convolution's window read as
// movement ops (repeat, flatten, reshape: op_helpers.h windows_last) indexes its input
// (x + 11 k) % 10 for a width of 10, which becomes (x + k) % 10 and then, in range,
// x + k: a contiguous read instead of a division per lane.
const UOp* divmod_split(const Match& m) {
  const DType& T = m.root->dtype();
  i128 c = ival(m["c"]);
  if (!int_bounded(T) || c <= 0) return nullptr;
  std::vector<const UOp*> terms;
  if (!flatten_sum(m["x"], 64, terms)) return nullptr;
  Ranges range(m);
  struct Quot { const UOp* factor; i128 coeff; };
  std::vector<Quot> quot;
  std::vector<const UOp*> rem;
  std::vector<i128> consts;
  Interval S{0, 0}, R{0, 0};
  for (const UOp* t : terms) {
    Interval tr = range(t);
    S = {S.lo + tr.lo, S.hi + tr.hi};
    if (is_const(t)) {
      consts.push_back(ival(t));
      continue;
    }
    if (t->op() == Op::MUL && is_const(t->src(1))) {
      i128 k = ival(t->src(1));
      // The term is factor * k without wrapping only if that product fits.
      if (k % c == 0 && range.times(t->src(0), k).within(T)) {
        quot.push_back({t->src(0), k / c});
        continue;
      }
      if (m.root->op() == Op::MOD && k > c && range(t->src(0)).lo >= 0 && range.times(t->src(0), k).within(T)) {
        quot.push_back({t->src(0), k / c});
        const UOp* part = m.g.alu(Op::MUL, {t->src(0), iconst(m.g, T, k % c)});
        rem.push_back(part);
        Interval pr = range.times(t->src(0), k % c);
        R = {R.lo + pr.lo, R.hi + pr.hi};
        continue;
      }
    }
    rem.push_back(t);
    R = {R.lo + tr.lo, R.hi + tr.hi};
  }
  if (!S.within(T)) return nullptr;
  // Constants split so that their remainder has the sign of x: floor for x >= 0, ceiling
  // for x <= 0; when x may take both signs, only an exact split keeps R at zero.
  i128 qc = 0, rc = 0;
  for (i128 k : consts) {
    i128 q = S.lo >= 0 ? floor_div(k, c) : S.hi <= 0 ? -floor_div(-k, c) : (k % c == 0 ? k / c : 0);
    qc += q;
    rc += k - q * c;
  }
  R = {R.lo + rc, R.hi + rc};
  if (quot.empty() && qc == 0) return nullptr;
  bool same_sign = (S.lo >= 0 && R.lo >= 0) || (S.hi <= 0 && R.hi <= 0) || (R.lo == 0 && R.hi == 0);
  if (!same_sign || !R.within(T) || !fits(T, qc) || !fits(T, rc)) return nullptr;

  Graph& g = m.g;
  auto sum = [&](const UOp* acc, const UOp* t) { return acc ? g.alu(Op::ADD, {acc, t}) : t; };
  const UOp* rnode = nullptr;
  for (const UOp* t : rem) rnode = sum(rnode, t);
  if (rc != 0 || !rnode) rnode = sum(rnode, iconst(g, T, rc));
  if (m.root->op() == Op::MOD) return g.alu(Op::MOD, {rnode, m["c"]});
  const UOp* q = nullptr;
  for (const Quot& t : quot) q = sum(q, t.coeff == 1 ? t.factor : g.alu(Op::MUL, {t.factor, iconst(g, T, t.coeff)}));
  if (qc != 0 || !q) q = sum(q, iconst(g, T, qc));
  return g.alu(Op::ADD, {q, g.alu(Op::IDIV, {rnode, m["c"]})});
}

// x = a * X + R over a factor a of c (c = a * q), R the terms a does not divide, where
// X and R are non-negative, R below a, and nothing wraps: trunc(x / c) = trunc(X / q).
// divmod.split cannot take these apart: no coefficient is a multiple of c. Weights stored
// in blocks of output channels and read as [M, C, K...] (compiler/onnx conv_weights) index
// their block (m * C K + r) / (B C K) with r = c K + k below C K: that is m / B, where the
// division of the whole sum was one per lane of every tile row. (Not x % c = a (X % q) + R:
// a remainder kept whole is what a pad's gate bounds, and as a sum it no longer appears in
// the index the gate proves.)
const UOp* divmod_factor(const Match& m) {
  const DType& T = m.root->dtype();
  i128 c = ival(m["c"]);
  if (!int_bounded(T) || c <= 1) return nullptr;
  std::vector<const UOp*> terms;
  if (!flatten_sum(m["x"], 64, terms) || terms.size() < 2) return nullptr;
  Ranges range(m);
  auto coeff = [](const UOp* t) -> i128 {  // a constant term's is itself
    return t->op() == Op::MUL && is_const(t->src(1)) ? ival(t->src(1)) : is_const(t) ? ival(t) : 1;
  };
  auto gcd = [](i128 a, i128 b) {
    if (a < 0) a = -a;
    if (b < 0) b = -b;
    while (b != 0) {
      i128 t = a % b;
      a = b;
      b = t;
    }
    return a;
  };
  // The candidates, largest first: c's common factor with each term's coefficient.
  std::vector<i128> candidates;
  for (const UOp* t : terms) {
    i128 a = gcd(c, coeff(t));
    if (a > 1 && a < c && std::find(candidates.begin(), candidates.end(), a) == candidates.end()) candidates.push_back(a);
  }
  std::sort(candidates.rbegin(), candidates.rend());
  Interval S{0, 0};
  for (const UOp* t : terms) {
    Interval tr = range(t);
    S = {S.lo + tr.lo, S.hi + tr.hi};
  }
  if (!S.within(T) || S.lo < 0) return nullptr;
  Graph& g = m.g;
  for (i128 a : candidates) {
    std::vector<const UOp*> big, small;
    Interval X{0, 0}, R{0, 0};
    bool ok = true;
    for (const UOp* t : terms) {
      i128 k = coeff(t);
      if (k % a == 0) {
        const UOp* f = is_const(t) ? nullptr : t->op() == Op::MUL && is_const(t->src(1)) ? t->src(0) : t;
        Interval xr = f ? range.times(f, k / a) : Interval{k / a, k / a};
        if (!xr.within(T)) ok = false;
        X = {X.lo + xr.lo, X.hi + xr.hi};
        big.push_back(!f ? iconst(g, T, k / a) : k / a == 1 ? f : g.alu(Op::MUL, {f, iconst(g, T, k / a)}));
      } else {
        Interval tr = range(t);
        R = {R.lo + tr.lo, R.hi + tr.hi};
        small.push_back(t);
      }
    }
    if (!ok || big.empty() || small.empty() || X.lo < 0 || R.lo < 0 || R.hi >= a || !X.within(T)) continue;
    const UOp* xs = big[0];
    for (size_t i = 1; i < big.size(); ++i) xs = g.alu(Op::ADD, {xs, big[i]});
    return g.alu(Op::IDIV, {xs, iconst(g, T, c / a)});
  }
  return nullptr;
}

// --- the table ---------------------------------------------------------------------------

RuleSet build() {
  RuleSet rs("symbolic");
  // Every rule is for scalar nodes (symbolic.h).
  auto add = [&rs](const Pat& p, RewriteFn fn, const char* name) { rs.add(p.is_scalar(), std::move(fn), name); };
  const Pat x = var("x"), y = var("y"), d = var("d");
  const Pat c = cvar("c"), c1 = cvar("c1"), c2 = cvar("c2");
  const Pat nonconst_y = y.where([](const UOp* u) { return !is_const(u); });
  const OpSet commutative{Op::ADD, Op::MUL, Op::MAX, Op::MIN, Op::CMPNE, Op::CMPEQ, Op::AND, Op::OR, Op::XOR};

  // Constant folding.
  add(op(alu_ops() | OpSet{Op::CAST, Op::BITCAST}).where([](const UOp* u) {
        for (const UOp* s : u->src()) if (!is_const(s)) return false;
        return true;
      }),
      [](const Match& m) { return fold_constants(m.g, m.root); }, "fold.const");

  // Identities for every dtype.
  add(where_(cnst(true), x, any()), ret("x"), "where.true");
  add(where_(cnst(false), any(), x), ret("x"), "where.false");
  add(where_(any(), x, x), ret("x"), "where.same");
  add(where_(x, cnst(true), cnst(false)), ret("x"), "where.bool");
  add(neg(neg(x)), ret("x"), "neg.neg");
  add(cast(x), [](const Match& m) { return m["x"]->dtype() == m.root->dtype() ? m["x"] : nullptr; }, "cast.noop");
  add(bitcast(x), [](const Match& m) { return m["x"]->dtype() == m.root->dtype() ? m["x"] : nullptr; }, "bitcast.noop");
  add(cast(cast(x).named("mid")), cast_chain, "cast.cast");
  add(op(Op::TRUNC, {op(Op::TRUNC, {x}).named("t")}), ret("t"), "trunc.trunc");
  add(max_(x, x), ret("x"), "max.self");  // NaN stays NaN, -0.0 stays -0.0
  add(min_(x, x), ret("x"), "min.self");
  add(x & x, ret("x"), "and.self");
  add(x | x, ret("x"), "or.self");
  add((x ^ x).dtype(int_or_bool), ret_zero, "xor.self");
  add((x - x).is_int(), ret_zero, "sub.self");  // unsigned; signed x - x meets as x*(1 + -1)
  // A value against itself, where no NaN can make it unequal.
  add(lt(x.dtype(int_or_bool), x), [](const Match& m) { return m.g.cnst_bool(false); }, "lt.self");
  add(ne(x.dtype(int_or_bool), x), [](const Match& m) { return m.g.cnst_bool(false); }, "ne.self");
  add(eq(x.dtype(int_or_bool), x), [](const Match& m) { return m.g.cnst_bool(true); }, "eq.self");

  // Identities with a constant. x + 0.0 is not x for x = -0.0; x + -0.0 and x - 0.0 are.
  add((x + zero()).is_int(), ret("x"), "add.zero");
  add(x + nzero(), ret("x"), "add.negzero");
  add(x - pzero(), ret("x"), "sub.zero");
  add(x * one(), ret("x"), "mul.one");
  add((x * zero().named("z")).is_int(), ret("z"), "mul.zero");  // not floats: NaN, inf, -0.0
  add(x / one(), ret("x"), "fdiv.one");
  add(idiv(x, one()), ret("x"), "idiv.one");
  add(idiv(x, zero()), ret_zero, "idiv.zero");  // eval.h: x / 0 = 0
  add(mod(x, zero()), ret("x"), "mod.zero");    // eval.h: x % 0 = x
  add(mod(x, one()), ret_zero, "mod.one");
  add(mod(x, cnst(-1)), ret_zero, "mod.minus_one");  // INT_MIN % -1 = 0 too
  // INT_MIN / -1 wraps to INT_MIN, as INT_MIN * -1 does.
  add(idiv(x, cnst(-1)).is_signed(),
      [](const Match& m) { return m.g.alu(Op::MUL, {m["x"], m.g.cnst_int(m.root->dtype(), -1)}); }, "idiv.minus_one");
  add(idiv(zero(), any()), ret_zero, "zero.idiv");
  add(mod(zero(), any()), ret_zero, "zero.mod");
  add(mod(x, x), ret_zero, "mod.self");  // 0 % 0 = 0 as well
  add(x & zero().named("z"), ret("z"), "and.zero");
  add(x & ones(), ret("x"), "and.ones");
  add(x | zero(), ret("x"), "or.zero");
  add(x | ones().named("o"), ret("o"), "or.ones");
  add(x ^ zero(), ret("x"), "xor.zero");
  add(shl(x, zero()), ret("x"), "shl.zero");
  add(shr(x, zero()), ret("x"), "shr.zero");
  add(op({Op::SHL, Op::SHR}, {zero().named("z"), any()}), ret("z"), "zero.shift");
  add(ne(x.is_bool(), cnst(false)), ret("x"), "ne.false");
  add(eq(x.is_bool(), cnst(true)), ret("x"), "eq.true");

  // Canonical form: constants on the right of commutative ops (exact for every dtype), and
  // signed SUB / NEG as ADD / MUL by -1 so that like terms meet.
  add(op(commutative, {c, nonconst_y}).ordered(),
      [](const Match& m) { return m.g.alu(m.root->op(), {m["y"], m["c"]}); }, "commute.const");
  add((x - y).is_signed(), [](const Match& m) {
        return m.g.alu(Op::ADD, {m["x"], m.g.alu(Op::MUL, {m["y"], m.g.cnst_int(m.root->dtype(), -1)})});
      }, "sub.to_add");
  add(neg(x).is_signed(), [](const Match& m) { return m.g.alu(Op::MUL, {m["x"], m.g.cnst_int(m.root->dtype(), -1)}); },
      "neg.to_mul");

  // Integer ring rules: exact modulo 2^bits, so exact even when they wrap.
  auto ring = [](Op outer, Op inner) {  // (x inner c1) outer c2 -> x inner fold(c1 outer c2)
    return [outer, inner](const Match& m) -> const UOp* {
      const UOp* k = fold(m, outer, m["c1"], m["c2"]);
      return k ? m.g.alu(inner, {m["x"], k}) : nullptr;
    };
  };
  add(((x + c1) + c2).is_int(), ring(Op::ADD, Op::ADD), "add.consts");
  add(((x * c1) * c2).is_int(), ring(Op::MUL, Op::MUL), "mul.consts");
  add(((x & c1) & c2).dtype(int_or_bool), ring(Op::AND, Op::AND), "and.consts");
  add(((x | c1) | c2).dtype(int_or_bool), ring(Op::OR, Op::OR), "or.consts");
  add(((x ^ c1) ^ c2).dtype(int_or_bool), ring(Op::XOR, Op::XOR), "xor.consts");
  // Constants move up the chain, where they meet and fold.
  add(((x + c) + nonconst_y).is_int(),
      [](const Match& m) { return alu(m, Op::ADD, alu(m, Op::ADD, m["x"], m["y"]), m["c"]); }, "add.hoist_const");
  add(((x * c) * nonconst_y).is_int(),
      [](const Match& m) { return alu(m, Op::MUL, alu(m, Op::MUL, m["x"], m["y"]), m["c"]); }, "mul.hoist_const");
  // (x + y) * c -> x*c + y*c: sums stay flat, so div / mod see every term's coefficient.
  add(((x + y) * c).is_int(), [](const Match& m) {
        return alu(m, Op::ADD, alu(m, Op::MUL, m["x"], m["c"]), alu(m, Op::MUL, m["y"], m["c"]));
      }, "mul.distribute");
  // Like terms.
  auto times = [](const char* k1, const char* k2, int64_t extra) {  // x * (k1 + k2 + extra)
    return [=](const Match& m) -> const UOp* {
      const DType& t = m.root->dtype();
      const UOp* k = k1 ? m[k1] : m.g.cnst_int(t, 0);
      if (k2) k = fold(m, Op::ADD, k, m[k2]);
      if (extra) k = fold(m, Op::ADD, k, m.g.cnst_int(t, extra));
      const UOp* term = alu(m, Op::MUL, m["x"], k);
      return term;
    };
  };
  add((x + x).is_int(), times(nullptr, nullptr, 2), "add.self");
  add((x * c1 + x * c2).is_int(), times("c1", "c2", 0), "add.like");
  add((x * c + x).is_int(), times("c", nullptr, 1), "add.like_one");
  add(op(Op::ADD).is_int(), collect_terms, "add.collect");
  // x // d * d + x % d = x by eval.h's definition of MOD, for every d (x % 0 = x).
  add((idiv(x, d) * d + mod(x, d)).is_int(), ret("x"), "divmod.recombine");
  add(((y + idiv(x, d) * d) + mod(x, d)).is_int(),
      [](const Match& m) { return alu(m, Op::ADD, m["y"], m["x"]); }, "divmod.recombine_chain");
  add(((y + mod(x, d)) + idiv(x, d) * d).is_int(),
      [](const Match& m) { return alu(m, Op::ADD, m["y"], m["x"]); }, "divmod.recombine_chain2");
  add(op(Op::ADD).is_int(), divmod_refold, "divmod.refold");

  // Rules that need bounds. Only for integer dtypes whose bounds are exact.
  add(op(alu_ops()).where([](const UOp* u) { return ValueRange::bounded(u->dtype()); }),
      [](const Match& m) -> const UOp* {
        auto [lo, hi] = Ranges(m).vr()(m.root);
        return lo == hi ? iconst(m.g, m.root->dtype(), lo) : nullptr;
      }, "fold.bounds");
  add(idiv(x, x).where([](const UOp* u) { return int_bounded(u->dtype()); }), [](const Match& m) -> const UOp* {
        Interval r = Ranges(m)(m["x"]);
        return r.lo > 0 || r.hi < 0 ? iconst(m.g, m.root->dtype(), 1) : nullptr;  // 0 / 0 = 0
      }, "idiv.self");
  // x * c neither wraps nor loses c: (x*c)/c = x, (x*c)%c = 0.
  auto exact_mul = [](const Match& m, const char* k) {
    const DType& t = m.root->dtype();
    return int_bounded(t) && ival(m[k]) != 0 && Ranges(m).times(m["x"], ival(m[k])).within(t);
  };
  add(idiv(x * c, c), [=](const Match& m) { return exact_mul(m, "c") ? m["x"] : nullptr; }, "idiv.mul_exact");
  add(mod(x * c, c), [=](const Match& m) { return exact_mul(m, "c") ? ret_zero(m) : nullptr; }, "mod.mul_exact");
  add(idiv(x * c1, c2), [=](const Match& m) -> const UOp* {
        i128 k1 = ival(m["c1"]), k2 = ival(m["c2"]);
        if (k2 == 0 || !exact_mul(m, "c1")) return nullptr;
        const DType& t = m.root->dtype();
        if (k1 % k2 == 0) return alu(m, Op::MUL, m["x"], iconst(m.g, t, k1 / k2));
        if (k1 > 0 && k2 > 0 && k2 % k1 == 0) return alu(m, Op::IDIV, m["x"], iconst(m.g, t, k2 / k1));
        return nullptr;
      }, "idiv.mul_multiple");
  add(mod(x * c1, c2), [=](const Match& m) -> const UOp* {
        i128 k2 = ival(m["c2"]);
        return k2 != 0 && ival(m["c1"]) % k2 == 0 && exact_mul(m, "c1") ? ret_zero(m) : nullptr;
      }, "mod.mul_multiple");
  // trunc(trunc(x/a)/b) = trunc(x/(a*b)) for a, b > 0 and every x.
  add(idiv(idiv(x, c1), c2), [](const Match& m) -> const UOp* {
        i128 k1 = ival(m["c1"]), k2 = ival(m["c2"]);
        const DType& t = m.root->dtype();
        if (!int_bounded(t) || k1 <= 0 || k2 <= 0 || !fits(t, k1 * k2)) return nullptr;
        return alu(m, Op::IDIV, m["x"], iconst(m.g, t, k1 * k2));
      }, "idiv.idiv");
  // x % a keeps x's sign and differs from x by a multiple of a, hence of b when b | a.
  add(mod(mod(x, c1), c2), [](const Match& m) -> const UOp* {
        i128 k1 = ival(m["c1"]), k2 = ival(m["c2"]);
        if (!int_bounded(m.root->dtype()) || k1 <= 0 || k2 <= 0 || k1 % k2 != 0) return nullptr;
        return alu(m, Op::MOD, m["x"], m["c2"]);
      }, "mod.mod");
  add(mod(x, c), [](const Match& m) -> const UOp* {
        if (!int_bounded(m.root->dtype())) return nullptr;
        i128 k = ival(m["c"]), a = k < 0 ? -k : k;
        Interval r = Ranges(m)(m["x"]);
        return k != 0 && r.lo > -a && r.hi < a ? m["x"] : nullptr;
      }, "mod.small");
  add(op({Op::IDIV, Op::MOD}, {x, c}), divmod_split, "divmod.split");
  add(idiv(x, c), divmod_factor, "divmod.factor");
  // Comparisons: move constants across when the left side cannot wrap.
  add(lt(x + c1, c2), [](const Match& m) -> const UOp* {
        const DType& t = m["x"]->dtype();
        if (!int_bounded(t)) return nullptr;
        Interval r = Ranges(m)(m["x"]);
        i128 k1 = ival(m["c1"]), k = ival(m["c2"]) - k1;
        if (!fits(t, r.lo + k1) || !fits(t, r.hi + k1) || !fits(t, k)) return nullptr;
        return alu(m, Op::CMPLT, m["x"], iconst(m.g, t, k));
      }, "lt.add_const");
  // x*k < c  <=>  x*k <= c-1  <=>  x <= floor((c-1)/k), for k > 0 and no wrap.
  add(lt(x * c1, c2), [](const Match& m) -> const UOp* {
        const DType& t = m["x"]->dtype();
        i128 k1 = ival(m["c1"]);
        if (!int_bounded(t) || k1 <= 0 || !Ranges(m).times(m["x"], k1).within(t)) return nullptr;
        i128 k = floor_div(ival(m["c2"]) - 1, k1) + 1;
        return fits(t, k) ? alu(m, Op::CMPLT, m["x"], iconst(m.g, t, k)) : nullptr;
      }, "lt.mul_const");
  auto pick = [](bool is_max) {  // max(x, y) -> x when x >= y everywhere (and min alike)
    return [is_max](const Match& m) -> const UOp* {
      if (!ValueRange::bounded(m.root->dtype())) return nullptr;
      Ranges range(m);
      Interval a = range(m["x"]), b = range(m["y"]);
      return (is_max ? a.lo >= b.hi : a.hi <= b.lo) ? m["x"] : nullptr;
    };
  };
  add(max_(x, y), pick(true), "max.bounds");
  add(min_(x, y), pick(false), "min.bounds");
  return rs;
}

}  // namespace

const UOp* fold_constants(Graph& g, const UOp* u) {
  const DType& d = u->dtype();
  Op op = u->op();
  if (d.count != 1 || d.ptr || !(is_alu(op) || op == Op::CAST || op == Op::BITCAST)) return nullptr;
  std::vector<ConstValue> vals;
  for (const UOp* s : u->src()) {
    if (!is_const(s) || s->dtype().count != 1) return nullptr;
    vals.push_back(*s->const_value());
  }
  std::optional<ConstValue> r;
  if (op == Op::CAST) r = cast_value(vals[0], d.scalar);
  else if (op == Op::BITCAST) r = bitcast_value(vals[0], u->src(0)->dtype().scalar, d.scalar);
  else r = eval_alu(op, u->src(op == Op::WHERE ? 1 : 0)->dtype().scalar, vals);
  return r ? g.make(Op::CONST, d, {}, *r) : nullptr;
}

const rw::RuleSet& symbolic_rules() {
  static const rw::RuleSet* rules = new rw::RuleSet(build());
  return *rules;
}

absl::StatusOr<const UOp*> simplify(Graph& g, const UOp* root) {
  ValueRange ranges;
  return rw::graph_rewrite(g, root, symbolic_rules(), &ranges);
}

}  // namespace uop
