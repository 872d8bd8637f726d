// symbolic: every rule is checked against evaluation of the original expression (the
// oracle is expr_eval.h, i.e. eval.h), per rule and on thousands of random expressions;
// and the rules must actually simplify what they claim to.
#include "compiler/passes/symbolic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "compiler/ir/value_range.h"
#include "compiler/rewrite/graph_rewrite.h"
#include "tests/unit/compiler/passes/expr_eval.h"
#include "tests/unit/compiler/passes/expr_gen.h"

namespace uop {
namespace {

using testing::Env;
using testing::eval_expr;
using testing::expr_str;
using testing::same_value;

// A tiny expression builder so the tests read like the expressions they check.
struct E {
  Graph* g;
  const UOp* u;
  E k(int64_t v) const { return {g, g->cnst_int(u->dtype(), v)}; }
  E bin(Op op, E b) const { return {g, g->alu(op, {u, b.u})}; }
  friend E operator+(E a, E b) { return a.bin(Op::ADD, b); }
  friend E operator-(E a, E b) { return a.bin(Op::SUB, b); }
  friend E operator*(E a, E b) { return a.bin(Op::MUL, b); }
  friend E operator+(E a, int64_t b) { return a + a.k(b); }
  friend E operator-(E a, int64_t b) { return a - a.k(b); }
  friend E operator*(E a, int64_t b) { return a * a.k(b); }
  friend E operator+(int64_t a, E b) { return b.k(a) + b; }
  friend E operator&(E a, E b) { return a.bin(Op::AND, b); }
  friend E operator|(E a, E b) { return a.bin(Op::OR, b); }
  friend E operator^(E a, E b) { return a.bin(Op::XOR, b); }
  friend E operator-(E a) { return {a.g, a.g->alu(Op::NEG, {a.u})}; }
};
E idiv(E a, int64_t b) { return a.bin(Op::IDIV, a.k(b)); }
E idiv(E a, E b) { return a.bin(Op::IDIV, b); }
E mod(E a, int64_t b) { return a.bin(Op::MOD, a.k(b)); }
E mod(E a, E b) { return a.bin(Op::MOD, b); }
E max_(E a, E b) { return a.bin(Op::MAX, b); }
E min_(E a, E b) { return a.bin(Op::MIN, b); }
E lt(E a, E b) { return a.bin(Op::CMPLT, b); }
E lt(E a, int64_t b) { return a.bin(Op::CMPLT, a.k(b)); }
E where_(E c, E a, E b) { return {a.g, a.g->alu(Op::WHERE, {c.u, a.u, b.u})}; }
E cast(E a, DType d) { return {a.g, a.g->make(Op::CAST, d, {a.u})}; }

size_t node_count(const UOp* u) { return toposort(u).size(); }

class SymbolicTest : public ::testing::Test {
 protected:
  E var(const char* name, int64_t lo, int64_t hi, DType d = dtypes::index) {
    return {&g, g.make(Op::DEFINE_VAR, d, {}, DefineVarArg{name, lo, hi})};
  }
  E fvar(const char* name, DType d = dtypes::float32) { return {&g, g.make(Op::DEFINE_VAR, d, {}, DefineVarArg{name, 0, 0})}; }
  E c(int64_t v, DType d = dtypes::index) { return {&g, g.cnst_int(d, v)}; }
  E f(double v, DType d = dtypes::float32) { return {&g, g.cnst(d, v)}; }
  E b(bool v) { return {&g, g.cnst_bool(v)}; }

  // Simplifies `e`, checks the result against evaluation of `e` at random points inside
  // the variables' bounds, and returns it.
  const UOp* simp(E e, int points = 200) {
    auto r = simplify(g, e.u);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return e.u;
    expect_equivalent(e.u, *r, points);
    return *r;
  }

  void expect_equivalent(const UOp* before, const UOp* after, int points) {
    EXPECT_EQ(before->dtype(), after->dtype()) << expr_str(before);
    std::mt19937_64 rng(before->id());
    auto ls = testing::leaves(before);
    for (int i = 0; i < points; ++i) {
      Env env = testing::random_env(rng, ls);
      auto want = eval_expr(before, env), got = eval_expr(after, env);
      ASSERT_TRUE(want.has_value()) << expr_str(before);
      ASSERT_TRUE(got.has_value()) << expr_str(after);
      if (!same_value(*want, *got)) {
        std::string vals;
        for (const UOp* l : ls) vals += cat(" ", expr_str(l), "=", env.at(l).str());
        ADD_FAILURE() << expr_str(before) << "\n  simplified to " << expr_str(after) << "\n  at" << vals
                      << ": " << want->str() << " vs " << got->str();
        return;
      }
    }
  }

  Graph g;
};

TEST_F(SymbolicTest, FoldsConstantsThroughEval) {
  EXPECT_EQ(simp(c(3, dtypes::int32) + c(4, dtypes::int32)), c(7, dtypes::int32).u);
  EXPECT_EQ(simp(c(127, dtypes::int8) + c(1, dtypes::int8)), c(-128, dtypes::int8).u);  // wraps
  EXPECT_EQ(simp(idiv(c(7, dtypes::int32), 0)), c(0, dtypes::int32).u);                // x / 0 = 0
  EXPECT_EQ(simp(mod(c(-7, dtypes::int32), 2)), c(-1, dtypes::int32).u);               // truncating
  EXPECT_EQ(simp(lt(c(2), c(3))), b(true).u);
  EXPECT_EQ(simp(f(1.0, dtypes::float16) + f(std::ldexp(1, -11), dtypes::float16)), f(1.0, dtypes::float16).u);
  const UOp* nan = simp(f(NAN) + f(1.0));
  ASSERT_TRUE(nan->is(Op::CONST));
  EXPECT_TRUE(std::isnan(nan->const_value()->as_float()));
  EXPECT_EQ(simp(max_(f(-0.0), f(0.0))), f(0.0).u);
  EXPECT_EQ(simp(cast(c(300, dtypes::int32), dtypes::int8)), c(44, dtypes::int8).u);
  EXPECT_EQ(simp(cast(f(1e10), dtypes::int32)), c(INT32_MAX, dtypes::int32).u);  // saturates
  E one_bits{&g, g.make(Op::BITCAST, dtypes::int32, {f(1.0).u})};
  EXPECT_EQ(simp(one_bits), c(0x3f800000, dtypes::int32).u);
  EXPECT_EQ(simp(where_(b(false), c(1), c(2))), c(2).u);
  E fma{&g, g.alu(Op::MULACC, {f(2.0).u, f(3.0).u, f(1.0).u})};
  EXPECT_EQ(simp(fma), f(7.0).u);
}

TEST_F(SymbolicTest, IntegerIdentities) {
  E x = var("x", -50, 50, dtypes::int32), y = var("y", -50, 50, dtypes::int32);
  EXPECT_EQ(simp(x * 1), x.u);
  EXPECT_EQ(simp(x + 0), x.u);
  EXPECT_EQ(simp(0 + x), x.u);
  EXPECT_EQ(simp(x - 0), x.u);
  EXPECT_EQ(simp(x * 0), c(0, dtypes::int32).u);
  EXPECT_EQ(simp(x - x), c(0, dtypes::int32).u);
  EXPECT_EQ(simp(idiv(x, 1)), x.u);
  EXPECT_EQ(simp(mod(x, 1)), c(0, dtypes::int32).u);
  EXPECT_EQ(simp(mod(x, x)), c(0, dtypes::int32).u);
  EXPECT_EQ(simp(idiv(x, 0)), c(0, dtypes::int32).u);
  EXPECT_EQ(simp(mod(x, 0)), x.u);
  EXPECT_EQ(simp(x & x), x.u);
  EXPECT_EQ(simp(x | x), x.u);
  EXPECT_EQ(simp(x ^ x), c(0, dtypes::int32).u);
  EXPECT_EQ(simp(x & c(-1, dtypes::int32)), x.u);
  EXPECT_EQ(simp(max_(x, x)), x.u);
  EXPECT_EQ(simp(min_(y, y)), y.u);
  EXPECT_EQ(simp(-(-x)), x.u);
  EXPECT_EQ(simp(lt(x, x)), b(false).u);
  EXPECT_EQ(simp(where_(lt(x, y), x, x)), x.u);
  EXPECT_EQ(simp(where_(b(true), x, y)), x.u);
  EXPECT_EQ(simp(cast(x, dtypes::int32)), x.u);
  // int8 -> int32 -> int64 is int8 -> int64; int32 -> int8 -> int32 is not the identity.
  E s = var("s", -128, 127, dtypes::int8);
  EXPECT_EQ(simp(cast(cast(s, dtypes::int32), dtypes::int64)), cast(s, dtypes::int64).u);
  EXPECT_EQ(simp(cast(cast(s, dtypes::float32), dtypes::int8)), s.u);
  E w = var("w", -1000, 1000, dtypes::int32);
  EXPECT_NE(simp(cast(cast(w, dtypes::int8), dtypes::int32)), w.u);
  // Unsigned: x - x still folds, without the signed canonical form.
  E u = var("u", 0, 255, dtypes::uint8);
  EXPECT_EQ(simp(u - u), c(0, dtypes::uint8).u);
  EXPECT_EQ(simp(idiv(u, c(255, dtypes::uint8))), simp(idiv(u, c(255, dtypes::uint8))));  // stays valid
}

TEST_F(SymbolicTest, BoolIdentities) {
  E p = var("p", 0, 1, dtypes::bool_), q = var("q", 0, 1, dtypes::bool_);
  EXPECT_EQ(simp(p & b(true)), p.u);
  EXPECT_EQ(simp(p & b(false)), b(false).u);
  EXPECT_EQ(simp(p | b(false)), p.u);
  EXPECT_EQ(simp(p | b(true)), b(true).u);
  EXPECT_EQ(simp(p ^ p), b(false).u);
  EXPECT_EQ(simp(where_(p, b(true), b(false))), p.u);
  EXPECT_EQ(simp(where_(q, p, p)), p.u);
  EXPECT_EQ(simp((p ^ b(true)) ^ b(true)), p.u);
}

TEST_F(SymbolicTest, FloatIdentitiesAreExactOnly) {
  E x = fvar("x"), h = fvar("h", dtypes::float16);
  EXPECT_EQ(simp(x * f(1.0)), x.u);
  EXPECT_EQ(simp(h * f(1.0, dtypes::float16)), h.u);
  EXPECT_EQ(simp(E{&g, g.alu(Op::FDIV, {x.u, f(1.0).u})}), x.u);
  EXPECT_EQ(simp(x + f(-0.0)), x.u);
  EXPECT_EQ(simp(x - f(0.0)), x.u);
  EXPECT_EQ(simp(-(-x)), x.u);
  EXPECT_EQ(simp(max_(x, x)), x.u);
  // Not identities for floats: -0.0 + 0.0 = +0.0, NaN * 0 = NaN, inf - inf = NaN, NaN < NaN.
  E sum = x + f(0.0);
  EXPECT_EQ(simp(sum), sum.u);
  E prod = x * f(0.0);
  EXPECT_EQ(simp(prod), prod.u);
  E diff = x - x;
  EXPECT_EQ(simp(diff), diff.u);
  E self_lt = lt(x, x);
  EXPECT_EQ(simp(self_lt), self_lt.u);
  E sub_negzero = x - f(-0.0);
  EXPECT_EQ(simp(sub_negzero), sub_negzero.u);
  // No reassociation: (x + 1) + 2 is not x + 3 in floats.
  E chain = (x + f(1.0)) + f(2.0);
  EXPECT_EQ(simp(chain), chain.u);
}

TEST_F(SymbolicTest, IndexArithmetic) {
  E x = var("x", 0, 100), y = var("y", 0, 100);
  EXPECT_EQ(simp((x + 3) + 4), (x + 7).u);
  EXPECT_EQ(simp((x * 2) * 3), (x * 6).u);
  EXPECT_EQ(simp((x + 1) * 4), (x * 4 + 4).u);
  EXPECT_EQ(simp(3 + x), (x + 3).u);
  EXPECT_EQ(simp(x * 3 + x * 4), (x * 7).u);
  EXPECT_EQ(simp(x + x), (x * 2).u);
  EXPECT_EQ(simp(x * 3 + x), (x * 4).u);
  EXPECT_EQ(simp(((x + 2) + y) + 5), ((x + y) + 7).u);
  EXPECT_EQ(simp((y + x * 2) + x * 5), (y + x * 7).u);
  EXPECT_EQ(simp((((x * 2 + y) + x * 3) + 1) + 4), (x * 5 + y + 5).u);  // like terms apart
  EXPECT_EQ(simp(((x + y) + x * -1) + y * -1), c(0).u);
  EXPECT_EQ(simp((x + y) * 3), (x * 3 + y * 3).u);
  EXPECT_EQ(simp((x - 3) + 3), x.u);
  EXPECT_EQ(simp((x + y) - y), x.u);
  EXPECT_EQ(simp(x * 4 - x * 4), c(0).u);
  EXPECT_EQ(simp(idiv(x, 6) * 6 + mod(x, 6)), x.u);
  EXPECT_EQ(simp((y + mod(x, 6)) + idiv(x, 6) * 6), (y + x).u);
}

TEST_F(SymbolicTest, DivModWithBounds) {
  E x = var("x", 0, 10), y = var("y", 0, 3), n = var("n", -5, 5);
  EXPECT_EQ(simp(idiv(x * 4 + 3, 4)), x.u);
  EXPECT_EQ(simp(mod(x * 4 + 3, 4)), c(3).u);
  EXPECT_EQ(simp(idiv(x * 4 + y, 4)), x.u);
  EXPECT_EQ(simp(mod(x * 4 + y, 4)), y.u);
  EXPECT_EQ(simp(idiv(y, 8)), c(0).u);
  EXPECT_EQ(simp(mod(x, 16)), x.u);
  EXPECT_EQ(simp(idiv(idiv(x, 2), 3)), idiv(x, 6).u);
  EXPECT_EQ(simp(mod(mod(x, 8), 4)), mod(x, 4).u);
  EXPECT_EQ(simp(idiv(x * 6, 3)), (x * 2).u);
  EXPECT_EQ(simp(idiv(x * 2, 6)), idiv(x, 3).u);
  EXPECT_EQ(simp(mod(x * 6, 3)), c(0).u);
  EXPECT_EQ(simp(idiv(n * 4, 4)), n.u);  // exact whatever the sign
  EXPECT_EQ(simp(idiv(x * 16 + y * 4 + 2, 4)), (x * 4 + y).u);
  EXPECT_EQ(simp(idiv(x * 4 - 1 + 4, 4)), x.u);
  // Truncation makes the sign matter: (n*4 + 3) / 4 is not n for n < 0 (n = -1 gives 0).
  const UOp* r = simp(idiv(n * 4 + 3, 4));
  EXPECT_NE(r, n.u);
  // Nor is (x*4 - 1) / 4 equal to x - 1 when x can be 0.
  EXPECT_NE(simp(idiv(x * 4 - 1, 4)), (x - 1).u);
  E z = var("z", 1, 10);
  EXPECT_EQ(simp(idiv(z * 4 - 1, 4)), simp(z - 1));
  // With a negative dividend range and a negative remainder the ceiling split applies.
  E m = var("m", -10, 0);
  EXPECT_EQ(simp(idiv(m * 4 - 3, 4)), m.u);
  EXPECT_EQ(simp(mod(m * 4 - 3, 4)), c(-3).u);
}

// A coefficient above the divisor reduces modulo it under a MOD: a convolution's window
// read through movement ops, (x + 11 u) % 10 for a padded row of 10, is x + u in range.
TEST_F(SymbolicTest, ModReducesCoefficientsAboveTheDivisor) {
  E x = var("x", 0, 7), u = var("u", 0, 2), y = var("y", 0, 9), n = var("n", -3, 3);
  EXPECT_EQ(simp(mod(x + u * 11, 10)), simp(x + u));
  EXPECT_EQ(simp(mod(x * 21 + u, 10)), simp(x + u));
  // Out of range it stays a MOD, of the reduced sum: (y + 11 u) % 10 = (y + u) % 10.
  EXPECT_EQ(simp(mod(y + u * 11, 10)), simp(mod(y + u, 10)));
  // A factor that may be negative keeps its coefficient (truncating MOD follows the sign).
  const UOp* kept = simp(mod(n * 11 + x, 10));
  EXPECT_NE(kept, simp(mod(n + x, 10)));
  // A quotient is not split so: it would be bounded more loosely than before.
  EXPECT_EQ(simp(idiv(x + u * 11, 10)), idiv(x + u * 11, 10).u);
}

TEST_F(SymbolicTest, UnflattensRowMajorIndices) {
  // A (5, 3, 4, 6) tensor's flat index in Horner form, as rangeify writes it, and the
  // div / mod that a reshape back to its axes produces.
  auto range = [&](int64_t axis, int64_t end) {
    return E{&g, g.make(Op::RANGE, dtypes::index, {g.idx(end)}, RangeArg{axis, AxisType::Loop})};
  };
  E r0 = range(0, 5), r1 = range(1, 3), r2 = range(2, 4), r3 = range(3, 6);
  E flat = ((r0 * 3 + r1) * 4 + r2) * 6 + r3;
  EXPECT_EQ(simp(mod(flat, 6)), r3.u);
  EXPECT_EQ(simp(mod(idiv(flat, 6), 4)), r2.u);
  EXPECT_EQ(simp(mod(idiv(flat, 24), 3)), r1.u);
  EXPECT_EQ(simp(idiv(flat, 72)), r0.u);
  EXPECT_EQ(simp(idiv(flat, 24)), (r0 * 3 + r1).u);
  EXPECT_EQ(simp(idiv(flat, 6) * 6 + mod(flat, 6)), simp(flat));
}

TEST_F(SymbolicTest, RejoinsAFlatIndexSplitIntoItsAxes) {
  // A padded image's read of its unpadded source: the flat position (c, y - 1, x - 1), split
  // into the source's axes by a reshape. Outside the pad's gate it is negative or past a row,
  // so no bound makes the divisions vanish; the split and the join cancel regardless.
  auto range = [&](int64_t axis, int64_t end) {
    return E{&g, g.make(Op::RANGE, dtypes::index, {g.idx(end)}, RangeArg{axis, AxisType::Loop})};
  };
  E ch = range(0, 4), y = range(1, 7), x = range(2, 7);
  E flat = ch * 25 + y * 5 + x - 6;
  E split = mod(flat, 5) + mod(idiv(flat, 5), 5) * 5 + mod(idiv(flat, 25), 4) * 25 + idiv(flat, 100) * 100;
  EXPECT_EQ(simp(split), simp(flat));
  // In any order, scaled alike, and stopping at any axis.
  EXPECT_EQ(simp(mod(idiv(flat, 5), 5) * 15 + x + mod(flat, 5) * 3), simp(x + mod(flat, 25) * 3));
  E n = var("n", -1000, 1000, dtypes::int32);
  EXPECT_EQ(simp(idiv(n, 7) * 7 * 2 + mod(n, 7) * 2), simp(n * 2));
  // Not when the scales disagree, or the inner divisor is not the outer modulus.
  EXPECT_NE(simp(mod(flat, 5) + mod(idiv(flat, 5), 5) * 6), simp(mod(flat, 25)));
  EXPECT_NE(simp(mod(flat, 5) + mod(idiv(flat, 4), 5) * 5), simp(mod(flat, 25)));
}

TEST_F(SymbolicTest, DividesOutAFactorOfTheDivisor) {
  // Weights [M, C, K] stored in blocks of B = 16 channels ([M / 16, C, K, 16]) read back as
  // [M, C, K], with C K = 1152: the block of channel m at step r (below C K) is
  // (m * 1152 + r) / 18432 = m / 16, even though no coefficient is a multiple of the
  // divisor. A remainder is left whole (what a pad's gate bounds).
  E m = var("m", 0, 127), c = var("c", 0, 127), k = var("k", 0, 8), l = var("l", 0, 7), m0 = var("m0", 0, 15);
  E r = c * 9 + k;
  EXPECT_EQ(simp(idiv(m * 1152 + r, 18432)), simp(idiv(m, 16)));
  EXPECT_EQ(simp(mod(m * 1152 + r, 18432)), mod(m * 1152 + r, 18432).u);
  // A tile's row m = 8 m0 + l, as the schedule leaves it.
  EXPECT_EQ(simp(idiv((m0 * 8 + l) * 1152 + r, 18432)), simp(idiv(m0 * 8 + l, 16)));
  // Not where the rest can reach the factor (k up to 1152 here), or may be negative.
  E big = var("big", 0, 1152), neg = var("neg", -1, 5);
  EXPECT_EQ(simp(idiv(m * 1152 + big, 18432)), idiv(m * 1152 + big, 18432).u);
  EXPECT_EQ(simp(idiv(m * 1152 + neg, 18432)), idiv(m * 1152 + neg, 18432).u);
}

TEST_F(SymbolicTest, ComparisonsAndMinMaxByBounds) {
  E x = var("x", 0, 9), y = var("y", 10, 20);
  EXPECT_EQ(simp(lt(x, 10)), b(true).u);
  EXPECT_EQ(simp(lt(x, y)), b(true).u);
  EXPECT_EQ(simp(lt(y, x)), b(false).u);
  EXPECT_EQ(simp(lt(x, 0)), b(false).u);
  E open = lt(x, 5);
  EXPECT_EQ(simp(open), open.u);
  EXPECT_EQ(simp(max_(x, y)), y.u);
  EXPECT_EQ(simp(min_(x, y)), x.u);
  EXPECT_EQ(simp(max_(x, c(0))), x.u);
  EXPECT_EQ(simp(lt(x + 3, 7)), lt(x, 4).u);
  EXPECT_EQ(simp(lt(x * 4, 10)), lt(x, 3).u);
  EXPECT_EQ(simp(where_(lt(x, 10), x, y)), x.u);
  EXPECT_EQ(simp(E{&g, g.alu(Op::CMPNE, {x.u, y.u})}), b(true).u);
  // A value whose bounds are one point is that constant.
  E p = var("p", 0, 3);
  EXPECT_EQ(simp(idiv(p, 4) + 2), c(2).u);
  EXPECT_EQ(simp(p & c(0)), c(0).u);
  // int8 wraps: x + 100 < 0 is not "false" even though x >= 0.
  E s = var("s", 0, 100, dtypes::int8);
  E wraps = lt(s + c(100, dtypes::int8), c(0, dtypes::int8));
  EXPECT_NE(simp(wraps), b(false).u);
}

TEST_F(SymbolicTest, IndexOverflowIsNotAssumedAway) {
  // index evaluates as int64: x * 2^62 wraps, so (x * 2^62) / 2^62 is not x.
  E x = var("x", 0, 100);
  int64_t big = int64_t{1} << 62;
  E e = idiv(x * big, big);
  EXPECT_NE(simp(e), x.u);
  E small = idiv(x * 1024, 1024);
  EXPECT_EQ(simp(small), x.u);
}

TEST_F(SymbolicTest, SimplifyingShrinksFoldableGraphs) {
  E x = var("x", 0, 10), y = var("y", 0, 3);
  // The flattened index of a (11, 4) tensor unflattened again.
  E flat = x * 4 + y;
  E e = idiv(flat, 4) * 4 + mod(flat, 4) + (c(2) * c(3) - 6) + x * 0;
  const UOp* r = simp(e);
  EXPECT_LT(node_count(r), node_count(e.u));
  EXPECT_EQ(r, flat.u);
  E deep = x;
  for (int i = 0; i < 50; ++i) deep = (deep + 1) * 1;
  const UOp* rd = simp(deep);
  EXPECT_EQ(rd, (x + 50).u);
}

TEST_F(SymbolicTest, RulesAreScalarOnly) {
  // A vector x * 1 is left alone: vectors are devectorized before symbolic runs.
  const UOp* v = g.make(Op::DEFINE_VAR, dtypes::int32.vec(4), {}, DefineVarArg{"v", 0, 9});
  const UOp* e = g.alu(Op::MUL, {v, g.cnst_int(dtypes::int32.vec(4), 1)});
  auto r = simplify(g, e);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, e);
}

TEST_F(SymbolicTest, ValueRangeBasics) {
  ValueRange vr;
  E x = var("x", -3, 7), y = var("y", 2, 5);
  EXPECT_EQ(vr((x * y).u), std::make_pair(int64_t{-15}, int64_t{35}));
  EXPECT_EQ(vr(idiv(x, 2).u), std::make_pair(int64_t{-1}, int64_t{3}));
  EXPECT_EQ(vr(mod(x, 4).u), std::make_pair(int64_t{-3}, int64_t{3}));
  EXPECT_EQ(vr(mod(y, 8).u), std::make_pair(int64_t{2}, int64_t{5}));
  EXPECT_EQ(vr(idiv(x, y).u), std::make_pair(int64_t{-1}, int64_t{3}));
  const UOp* r = g.make(Op::RANGE, dtypes::index, {y.u}, RangeArg{0, AxisType::Loop});
  EXPECT_EQ(vr(r), std::make_pair(int64_t{0}, int64_t{4}));
  EXPECT_EQ(vr(lt(x, 8).u), std::make_pair(int64_t{1}, int64_t{1}));
  EXPECT_EQ(vr(lt(x, 0).u), std::make_pair(int64_t{0}, int64_t{1}));
  // int8 that may wrap: the full range.
  E s = var("s", 0, 100, dtypes::int8);
  EXPECT_EQ(vr((s + c(100, dtypes::int8)).u), std::make_pair(int64_t{-128}, int64_t{127}));
  EXPECT_EQ(vr((s + c(27, dtypes::int8)).u), std::make_pair(int64_t{27}, int64_t{127}));
  E d = var("d", 0, 3, dtypes::int32);
  EXPECT_EQ(vr(idiv(c(10, dtypes::int32), d).u), std::make_pair(int64_t{0}, int64_t{10}));  // 10 / 0 = 0
  EXPECT_EQ(vr(fvar("f").u), std::make_pair(INT64_MIN, INT64_MAX));
  // Assumed bounds (what a gate guarantees) replace the computed ones.
  ValueRange gated({{x.u, {0, 3}}});
  EXPECT_EQ(gated((x * 2 + 1).u), std::make_pair(int64_t{1}, int64_t{7}));
  // Deep chains are fine.
  E deep = x;
  for (int i = 0; i < 100'000; ++i) deep = deep + 1;
  EXPECT_EQ(vr(deep.u), std::make_pair(int64_t{99'997}, int64_t{100'007}));
}

// Simplifies random expressions and evaluates original and result at random points: they
// must give the same value, bit for bit (any NaN for a NaN). Counts the rules that fired.
struct RandomRun {
  std::map<std::string, int> fired;
  size_t nodes_before = 0, nodes_after = 0;

  void run(int exprs, uint64_t base_seed, const std::function<const UOp*(testing::ExprGen&, int)>& make) {
    constexpr int kPoints = 48;
    for (int i = 0; i < exprs; ++i) {
      uint64_t seed = base_seed + i;
      Graph g;
      testing::ExprGen gen(g, seed);
      const UOp* e = make(gen, i);
      ValueRange vr;
      rw::RewriteOptions opt;
      opt.trace = [&](const rw::Rule& r, const UOp*, const UOp*) { ++fired[r.name()]; };
      auto r = rw::graph_rewrite(g, e, symbolic_rules(), &vr, opt);
      ASSERT_TRUE(r.ok()) << "seed " << seed << ": " << r.status() << "\n  " << expr_str(e);
      const UOp* s = *r;
      ASSERT_EQ(s->dtype(), e->dtype()) << "seed " << seed << "\n  " << expr_str(e) << "\n  -> " << expr_str(s);
      nodes_before += node_count(e);
      nodes_after += node_count(s);
      // Simplifying again changes nothing: the result is a fixed point.
      auto again = simplify(g, s);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(*again, s) << "seed " << seed << ": not a fixed point\n  " << expr_str(s);
      auto ls = testing::leaves(e);
      for (int p = 0; p < kPoints; ++p) {
        Env env = testing::random_env(gen.rng(), ls);
        auto want = eval_expr(e, env);
        auto got = eval_expr(s, env);
        ASSERT_TRUE(want.has_value()) << "seed " << seed << ": original does not evaluate\n  " << expr_str(e);
        ASSERT_TRUE(got.has_value()) << "seed " << seed << ": simplified does not evaluate\n  " << expr_str(s);
        if (!same_value(*want, *got)) {
          std::string vals;
          for (const UOp* l : ls) vals += cat(" ", expr_str(l), "=", env.at(l).str());
          FAIL() << "seed " << seed << "\n  original   " << expr_str(e) << "\n  simplified " << expr_str(s)
                 << "\n  at" << vals << "\n  values " << want->str() << " vs " << got->str();
        }
      }
    }
  }
  std::string summary() const {
    std::string out = cat("nodes ", nodes_before, " -> ", nodes_after, "; rules fired:");
    for (const auto& [name, n] : fired) out += cat(" ", name, "=", n);
    return out;
  }
};

TEST(SymbolicRandom, SimplifiedEqualsOriginalEverywhere) {
  const DType kTypes[] = {dtypes::int32, dtypes::int8, dtypes::uint8, dtypes::index,
                          dtypes::bool_, dtypes::float32, dtypes::float16};
  RandomRun run;
  run.run(4000, 0x5eed0000, [&](testing::ExprGen& gen, int i) {
    return gen.gen(kTypes[i % std::size(kTypes)], 2 + i % 4);
  });
  std::printf("%s\n", run.summary().c_str());
  EXPECT_LT(run.nodes_after, run.nodes_before);
  // The generator reaches the rules this test exists for.
  for (const char* rule : {"fold.const", "fold.bounds", "add.consts", "commute.const", "mul.one",
                           "add.negzero", "sub.to_add", "mod.small", "where.same", "cast.cast"})
    EXPECT_GT(run.fired[rule], 0) << rule;
}

TEST(SymbolicRandom, IndexMathEqualsOriginalEverywhere) {
  const DType kTypes[] = {dtypes::index, dtypes::int32, dtypes::int8, dtypes::uint8};
  RandomRun run;
  run.run(4000, 0xd1f0000, [&](testing::ExprGen& gen, int i) {
    return gen.gen_index_math(kTypes[i % std::size(kTypes)], 1 + i % 3);
  });
  std::printf("%s\n", run.summary().c_str());
  EXPECT_LT(run.nodes_after, run.nodes_before);
  for (const char* rule : {"divmod.split", "add.collect", "add.hoist_const", "mul.distribute", "idiv.idiv",
                           "mod.mod", "lt.add_const", "lt.mul_const", "divmod.recombine", "divmod.refold"})
    EXPECT_GT(run.fired[rule], 0) << rule;
}

// Every value an integer expression takes lies inside its ValueRange.
TEST(ValueRangeRandom, BoundsHoldEveryValue) {
  const DType kTypes[] = {dtypes::int32, dtypes::int8, dtypes::uint8, dtypes::index, dtypes::bool_};
  for (int i = 0; i < 3000; ++i) {
    uint64_t seed = 0xb0d0000 + i;
    Graph g;
    testing::ExprGen gen(g, seed);
    DType t = kTypes[i % std::size(kTypes)];
    const UOp* e = i % 2 && !t.is_bool() ? gen.gen_index_math(t, 2) : gen.gen(t, 2 + i % 4);
    ValueRange vr;
    auto ls = testing::leaves(e);
    auto nodes = toposort(e);
    for (int p = 0; p < 24; ++p) {
      Env env = testing::random_env(gen.rng(), ls);
      for (const UOp* n : nodes) {
        if (!ValueRange::bounded(n->dtype())) continue;
        auto v = eval_expr(n, env);
        ASSERT_TRUE(v.has_value());
        int64_t x = v->kind() == ConstValue::Kind::UInt ? static_cast<int64_t>(v->as_uint()) : v->to_int();
        auto [lo, hi] = vr(n);
        ASSERT_TRUE(lo <= x && x <= hi) << "seed " << seed << ": " << expr_str(n) << " = " << x
                                        << " outside [" << lo << ", " << hi << "]";
      }
    }
  }
}

// may_wrap is what the bounds proof trusts to reason about exact integers: wherever an
// op's wrapped result differs from its exact one at some point, it must say so.
TEST(ValueRangeRandom, MayWrapHoldsWhereverTheExactResultLeavesTheDtype) {
  const DType kTypes[] = {dtypes::int32, dtypes::int8, dtypes::uint8, dtypes::index, dtypes::int16};
  int wrapped = 0;
  for (int i = 0; i < 3000; ++i) {
    uint64_t seed = 0x3a70000 + i;
    Graph g;
    testing::ExprGen gen(g, seed);
    DType t = kTypes[i % std::size(kTypes)];
    const UOp* e = i % 2 ? gen.gen_index_math(t, 3) : gen.gen(t, 3);
    ValueRange vr;
    auto ls = testing::leaves(e);
    auto nodes = toposort(e);
    auto exact = [](const ConstValue& v) {
      return v.kind() == ConstValue::Kind::UInt ? static_cast<__int128>(v.as_uint()) : static_cast<__int128>(v.to_int());
    };
    for (int p = 0; p < 16; ++p) {
      Env env = testing::random_env(gen.rng(), ls);
      for (const UOp* n : nodes) {
        if (!ValueRange::bounded(n->dtype()) || n->dtype().is_bool() || n->num_src() == 0) continue;
        std::vector<__int128> a;
        bool all = true;
        for (const UOp* s : n->src()) {
          auto v = eval_expr(s, env);
          all = all && v && v->kind() != ConstValue::Kind::Float;
          if (all) a.push_back(exact(*v));
        }
        auto v = eval_expr(n, env);
        if (!all || !v) continue;
        std::optional<__int128> want;
        switch (n->op()) {
          case Op::ADD: want = a[0] + a[1]; break;
          case Op::SUB: want = a[0] - a[1]; break;
          case Op::MUL: want = a[0] * a[1]; break;
          case Op::NEG: want = -a[0]; break;
          case Op::IDIV: want = a[1] == 0 ? 0 : a[0] / a[1]; break;
          case Op::SHL: want = a[0] * (__int128{1} << (static_cast<uint64_t>(a[1]) % scalar_bits(n->dtype().scalar))); break;
          case Op::CAST: want = a[0]; break;
          default: break;
        }
        if (!want || *want == exact(*v)) continue;
        ++wrapped;
        ASSERT_TRUE(vr.may_wrap(n)) << "seed " << seed << ": " << expr_str(n) << " wraps to " << v->str();
      }
    }
  }
  EXPECT_GT(wrapped, 100);  // the test saw wrapping, so it could fail
}

}  // namespace
}  // namespace uop
