// Test-only helpers for the symbolic tests: a short printer for small expressions, random
// values for an expression's leaves, and a generator of random well-typed scalar
// expressions over int32 / int8 / uint8 / index / bool / float32 / float16.
#pragma once

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compiler/ir/eval.h"
#include "compiler/ir/uop.h"
#include "compiler/support/strings.h"
#include "tests/unit/compiler/passes/expr_eval.h"

namespace uop::testing {

// ADD(x:int32, 3) style, for failure messages of small expressions.
inline std::string expr_str(const UOp* u, int depth = 0) {
  if (depth > 24) return "...";
  switch (u->op()) {
    case Op::CONST: return cat(u->const_value()->str(), ":", u->dtype().str());
    case Op::DEFINE_VAR: return cat(u->arg_as<DefineVarArg>().name, ":", u->dtype().str());
    case Op::RANGE: return cat("r", u->arg_as<RangeArg>().axis_id);
    default: break;
  }
  std::string out = cat(op_name(u->op()));
  if (u->op() == Op::CAST || u->op() == Op::BITCAST) out += cat("<", u->dtype().str(), ">");
  out += "(";
  for (size_t i = 0; i < u->num_src(); ++i) out += cat(i ? ", " : "", expr_str(u->src(i), depth + 1));
  return out + ")";
}

inline std::vector<const UOp*> leaves(const UOp* root) {
  std::vector<const UOp*> out;
  for (const UOp* u : toposort(root))
    if (u->op() == Op::DEFINE_VAR || u->op() == Op::RANGE) out.push_back(u);
  return out;
}

inline double random_float(std::mt19937_64& rng, Scalar t) {
  static const double kSpecial[] = {0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -3.0, 1e-3, 65504.0, 1e30,
                                    INFINITY, -INFINITY, std::numeric_limits<double>::quiet_NaN()};
  double v;
  if (rng() % 3 == 0) v = kSpecial[rng() % std::size(kSpecial)];
  else v = std::uniform_real_distribution<double>(-100, 100)(rng);
  return cast_value(ConstValue::Float(v), t).as_float();
}

// A random value for each leaf, inside its bounds (DEFINE_VAR's [min, max], RANGE's
// [0, end - 1] for a CONST end); floats anywhere, with the special values.
inline Env random_env(std::mt19937_64& rng, const std::vector<const UOp*>& ls) {
  Env env;
  for (const UOp* u : ls) {
    Scalar t = u->dtype().scalar;
    if (scalar_is_float(t)) {
      env[u] = ConstValue::Float(random_float(rng, t));
      continue;
    }
    int64_t lo = 0, hi = 0;
    if (u->op() == Op::DEFINE_VAR) {
      lo = u->arg_as<DefineVarArg>().min;
      hi = u->arg_as<DefineVarArg>().max;
    } else {
      hi = u->src(0)->const_value()->as_int() - 1;
    }
    // Bias toward the ends, where off-by-one mistakes live.
    uint64_t pick = rng() % 8;
    int64_t v = pick == 0 ? lo : pick == 1 ? hi
                : lo + static_cast<int64_t>(rng() % (static_cast<uint64_t>(hi - lo) + 1));
    env[u] = cast_value(ConstValue::Int(v), t);
  }
  return env;
}

// Random scalar expressions. Integer ones lean toward index arithmetic (affine sums, div
// and mod by small constants) so that the interesting rules get exercised.
class ExprGen {
 public:
  ExprGen(Graph& g, uint64_t seed) : g_(g), rng_(seed) {}

  const UOp* gen(DType t, int depth) {
    if (depth <= 0 || pick(5) == 0) return leaf(t);
    if (t.is_bool()) return gen_bool(depth);
    if (t.is_float()) return gen_float(t, depth);
    return gen_int(t, depth);
  }
  std::mt19937_64& rng() { return rng_; }

  // Index arithmetic as lowering makes it: sums of variables times constants plus a
  // constant, nested through div and mod by constants, under a div, mod or comparison.
  const UOp* gen_index_math(DType t, int depth) {
    const UOp* a = affine(t, depth);
    switch (pick(6)) {
      case 0: return g_.alu(Op::IDIV, {a, small_pos(t)});
      case 1: return g_.alu(Op::MOD, {a, small_pos(t)});
      case 2: return g_.alu(Op::CMPLT, {a, g_.cnst_int(t, range_in(-20, 40))});
      case 3: return g_.alu(Op::ADD, {g_.alu(Op::MUL, {g_.alu(Op::IDIV, {a, small_pos(t)}), small_pos(t)}),
                                      g_.alu(Op::MOD, {a, small_pos(t)})});
      case 4: {  // a split into axes n and m and joined again (a reshape's), maybe inexactly
        const UOp* n = small_pos(t);
        const UOp* inner = g_.alu(Op::MOD, {g_.alu(Op::IDIV, {a, pick(4) ? n : small_pos(t)}), small_pos(t)});
        return g_.alu(Op::ADD, {g_.alu(Op::MUL, {inner, pick(4) ? n : small_pos(t)}), g_.alu(Op::MOD, {a, n})});
      }
      default: return a;
    }
  }

 private:
  uint64_t pick(uint64_t n) { return rng_() % n; }
  int64_t range_in(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(pick(static_cast<uint64_t>(hi - lo) + 1)); }

  static int64_t tmin(DType t) {
    if (t.is_unsigned()) return 0;
    return t.is_index() ? -(int64_t{1} << 40) : -(int64_t{1} << (scalar_bits(t.scalar) - 1));
  }
  static int64_t tmax(DType t) {
    if (t.is_index()) return int64_t{1} << 40;
    int n = scalar_bits(t.scalar);
    return t.is_unsigned() ? (int64_t{1} << n) - 1 : (int64_t{1} << (n - 1)) - 1;
  }

  const UOp* int_const(DType t) {
    switch (pick(6)) {
      case 0: return g_.cnst_int(t, tmin(t));
      case 1: return g_.cnst_int(t, tmax(t));
      case 2: return g_.cnst_int(t, int64_t{1} << pick(6));
      default: return g_.cnst_int(t, range_in(-10, 10));
    }
  }

  const UOp* leaf(DType t) {
    // Reuse a variable half the time, so that like terms and x - x occur.
    std::vector<const UOp*>& pool = pool_[static_cast<int>(t.scalar)];
    if (!pool.empty() && pick(2) == 0) return pool[pick(pool.size())];
    const UOp* v = new_leaf(t);
    if (v->op() != Op::CONST) pool.push_back(v);
    return v;
  }

  const UOp* new_leaf(DType t) {
    std::string name = cat("v", vars_++);
    if (t.is_bool()) {
      if (pick(3) == 0) return g_.cnst_bool(pick(2) == 0);
      return g_.make(Op::DEFINE_VAR, t, {}, DefineVarArg{name, 0, 1});
    }
    if (t.is_float()) {
      if (pick(2) == 0) return g_.cnst(t, random_float(rng_, t.scalar));
      return g_.make(Op::DEFINE_VAR, t, {}, DefineVarArg{name, 0, 0});
    }
    if (pick(3) == 0) return int_const(t);
    if (t.is_index() && pick(2) == 0)
      return g_.make(Op::RANGE, t, {g_.idx(range_in(1, 16))}, RangeArg{static_cast<int64_t>(vars_), AxisType::Loop});
    int64_t lo, hi;
    switch (pick(4)) {
      case 0: lo = tmin(t); hi = tmax(t); break;             // anything
      case 1: lo = 0; hi = range_in(0, 20); break;           // small, nonnegative
      case 2: lo = range_in(-20, 0); hi = range_in(0, 20); break;
      default: lo = range_in(-5, 5); hi = lo + range_in(0, 40); break;
    }
    lo = std::max(lo, tmin(t));
    hi = std::min(hi, tmax(t));
    return g_.make(Op::DEFINE_VAR, t, {}, DefineVarArg{name, lo, std::max(lo, hi)});
  }

  const UOp* small_pos(DType t) { return g_.cnst_int(t, range_in(1, 9)); }

  const UOp* affine(DType t, int depth) {
    const UOp* sum = nullptr;
    for (int i = 0, n = 1 + static_cast<int>(pick(4)); i < n; ++i) {
      const UOp* term = depth > 0 && pick(3) == 0
                            ? g_.alu(pick(2) ? Op::IDIV : Op::MOD, {affine(t, depth - 1), small_pos(t)})
                            : leaf(t);
      if (pick(3)) term = g_.alu(Op::MUL, {term, g_.cnst_int(t, range_in(-4, 8))});
      sum = sum ? g_.alu(pick(4) ? Op::ADD : Op::SUB, {sum, term}) : term;
    }
    if (pick(2)) sum = g_.alu(Op::ADD, {sum, g_.cnst_int(t, range_in(-9, 9))});
    return sum;
  }

  const UOp* gen_int(DType t, int depth) {
    auto sub = [&] { return gen(t, depth - 1); };
    static const Op kBin[] = {Op::ADD, Op::SUB, Op::MUL, Op::IDIV, Op::MOD, Op::MAX, Op::MIN,
                              Op::AND, Op::OR, Op::XOR, Op::SHL, Op::SHR, Op::CMPLT};
    switch (pick(12)) {
      case 0: case 1: return g_.alu(Op::ADD, {sub(), pick(2) ? small_pos(t) : sub()});
      case 2: return g_.alu(Op::MUL, {sub(), small_pos(t)});
      case 3: return g_.alu(pick(2) ? Op::IDIV : Op::MOD, {sub(), small_pos(t)});
      case 4: return g_.alu(Op::ADD, {g_.alu(Op::MUL, {sub(), small_pos(t)}), sub()});
      case 5: return g_.alu(Op::NEG, {sub()});
      case 6: return g_.alu(Op::WHERE, {gen(dtypes::bool_, depth - 1), sub(), sub()});
      case 7: {
        static const DType kFrom[] = {dtypes::int32, dtypes::int8, dtypes::uint8, dtypes::index,
                                      dtypes::bool_, dtypes::float32, dtypes::float16};
        DType from = kFrom[pick(std::size(kFrom))];
        if (from == t) return sub();
        if ((t == dtypes::int8 && from == dtypes::uint8) || (t == dtypes::uint8 && from == dtypes::int8))
          if (pick(2)) return g_.make(Op::BITCAST, t, {gen(from, depth - 1)});
        return g_.make(Op::CAST, t, {gen(from, depth - 1)});
      }
      default: {
        Op op = kBin[pick(std::size(kBin) - 1)];  // CMPLT is for gen_bool
        const UOp* a = sub();
        return g_.alu(op, {a, pick(3) == 0 ? a : sub()});
      }
    }
  }

  const UOp* gen_bool(int depth) {
    static const DType kCmp[] = {dtypes::int32, dtypes::int8, dtypes::uint8, dtypes::index, dtypes::float32,
                                 dtypes::float16, dtypes::bool_};
    switch (pick(4)) {
      case 0: case 1: {
        DType t = kCmp[pick(std::size(kCmp))];
        static const Op kOps[] = {Op::CMPLT, Op::CMPNE, Op::CMPEQ};
        const UOp* a = gen(t, depth - 1);
        const UOp* b = pick(4) == 0 ? a : (t.is_int() && pick(2) ? int_const(t) : gen(t, depth - 1));
        return g_.alu(kOps[pick(3)], {a, b});
      }
      case 2: {
        static const Op kOps[] = {Op::AND, Op::OR, Op::XOR, Op::MAX, Op::MIN};
        const UOp* a = gen(dtypes::bool_, depth - 1);
        return g_.alu(kOps[pick(5)], {a, pick(3) == 0 ? a : gen(dtypes::bool_, depth - 1)});
      }
      default: return g_.alu(Op::WHERE, {gen(dtypes::bool_, depth - 1), gen(dtypes::bool_, depth - 1),
                                         gen(dtypes::bool_, depth - 1)});
    }
  }

  const UOp* gen_float(DType t, int depth) {
    auto sub = [&] { return gen(t, depth - 1); };
    static const Op kUn[] = {Op::NEG, Op::SQRT, Op::EXP2, Op::LOG2, Op::SIN, Op::RECIPROCAL, Op::TRUNC};
    static const Op kBin[] = {Op::ADD, Op::SUB, Op::MUL, Op::FDIV, Op::MAX, Op::MIN, Op::POW};
    switch (pick(7)) {
      case 0: return g_.alu(kUn[pick(std::size(kUn))], {sub()});
      case 1: return g_.alu(Op::MULACC, {sub(), sub(), sub()});
      case 2: return g_.alu(Op::WHERE, {gen(dtypes::bool_, depth - 1), sub(), sub()});
      case 3: {
        static const DType kFrom[] = {dtypes::int32, dtypes::int8, dtypes::index, dtypes::bool_,
                                      dtypes::float32, dtypes::float16};
        DType from = kFrom[pick(std::size(kFrom))];
        if (from == t) return sub();
        if (t == dtypes::float32 && from == dtypes::int32 && pick(2)) return g_.make(Op::BITCAST, t, {gen(from, depth - 1)});
        return g_.make(Op::CAST, t, {gen(from, depth - 1)});
      }
      default: {
        const UOp* a = sub();
        // Operands that are constants the identities look for: 0.0, -0.0, 1.0.
        static const double kIds[] = {0.0, -0.0, 1.0};
        const UOp* b = pick(3) == 0 ? a : pick(3) == 0 ? g_.cnst(t, kIds[pick(3)]) : sub();
        if (pick(2)) std::swap(a, b);
        return g_.alu(kBin[pick(std::size(kBin))], {a, b});
      }
    }
  }

  Graph& g_;
  std::mt19937_64 rng_;
  int vars_ = 0;
  std::vector<const UOp*> pool_[kNumScalars];
};

}  // namespace uop::testing
