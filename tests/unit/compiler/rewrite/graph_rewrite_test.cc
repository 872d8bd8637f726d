// graph_rewrite: fixed point, memoization, identity on unchanged graphs, any depth, and a
// bounded error for rule sets that never settle.
#include "compiler/rewrite/graph_rewrite.h"

#include <gtest/gtest.h>

#include "compiler/ir/eval.h"

namespace uop::rw {
namespace {

const UOp* ret_x(const Match& m) { return m["x"]; }

// x*1 -> x, x+0 -> x, (x+c1)+c2 -> x+(c1+c2), and NEG(x) -> 0 - x*1 (whose x*1 is new
// and unrewritten, so the engine must rewrite the replacement bottom-up).
RuleSet arith() {
  RuleSet rs("arith");
  Pat x = var("x");
  rs.add(x * one(), ret_x, "mul.one");
  rs.add(x + zero(), ret_x, "add.zero");
  rs.add((x + cvar("c1")) + cvar("c2"), [](const Match& m) {
    int64_t v = m.cv("c1").as_int() + m.cv("c2").as_int();
    return m.g.alu(Op::ADD, {m["x"], m.g.cnst_int(m.root->dtype(), v)});
  }, "add.consts");
  rs.add(neg(x), [](const Match& m) {
    const UOp* one = m.g.cnst_int(m.root->dtype(), 1);
    return m.g.alu(Op::SUB, {m.g.cnst_int(m.root->dtype(), 0), m.g.alu(Op::MUL, {m["x"], one})});
  }, "neg.expand");
  return rs;
}

class GraphRewriteTest : public ::testing::Test {
 protected:
  const UOp* var_(const char* name, DType d = dtypes::int32) {
    return g.make(Op::DEFINE_VAR, d, {}, DefineVarArg{name, 0, 100});
  }
  const UOp* i32(int64_t v) { return g.cnst_int(dtypes::int32, v); }
  Graph g;
};

TEST_F(GraphRewriteTest, ReachesFixedPoint) {
  const UOp* a = var_("a");
  // ((a*1 + 0) + 2) + 3  ->  a + 5
  const UOp* e = g.alu(Op::ADD, {g.alu(Op::ADD, {g.alu(Op::ADD, {g.alu(Op::MUL, {a, i32(1)}), i32(0)}), i32(2)}), i32(3)});
  auto r = graph_rewrite(g, e, arith());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, g.alu(Op::ADD, {a, i32(5)}));
}

TEST_F(GraphRewriteTest, RewritesTheSourcesOfAReplacement) {
  const UOp* a = var_("a");
  // NEG(a) -> 0 - a*1; the new a*1 must then become a.
  auto r = graph_rewrite(g, g.alu(Op::MAX, {g.alu(Op::NEG, {a}), a}), arith());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, g.alu(Op::MAX, {g.alu(Op::SUB, {i32(0), a}), a}));
}

TEST_F(GraphRewriteTest, RuleFiresAgainOnItsOwnResult) {
  const UOp* a = var_("a");
  // ((a+1)+1) is rewritten to a+2 at the outer ADD, which matches again with the +3 above.
  const UOp* e = g.alu(Op::ADD, {g.alu(Op::ADD, {g.alu(Op::ADD, {a, i32(1)}), i32(1)}), i32(3)});
  std::vector<std::string> fired;
  RewriteOptions opt;
  opt.trace = [&](const Rule& r, const UOp*, const UOp*) { fired.push_back(r.name()); };
  auto r = graph_rewrite(g, e, arith(), nullptr, opt);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, g.alu(Op::ADD, {a, i32(5)}));
  EXPECT_EQ(fired, (std::vector<std::string>{"add.consts", "add.consts"}));
}

TEST_F(GraphRewriteTest, EachNodeRewrittenOnce) {
  const UOp *a = var_("a"), *b = var_("b");
  const UOp* shared = g.alu(Op::ADD, {a, b});
  // shared is used four times, through two distinct users.
  const UOp* u1 = g.alu(Op::MUL, {shared, shared});
  const UOp* u2 = g.alu(Op::MAX, {shared, shared});
  const UOp* root = g.alu(Op::SUB, {u1, u2});
  int calls = 0;
  RuleSet rs("count");
  rs.add(op(Op::ADD, {var("x"), var("y")}).ordered(), [&](const Match&) -> const UOp* { ++calls; return nullptr; }, "count");
  auto r = graph_rewrite(g, root, rs);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(*r, root);

  // The same when the shared node is rewritten: one application, reused by every user.
  int rewrites = 0;
  RewriteOptions opt;
  opt.trace = [&](const Rule&, const UOp*, const UOp*) { ++rewrites; };
  const UOp* shared1 = g.alu(Op::MUL, {a, i32(1)});
  const UOp* root2 = g.alu(Op::SUB, {g.alu(Op::ADD, {shared1, shared1}), g.alu(Op::MUL, {shared1, b})});
  auto r2 = graph_rewrite(g, root2, arith(), nullptr, opt);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(*r2, g.alu(Op::SUB, {g.alu(Op::ADD, {a, a}), g.alu(Op::MUL, {a, b})}));
  EXPECT_EQ(rewrites, 1);
}

TEST_F(GraphRewriteTest, UnchangedGraphIsReturnedAsIs) {
  const UOp *a = var_("a"), *b = var_("b");
  const UOp* root = g.alu(Op::WHERE, {g.alu(Op::CMPLT, {a, b}), g.alu(Op::MUL, {a, b}), g.alu(Op::ADD, {a, i32(7)})});
  size_t before = g.size();
  auto r = graph_rewrite(g, root, arith());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, root);
  EXPECT_EQ(g.size(), before);  // nothing was built
}

// Graphs come from the network: a 200k-deep chain must not overflow any stack.
constexpr int kDepth = 200'000;

TEST_F(GraphRewriteTest, DeepChainFolds) {
  const UOp* a = var_("a");
  // ((a + 1) + 1) + ... : every level is rewritten to a + i, a node made by the rule.
  const UOp* e = a;
  for (int i = 0; i < kDepth; ++i) e = g.alu(Op::ADD, {e, i32(1)});
  auto r = graph_rewrite(g, e, arith());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, g.alu(Op::ADD, {a, i32(kDepth)}));
}

TEST_F(GraphRewriteTest, DeepChainUnchanged) {
  const UOp* f = var_("a");
  for (int i = 0; i < kDepth; ++i) f = g.alu(Op::MAX, {f, i32(i % 1000)});
  size_t before = g.size();
  auto r = graph_rewrite(g, f, arith());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, f);
  EXPECT_EQ(g.size(), before);
}

TEST_F(GraphRewriteTest, DeepChainCollapses) {
  const UOp* a = var_("a");
  // a*1*1*...*1 -> a: every node is replaced by a source.
  const UOp* h = a;
  for (int i = 0; i < kDepth; ++i) h = g.alu(Op::MUL, {h, i32(1)});
  auto r = graph_rewrite(g, h, arith());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, a);
}

TEST_F(GraphRewriteTest, OscillatingRulesAreAnError) {
  RuleSet flip("flip");
  flip.add(op(Op::ADD, {var("a"), var("b")}).ordered(),
           [](const Match& m) { return m.g.alu(Op::ADD, {m["b"], m["a"]}); }, "add.comm");
  const UOp* root = g.alu(Op::ADD, {var_("p", dtypes::index), var_("q", dtypes::index)});
  auto r = graph_rewrite(g, root, flip);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "rewrite 'flip' did not converge after 1000000 rewrites (last rule 'add.comm' at ADD : index) "
            "[rewrite.no_fixed_point]");

  RewriteOptions opt;
  opt.name = "symbolic";
  opt.max_rewrites = 1000;
  auto r2 = graph_rewrite(g, root, flip, nullptr, opt);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("rewrite 'symbolic' did not converge after 1000 rewrites"), absl::string_view::npos);
}

TEST_F(GraphRewriteTest, GrowingRulesAreAnError) {
  // x -> x + 0 on every ADD's operands never settles either, and builds new nodes each time.
  RuleSet grow("grow");
  grow.add(op(Op::ADD, {var("x"), cvar("c")}).ordered(), [](const Match& m) {
    return m.g.alu(Op::ADD, {m.g.alu(Op::ADD, {m["x"], m["c"]}), m.g.cnst_int(m.root->dtype(), 0)});
  }, "grow");
  RewriteOptions opt;
  opt.max_rewrites = 500;
  auto r = graph_rewrite(g, g.alu(Op::ADD, {var_("a"), i32(1)}), grow, nullptr, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("[rewrite.no_fixed_point]"), absl::string_view::npos);
}

TEST_F(GraphRewriteTest, ContextReachesCallbacks) {
  struct Counter { int n = 0; } ctx;
  RuleSet rs("ctx");
  rs.add(op(Op::NEG, {var("x")}), [](const Match& m) { ++m.ctx<Counter>()->n; return m["x"]; }, "neg");
  const UOp* a = var_("a", dtypes::float32);
  auto r = graph_rewrite(g, g.alu(Op::ADD, {g.alu(Op::NEG, {a}), g.alu(Op::NEG, {g.alu(Op::SQRT, {a})})}), rs, &ctx);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, g.alu(Op::ADD, {a, g.alu(Op::SQRT, {a})}));
  EXPECT_EQ(ctx.n, 2);
}

}  // namespace
}  // namespace uop::rw
