#include "compiler/ir/shape.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace uop {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Tensor-level graph building for the tests.
struct Tensors {
  Graph g;
  const UOp* dev = g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{"CPU:0"}});

  const UOp* buffer(int64_t n, DType dt = dtypes::float32, int64_t id = 0) {
    return g.make(Op::BUFFER, dt, {g.make(Op::UNIQUE, dtypes::void_, {}, IntArg{id}), dev}, BufferArg{n});
  }
  const UOp* shp(std::vector<int64_t> dims) {
    Shape s;
    for (int64_t d : dims) s.push_back(g.idx(d));
    return make_shape_operand(g, s);
  }
  const UOp* reshape(const UOp* x, const UOp* s) { return g.make(Op::RESHAPE, x->dtype(), {x, s}); }
  const UOp* reshape(const UOp* x, std::vector<int64_t> s) { return reshape(x, shp(s)); }
  const UOp* expand(const UOp* x, const UOp* s) { return g.make(Op::EXPAND, x->dtype(), {x, s}); }
  const UOp* expand(const UOp* x, std::vector<int64_t> s) { return expand(x, shp(s)); }
  const UOp* permute(const UOp* x, std::vector<int64_t> p) { return g.make(Op::PERMUTE, x->dtype(), {x}, IntsArg{p}); }
  const UOp* pad(const UOp* x, std::vector<int64_t> b, std::vector<int64_t> e) {
    return g.make(Op::PAD, x->dtype(), {x, shp(b), shp(e)});
  }
  const UOp* shrink(const UOp* x, const UOp* b, const UOp* e) { return g.make(Op::SHRINK, x->dtype(), {x, b, e}); }
  const UOp* shrink(const UOp* x, std::vector<int64_t> b, std::vector<int64_t> e) { return shrink(x, shp(b), shp(e)); }
  const UOp* flip(const UOp* x, std::vector<bool> f) { return g.make(Op::FLIP, x->dtype(), {x}, BoolsArg{f}); }
  const UOp* sum(const UOp* x, std::vector<int64_t> axes) {
    return g.make(Op::REDUCE_AXIS, x->dtype(), {x}, ReduceAxisArg{ReduceOp::Add, axes});
  }
  const UOp* var(const char* name, int64_t lo, int64_t hi) {
    return g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{name, lo, hi});
  }
  const UOp* bind(const UOp* v, int64_t value) { return g.make(Op::BIND, dtypes::index, {v, g.idx(value)}); }
};

// The constant dims of a shape() result, or the error message.
std::string dims_of(ShapeInference& si, const UOp* u) {
  auto s = si.shape(u);
  if (!s.ok()) return std::string(s.status().message());
  auto c = const_shape(**s);
  if (!c) return "symbolic";
  std::string out = "(";
  for (size_t i = 0; i < c->size(); ++i) out += (i ? ", " : "") + std::to_string((*c)[i]);
  return out + ")";
}

TEST(Shape, LeavesAndScalars) {
  Tensors t;
  ShapeInference si(t.g);
  EXPECT_EQ(dims_of(si, t.buffer(16)), "(16)");
  EXPECT_EQ(dims_of(si, t.g.cnst(dtypes::float32, 1.0)), "()");
  const UOp* b = t.bind(t.var("b", 1, 8), 3);
  EXPECT_EQ(dims_of(si, b), "()");
  EXPECT_EQ(dims_of(si, b->src(0)), "()");
  EXPECT_TRUE(si.has_shape(t.buffer(4)));
  EXPECT_FALSE(si.has_shape(t.shp({2, 3})));
  EXPECT_FALSE(si.has_shape(t.dev));
  EXPECT_FALSE(si.has_shape(t.g.make(Op::SINK, dtypes::void_, {t.buffer(4)})));
}

TEST(Shape, MovementOps) {
  Tensors t;
  ShapeInference si(t.g);
  const UOp* x = t.reshape(t.buffer(6), {2, 3});
  EXPECT_EQ(dims_of(si, x), "(2, 3)");
  EXPECT_EQ(dims_of(si, t.permute(x, {1, 0})), "(3, 2)");
  EXPECT_EQ(dims_of(si, t.expand(t.reshape(x, {2, 1, 3}), {2, 5, 3})), "(2, 5, 3)");
  EXPECT_EQ(dims_of(si, t.pad(x, {1, 0}, {0, 2})), "(3, 5)");
  EXPECT_EQ(dims_of(si, t.shrink(x, {1, 1}, {2, 3})), "(1, 2)");
  EXPECT_EQ(dims_of(si, t.shrink(x, {0, 3}, {2, 3})), "(2, 0)");  // empty is fine
  EXPECT_EQ(dims_of(si, t.flip(x, {true, false})), "(2, 3)");
  EXPECT_EQ(dims_of(si, t.sum(x, {1})), "(2, 1)");
  EXPECT_EQ(dims_of(si, t.sum(x, {0, 1})), "(1, 1)");
  EXPECT_EQ(dims_of(si, t.reshape(t.sum(x, {0, 1}), std::vector<int64_t>{})), "()");
  EXPECT_EQ(dims_of(si, t.g.alu(Op::ADD, {x, t.flip(x, {false, true})})), "(2, 3)");
  EXPECT_EQ(dims_of(si, t.g.make(Op::CAST, dtypes::int32, {x})), "(2, 3)");
  EXPECT_EQ(dims_of(si, t.g.alu(Op::CMPLT, {x, x})), "(2, 3)");
  // A scalar broadcast: RESHAPE to rank 2, then EXPAND.
  const UOp* one = t.g.cnst(dtypes::float32, 1.0);
  EXPECT_EQ(dims_of(si, t.expand(t.reshape(one, {1, 1}), {2, 3})), "(2, 3)");
  // Constant dims are shared CONST nodes.
  auto s = si.shape(t.permute(x, {1, 0}));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((**s)[0], t.g.idx(3));
}

struct Bad {
  const char* what;
  const UOp* node;
  const char* tag;
};

TEST(Shape, ErrorsNameTheRule) {
  Tensors t;
  const UOp* x = t.reshape(t.buffer(6), {2, 3});
  std::vector<Bad> cases = {
      {"reshape count", t.reshape(x, {4, 2}), "shape.reshape"},
      {"expand non-1", t.expand(x, {4, 3}), "shape.expand"},
      {"expand rank", t.expand(x, {1, 2, 3}), "shape.expand"},
      {"permute repeated", t.permute(x, {0, 0}), "shape.permute"},
      {"permute short", t.permute(x, {0}), "shape.permute"},
      {"permute range", t.permute(x, {0, 2}), "shape.permute"},
      {"pad rank", t.pad(x, {1}, {1}), "shape.pad"},
      {"shrink past end", t.shrink(x, {0, 0}, {2, 4}), "shape.shrink"},
      {"shrink begin > end", t.shrink(x, {0, 2}, {2, 1}), "shape.shrink"},
      {"flip count", t.flip(x, {true}), "shape.flip"},
      {"reduce range", t.sum(x, {2}), "shape.reduce_axis"},
      {"reduce repeated", t.sum(x, {1, 1}), "shape.reduce_axis"},
      {"alu shapes", t.g.alu(Op::ADD, {x, t.permute(x, {1, 0})}), "shape.alu"},
      {"alu scalar vs tensor", t.g.alu(Op::ADD, {x, t.g.cnst(dtypes::float32, 1.0)}), "shape.alu"},
      {"rank", t.reshape(t.buffer(1), std::vector<int64_t>(17, 1)), "shape.rank"},
      {"negative dim", t.reshape(t.buffer(6), {-2, -3}), "shape.negative"},
      {"negative pad", t.pad(x, {-1, 0}, {0, 0}), "shape.pad"},
      {"buffer too large", t.buffer(int64_t{1} << 41), "shape.too_large"},
      {"expand too large", t.expand(t.reshape(t.buffer(1), {1, 1}), {int64_t{1} << 21, int64_t{1} << 21}),
       "shape.too_large"},
      {"product overflows int64",
       t.expand(t.reshape(t.buffer(1), {1, 1, 1}), {int64_t{1} << 30, int64_t{1} << 30, int64_t{1} << 30}),
       "shape.too_large"},
      {"float shape operand", t.g.make(Op::RESHAPE, dtypes::float32, {x, t.g.make(Op::VCONST, dtypes::float32.vec(2), {},
                                                                       VConstArg{{ConstValue::Float(2), ConstValue::Float(3)}})}),
       "shape.operand"},
      {"vector is not a tensor", t.g.make(Op::CAST, dtypes::float32.vec(4), {x}), "shape.dtype"},
      {"alu over shape operands", t.g.alu(Op::ADD, {t.shp({2, 3}), t.shp({2, 3})}), "shape.operand"},
      {"shape operand as a source", t.g.make(Op::CAST, dtypes::index, {t.shp({2, 3})}), "shape.operand"},
      {"dim not an index expr",
       t.reshape(t.buffer(6), t.g.make(Op::CAST, dtypes::index, {t.g.cnst_int(dtypes::int32, 6)})), "shape.dim"},
      {"negative buffer", t.buffer(-1), "shape.buffer"},
  };
  for (const Bad& c : cases) {
    ShapeInference si(t.g);
    auto s = si.shape(c.node);
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(std::string("[") + c.tag + "]")) << c.what;
    ASSERT_NE(si.last_failure(), nullptr);
    EXPECT_EQ(si.last_failure()->node, c.node) << c.what;
  }
}

TEST(Shape, MessageNamesNodeByToposortIndex) {
  Tensors t;
  const UOp* bad = t.reshape(t.buffer(6), {4, 2});
  ShapeInference si(t.g);
  auto s = si.shape(bad);
  ASSERT_FALSE(s.ok());
  // UNIQUE 0, DEVICE 1, BUFFER 2, VCONST 3, RESHAPE 4.
  EXPECT_EQ(s.status().message(), "node 4 (RESHAPE): cannot reshape (6,) to (4, 2): the element counts differ "
                                  "[shape.reshape]");
  // An error below is reported for everything above it, and memoized.
  const UOp* above = t.g.make(Op::CONTIGUOUS, dtypes::float32, {bad});
  auto s2 = si.shape(above);
  ASSERT_FALSE(s2.ok());
  EXPECT_THAT(std::string(s2.status().message()), StartsWith("node 4 (RESHAPE)"));
  EXPECT_EQ(si.last_failure()->node, bad);
}

TEST(Shape, SymbolicBatch) {
  Tensors t;
  ShapeInference si(t.g);
  // A BUFFER allocated at the maximum size, shrunk to the bound batch, then reshaped.
  const UOp* b = t.bind(t.var("b", 1, 128), 7);
  const UOp* n = t.g.alu(Op::MUL, {b, t.g.idx(16)});
  const UOp* x = t.shrink(t.buffer(2048), t.shp({0}), make_shape_operand(t.g, {n}));
  auto sx = si.shape(x);
  ASSERT_TRUE(sx.ok()) << sx.status();
  ASSERT_EQ((*sx)->size(), 1u);
  EXPECT_EQ((**sx)[0], n);  // x - 0 folds to x
  EXPECT_EQ(dim_max(n), 2048);
  EXPECT_EQ(dim_bounds(n).min, 16);

  const UOp* y = t.reshape(x, make_shape_operand(t.g, {b, t.g.idx(16)}));
  auto sy = si.shape(y);
  ASSERT_TRUE(sy.ok()) << sy.status();
  EXPECT_EQ((**sy)[0], b);
  EXPECT_EQ(const_dim((**sy)[1]), 16);

  // The same count written the other way round has the same canonical form.
  const UOp* y2 = t.reshape(x, make_shape_operand(t.g, {t.g.idx(16), b}));
  EXPECT_TRUE(si.shape(y2).ok());
  // A wrong count is not.
  const UOp* y3 = t.reshape(x, make_shape_operand(t.g, {b, t.g.idx(8)}));
  auto s3 = si.shape(y3);
  ASSERT_FALSE(s3.ok());
  EXPECT_THAT(std::string(s3.status().message()), HasSubstr("[shape.reshape]"));

  // Broadcasting along a symbolic axis, then reducing it.
  const UOp* z = t.expand(t.reshape(y, make_shape_operand(t.g, {b, t.g.idx(1), t.g.idx(16)})),
                          make_shape_operand(t.g, {b, t.g.idx(4), t.g.idx(16)}));
  auto sz = si.shape(t.sum(z, {0}));
  ASSERT_TRUE(sz.ok()) << sz.status();
  EXPECT_EQ(const_shape(**sz), (std::vector<int64_t>{1, 4, 16}));
  // An EXPAND may not change a symbolic dim.
  const UOp* bad = t.expand(y, make_shape_operand(t.g, {t.g.idx(7), t.g.idx(16)}));
  EXPECT_FALSE(si.shape(bad).ok());
  // Shrinking past the buffer at the variable's maximum is refused.
  const UOp* big = t.g.alu(Op::MUL, {b, t.g.idx(17)});
  auto s4 = si.shape(t.shrink(t.buffer(2048), t.shp({0}), make_shape_operand(t.g, {big})));
  ASSERT_FALSE(s4.ok());
  EXPECT_THAT(std::string(s4.status().message()), HasSubstr("[shape.shrink]"));
}

TEST(Shape, SymbolicLimits) {
  Tensors t;
  ShapeInference si(t.g);
  // Each dim may reach 2^30: 2^60 elements at the maximum.
  const UOp* n = t.var("n", 0, int64_t{1} << 30);
  const UOp* x = t.expand(t.reshape(t.buffer(1), {1, 1}), make_shape_operand(t.g, {n, n}));
  auto s = si.shape(x);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("[shape.too_large]"));
  // A dim that may be negative (n - 5 with n >= 0).
  const UOp* m = t.g.alu(Op::SUB, {t.var("m", 0, 10), t.g.idx(5)});
  auto s2 = si.shape(t.expand(t.reshape(t.buffer(1), {1}), make_shape_operand(t.g, {m})));
  ASSERT_FALSE(s2.ok());
  EXPECT_THAT(std::string(s2.status().message()), HasSubstr("[shape.negative]"));
  // Smaller limits come from the caller.
  ShapeInference small(t.g, ShapeLimits{2, 100});
  EXPECT_FALSE(small.shape(t.buffer(101)).ok());
  EXPECT_FALSE(small.shape(t.reshape(t.buffer(8), {2, 2, 2})).ok());
  EXPECT_TRUE(small.shape(t.reshape(t.buffer(8), {2, 4})).ok());
}

TEST(Shape, Numel) {
  Graph g;
  const UOp* v = g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"v", 0, 9});
  EXPECT_EQ(shape_numel(g, {}), g.idx(1));
  EXPECT_EQ(shape_numel(g, {g.idx(2), g.idx(3)}), g.idx(6));
  EXPECT_EQ(shape_numel(g, {v, g.idx(1)}), v);
}

// A claim the dim algebra cannot decide is refused, saying so, rather than guessed.
TEST(Shape, UndecidedEqualityIsRefusedAsSuch) {
  Tensors t;
  ShapeInference si(t.g);
  const UOp* a = t.bind(t.var("a", 1, 8), 2);
  const UOp* b = t.bind(t.var("b", 1, 8), 3);
  // MAX(a, b) == WHERE(a < b, b, a) everywhere, but they are different opaque terms.
  const UOp* mx = t.g.alu(Op::MAX, {a, b});
  const UOp* other = t.g.alu(Op::WHERE, {t.g.alu(Op::CMPLT, {a, b}), b, a});
  const UOp* x = t.shrink(t.buffer(8), t.shp({0}), make_shape_operand(t.g, {mx}));
  ASSERT_TRUE(si.shape(x).ok());
  auto s = si.shape(t.reshape(x, make_shape_operand(t.g, {other})));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("are not provably equal [shape.reshape]"));
  // Different element counts are said to differ.
  auto s2 = si.shape(t.reshape(x, make_shape_operand(t.g, {t.g.alu(Op::ADD, {mx, t.g.idx(1)})})));
  ASSERT_FALSE(s2.ok());
  EXPECT_THAT(std::string(s2.status().message()), HasSubstr("the element counts differ [shape.reshape]"));
  // The same count written as another sum of products is equal: 2 * mx as mx + mx, and
  // as the product of the dims (2, mx).
  const UOp* y = t.shrink(t.buffer(16), t.shp({0}), make_shape_operand(t.g, {t.g.alu(Op::MUL, {mx, t.g.idx(2)})}));
  auto sy = si.shape(t.reshape(y, make_shape_operand(t.g, {t.g.alu(Op::ADD, {mx, mx})})));
  EXPECT_TRUE(sy.ok()) << sy.status();
  auto sy2 = si.shape(t.reshape(y, make_shape_operand(t.g, {t.g.idx(2), mx})));
  EXPECT_TRUE(sy2.ok()) << sy2.status();
  // An ALU over operands whose shapes cannot be proven equal names why it is refused.
  auto s3 = si.shape(t.g.alu(Op::ADD, {x, t.expand(t.reshape(t.buffer(1), {1}), make_shape_operand(t.g, {other}))}));
  ASSERT_FALSE(s3.ok());
  EXPECT_THAT(std::string(s3.status().message()), HasSubstr("(not provably equal) [shape.alu]"));
}

TEST(Shape, ShapeOperands) {
  Graph g;
  const UOp* v = g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"v", 0, 9});
  const UOp* c = make_shape_operand(g, {g.idx(2), g.idx(3)});
  EXPECT_EQ(c->op(), Op::VCONST);
  EXPECT_EQ(c->dtype(), dtypes::index.vec(2));
  auto dc = shape_operand_dims(g, c);
  ASSERT_TRUE(dc.ok());
  EXPECT_EQ(*dc, (Shape{g.idx(2), g.idx(3)}));

  const UOp* s = make_shape_operand(g, {v, g.idx(3)});
  EXPECT_EQ(s->op(), Op::VECTORIZE);
  EXPECT_EQ(*shape_operand_dims(g, s), (Shape{v, g.idx(3)}));

  const UOp* r0 = make_shape_operand(g, {});
  EXPECT_EQ(r0->op(), Op::VCONST);
  EXPECT_EQ(r0->dtype().count, 0u);
  EXPECT_TRUE(shape_operand_dims(g, r0)->empty());

  EXPECT_EQ(*shape_operand_dims(g, v), (Shape{v}));  // an index scalar is a rank-1 shape
  auto bad = shape_operand_dims(g, g.cnst(dtypes::float32, 1.0));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("[shape.operand]"));
}

TEST(Shape, DeepChainIsIterative) {
  Tensors t;
  const UOp* x = t.reshape(t.buffer(12), {3, 4});
  for (int i = 0; i < 200000; ++i) x = t.g.alu(Op::NEG, {x});
  ShapeInference si(t.g);
  EXPECT_EQ(dims_of(si, x), "(3, 4)");
  // An error at the bottom of a deep chain is found and memoized too.
  const UOp* y = t.reshape(t.buffer(12), {5, 4});
  for (int i = 0; i < 200000; ++i) y = t.g.alu(Op::NEG, {y});
  EXPECT_THAT(dims_of(si, y), HasSubstr("[shape.reshape]"));
}

}  // namespace
}  // namespace uop
