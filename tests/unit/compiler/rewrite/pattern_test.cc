// The pattern DSL: every matcher feature with a case that matches and one that does not.
#include "compiler/rewrite/pattern.h"

#include <gtest/gtest.h>

namespace uop::rw {
namespace {

class PatternTest : public ::testing::Test {
 protected:
  const UOp* ivar(const char* name, DType d = dtypes::int32) {
    return g.make(Op::DEFINE_VAR, d, {}, DefineVarArg{name, 0, 100});
  }
  // The ids of the captures a one-rule set binds first on `u`, or "<none>".
  std::string match(const Pat& p, const UOp* u, std::vector<std::string> names = {}) {
    std::string out = "<none>";
    RuleSet rs("test");
    rs.add(p, [&](const Match& m) -> const UOp* {
      if (out != "<none>") return nullptr;  // keep the first binding
      out.clear();
      for (const auto& n : names) out += (out.empty() ? "" : " ") + std::to_string(m[n]->id());
      return nullptr;  // decline: the matcher goes on through the other bindings
    }, "probe");
    rs.apply(g, u);
    return out;
  }
  bool matches(const Pat& p, const UOp* u) { return match(p, u) != "<none>"; }
  std::string id(const UOp* u) { return std::to_string(u->id()); }

  Graph g;
};

TEST_F(PatternTest, OpsSetsAndAny) {
  const UOp *a = ivar("a"), *b = ivar("b");
  const UOp* add = g.alu(Op::ADD, {a, b});
  const UOp* mul = g.alu(Op::MUL, {a, b});
  EXPECT_TRUE(matches(op(Op::ADD), add));
  EXPECT_FALSE(matches(op(Op::ADD), mul));
  EXPECT_TRUE(matches(op({Op::ADD, Op::MUL}), mul));
  EXPECT_FALSE(matches(op({Op::SUB, Op::MAX}), mul));
  EXPECT_TRUE(matches(any(), a));
  EXPECT_TRUE(matches(op(alu_ops()), add));
  EXPECT_FALSE(matches(op(alu_ops()), a));
  // Exact source count.
  EXPECT_TRUE(matches(op(Op::ADD, {any(), any()}), add));
  EXPECT_FALSE(matches(op(Op::ADD, {any()}), add));
}

TEST_F(PatternTest, CommutativeTriesBothOrders) {
  const UOp *a = ivar("a"), *two = g.cnst_int(dtypes::int32, 2);
  EXPECT_EQ(match(var("x") + cvar("c"), g.alu(Op::ADD, {two, a}), {"x", "c"}), id(a) + " " + id(two));
  EXPECT_EQ(match(var("x") + cvar("c"), g.alu(Op::ADD, {a, two}), {"x", "c"}), id(a) + " " + id(two));
  // Not for ops that do not commute, nor when asked to keep the order.
  EXPECT_FALSE(matches(var("x") - cvar("c"), g.alu(Op::SUB, {two, a})));
  EXPECT_FALSE(matches((cvar("c") + var("x")).ordered(), g.alu(Op::ADD, {a, two})));
  EXPECT_TRUE(matches((cvar("c") + var("x")).ordered(), g.alu(Op::ADD, {two, a})));
}

TEST_F(PatternTest, CommutativeBacktracksAcrossLevels) {
  const UOp *a = ivar("a"), *b = ivar("b"), *c = ivar("c");
  Pat x = var("x"), y = var("y");
  // (b + a) + a: the inner ADD first binds x = b, which the outer a contradicts; the
  // matcher must go back and bind x = a, y = b.
  EXPECT_EQ(match((x + y) + x, g.alu(Op::ADD, {g.alu(Op::ADD, {b, a}), a}), {"x", "y"}), id(a) + " " + id(b));
  // a + (b + a): the outer order must swap too.
  EXPECT_EQ(match((x + y) + x, g.alu(Op::ADD, {a, g.alu(Op::ADD, {b, a})}), {"x", "y"}), id(a) + " " + id(b));
  EXPECT_FALSE(matches((x + y) + x, g.alu(Op::ADD, {g.alu(Op::ADD, {b, a}), c})));
  // x + x * 2 with the MUL first.
  const UOp* two = g.cnst_int(dtypes::int32, 2);
  EXPECT_EQ(match(x + x * cvar("c"), g.alu(Op::ADD, {g.alu(Op::MUL, {two, a}), a}), {"x"}), id(a));
}

TEST_F(PatternTest, DecliningCallbackTriesTheNextBinding) {
  const UOp *a = ivar("a"), *two = g.cnst_int(dtypes::int32, 2);
  RuleSet rs("t");
  // Accept only the binding where y is the constant.
  rs.add(var("x") + var("y"), [](const Match& m) { return m["y"]->is(Op::CONST) ? m["x"] : nullptr; }, "pick");
  EXPECT_EQ(rs.apply(g, g.alu(Op::ADD, {two, a})).node, a);
  EXPECT_EQ(rs.apply(g, g.alu(Op::ADD, {a, a})).node, nullptr);
}

TEST_F(PatternTest, SameNameMeansSameNode) {
  const UOp *a = ivar("a"), *b = ivar("b");
  Pat x = var("x");
  EXPECT_TRUE(matches(x - x, g.alu(Op::SUB, {a, a})));
  EXPECT_FALSE(matches(x - x, g.alu(Op::SUB, {a, b})));
  EXPECT_TRUE(matches(where_(any(), x, x), g.alu(Op::WHERE, {g.cnst_bool(true), b, b})));
  EXPECT_FALSE(matches(where_(any(), x, x), g.alu(Op::WHERE, {g.cnst_bool(true), a, b})));
}

TEST_F(PatternTest, SemanticConstantsAcrossDtypes) {
  for (DType d : {dtypes::int32, dtypes::uint8, dtypes::index, dtypes::int64}) {
    EXPECT_TRUE(matches(zero(), g.cnst_int(d, 0))) << d.str();
    EXPECT_FALSE(matches(zero(), g.cnst_int(d, 1))) << d.str();
    EXPECT_TRUE(matches(one(), g.cnst_int(d, 1))) << d.str();
    EXPECT_FALSE(matches(one(), g.cnst_int(d, 2))) << d.str();
  }
  for (DType d : {dtypes::float32, dtypes::float16, dtypes::bfloat16, dtypes::float64}) {
    EXPECT_TRUE(matches(zero(), g.cnst(d, 0.0))) << d.str();
    EXPECT_TRUE(matches(zero(), g.cnst(d, -0.0))) << d.str();  // numerically zero
    EXPECT_FALSE(matches(zero(), g.cnst(d, 0.5))) << d.str();
    EXPECT_TRUE(matches(one(), g.cnst(d, 1.0))) << d.str();
    EXPECT_FALSE(matches(one(), g.cnst(d, -1.0))) << d.str();
  }
  EXPECT_TRUE(matches(zero(), g.cnst_bool(false)));
  EXPECT_FALSE(matches(zero(), g.cnst_bool(true)));
  EXPECT_TRUE(matches(one(), g.cnst_bool(true)));
  EXPECT_FALSE(matches(one(), g.cnst_bool(false)));
  // A variable is not a constant, whatever its bounds.
  EXPECT_FALSE(matches(zero(), g.make(Op::DEFINE_VAR, dtypes::int32, {}, DefineVarArg{"z", 0, 0})));
  EXPECT_FALSE(matches(cvar("c"), ivar("a")));
  EXPECT_TRUE(matches(cvar("c"), g.cnst(dtypes::float32, 3.5)));
}

TEST_F(PatternTest, ExactConstants) {
  EXPECT_TRUE(matches(cnst(2), g.cnst_int(dtypes::int8, 2)));
  EXPECT_TRUE(matches(cnst(2), g.cnst(dtypes::float32, 2.0)));
  EXPECT_FALSE(matches(cnst(2), g.cnst(dtypes::float32, 2.5)));
  EXPECT_TRUE(matches(cnst(-1), g.cnst_int(dtypes::int32, -1)));
  EXPECT_FALSE(matches(cnst(-1), g.cnst_int(dtypes::uint8, 255)));  // 255 is not -1
  EXPECT_TRUE(matches(cnst(2.5), g.cnst(dtypes::float16, 2.5)));
  EXPECT_FALSE(matches(cnst(2.5), g.cnst_int(dtypes::int32, 2)));
  EXPECT_TRUE(matches(cnst(true), g.cnst_bool(true)));
  EXPECT_FALSE(matches(cnst(true), g.cnst_int(dtypes::int32, 1)));  // only bools are true
}

TEST_F(PatternTest, DtypePredicates) {
  const UOp *i = ivar("i"), *f = ivar("f", dtypes::float32), *b = ivar("b", dtypes::bool_);
  const UOp* n = ivar("n", dtypes::index);
  EXPECT_TRUE(matches(var("x").is_int(), i));
  EXPECT_TRUE(matches(var("x").is_int(), n));
  EXPECT_FALSE(matches(var("x").is_int(), f));
  EXPECT_TRUE(matches(var("x").is_float(), f));
  EXPECT_FALSE(matches(var("x").is_float(), b));
  EXPECT_TRUE(matches(var("x").is_bool(), b));
  EXPECT_FALSE(matches(var("x").is_bool(), i));
  EXPECT_TRUE(matches(var("x").is_index(), n));
  EXPECT_FALSE(matches(var("x").is_index(), i));
  EXPECT_TRUE(matches(var("x").is_signed(), i));
  EXPECT_FALSE(matches(var("x").is_signed(), ivar("u", dtypes::uint16)));
  EXPECT_TRUE(matches(var("x").dtype_is(dtypes::int32), i));
  EXPECT_FALSE(matches(var("x").dtype_is(dtypes::int64), i));
  EXPECT_TRUE(matches(var("x").is_scalar(), i));
  EXPECT_FALSE(matches(var("x").is_scalar(), ivar("v", dtypes::int32.vec(4))));
  EXPECT_TRUE(matches(var("x").dtype([](const DType& d) { return d.itemsize() == 4; }), f));
  // On an inner node: the operand's dtype, not the root's.
  const UOp* cmp = g.alu(Op::CMPLT, {i, i});
  EXPECT_TRUE(matches(lt(var("x").is_int(), any()), cmp));
  EXPECT_FALSE(matches(lt(var("x").is_float(), any()), cmp));
}

TEST_F(PatternTest, ArgPredicatesAndGuards) {
  const UOp* n = g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"n", 1, 8});
  EXPECT_TRUE(matches(op(Op::DEFINE_VAR).arg_is(DefineVarArg{"n", 1, 8}), n));
  EXPECT_FALSE(matches(op(Op::DEFINE_VAR).arg_is(DefineVarArg{"n", 1, 9}), n));
  auto small = [](const Arg& a) { return std::get<DefineVarArg>(a).max < 10; };
  EXPECT_TRUE(matches(op(Op::DEFINE_VAR).arg(small), n));
  EXPECT_FALSE(matches(op(Op::DEFINE_VAR).arg(small), g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"m", 1, 80})));
  auto no_src = [](const UOp* u) { return u->num_src() == 0; };
  EXPECT_TRUE(matches(any().where(no_src), n));
  EXPECT_FALSE(matches(any().where(no_src), g.alu(Op::NEG, {n})));
}

TEST_F(PatternTest, PrefixSources) {
  const UOp* buf = g.make(Op::PARAM, dtypes::float32.ptr_to(), {}, ParamArg{0, 16});
  const UOp* i = g.idx(3);
  const UOp* gate = g.cnst_bool(true);
  const UOp* idx2 = g.make(Op::INDEX, dtypes::float32, {buf, i});
  const UOp* idx3 = g.make(Op::INDEX, dtypes::float32, {buf, i, gate});
  Pat p = op_prefix(Op::INDEX, {op(Op::PARAM).named("buf")});
  EXPECT_TRUE(matches(p, idx2));
  EXPECT_TRUE(matches(p, idx3));
  EXPECT_FALSE(matches(op(Op::INDEX, {op(Op::PARAM)}), idx2));  // exact: one source only
  EXPECT_FALSE(matches(op_prefix(Op::INDEX, {any(), any(), any(), any()}), idx3));
  EXPECT_EQ(match(p, idx3, {"buf"}), id(buf));
}

TEST_F(PatternTest, RulesAreIndexedByRootOp) {
  int mul_guard_calls = 0;
  RuleSet rs("t");
  rs.add((var("x") * one()).where([&](const UOp*) { ++mul_guard_calls; return true; }),
         [](const Match& m) { return m["x"]; }, "mul.one");
  rs.add(var("x") + zero(), [](const Match& m) { return m["x"]; }, "add.zero");
  rs.add(op({Op::ADD, Op::SUB}, {var("x"), var("x")}), [](const Match& m) { return m["x"]; }, "self");
  rs.add(any().where([](const UOp*) { return false; }), [](const Match& m) { return m.root; }, "never");
  EXPECT_EQ(rs.rules_for(Op::MUL), 2u);
  EXPECT_EQ(rs.rules_for(Op::ADD), 3u);
  EXPECT_EQ(rs.rules_for(Op::SUB), 2u);
  EXPECT_EQ(rs.rules_for(Op::CONST), 1u);

  const UOp* a = ivar("a");
  auto r = rs.apply(g, g.alu(Op::ADD, {a, g.cnst_int(dtypes::int32, 0)}));
  EXPECT_EQ(r.node, a);
  ASSERT_NE(r.rule, nullptr);
  EXPECT_EQ(r.rule->name(), "add.zero");
  EXPECT_EQ(mul_guard_calls, 0);  // never tried on an ADD
  r = rs.apply(g, g.alu(Op::MUL, {a, g.cnst_int(dtypes::int32, 1)}));
  EXPECT_EQ(r.rule->name(), "mul.one");
  EXPECT_EQ(mul_guard_calls, 1);
  EXPECT_EQ(rs.apply(g, g.alu(Op::MUL, {a, a})).node, nullptr);
}

TEST_F(PatternTest, InsertionOrderDecides) {
  const UOp* a = ivar("a");
  const UOp* sum = g.alu(Op::ADD, {a, a});
  RuleSet rs("t");
  rs.add(var("x") + var("x"), [](const Match&) -> const UOp* { return nullptr; }, "declines");
  rs.add(var("x") + var("y"), [](const Match& m) { return m["y"]; }, "first");
  rs.add(var("x") + var("x"), [](const Match& m) { return m.g.idx(0); }, "second");
  auto r = rs.apply(g, sum);
  EXPECT_EQ(r.node, a);
  EXPECT_EQ(r.rule->name(), "first");
  // A callback returning the root is "no change".
  RuleSet same("same");
  same.add(any(), [](const Match& m) { return m.root; }, "identity");
  EXPECT_EQ(same.apply(g, sum).node, nullptr);
}

TEST_F(PatternTest, ContextAndExtend) {
  int seen = 0;
  RuleSet a("a");
  a.add(op(Op::NEG, {var("x")}), [](const Match& m) { ++*m.ctx<int>(); return m["x"]; }, "neg");
  RuleSet b("b");
  b.add(op(Op::SQRT), [](const Match&) -> const UOp* { return nullptr; }, "sqrt");
  b.extend(a);
  EXPECT_EQ(b.size(), 2u);
  EXPECT_EQ(b.rules_for(Op::NEG), 1u);
  const UOp* f = ivar("f", dtypes::float32);
  EXPECT_EQ(b.apply(g, g.alu(Op::NEG, {f}), &seen).node, f);
  EXPECT_EQ(seen, 1);
}

TEST_F(PatternTest, PatternsPrintForMessages) {
  Pat x = var("x");
  EXPECT_EQ((x + cvar("c1")).str(), "ADD(x, CONST:c1)");
  EXPECT_EQ(idiv(x * one(), any()).str(), "IDIV(MUL(x, one), any)");
  EXPECT_EQ(op_prefix(Op::INDEX, {x}).str(), "INDEX(x, ...)");
  EXPECT_EQ(op({Op::ADD, Op::MUL}).named("y").str(), "{ADD|MUL}:y");
}

}  // namespace
}  // namespace uop::rw
