// The dim algebra: folding, bounds, the evaluator, and equality / order decided exactly on
// canonical forms (kUnknown where the forms cannot decide).
#include "compiler/ir/dim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace uop {
namespace {

using ::testing::HasSubstr;

struct Dims {
  Graph g;
  const UOp* var(const char* name, int64_t lo, int64_t hi) {
    return g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{name, lo, hi});
  }
  const UOp* bind(const UOp* v, int64_t value) { return g.make(Op::BIND, dtypes::index, {v, g.idx(value)}); }
  const UOp* k(int64_t v) { return g.idx(v); }
  const UOp* add(const UOp* a, const UOp* b) { return g.alu(Op::ADD, {a, b}); }
  const UOp* sub(const UOp* a, const UOp* b) { return g.alu(Op::SUB, {a, b}); }
  const UOp* mul(const UOp* a, const UOp* b) { return g.alu(Op::MUL, {a, b}); }
  const UOp* div(const UOp* a, const UOp* b) { return g.alu(Op::IDIV, {a, b}); }
};

constexpr DimTruth kTrue = DimTruth::kTrue, kFalse = DimTruth::kFalse, kUnknown = DimTruth::kUnknown;

TEST(Dim, ArithmeticFolds) {
  Graph g;
  const UOp* v = g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"v", 0, 9});
  EXPECT_EQ(dim_add(g, g.idx(2), g.idx(3)), g.idx(5));
  EXPECT_EQ(dim_sub(g, g.idx(2), g.idx(3)), g.idx(-1));
  EXPECT_EQ(dim_mul(g, g.idx(4), g.idx(3)), g.idx(12));
  EXPECT_EQ(dim_add(g, v, g.idx(0)), v);
  EXPECT_EQ(dim_add(g, g.idx(0), v), v);
  EXPECT_EQ(dim_sub(g, v, g.idx(0)), v);
  EXPECT_EQ(dim_sub(g, v, v), g.idx(0));
  EXPECT_EQ(dim_mul(g, v, g.idx(1)), v);
  EXPECT_EQ(dim_mul(g, g.idx(0), v), g.idx(0));
  EXPECT_EQ(dim_mul(g, v, g.idx(2))->op(), Op::MUL);
  // An overflowing product stays a MUL node, and it may wrap: no bounds.
  const UOp* big = dim_mul(g, g.idx(int64_t{1} << 40), g.idx(int64_t{1} << 40));
  EXPECT_EQ(big->op(), Op::MUL);
  EXPECT_EQ(dim_max(big), INT64_MAX);
  EXPECT_EQ(dim_bounds(big).min, INT64_MIN);
}

TEST(Dim, Bounds) {
  Dims d;
  const UOp* a = d.var("a", 1, 8);
  const UOp* b = d.var("b", 2, 4);
  const UOp* ab = d.bind(a, 3);
  EXPECT_EQ(dim_bounds(ab).min, 1);  // a BIND counts as the variable's whole range
  EXPECT_EQ(dim_max(ab), 8);
  EXPECT_EQ(dim_max(d.mul(a, b)), 32);
  EXPECT_EQ(dim_max(d.div(a, b)), 4);
  EXPECT_EQ(dim_max(d.g.alu(Op::MOD, {a, d.k(5)})), 4);
  EXPECT_EQ(dim_bounds(d.sub(a, b)).min, -3);
  EXPECT_EQ(dim_max(d.g.alu(Op::MAX, {a, b})), 8);
  // Not a dim expression (a CAST): nothing known.
  EXPECT_EQ(dim_max(d.g.make(Op::CAST, dtypes::index, {d.g.cnst_int(dtypes::int32, 1)})), INT64_MAX);
  DimFacts facts;
  EXPECT_FALSE(facts.bounds(d.g.cnst(dtypes::float32, 1.0)).has_value());
  EXPECT_EQ(facts.bounds(d.add(a, b))->max, 12);
}

TEST(Dim, Evaluates) {
  Dims d;
  const UOp* a = d.var("a", 1, 8);
  const UOp* b = d.var("b", 0, 4);
  std::vector<std::pair<const UOp*, int64_t>> vars = {{a, 7}, {b, 3}};
  auto v = eval_dim(d.add(d.mul(a, d.k(16)), d.div(a, b)), vars);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 7 * 16 + 2);
  // eval.h's semantics: x / 0 = 0; a bool inside (WHERE) is evaluated as a bool.
  std::vector<std::pair<const UOp*, int64_t>> zero = {{a, 7}, {b, 0}};
  EXPECT_EQ(*eval_dim(d.div(a, b), zero), 0);
  const UOp* w = d.g.alu(Op::WHERE, {d.g.alu(Op::CMPLT, {a, b}), b, a});
  EXPECT_EQ(*eval_dim(w, vars), 7);
  // A BIND is its variable; without a value for the variable, the value it binds.
  EXPECT_EQ(*eval_dim(d.bind(a, 5), vars), 7);
  EXPECT_EQ(*eval_dim(d.bind(a, 5), {}), 5);
  auto unbound = eval_dim(d.add(a, d.k(1)), {});
  ASSERT_FALSE(unbound.ok());
  EXPECT_THAT(std::string(unbound.status().message()), HasSubstr("variable a is not bound [dim.var]"));
  auto bad = eval_dim(d.g.make(Op::CAST, dtypes::index, {d.g.cnst_int(dtypes::int32, 1)}), vars);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("CAST [dim.op]"));
}

TEST(Dim, EqualFormsAreEqual) {
  Dims d;
  const UOp* a = d.var("a", 1, 8);
  const UOp* b = d.var("b", 2, 4);
  EXPECT_EQ(dims_equal(d.mul(a, d.k(16)), d.mul(d.k(16), a)), kTrue);
  EXPECT_EQ(dims_equal(d.add(a, a), d.mul(d.k(2), d.bind(a, 3))), kTrue);  // BIND is its var
  EXPECT_EQ(dims_equal(d.mul(a, b), d.mul(b, a)), kTrue);
  // (a + b)(a - b) = a*a - b*b: distributivity, not just reordering.
  EXPECT_EQ(dims_equal(d.mul(d.add(a, b), d.sub(a, b)), d.sub(d.mul(a, a), d.mul(b, b))), kTrue);
  // Opaque terms are equal when their operands are: (a*b) / 3 and (b*a) / 3, and MAX is
  // commutative.
  EXPECT_EQ(dims_equal(d.div(d.mul(a, b), d.k(3)), d.div(d.mul(b, a), d.k(3))), kTrue);
  EXPECT_EQ(dims_equal(d.g.alu(Op::MAX, {a, b}), d.g.alu(Op::MAX, {b, a})), kTrue);
  EXPECT_EQ(dims_equal(d.add(d.div(a, b), a), d.add(a, d.div(a, b))), kTrue);
}

// Equal forms that evaluating at sample points cannot prove: an expression of thousands of
// nodes, and more variables than can be varied one at a time.
TEST(Dim, EqualFormsPastWhereSamplingGaveUp) {
  Dims d;
  const UOp* v = d.var("v", 1, 100);
  const UOp* deep = v;
  for (int i = 0; i < 3000; ++i) deep = d.sub(d.add(deep, d.k(i + 1)), d.k(i + 1));  // 6000 nodes
  EXPECT_EQ(dims_equal(deep, v), kTrue);
  EXPECT_EQ(dims_equal(deep, d.add(v, d.k(1))), kFalse);

  std::vector<const UOp*> vars;
  for (int i = 0; i < 24; ++i) vars.push_back(d.var(("x" + std::to_string(i)).c_str(), 0, 1000));
  const UOp* fwd = d.k(0);
  const UOp* back = d.k(0);
  for (size_t i = 0; i < vars.size(); ++i) {
    fwd = d.add(fwd, d.mul(vars[i], d.k(static_cast<int64_t>(i) + 1)));
    back = d.add(d.mul(d.k(static_cast<int64_t>(vars.size() - i)), vars[vars.size() - 1 - i]), back);
  }
  EXPECT_EQ(dims_equal(fwd, back), kTrue);
}

// Unequal forms that agree at many points, among them each variable's min, max, midpoint
// and bound value, where sampling would look: decided unequal exactly.
TEST(Dim, UnequalFormsThatAgreeAtManyPoints) {
  Dims d;
  const UOp* v = d.var("v", 0, 16);
  const UOp* bv = d.bind(v, 3);
  // v + v (v - 3)(v - 8)(v - 16) equals v at v = 0, 3, 8, 16 (min, bound, midpoint, max).
  const UOp* bump = d.mul(d.mul(v, d.sub(v, d.k(3))), d.mul(d.sub(v, d.k(8)), d.sub(v, d.k(16))));
  const UOp* lookalike = d.add(bv, bump);
  for (int64_t x : {0, 3, 8, 16}) {
    std::vector<std::pair<const UOp*, int64_t>> at = {{v, x}};
    ASSERT_EQ(*eval_dim(lookalike, at), *eval_dim(bv, at)) << x;
  }
  EXPECT_EQ(dims_equal(lookalike, bv), kFalse);  // degree 4 < 17 values of v
  // Forms that differ by a constant differ everywhere, whatever they hold.
  EXPECT_EQ(dims_equal(d.div(v, d.k(2)), d.add(d.div(v, d.k(2)), d.k(1))), kFalse);
  // Two variables: a*b against a*b + (a - 1)(a - 8)(b - 2)(b - 4), equal at all four corners.
  const UOp* a = d.var("a", 1, 8);
  const UOp* b = d.var("b", 2, 5);
  const UOp* corners = d.mul(d.mul(d.sub(a, d.k(1)), d.sub(a, d.k(8))), d.mul(d.sub(b, d.k(2)), d.sub(b, d.k(5))));
  EXPECT_EQ(dims_equal(d.add(d.mul(a, b), corners), d.mul(a, b)), kFalse);
}

// What the forms cannot decide is kUnknown, never a guess either way.
TEST(Dim, UndecidableIsUnknown) {
  Dims d;
  const UOp* a = d.var("a", 1, 8);
  const UOp* b = d.var("b", 2, 4);
  // Equal everywhere, but different opaque terms.
  EXPECT_EQ(dims_equal(d.g.alu(Op::MAX, {a, b}), d.g.alu(Op::WHERE, {d.g.alu(Op::CMPLT, {a, b}), b, a})), kUnknown);
  EXPECT_EQ(dims_equal(d.div(d.mul(a, d.k(2)), d.k(2)), a), kUnknown);
  // (b - 2)(b - 3)(b - 4) is zero at every value of b (degree 3 = its 3 values): equal
  // everywhere, though not as polynomials.
  const UOp* zero_on_box = d.mul(d.mul(d.sub(b, d.k(2)), d.sub(b, d.k(3))), d.sub(b, d.k(4)));
  EXPECT_EQ(dims_equal(d.add(a, zero_on_box), a), kUnknown);
  // Not a dim expression.
  EXPECT_EQ(dims_equal(a, d.g.cnst(dtypes::float32, 1.0)), kUnknown);
}

TEST(Dim, DifferentValuesAreUnequal) {
  Dims d;
  const UOp* a = d.var("a", 1, 8);
  const UOp* b = d.var("b", 2, 4);
  EXPECT_EQ(dims_equal(d.mul(a, b), d.mul(a, a)), kFalse);
  EXPECT_EQ(dims_equal(a, b), kFalse);
  EXPECT_EQ(dims_equal(d.k(3), d.k(4)), kFalse);
  EXPECT_EQ(dims_equal(d.add(a, d.k(9)), d.k(3)), kFalse);  // disjoint bounds
  // a / 2 against a: different opaque forms, told apart at a point where they differ.
  EXPECT_EQ(dims_equal(d.div(a, d.k(2)), a), kFalse);
}

TEST(Dim, Order) {
  Dims d;
  const UOp* a = d.var("a", 1, 8);
  const UOp* b = d.var("b", 2, 4);
  EXPECT_EQ(dims_le(b, d.k(4)), kTrue);   // bounds
  EXPECT_EQ(dims_le(d.k(5), b), kFalse);  // disjoint bounds
  // a <= a*b: a*b - a is multilinear and >= 0 at every corner of the box.
  EXPECT_EQ(dims_le(a, d.mul(a, b)), kTrue);
  EXPECT_EQ(dims_le(d.sub(d.mul(d.k(2), a), a), a), kTrue);  // equal forms
  EXPECT_EQ(dims_le(d.add(d.mul(a, b), d.k(1)), d.mul(b, a)), kFalse);
  EXPECT_EQ(dims_le(a, b), kFalse);  // a = 8, b = 4
  // v <= v*v holds for every integer, but v*v - v is not multilinear: undecided.
  const UOp* v = d.var("v", 0, 9);
  EXPECT_EQ(dims_le(v, d.mul(v, v)), kUnknown);
}

}  // namespace
}  // namespace uop
