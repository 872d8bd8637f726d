// The random graph generator (random_graph.h). A pool of values grows one op at a time;
// each op picks its operands from the pool (so subexpressions are shared) and its partner
// operands by broadcasting, reducing or reshaping other values. Error and magnitude bounds
// travel with every value (see the header); the few rules that keep floats stable are
// written next to the op they guard.
#include "tests/unit/compiler/random_graph.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"
#include "tests/unit/compiler/composites.h"

namespace uop::randgraph {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
int64_t Rng::range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1)); }
bool Rng::chance(double p) { return static_cast<double>(next() >> 11) * 0x1p-53 < p; }

namespace {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Relative rounding error of one operation in the dtype (half an ULP, doubled for margin).
double eps(Scalar s) {
  switch (s) {
    case Scalar::Float16: return 0x1p-10;
    case Scalar::BFloat16: return 0x1p-7;
    case Scalar::Float32: return 0x1p-23;
    default: return 0x1p-52;
  }
}
double ulp(Scalar s, double mag) { return eps(s) * std::max(mag, 0x1p-14); }

// The largest magnitude a value of the type holds.
double type_max(Scalar s) {
  switch (s) {
    case Scalar::Bool: return 1;
    case Scalar::Float16: return 65504;
    case Scalar::BFloat16: return 3.38e38;
    case Scalar::Float32: return 3.40e38;
    case Scalar::Float64: return 1.79e308;
    default: return std::ldexp(1.0, scalar_bits(s) - (scalar_is_signed_int(s) ? 1 : 0));
  }
}
// Float values are clamped back below this, so a product of two stays finite.
double mag_cap(Scalar s) { return s == Scalar::Float16 ? 128 : s == Scalar::BFloat16 ? 1e4 : 1e6; }

struct Val {
  const UOp* u = nullptr;
  double mag = 0;     // |value| <= mag (inf: unknown, possibly inf / NaN)
  double err = 0;     // |compiled - interpreted| <= err; 0: bit-exact
  bool wild = false;  // may be inf or NaN: only exact ops may use it
};

class Gen {
 public:
  Gen(TensorBuilder& tb, uint64_t seed, const Options& o) : tb_(tb), rng_(seed), o_(o) {
    if (o_.dtypes.empty())
      o_.dtypes = {Scalar::Bool,   Scalar::Int8,    Scalar::Int16,   Scalar::Int32,    Scalar::Int64,
                   Scalar::UInt8,  Scalar::UInt16,  Scalar::UInt32,  Scalar::UInt64,   Scalar::Float16,
                   Scalar::BFloat16, Scalar::Float32, Scalar::Float32, Scalar::Float32, Scalar::Int32,
                   Scalar::Float64};
  }

  RandomGraph run() {
    pool_.push_back(input(rng_.pick(o_.dtypes), random_shape(rng_, o_.max_rank, o_.max_numel, o_.zero_dim_chance)));
    for (int step = 0; step < o_.steps; ++step) {
      Val a = pick_value();
      std::optional<Val> r;
      int64_t action = rng_.range(0, 99);
      if (action < 8) r = input(rng_.pick(o_.dtypes), random_shape(rng_, o_.max_rank, o_.max_numel, o_.zero_dim_chance));
      else if (action < 22) r = unary(a);
      else if (action < 44) r = binary(a);
      else if (action < 52) r = ternary(a);
      else if (action < 62) r = convert(a);
      else if (action < 76) r = movement(a);
      else if (action < 92) r = reduce(a);
      else if (action < 97) r = composite(a);
      else r = Val{tb_.contiguous(a.u), a.mag, a.err, a.wild};
      if (!r) continue;
      Val v = tame(*r);
      // A bound this loose would check next to nothing: leave such values out.
      if (is_float(v) && v.err > 0.05 * std::max(v.mag, 1.0)) continue;
      pool_.push_back(v);
    }
    RandomGraph out;
    std::vector<const UOp*> outs{pool_.back().u};
    std::vector<Val> meta{pool_.back()};
    int64_t extra = rng_.range(0, o_.max_outputs - 1);
    for (int64_t i = 0; i < extra; ++i) {
      const Val& v = pool_[rng_.range(0, static_cast<int64_t>(pool_.size()) - 1)];
      if (std::find(outs.begin(), outs.end(), v.u) != outs.end()) continue;
      outs.push_back(v.u);
      meta.push_back(v);
    }
    out.sink = tb_.sink(outs);
    // Inputs made for ops that were then left out are not part of the graph.
    absl::flat_hash_set<const UOp*> reachable;
    for (const UOp* u : toposort(out.sink)) reachable.insert(u);
    for (size_t i = 0; i < inputs_.size(); ++i)
      if (reachable.contains(inputs_[i])) out.inputs.push_back(inputs_[i]), out.wide.push_back(wide_[i]);
    for (const Val& v : meta) {
      Scalar s = dt(v);
      Tolerance t = Tolerance::exact();
      if (v.err > 0) {  // the defaults, widened to the propagated bound where that is larger
        t = Tolerance::for_dtype(s);
        t.atol = std::max(t.atol, 2 * v.err);
      }
      out.tolerances.push_back(t);
      out.notes.push_back(cat(scalar_name(s), shape_str(shape(v)), " err<=", v.err, " mag<=", v.mag,
                              v.wild ? " (may be inf/nan)" : ""));
    }
    return out;
  }

 private:
  Scalar dt(const Val& v) const { return v.u->dtype().scalar; }
  const Shape& shape(const Val& v) const { return tb_.shape(v.u); }
  bool is_float(const Val& v) const { return scalar_is_float(dt(v)); }

  // Recent values are picked more often, so chains grow deep as well as wide.
  Val pick_value() {
    int64_t n = static_cast<int64_t>(pool_.size());
    if (rng_.chance(0.6)) return pool_[std::max<int64_t>(0, n - 1 - rng_.range(0, 3))];
    return pool_[rng_.range(0, n - 1)];
  }

  Val input(Scalar s, Shape sh) {
    const UOp* x = tb_.input(s, std::move(sh));
    inputs_.push_back(x);
    bool wide = scalar_is_int(s) && rng_.chance(0.3);  // integers stay exact at any value
    wide_.push_back(wide);
    double mag = s == Scalar::Bool ? 1 : scalar_is_float(s) ? 2 : wide ? type_max(s) : scalar_is_unsigned_int(s) ? 32 : 16;
    return {x, mag, 0, false};
  }

  Val constant(Scalar s) {
    ConstValue v;
    if (s == Scalar::Bool) v = ConstValue::Bool(rng_.chance(0.5));
    else if (scalar_is_float(s)) v = ConstValue::Float(rng_.pick(std::vector<double>{0.0, 1.0, -1.0, 0.5, 2.0, 3.25, -0.0, 0.1}));
    else if (rng_.chance(0.1)) v = bits_to_value(~uint64_t{0} >> 1, s);  // near the type's top
    else v = ConstValue::Int(rng_.range(scalar_is_unsigned_int(s) ? 0 : -8, 8));
    v = cast_value(v, s);
    double mag = std::fabs(v.to_double());
    return {tb_.full(s, v, {}), mag, 0, false};
  }

  // max(min(v, hi), lo): keeps exactness and the error bound (both are 1-Lipschitz).
  Val clamp(Val v, double lo, double hi) {
    Scalar s = dt(v);
    const UOp* u = tb_.alu(Op::MIN, {v.u, tb_.full(s, cast_value(ConstValue::Float(hi), s), {})});
    u = tb_.alu(Op::MAX, {u, tb_.full(s, cast_value(ConstValue::Float(lo), s), {})});
    return {u, v.wild ? INFINITY : std::max(std::fabs(lo), std::fabs(hi)), v.err, v.wild};
  }
  Val tame(Val v) {
    if (!is_float(v) || v.wild || v.mag <= mag_cap(dt(v))) return v;
    double c = rng_.pick(std::vector<double>{1, 2, 4, 16});
    return clamp(v, -c, c);
  }

  // Whether `p`'s shape broadcasts to `to` (NumPy: trailing dims equal or 1).
  static bool broadcasts(const Shape& p, const Shape& to) {
    if (p.size() > to.size()) return false;
    for (size_t i = 0; i < p.size(); ++i) {
      int64_t d = p[p.size() - 1 - i], t = to[to.size() - 1 - i];
      if (d != t && d != 1) return false;
    }
    return true;
  }

  // v as a value of dtype `to`, if a cast is allowed there; nullopt otherwise.
  std::optional<Val> coerce(const Val& v, Scalar to) {
    if (dt(v) == to) return v;
    return cast(v, to);
  }

  // CAST (or BITCAST) with the rules of the header: discontinuous conversions want exact
  // values; a float narrowing a tainted value adds its rounding.
  std::optional<Val> cast(const Val& v, Scalar to, bool bitcast = false) {
    Scalar from = dt(v);
    if (bitcast) {
      if (from == Scalar::Bool || to == Scalar::Bool || scalar_bits(from) != scalar_bits(to)) return std::nullopt;
      if (v.err > 0 || v.wild) return std::nullopt;  // NaN payloads are outside the contract
      bool to_float = scalar_is_float(to);
      return Val{tb_.bitcast(v.u, to), to_float ? INFINITY : type_max(to), 0, to_float};
    }
    const UOp* u = tb_.cast(v.u, to);
    if (to == Scalar::Bool) return v.err > 0 ? std::nullopt : std::optional<Val>(Val{u, 1, 0, false});
    if (from == Scalar::Bool) return Val{u, 1, 0, false};
    if (!scalar_is_float(to)) {
      if (v.err > 0) return std::nullopt;  // truncation is not continuous
      bool wraps = scalar_is_int(from) && scalar_is_signed_int(from) && scalar_is_unsigned_int(to);
      double m = (wraps || v.mag > type_max(to)) ? type_max(to) : v.mag;
      return Val{u, m, 0, false};
    }
    if (v.wild) return Val{u, INFINITY, 0, true};
    bool overflow = v.mag >= type_max(to);
    if (!scalar_is_float(from)) return Val{u, v.mag, 0, overflow};  // one rounding, bit-exact
    bool widens = (from == Scalar::Float16 || from == Scalar::BFloat16) ? to == Scalar::Float32 || to == Scalar::Float64
                                                                         : from == Scalar::Float32 && to == Scalar::Float64;
    if (v.err == 0) return Val{u, v.mag, 0, overflow};
    if (overflow || v.mag > type_max(to) / 2) return std::nullopt;
    return Val{u, v.mag, widens ? v.err : v.err + ulp(to, v.mag), false};
  }

  // A value of a's dtype whose shape broadcasts to a's: another value of the pool, a
  // reduction broadcast back (softmax's pattern), a fresh input with some dims 1, a value
  // of the same size reshaped, or a constant.
  Val partner(const Val& a) {
    const Shape& s = shape(a);
    for (int tries = 0; tries < 4; ++tries) {
      int64_t r = rng_.range(0, 9);
      std::vector<Val> c;
      if (r < 3) {
        for (const Val& p : pool_)
          if (broadcasts(shape(p), s)) c.push_back(p);
      } else if (r < 5) {
        for (const Val& p : pool_)
          if (shape(p) == s && !s.empty()) c.push_back(p);
      } else if (r < 7) {
        Shape t = s;
        for (int64_t& d : t)
          if (rng_.chance(0.4)) d = 1;
        if (!t.empty() && rng_.chance(0.3)) t.erase(t.begin());
        return input(dt(a), t);
      } else if (r < 9) {
        for (const Val& p : pool_)
          if (numel(shape(p)) == numel(s)) c.push_back(p);
      } else {
        return constant(dt(a));
      }
      if (c.empty()) continue;
      std::optional<Val> p = coerce(rng_.pick(c), dt(a));
      if (!p) continue;
      if (r < 3) return *p;
      if (r < 5) {
        if (auto red = reduce_over(*p, random_axes(shape(*p), true))) return *red;
        continue;
      }
      return Val{tb_.reshape(p->u, s), p->mag, p->err, p->wild};
    }
    return input(dt(a), s);
  }

  std::vector<int64_t> random_axes(const Shape& s, bool nonempty) {
    std::vector<int64_t> axes;
    for (size_t i = 0; i < s.size(); ++i)
      if (rng_.chance(0.5)) axes.push_back(static_cast<int64_t>(i));
    if (axes.empty() && nonempty && !s.empty()) axes.push_back(rng_.range(0, static_cast<int64_t>(s.size()) - 1));
    return axes;
  }

  // Magnitude and error of a float op's result from its operands' (the op's Lipschitz
  // bounds; a tainted operand also adds the result's rounding, a transcendental its ULP).
  Val float_result(const UOp* u, Op op, const std::vector<Val>& v) {
    Scalar s = u->dtype().scalar;
    bool wild = false, tainted = false;
    for (const Val& x : v) wild |= x.wild, tainted |= x.err > 0;
    if (wild) return {u, INFINITY, 0, true};
    auto M = [&](size_t i) { return v[i].mag; };
    auto E = [&](size_t i) { return v[i].err; };
    double mag = 0, err = 0;
    switch (op) {
      case Op::NEG: case Op::TRUNC: mag = M(0); err = E(0); break;
      case Op::ADD: case Op::SUB: mag = M(0) + M(1); err = E(0) + E(1); break;
      case Op::MUL: mag = M(0) * M(1); err = M(0) * E(1) + M(1) * E(0) + E(0) * E(1); break;
      case Op::FDIV: mag = M(0); err = E(0) + M(0) * E(1); break;  // divisor >= 1
      case Op::MAX: case Op::MIN: mag = std::max(M(0), M(1)); err = std::max(E(0), E(1)); break;
      case Op::MULACC: mag = M(0) * M(1) + M(2); err = M(0) * E(1) + M(1) * E(0) + E(0) * E(1) + E(2); break;
      case Op::WHERE: mag = std::max(M(1), M(2)); err = std::max(E(1), E(2)); break;
      case Op::SQRT: mag = std::sqrt(M(0)); err = E(0) / 2; break;  // argument >= 1 when tainted
      case Op::RECIPROCAL: mag = 1; err = E(0); break;              // argument >= 1
      case Op::EXP2: mag = std::exp2(M(0)); err = std::log(2.0) * mag * E(0) + ulp(s, mag); break;
      case Op::LOG2: mag = std::max(4.0, std::log2(std::max(M(0), 1.0))); err = E(0) / std::log(2.0) + ulp(s, mag); break;  // argument >= 1 when tainted
      case Op::SIN: mag = std::min(M(0), 1.0); err = E(0) + ulp(s, 1); break;
      case Op::POW: mag = 8; err = 48 * E(0) + 6 * E(1) + ulp(s, 8); break;  // base in [0.5, 2], exponent in [-3, 3]
      default: mag = INFINITY; break;
    }
    if (tainted) err += ulp(s, mag);
    return {u, mag, err, false};
  }

  // The magnitude of an integer op's result: interval bounds, or the type's whole range
  // where it may wrap (the value is exact either way).
  Val int_result(const UOp* u, Op op, const std::vector<Val>& v) {
    Scalar s = u->dtype().scalar;
    bool sgn = scalar_is_signed_int(s);
    double top = type_max(s), mag = top;
    switch (op) {
      case Op::NEG: mag = sgn ? v[0].mag : top; break;
      case Op::ADD: mag = v[0].mag + v[1].mag; break;
      case Op::SUB: mag = sgn ? v[0].mag + v[1].mag : top; break;
      case Op::MUL: mag = v[0].mag * v[1].mag; break;
      case Op::IDIV: case Op::MOD: mag = v[0].mag; break;
      case Op::MAX: case Op::MIN: mag = std::max(v[0].mag, v[1].mag); break;
      case Op::MULACC: mag = v[0].mag * v[1].mag + v[2].mag; break;
      case Op::WHERE: mag = std::max(v[1].mag, v[2].mag); break;
      default: break;
    }
    return {u, std::min(mag, top), 0, false};
  }

  Val result(Op op, const std::vector<Val>& v) {
    std::vector<const UOp*> src;
    for (const Val& x : v) src.push_back(x.u);
    const UOp* u = src.size() == 3 ? tb_.alu(op, {src[0], src[1], src[2]})
                 : src.size() == 2 ? tb_.alu(op, {src[0], src[1]})
                                   : tb_.alu(op, {src[0]});
    if (u->dtype().is_bool()) return {u, 1, 0, false};
    return scalar_is_float(u->dtype().scalar) ? float_result(u, op, v) : int_result(u, op, v);
  }

  // 1 + x*x: at least 1, for the ops below that need their argument away from zero.
  Val one_plus_square(const Val& x) {
    Val sq = result(Op::MUL, {x, x});
    return result(Op::ADD, {sq, constant_val(dt(x), 1.0)});
  }
  Val constant_val(Scalar s, double v) { return {tb_.full(s, v, {}), std::fabs(v), 0, false}; }

  std::optional<Val> unary(Val a) {
    Scalar s = dt(a);
    if (!is_float(a)) {
      if (s == Scalar::Bool) return std::nullopt;
      return result(Op::NEG, {a});
    }
    Op op = rng_.pick(std::vector<Op>{Op::NEG, Op::EXP2, Op::LOG2, Op::SIN, Op::SQRT, Op::RECIPROCAL, Op::TRUNC});
    bool exact = a.err == 0;
    if (a.wild && (op == Op::EXP2 || op == Op::LOG2 || op == Op::SIN)) return std::nullopt;  // exact ops only
    switch (op) {
      case Op::EXP2: {
        double c = s == Scalar::Float16 ? 6 : 10;
        return result(op, {clamp(a, -c, c)});
      }
      case Op::LOG2:  // the argument kept >= 1/16 (exact) or >= 1 (tainted)
        if (exact) return result(op, {result(Op::MAX, {a, constant_val(s, 0.0625)})});
        return result(op, {one_plus_square(clamp(a, -16, 16))});
      case Op::SQRT:
        if (exact || a.wild) return result(op, {a.wild ? a : result(Op::MAX, {a, constant_val(s, 0.0)})});
        return result(op, {one_plus_square(clamp(a, -16, 16))});
      case Op::RECIPROCAL:
        if (exact && rng_.chance(0.5)) return Val{tb_.alu(op, {a.u}), INFINITY, 0, true};  // 1/0 is inf
        if (a.wild) return std::nullopt;
        return result(op, {one_plus_square(clamp(a, -16, 16))});
      case Op::TRUNC:
        if (!exact) return std::nullopt;
        return result(op, {a});
      default: return result(op, {a});
    }
  }

  std::optional<Val> binary(Val a) {
    Scalar s = dt(a);
    std::vector<Op> ops;
    if (s == Scalar::Bool) ops = {Op::AND, Op::OR, Op::XOR, Op::MAX, Op::MIN, Op::CMPLT, Op::CMPNE, Op::CMPEQ};
    else if (scalar_is_float(s)) ops = {Op::ADD, Op::SUB, Op::MUL, Op::FDIV, Op::MAX, Op::MIN, Op::POW, Op::CMPLT, Op::CMPNE, Op::CMPEQ};
    else ops = {Op::ADD, Op::SUB, Op::MUL, Op::IDIV, Op::MOD, Op::MAX, Op::MIN, Op::CMPLT, Op::CMPNE,
                Op::CMPEQ, Op::AND, Op::OR, Op::XOR, Op::SHL, Op::SHR};
    Op op = rng_.pick(ops);
    Val b = partner(a);
    if (rng_.chance(0.5) && op != Op::POW && op != Op::FDIV) std::swap(a, b);  // either side broadcasts
    bool exact = a.err == 0 && b.err == 0, wild = a.wild || b.wild;
    if (is_comparison(op) && !exact) return std::nullopt;
    if (!scalar_is_float(s)) return result(op, {a, b});
    if (op == Op::POW) {
      if (wild) return std::nullopt;
      return result(op, {clamp(a, 0.5, 2), clamp(b, -3, 3)});
    }
    if (op == Op::FDIV) {
      if (exact && rng_.chance(0.5)) return Val{tb_.alu(op, {a.u, b.u}), INFINITY, 0, true};  // x/0 is inf or NaN
      if (wild) return std::nullopt;
      return result(op, {a, one_plus_square(clamp(b, -16, 16))});
    }
    if (wild && !exact) return std::nullopt;
    return result(op, {a, b});
  }

  std::optional<Val> ternary(Val a) {
    Scalar s = dt(a);
    if (s != Scalar::Bool && rng_.chance(0.3) && !a.wild) {
      Val b = partner(a), c = partner(a);
      if (b.wild || c.wild) return std::nullopt;
      if (is_float(a)) {  // keep the product's magnitude in range
        double cap = std::sqrt(mag_cap(s)) / 2;
        a = a.mag > cap ? clamp(a, -cap, cap) : a;
        b = b.mag > cap ? clamp(b, -cap, cap) : b;
      }
      return result(Op::MULACC, {a, b, c});
    }
    // WHERE: a condition from the pool (any bool broadcasting to a), or a comparison.
    std::vector<Val> conds;
    for (const Val& p : pool_)
      if (dt(p) == Scalar::Bool && broadcasts(shape(p), shape(a))) conds.push_back(p);
    Val cond;
    if (!conds.empty() && rng_.chance(0.5)) {
      cond = rng_.pick(conds);
    } else {
      if (a.err > 0) return std::nullopt;
      Val k = partner(a);
      if (k.err > 0) return std::nullopt;
      cond = result(rng_.pick(std::vector<Op>{Op::CMPLT, Op::CMPNE, Op::CMPEQ}), {a, k});
    }
    Val other = partner(a);
    if ((a.wild || other.wild) && (a.err > 0 || other.err > 0)) return std::nullopt;
    return result(Op::WHERE, {cond, a, other});
  }

  std::optional<Val> convert(Val a) {
    Scalar to = rng_.pick(o_.dtypes);
    if (rng_.chance(0.25)) return cast(a, to, /*bitcast=*/true);
    if (to == dt(a)) return std::nullopt;
    return cast(a, to);
  }

  std::optional<Val> movement(Val a) {
    Op op = rng_.pick(std::vector<Op>{Op::RESHAPE, Op::PERMUTE, Op::EXPAND, Op::PAD, Op::SHRINK, Op::FLIP});
    if (op == Op::EXPAND && shape(a).size() >= static_cast<size_t>(o_.max_rank)) op = Op::PERMUTE;
    return Val{random_movement(tb_, a.u, op, rng_, o_.max_numel), a.mag, a.err, a.wild};
  }

  // REDUCE_AXIS over `axes` with an op valid for a's dtype and value: Add and Mul of floats
  // first clamp so the result stays in range, and are tainted by reassociation.
  std::optional<Val> reduce_over(Val a, std::vector<int64_t> axes) {
    Scalar s = dt(a);
    std::vector<ReduceOp> ops{ReduceOp::Max, ReduceOp::Min};
    if (s != Scalar::Bool && !a.wild) ops.insert(ops.end(), {ReduceOp::Add, ReduceOp::Add, ReduceOp::Mul});
    ReduceOp op = rng_.pick(ops);
    double n = 1;
    bool empty = false;
    for (int64_t ax : axes) n *= static_cast<double>(shape(a)[ax]), empty |= shape(a)[ax] == 0;
    if (scalar_is_float(s) && op == ReduceOp::Add && n * a.mag > mag_cap(s)) a = clamp(a, -mag_cap(s) / n, mag_cap(s) / n);
    if (scalar_is_float(s) && op == ReduceOp::Mul && a.mag > 1) a = clamp(a, -1, 1);
    const UOp* u = tb_.reduce(a.u, op, axes);
    Val r{u, a.mag, a.err, a.wild};
    if (!scalar_is_float(s)) {
      if (op == ReduceOp::Add) r.mag = std::min(type_max(s), n * a.mag);
      else if (op == ReduceOp::Mul || empty) r.mag = type_max(s);
      return r;
    }
    if (op == ReduceOp::Max || op == ReduceOp::Min) {
      if (empty) r = {u, INFINITY, 0, true};  // the identity: -inf or +inf
      return r;
    }
    if (op == ReduceOp::Add) r.mag = n * a.mag;
    // Any order of the n terms, and a product fused into the accumulation (MULACC), is
    // within 2 (n - 1) u sum|terms| <= n ulp(n mag) of the interpreter's order.
    double reassoc = n >= 2 ? n * ulp(s, r.mag) : 0;
    r.err = n * a.err + reassoc + (a.err > 0 ? n * ulp(s, r.mag) : 0);
    return r;
  }

  std::optional<Val> reduce(Val a) {
    if (shape(a).empty()) return std::nullopt;
    auto r = reduce_over(a, random_axes(shape(a), !rng_.chance(0.05)));
    if (!r || !rng_.chance(0.4)) return r;
    Shape squeezed;  // keepdim=False, as frontends often write it
    for (int64_t d : shape(*r))
      if (d != 1) squeezed.push_back(d);
    r->u = tb_.reshape(r->u, squeezed);
    return r;
  }

  // A composite activation on a clamped float value, with a generous bound for what its
  // transcendentals and their amplification add.
  std::optional<Val> composite(Val a) {
    Scalar s = dt(a);
    if (!is_float(a) || a.wild) return std::nullopt;
    double c = s == Scalar::Float16 ? 4 : rng_.pick(std::vector<double>{2, 4, 6});
    Val x = clamp(a, -c, c);
    double u1 = ulp(s, 1), e = x.err;
    switch (rng_.range(0, 5)) {
      case 0: {
        double mag = std::exp(c);
        return Val{composites::exp(tb_, x.u), mag, mag * (1.5 * e + (e > 0 ? ulp(s, 1.5 * c) : 0)) + 2 * ulp(s, mag), false};
      }
      case 1: {
        Val y = one_plus_square(x);
        double mag = std::log(y.mag);
        return Val{composites::log(tb_, y.u), mag, y.err + 3 * ulp(s, std::max(1.5 * mag, 1.0)), false};
      }
      case 2: return Val{composites::sigmoid(tb_, x.u), 1, 0.3 * e + 6 * u1, false};
      case 3: return Val{composites::tanh(tb_, x.u), 1, 1.2 * e + 12 * u1, false};
      case 4: return Val{composites::gelu(tb_, x.u), c, 1.2 * e * (1 + c) + (c + 1) * 12 * u1, false};
      default: return Val{composites::erf(tb_, x.u), 1, 1.5 * e + 16 * u1, false};
    }
  }

  TensorBuilder& tb_;
  Rng rng_;
  Options o_;
  std::vector<Val> pool_;
  std::vector<const UOp*> inputs_;
  std::vector<bool> wide_;
};

// n's prime factors spread over `rank` dims (a 0 lands in one dim).
Shape random_factorization(Rng& rng, int64_t n, int rank) {
  Shape s(rank, 1);
  if (n == 0) {
    for (int64_t& d : s) d = rng.range(1, 3);
    s[rng.range(0, rank - 1)] = 0;
    return s;
  }
  for (int64_t p = 2; p * p <= n; ++p)
    while (n % p == 0) s[rng.range(0, rank - 1)] *= p, n /= p;
  if (n > 1) s[rng.range(0, rank - 1)] *= n;
  return s;
}

}  // namespace

std::vector<int64_t> random_shape(Rng& rng, int max_rank, int64_t max_numel, double zero_dim_chance) {
  static const std::vector<int64_t> kDims = {1, 1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 33, 64};
  int64_t rank = rng.range(1, max_rank), n = 1;
  Shape s;
  for (int64_t i = 0; i < rank; ++i) {
    int64_t d = rng.pick(kDims);
    if (n * d > max_numel) d = 1;
    s.push_back(d);
    n *= d;
  }
  if (rng.chance(zero_dim_chance)) s[rng.range(0, rank - 1)] = 0;
  return s;
}

const UOp* random_movement(TensorBuilder& tb, const UOp* x, Op op, Rng& rng, int64_t max_numel) {
  Shape s = tb.shape(x);
  if (s.empty() && op != Op::RESHAPE && op != Op::PERMUTE) {
    x = tb.reshape(x, {1});
    s = {1};
  }
  const int64_t rank = static_cast<int64_t>(s.size());
  switch (op) {
    case Op::RESHAPE: {
      for (int tries = 0; tries < 4; ++tries) {
        Shape t = random_factorization(rng, numel(s), static_cast<int>(rng.range(1, 4)));
        if (t != s) return tb.reshape(x, t);
      }
      return tb.reshape(x, {numel(s)});
    }
    case Op::PERMUTE: {
      std::vector<int64_t> p(s.size());
      std::iota(p.begin(), p.end(), 0);
      for (size_t i = p.size(); i > 1; --i) std::swap(p[i - 1], p[rng.range(0, static_cast<int64_t>(i) - 1)]);
      return tb.permute(x, p);
    }
    case Op::EXPAND: {
      std::vector<int64_t> ones;
      for (int64_t i = 0; i < rank; ++i)
        if (s[i] == 1) ones.push_back(i);
      if (ones.empty() || rng.chance(0.3)) {  // unsqueeze first
        int64_t at = rng.range(0, rank);
        s.insert(s.begin() + at, 1);
        x = tb.reshape(x, s);
        ones = {at};
      }
      Shape t = s;
      for (int64_t i : ones) {
        int64_t k = rng.range(2, 5);
        if (numel(t) * k <= max_numel) t[i] = k;
      }
      return tb.expand(x, t);
    }
    case Op::PAD: {
      Shape b(rank), e(rank), t = s;
      for (int64_t i = 0; i < rank; ++i) {
        b[i] = rng.range(0, 2), e[i] = rng.range(0, 2);
        t[i] += b[i] + e[i];
      }
      if (numel(t) > max_numel) std::fill(b.begin(), b.end(), 0), std::fill(e.begin(), e.end(), 0);  // a PAD by nothing
      return tb.pad(x, b, e);
    }
    case Op::SHRINK: {
      Shape b(rank), e(rank);
      for (int64_t i = 0; i < rank; ++i) {
        int64_t d = s[i];
        if (d == 0 || rng.chance(0.04)) {
          b[i] = e[i] = rng.range(0, d);  // an empty slice
          continue;
        }
        b[i] = rng.range(0, (d - 1) / 2);
        e[i] = d - rng.range(0, (d - b[i] - 1) / 2);
      }
      return tb.shrink(x, b, e);
    }
    default: {  // FLIP
      std::vector<bool> f(rank);
      for (int64_t i = 0; i < rank; ++i) f[i] = rng.chance(0.5);
      f[rng.range(0, rank - 1)] = true;
      return tb.flip(x, f);
    }
  }
}

RandomGraph generate(TensorBuilder& tb, uint64_t seed, const Options& options) {
  return Gen(tb, seed, options).run();
}

}  // namespace uop::randgraph
