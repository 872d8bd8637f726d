// The differential corpus: every ALU op, CAST and BITCAST on every dtype over the edge
// values of the type (every pair of them, by broadcasting an [n, 1] operand against a
// [1, n] one), the composite activations users build from the primitives, movement ops in
// combination, REDUCE_AXIS over every axis set, matmuls, zero-size / size-1 / odd /
// broadcast / large shapes, and a symbolic batch. Each graph is compiled by the pipeline
// and LLVM and compared with the reference interpreter: bit-exact for ints, bools and
// every float op llvm_cpu.h promises exact (signed zeros included), within its 1-ULP bound
// for EXP2 / LOG2 / SIN / POW, within Tolerance::for_dtype where transcendentals feed
// further arithmetic, and within a reassociation bound over the terms where a float Add /
// Mul reduction may be reordered (differential.h). Reductions and matmuls over small
// integers are exact in any order, so most of them compare bit for bit.
//
// Compiles dominate the run time, so checks are batched: one graph carries many outputs
// (a kernel each), and one LocalRunner caches programs by kernel digest.
#include <gtest/gtest.h>

#include "compiler/ir/shape.h"
#include "tests/unit/compiler/composites.h"
#include "tests/unit/compiler/differential.h"
#include "tests/unit/compiler/random_graph.h"

namespace uop {
namespace {

using namespace difftest;

LocalRunner& runner() {
  static LocalRunner* r = new LocalRunner();
  return *r;
}

// A graph under construction with the checks for its outputs and the data of its inputs.
struct Batch {
  Graph g;
  TensorBuilder tb{g};
  std::vector<const UOp*> outputs;
  std::vector<OutputCheck> checks;
  Inputs inputs;

  const UOp* input(Scalar s, std::vector<int64_t> shape, HostTensor data) {
    const UOp* x = tb.input(s, std::move(shape));
    data.shape = {data.numel()};
    inputs[tb.buffer_of(x)] = std::move(data);
    return x;
  }
  // HostTensor::random contents.
  const UOp* random(Scalar s, std::vector<int64_t> shape, uint64_t seed) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return input(s, shape, HostTensor::random(s, {n}, seed));
  }
  // small_ints contents: float reductions over them are exact in any order.
  const UOp* ints(Scalar s, std::vector<int64_t> shape, uint64_t seed, int64_t lo = -3, int64_t hi = 3) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return input(s, shape, small_ints(s, {n}, seed, lo, hi));
  }
  // edge_tensor contents.
  const UOp* edges(Scalar s, std::vector<int64_t> shape, uint64_t seed, bool wide = true) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return input(s, shape, edge_tensor(s, {n}, seed, wide));
  }
  void out(const UOp* u, std::string label, Tolerance tol = Tolerance::exact()) {
    outputs.push_back(u);
    checks.push_back({std::move(label), tol});
  }
  void expect_match() {
    ASSERT_FALSE(outputs.empty());
    std::string why = check_graph(runner(), g, tb.sink(outputs), inputs, checks);
    EXPECT_EQ(why, "");
  }
};

Tolerance defaults(Scalar s) { return Tolerance::for_dtype(s); }
bool transcendental(Op op) { return op == Op::EXP2 || op == Op::LOG2 || op == Op::SIN || op == Op::POW; }
std::string name(Scalar s) { return std::string(scalar_name(s)); }
std::string name(Op op) { return std::string(op_name(op)); }

std::string dtype_param_name(const ::testing::TestParamInfo<Scalar>& p) { return name(p.param); }

const std::vector<Op> kUnary = {Op::NEG, Op::EXP2, Op::LOG2, Op::SIN, Op::SQRT, Op::RECIPROCAL, Op::TRUNC};
const std::vector<Op> kBinary = {Op::ADD,   Op::SUB,   Op::MUL,   Op::FDIV, Op::IDIV, Op::MOD,
                                 Op::MAX,   Op::MIN,   Op::POW,   Op::CMPLT, Op::CMPNE, Op::CMPEQ,
                                 Op::AND,   Op::OR,    Op::XOR,   Op::SHL,  Op::SHR};

// ---------------------------------------------------------------------------------------
// Every ALU op on every dtype.

class AluOps : public ::testing::TestWithParam<Scalar> {};

TEST_P(AluOps, EveryPairOfEdgeValues) {
  const Scalar s = GetParam();
  constexpr int64_t P = 47;  // more than the edge values of any type, and odd
  Batch b;
  const UOp* x = b.edges(s, {P, 1}, 1);
  const UOp* y = b.edges(s, {1, P}, 2);
  const UOp* z = b.edges(s, {P, P}, 3);
  const UOp* c = b.random(Scalar::Bool, {P, P}, 4);
  // The same pairs as dense tensors, so vector code sees them in every lane of both
  // operands, not only against a broadcast (splat) one.
  HostTensor xd = HostTensor::zeros(s, {P * P}), yd = HostTensor::zeros(s, {P * P});
  for (int64_t i = 0; i < P * P; ++i) {
    xd.set_bits(i, b.inputs.at(b.tb.buffer_of(x)).get_bits(i / P));
    yd.set_bits(i, b.inputs.at(b.tb.buffer_of(y)).get_bits(i % P));
  }
  const UOp* xx = b.input(s, {P, P}, xd);
  const UOp* yy = b.input(s, {P, P}, yd);
  for (Op op : kUnary)
    if (op_defined_on(op, s)) b.out(b.tb.alu(op, {z}), name(op), transcendental(op) ? ulp_bound() : Tolerance::exact());
  for (Op op : kBinary) {
    if (!op_defined_on(op, s)) continue;
    Tolerance tol = transcendental(op) ? ulp_bound() : Tolerance::exact();
    b.out(b.tb.alu(op, {x, y}), name(op), tol);
    b.out(b.tb.alu(op, {xx, yy}), name(op) + " dense", tol);
  }
  b.out(b.tb.alu(Op::WHERE, {c, x, y}), "WHERE");
  if (op_defined_on(Op::MULACC, s)) b.out(b.tb.alu(Op::MULACC, {x, y, z}), "MULACC");
  b.expect_match();
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, AluOps, ::testing::ValuesIn(all_dtypes()), dtype_param_name);

// ---------------------------------------------------------------------------------------
// CAST between all dtypes (and through a middle one, which the simplifier folds when the
// middle type holds every value), BITCAST between all dtypes of one width.

class Casts : public ::testing::TestWithParam<Scalar> {};

TEST_P(Casts, ToEveryDtypeAndThroughEveryDtype) {
  const Scalar from = GetParam();
  Batch b;
  const UOp* x = b.edges(from, {97}, 5);
  const auto& all = all_dtypes();
  for (Scalar to : all)
    if (to != from) b.out(b.tb.cast(x, to), cat("to ", name(to)));
  for (size_t i = 0; i < all.size(); ++i) {
    Scalar mid = all[i], to = all[(i + static_cast<size_t>(from) * 5) % all.size()];
    if (mid != from) b.out(b.tb.cast(b.tb.cast(x, mid), to), cat("via ", name(mid), " to ", name(to)));
  }
  b.expect_match();
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, Casts, ::testing::ValuesIn(all_dtypes()), dtype_param_name);

class Bitcasts : public ::testing::TestWithParam<Scalar> {};

TEST_P(Bitcasts, ToEverySameWidthDtypeAndBack) {
  const Scalar from = GetParam();
  Batch b;
  // NaN payloads are outside the backend's contract, so a float source has no NaN.
  HostTensor data = edge_tensor(from, {97}, 6);
  for (int64_t i = 0; i < data.numel(); ++i)
    if (scalar_is_float(from) && std::isnan(data.get(i).as_float())) data.set(i, ConstValue::Float(1.25));
  const UOp* x = b.input(from, {97}, data);
  for (Scalar to : all_dtypes())
    if (to != Scalar::Bool && scalar_bits(to) == scalar_bits(from) && to != from) {
      b.out(b.tb.bitcast(x, to), cat("as ", name(to)));
      if (!scalar_is_float(to)) b.out(b.tb.bitcast(b.tb.bitcast(x, to), from), cat("round trip via ", name(to)));
    }
  b.expect_match();
}

// Every dtype but bool, which has no BITCAST; each has another dtype of its width.
INSTANTIATE_TEST_SUITE_P(AllButBool, Bitcasts,
                         ::testing::ValuesIn(std::vector<Scalar>(all_dtypes().begin() + 1, all_dtypes().end())),
                         dtype_param_name);

// ---------------------------------------------------------------------------------------
// Composites built from the primitives, on every float dtype.

class Composites : public ::testing::TestWithParam<Scalar> {};

TEST_P(Composites, MatchTheInterpreter) {
  const Scalar s = GetParam();
  Batch b;
  const UOp* x = b.edges(s, {3, 41}, 7, /*wide=*/false);
  auto& tb = b.tb;
  namespace c = composites;
  b.out(c::exp(tb, x), "exp", defaults(s));
  b.out(c::log(tb, c::abs(tb, x)), "log|x|", defaults(s));
  b.out(c::sigmoid(tb, x), "sigmoid", defaults(s));
  b.out(c::tanh(tb, x), "tanh", defaults(s));
  b.out(c::gelu(tb, x), "gelu", defaults(s));
  b.out(c::erf(tb, x), "erf", defaults(s));
  const UOp* r = b.random(s, {5, 17}, 8);
  b.out(c::rsqrt_mean_square(tb, r), "rsqrt(mean(x^2))", mul_reduction(s, 17));  // positive terms: relative
  // softmax over the last axis: max, exp of the difference, sum, divide.
  const UOp* e = c::exp(tb, tb.alu(Op::SUB, {r, tb.reduce(r, ReduceOp::Max, {1})}));
  b.out(tb.alu(Op::FDIV, {e, tb.reduce(e, ReduceOp::Add, {1})}), "softmax", add_reduction(s, 17, 17));
  b.out(tb.alu(Op::SIN, {tb.alu(Op::ADD, {r, c::k(tb, r, 1.5707963267948966)})}), "cos", ulp_bound());
  b.expect_match();
}

INSTANTIATE_TEST_SUITE_P(Floats, Composites,
                         ::testing::Values(Scalar::Float16, Scalar::BFloat16, Scalar::Float32, Scalar::Float64),
                         dtype_param_name);

// ---------------------------------------------------------------------------------------
// Shapes: zero-size, size-1, odd, broadcast and large, with a few representative ops per
// dtype (an element-wise op against a broadcast operand, a comparison feeding WHERE, a
// reduction, a cast).

struct ShapeCase {
  std::string name;
  std::vector<int64_t> x, y;  // y broadcasts against x
};

class Shapes : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(Shapes, RepresentativeOpsOnEveryDtype) {
  const ShapeCase& sc = GetParam();
  Batch b;
  uint64_t seed = 10;
  for (Scalar s : all_dtypes()) {
    const UOp* x = b.edges(s, sc.x, seed++);
    const UOp* y = b.edges(s, sc.y, seed++);
    Op op = s == Scalar::Bool ? Op::XOR : Op::MUL;
    b.out(b.tb.alu(op, {x, y}), cat(name(s), " ", name(op)));
    b.out(b.tb.alu(Op::WHERE, {b.tb.alu(Op::CMPLT, {x, y}), x, y}), cat(name(s), " where(x<y)"));
    if (!sc.x.empty())
      b.out(b.tb.reduce(x, ReduceOp::Max, {static_cast<int64_t>(sc.x.size()) - 1}), cat(name(s), " max"));
    b.out(b.tb.cast(x, s == Scalar::Float32 ? Scalar::Int32 : Scalar::Float32), cat(name(s), " cast"));
  }
  b.expect_match();
}

INSTANTIATE_TEST_SUITE_P(
    All, Shapes,
    ::testing::Values(ShapeCase{"Scalar", {}, {}}, ShapeCase{"Zero", {0}, {1}}, ShapeCase{"ZeroInner", {5, 0}, {1, 0}},
                      ShapeCase{"ZeroOuter", {0, 3}, {3}}, ShapeCase{"One", {1}, {1}},
                      ShapeCase{"OnesRank4", {1, 1, 1, 1}, {1}}, ShapeCase{"Odd", {3, 5, 7}, {3, 5, 7}},
                      ShapeCase{"BroadcastMiddle", {4, 1, 6}, {4, 5, 1}},
                      ShapeCase{"BroadcastRank", {2, 3, 4, 5}, {4, 1}},
                      ShapeCase{"Large", {7, 4099}, {1, 4099}}),
    [](const ::testing::TestParamInfo<ShapeCase>& p) { return p.param.name; });

// Many elements through few ops: the Thread split, vector loops and their remainders.
TEST(LargeShapes, ElementwiseAndReductions) {
  Batch b;
  const UOp* f = b.ints(Scalar::Float32, {3, 100003}, 30);  // sums exact in any order
  const UOp* i = b.edges(Scalar::Int32, {3, 100003}, 31);
  const UOp* h = b.edges(Scalar::Float16, {100003}, 32);
  auto& tb = b.tb;
  b.out(tb.alu(Op::MULACC, {f, f, tb.full(Scalar::Float32, 0.5, {})}), "f32 mulacc");
  b.out(tb.reduce(f, ReduceOp::Add, {1}), "f32 sum");
  b.out(tb.reduce(f, ReduceOp::Max, {0, 1}), "f32 max");
  b.out(tb.alu(Op::IDIV, {i, tb.flip(i, {true, true})}), "i32 idiv flipped");
  b.out(tb.reduce(i, ReduceOp::Add, {0}), "i32 sum");
  b.out(tb.cast(tb.alu(Op::MAX, {h, tb.flip(h, {true})}), Scalar::BFloat16), "f16 max -> bf16");
  b.out(tb.alu(Op::SIN, {h}), "f16 sin", ulp_bound());
  b.expect_match();
}

// ---------------------------------------------------------------------------------------
// Movement ops: every ordered pair, then random chains of three, on an int32 tensor (exact)
// and through arithmetic on both sides; PAD of computed values fills zero, not f(0).

TEST(Movement, EveryOrderedPairAndRandomChains) {
  Batch b;
  auto& tb = b.tb;
  const UOp* x = b.edges(Scalar::Int32, {3, 4, 5}, 40);
  const std::vector<Op> ops = {Op::RESHAPE, Op::PERMUTE, Op::EXPAND, Op::PAD, Op::SHRINK, Op::FLIP};
  randgraph::Rng rng(41);
  for (Op first : ops)
    for (Op second : ops) {
      const UOp* y = randgraph::random_movement(tb, randgraph::random_movement(tb, x, first, rng, 2000), second, rng, 2000);
      b.out(y, cat(name(first), " then ", name(second), " ", shape_str(tb.shape(y))));
    }
  for (int i = 0; i < 12; ++i) {
    const UOp* y = tb.alu(Op::ADD, {x, tb.full(Scalar::Int32, ConstValue::Int(i), {})});
    std::string label = "x+const";
    for (int k = 0; k < 3; ++k) {
      Op op = ops[rng.range(0, 5)];
      y = randgraph::random_movement(tb, y, op, rng, 2000);
      label += cat(" ", name(op));
    }
    b.out(tb.alu(Op::MUL, {y, y}), cat(label, " ", shape_str(tb.shape(y))));
  }
  const UOp* f = b.edges(Scalar::Float16, {4, 5}, 42);
  b.out(tb.pad(tb.alu(Op::EXP2, {f}), {1, 0}, {2, 3}), "pad(exp2(f16))", ulp_bound());
  b.out(tb.pad(tb.alu(Op::CMPLT, {f, tb.full(Scalar::Float16, 0.5, {})}), {0, 2}, {1, 0}), "pad(f16 < 0.5)");
  b.out(tb.pad(tb.alu(Op::ADD, {x, tb.full(Scalar::Int32, ConstValue::Int(1), {})}), {1, 1, 1}, {1, 1, 1}), "pad(x+1)");
  b.out(tb.shrink(tb.pad(tb.flip(x, {false, true, true}), {2, 0, 1}, {0, 3, 1}), {1, 2, 0}, {5, 7, 7}), "pad shrink flip");
  b.expect_match();
}

// PAD of a zero-size tensor is all zeros: its reads sit under a gate that never holds.
TEST(Movement, PadOfAnEmptyTensor) {
  Batch b;
  const UOp* x = b.random(Scalar::Int32, {0, 3}, 43);
  const UOp* y = b.random(Scalar::Float32, {0, 2, 13}, 44);
  b.out(b.tb.pad(x, {1, 1}, {1, 0}), "int32[0, 3] padded to [2, 4]");
  b.out(b.tb.pad(b.tb.alu(Op::ADD, {y, y}), {1, 0, 2}, {2, 0, 1}), "float32[0, 2, 13] padded to [3, 2, 16]");
  b.expect_match();
}

// A PAD of an outer axis merged away by a RESHAPE: the pad's gate is on flat / 4.
TEST(Movement, PadThenReshapeMergingThePaddedAxis) {
  Batch b;
  const UOp* x = b.edges(Scalar::Int32, {3, 4}, 45);
  b.out(b.tb.reshape(b.tb.pad(x, {1, 0}, {0, 0}), {16}), "pad [3, 4] -> [4, 4] -> [16]");
  b.out(b.tb.reshape(b.tb.pad(x, {0, 0}, {2, 0}), {2, 10}), "pad [3, 4] -> [5, 4] -> [2, 10]");
  const UOp* y = b.edges(Scalar::Float64, {16, 8, 1}, 46);
  b.out(b.tb.reshape(b.tb.pad(y, {0, 0, 0}, {2, 0, 0}), {3, 6, 8}), "pad [16, 8, 1] -> [18, 8, 1] -> [3, 6, 8]");
  b.expect_match();
}

// ---------------------------------------------------------------------------------------
// REDUCE_AXIS: every op on every dtype, every axis set, empty axes, reductions feeding
// element-wise ops that are reduced again.

class Reductions : public ::testing::TestWithParam<Scalar> {};

TEST_P(Reductions, EveryOpOverSeveralAxisSets) {
  const Scalar s = GetParam();
  Batch b;
  // Max / Min see the edge values; Add / Mul bounded values (no overflow, whatever the order).
  const UOp* e = b.edges(s, {5, 7, 3}, 50);
  const UOp* r = b.random(s, {5, 7, 3}, 51);
  const UOp* z = b.random(s, {3, 0, 2}, 52);
  for (ReduceOp op : {ReduceOp::Add, ReduceOp::Mul, ReduceOp::Max, ReduceOp::Min}) {
    if (!op_defined_on(reduce_combine_op(op), s)) continue;
    bool minmax = op == ReduceOp::Max || op == ReduceOp::Min;
    auto tol = [&](int64_t n) {  // random floats are in [-2, 2]
      return minmax ? Tolerance::exact() : op == ReduceOp::Add ? add_reduction(s, n, 2.0 * n) : mul_reduction(s, n);
    };
    const UOp* x = minmax ? e : r;
    std::string n(reduce_op_name(op));
    b.out(b.tb.reduce(x, op, {1}), n + " {1}", tol(7));
    b.out(b.tb.reduce(x, op, {0, 2}), n + " {0,2}", tol(15));
    b.out(b.tb.reduce(z, op, {1}), n + " over a zero-size axis (the identity)", Tolerance::exact());
    b.out(b.tb.reduce(z, op, {0, 2}), n + " of a zero-size tensor, other axes", tol(6));
  }
  b.expect_match();
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, Reductions, ::testing::ValuesIn(all_dtypes()), dtype_param_name);

TEST(Reductions, EveryAxisSet) {
  Batch b;
  const UOp* i = b.edges(Scalar::Int32, {2, 3, 5, 7}, 53);
  const UOp* f = b.ints(Scalar::Float32, {2, 3, 5, 7}, 54);  // exact in any order
  for (int mask = 0; mask < 16; ++mask) {
    std::vector<int64_t> axes;
    for (int a = 0; a < 4; ++a)
      if (mask & (1 << a)) axes.push_back(a);
    std::string set = cat("{", join(axes, ","), "}");
    b.out(b.tb.reduce(i, mask % 2 ? ReduceOp::Add : ReduceOp::Min, axes), "i32 " + set);
    b.out(b.tb.reduce(f, mask % 3 ? ReduceOp::Add : ReduceOp::Max, axes), "f32 " + set);
  }
  // Unordered axes are a set too.
  b.out(b.tb.reduce(i, ReduceOp::Max, {3, 0}), "i32 max {3,0}");
  b.expect_match();
}

TEST(Reductions, ReducedThenElementwiseThenReducedAgain) {
  Batch b;
  auto& tb = b.tb;
  const UOp* x = b.random(Scalar::Float32, {6, 9}, 55);
  const UOp* n = b.edges(Scalar::Int16, {6, 9}, 56);
  // x - mean(x) along rows, squared, summed down the columns: a variance.
  const UOp* mean = tb.alu(Op::MUL, {tb.reduce(x, ReduceOp::Add, {1}), tb.full(Scalar::Float32, 1.0 / 9, {})});
  const UOp* d = tb.alu(Op::SUB, {x, mean});
  // Terms d^2 <= 16, doubled for the rounding the mean passes on.
  b.out(tb.reduce(tb.alu(Op::MUL, {d, d}), ReduceOp::Add, {0, 1}), "variance", add_reduction(Scalar::Float32, 54, 54 * 32));
  // Nested without a broadcast: max over rows of (sum over columns * 3).
  const UOp* s = tb.alu(Op::MUL, {tb.reduce(n, ReduceOp::Add, {1}), tb.full(Scalar::Int16, ConstValue::Int(3), {})});
  b.out(tb.reduce(s, ReduceOp::Max, {0}), "max of scaled sums");
  b.out(tb.reduce(tb.alu(Op::SUB, {n, tb.reduce(n, ReduceOp::Min, {0})}), ReduceOp::Mul, {1}), "prod(n - min(n))");
  // A reduction read by two outputs and by itself broadcast.
  const UOp* m = tb.reduce(n, ReduceOp::Max, {0, 1});
  b.out(m, "max");
  b.out(tb.alu(Op::CMPEQ, {n, m}), "n == max");
  b.expect_match();
}

// ---------------------------------------------------------------------------------------
// Matmul and batched matmul: EXPAND + MUL + REDUCE_AXIS.

TEST(Matmul, PlainBatchedBroadcastAndDegenerate) {
  Batch b;
  auto& tb = b.tb;
  // Small integers: every product and partial sum is exact, so any order compares bit for bit.
  auto mm = [&](Scalar s, std::vector<int64_t> sa, std::vector<int64_t> sb, const std::string& label) {
    int64_t lo = scalar_is_unsigned_int(s) ? 0 : -3;
    const UOp* x = b.ints(s, sa, 60 + b.outputs.size(), lo, 3);
    const UOp* y = b.ints(s, sb, 80 + b.outputs.size(), lo, 3);
    b.out(tb.matmul(x, y), cat(name(s), " ", label));
  };
  for (Scalar s : {Scalar::Float32, Scalar::Int32, Scalar::Float16, Scalar::BFloat16, Scalar::Float64, Scalar::UInt8})
    mm(s, {5, 7}, {7, 3}, "5x7 @ 7x3");
  mm(Scalar::Float32, {2, 3, 4, 5}, {2, 3, 5, 6}, "batched 2x3x[4x5 @ 5x6]");
  mm(Scalar::Float32, {1, 1}, {1, 9}, "k = 1");
  mm(Scalar::Float32, {0, 4}, {4, 3}, "m = 0");
  mm(Scalar::Float32, {3, 0}, {0, 2}, "k = 0 (zeros)");
  mm(Scalar::Float32, {64, 96}, {96, 80}, "64x96 @ 96x80");
  // Random values: sums of 96 products of magnitude <= 4, in whatever order the code adds.
  b.out(tb.matmul(b.random(Scalar::Float32, {64, 96}, 95), b.random(Scalar::Float32, {96, 80}, 96)),
        "float32 random 64x96 @ 96x80", add_reduction(Scalar::Float32, 96, 96 * 4));
  // Batch broadcast: [1, 4, 5] against [3, 5, 2], expanded by hand to one batch.
  const UOp* x = b.ints(Scalar::Float32, {1, 4, 5}, 90);
  const UOp* y = b.ints(Scalar::Float32, {3, 5, 2}, 91);
  b.out(tb.matmul(tb.expand(x, {3, 4, 5}), y), "broadcast batch");
  // A matmul feeding an activation and a second matmul (an MLP layer pair).
  const UOp* w1 = b.ints(Scalar::Float32, {8, 16}, 92);
  const UOp* w2 = b.random(Scalar::Float32, {16, 4}, 93);
  const UOp* in = b.ints(Scalar::Float32, {5, 8}, 94);
  const UOp* h = composites::gelu(tb, tb.matmul(in, w1));  // |h| <= 72
  b.out(tb.matmul(h, w2), "mlp", add_reduction(Scalar::Float32, 16, 16 * 72 * 2));
  b.expect_match();
}

// ---------------------------------------------------------------------------------------
// DEFINE_VAR / BIND: a batch dim bound at run time. The BUFFER holds the maximum batch; a
// SHRINK to BIND(b) * 6 and a RESHAPE to [b, 6] view the bound part. Every bound value is
// the same kernel, compiled once.

struct SymbolicGraph {
  Graph g;
  const UOp* sink;
  Inputs inputs;
};

// `flip` adds a FLIP along the batch axis (its index b - 1 - r needs r < b to be proven).
std::unique_ptr<SymbolicGraph> symbolic_graph(int64_t batch, int64_t max_batch, bool flip) {
  auto sg = std::make_unique<SymbolicGraph>();
  Graph& g = sg->g;
  const UOp* dev = g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{"CPU:0"}});
  auto buffer = [&](int64_t id, int64_t n, DType dt) {
    return g.make(Op::BUFFER, dt, {g.make(Op::UNIQUE, dtypes::void_, {}, IntArg{id}), dev}, BufferArg{n});
  };
  const UOp* b = g.make(Op::BIND, dtypes::index,
                        {g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"b", 1, max_batch}), g.idx(batch)});
  const UOp* buf = buffer(0, max_batch * 6, dtypes::float32);
  const UOp* ibuf = buffer(1, max_batch * 6, dtypes::int32);
  auto view = [&](const UOp* base) {
    const UOp* n = g.alu(Op::MUL, {b, g.idx(6)});
    const UOp* x = g.make(Op::SHRINK, base->dtype(), {base, make_shape_operand(g, {g.idx(0)}), make_shape_operand(g, {n})});
    return g.make(Op::RESHAPE, base->dtype(), {x, make_shape_operand(g, {b, g.idx(6)})});
  };
  const UOp* x = view(buf);
  const UOp* i = view(ibuf);
  const UOp* two = g.make(Op::EXPAND, dtypes::float32,
                          {g.make(Op::RESHAPE, dtypes::float32, {g.cnst(dtypes::float32, 2.0), make_shape_operand(g, {g.idx(1), g.idx(1)})}),
                           make_shape_operand(g, {b, g.idx(6)})});
  const UOp* rowsum = g.make(Op::REDUCE_AXIS, dtypes::float32, {x}, ReduceAxisArg{ReduceOp::Add, {1}});
  const UOp* colmax = g.make(Op::REDUCE_AXIS, dtypes::int32, {i}, ReduceAxisArg{ReduceOp::Max, {0}});
  const UOp* bcast = g.make(Op::EXPAND, dtypes::float32, {rowsum, make_shape_operand(g, {b, g.idx(6)})});
  std::vector<const UOp*> outs = {g.alu(Op::MUL, {x, two}), g.alu(Op::SUB, {x, bcast}), colmax};
  if (flip) outs.push_back(g.make(Op::CAST, dtypes::float32, {g.make(Op::FLIP, dtypes::int32, {i}, BoolsArg{{true, false}})}));
  sg->sink = g.make(Op::SINK, dtypes::void_, outs);
  sg->inputs[buf] = HostTensor::random(Scalar::Float32, {max_batch * 6}, 100);
  sg->inputs[ibuf] = edge_tensor(Scalar::Int32, {max_batch * 6}, 101);
  return sg;
}

void check_symbolic_batches(bool flip) {
  constexpr int64_t kMax = 9;
  std::vector<Digest> first;
  for (int64_t batch : std::vector<int64_t>{3, 1, kMax, 4}) {
    auto sg = symbolic_graph(batch, kMax, flip);
    std::vector<OutputCheck> checks = {{"x*2"}, {"x - rowsum", add_reduction(Scalar::Float32, 6, 12)}, {"colmax"}, {"cast(flip)"}};
    RunStats stats;
    EXPECT_EQ(check_graph(runner(), sg->g, sg->sink, sg->inputs, checks, &stats), "") << "batch " << batch;
    auto plan = plan_graph(sg->g, sg->sink);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<Digest> digests;
    for (const KernelPlan& k : plan->kernels) digests.push_back(k.kernel->digest());
    if (first.empty()) {
      first = digests;
      continue;
    }
    EXPECT_EQ(digests, first) << "batch " << batch << " should reuse the kernels of the first run";
    EXPECT_EQ(stats.compiled, 0) << "batch " << batch << " compiled again";
  }
}

TEST(Symbolic, BatchBoundAtRunTime) { check_symbolic_batches(/*flip=*/false); }
TEST(Symbolic, FlipOfTheBatchAxis) { check_symbolic_batches(/*flip=*/true); }

}  // namespace
}  // namespace uop
