#include "compiler/ir/printer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace uop {
namespace {

using ::testing::HasSubstr;

// out[i] = in[i] + 1.0 over 16 floats: PARAM 1 and the RANGE are shared.
const UOp* small_kernel(Graph& g) {
  DType ptr = dtypes::float32.ptr_to(AddrSpace::Global, 16);
  const UOp* out = g.make(Op::PARAM, ptr, {}, ParamArg{0, 16});
  const UOp* in = g.make(Op::PARAM, ptr, {}, ParamArg{1, 16});
  const UOp* r = g.make(Op::RANGE, dtypes::index, {g.idx(16)}, RangeArg{0, AxisType::Loop});
  const UOp* ld = g.make(Op::LOAD, dtypes::float32, {in, g.make(Op::INDEX, dtypes::float32, {in, r})});
  const UOp* val = g.alu(Op::ADD, {ld, g.cnst(dtypes::float32, 1.0)});
  return g.make(Op::STORE, dtypes::void_, {g.make(Op::INDEX, dtypes::float32, {out, r}), val, r});
}

TEST(Printer, BestiaryTreeWithSharedNodes) {
  Graph g;
  const UOp* st = small_kernel(g);
  EXPECT_EQ(print_tree(st),
            "[9] STORE : void\n"
            "├── [3] INDEX : float32\n"
            "│   ├── [0] PARAM(0, size=16) : ptr<float32, global, 16>\n"
            "│   └── [2] RANGE(R0, Loop) : index\n"
            "│       └── [1] CONST(16) : index\n"
            "├── [8] ADD : float32\n"
            "│   ├── [6] LOAD : float32\n"
            "│   │   ├── [4] PARAM(1, size=16) : ptr<float32, global, 16>\n"
            "│   │   └── [5] INDEX : float32\n"
            "│   │       ├── [4] → (same as above)\n"
            "│   │       └── [2] → (same as above)\n"
            "│   └── [7] CONST(1.0) : float32\n"
            "└── [2] → (same as above)\n");
}

TEST(Printer, NodeLineIndexAndNames) {
  Graph g;
  const UOp* st = small_kernel(g);
  NodeIndex index = index_by_toposort(st);
  const UOp* param = st->src(0)->src(0);
  EXPECT_EQ(print_node(param, &index), "[0] PARAM(0, size=16) : ptr<float32, global, 16>");
  EXPECT_EQ(print_node(st->src(1), &index), "[8] ADD : float32");
  EXPECT_EQ(print_node(g.idx(3)), "[0] CONST(3) : index");
  // Wire indices of a decoded graph, with a node missing from them.
  NodeIndex wire = index;
  for (auto& [u, i] : wire) i += 100;
  wire.erase(param);
  NodeNames names{{st, "out"}};
  std::string tree = print_tree(st, &wire, &names);
  EXPECT_THAT(tree, HasSubstr("[109] STORE : void  # out\n"));
  EXPECT_THAT(tree, HasSubstr("[?] PARAM(0, size=16)"));
}

TEST(Printer, DeepChainPrintsLinearly) {
  Graph g;
  const UOp* v = g.make(Op::DEFINE_VAR, dtypes::int32, {}, DefineVarArg{"v", 0, 1});
  const UOp* x = v;
  for (int i = 0; i < 200000; ++i) x = g.alu(Op::NEG, {x});
  std::string out = print_tree(x);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 200001);
  EXPECT_THAT(out, HasSubstr("⋮ "));
  EXPECT_LT(out.size(), size_t{200001} * 200);  // guides are capped, not quadratic
  EXPECT_THAT(out, HasSubstr("└── [0] DEFINE_VAR(\"v\", 0..1) : int32\n"));
}

}  // namespace
}  // namespace uop
