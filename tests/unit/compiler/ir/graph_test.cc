#include <gtest/gtest.h>

#include "compiler/ir/digest.h"
#include "compiler/ir/uop.h"

namespace uop {
namespace {

// a + b * 2 over two float32 buffers' loads, built in a given order.
const UOp* build(Graph& g, bool reversed) {
  const UOp* two = g.cnst(dtypes::float32, 2.0);
  const UOp *a, *b;
  if (reversed) {
    b = g.make(Op::DEFINE_VAR, dtypes::float32, {}, DefineVarArg{"b", 0, 10});
    a = g.make(Op::DEFINE_VAR, dtypes::float32, {}, DefineVarArg{"a", 0, 10});
  } else {
    a = g.make(Op::DEFINE_VAR, dtypes::float32, {}, DefineVarArg{"a", 0, 10});
    b = g.make(Op::DEFINE_VAR, dtypes::float32, {}, DefineVarArg{"b", 0, 10});
  }
  return g.alu(Op::ADD, {a, g.alu(Op::MUL, {b, two})});
}

TEST(Graph, HashConsing) {
  Graph g;
  const UOp* x = build(g, false);
  size_t n = g.size();
  const UOp* y = build(g, false);
  EXPECT_EQ(x, y);
  EXPECT_EQ(g.size(), n);  // nothing new was made
  EXPECT_NE(g.cnst(dtypes::float32, 1.0), g.cnst(dtypes::float64, 1.0));
  EXPECT_NE(g.cnst(dtypes::float32, 0.0), g.cnst(dtypes::float32, -0.0));
  EXPECT_EQ(g.cnst(dtypes::int32, 3.7), g.cnst_int(dtypes::int32, 3));  // CAST semantics
}

TEST(Graph, DigestIndependentOfOrderAndArena) {
  Graph g1, g2;
  g2.idx(7);  // shift ids in the second arena
  const UOp* x = build(g1, false);
  const UOp* y = build(g2, true);
  EXPECT_NE(x->id(), y->id());
  EXPECT_EQ(x->digest(), y->digest());
  EXPECT_NE(x->digest(), x->src(0)->digest());
}

TEST(Graph, DigestGolden) {
  // Pinned: a change of the canonical encoding changes every cache key and must be
  // deliberate (bump kEncodingVersion in digest.cc and update these).
  Graph g;
  EXPECT_EQ(g.idx(0)->digest().hex(), "d32ebaa40102de4c5e28f5d7c9f22c9c1d0a0bd0e9475de62cfc56db0f1b3060");
  EXPECT_EQ(build(g, false)->digest().hex(), "7e94ec57ce2765b191d9ebc5359ea7da2cc55b6d2f0dd807aea129574e239a6f");
}

TEST(Graph, ReplaceSrcKeepsNodeWhenUnchanged) {
  Graph g;
  const UOp* x = build(g, false);
  std::vector<const UOp*> same(x->src().begin(), x->src().end());
  EXPECT_EQ(g.replace_src(x, same), x);
  std::swap(same[0], same[1]);
  EXPECT_NE(g.replace_src(x, same), x);
}

TEST(Graph, ToposortIsIterativeAndOrdered) {
  Graph g;
  const UOp* v = g.make(Op::DEFINE_VAR, dtypes::int32, {}, DefineVarArg{"v", 0, 1});
  const UOp* x = v;
  for (int i = 0; i < 200000; ++i) x = g.alu(Op::ADD, {x, v});  // a deep chain
  auto order = toposort(x);
  ASSERT_EQ(order.size(), 200001u);
  EXPECT_EQ(order.front(), v);
  EXPECT_EQ(order.back(), x);
  EXPECT_EQ(x->digest().hex().size(), 64u);  // the digest walk does not recurse either
}

}  // namespace
}  // namespace uop
