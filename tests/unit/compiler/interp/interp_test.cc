// The reference interpreter against expectations written out by hand: each movement op,
// each reduction, broadcasting, casts and symbolic dims at tensor level; elementwise,
// reduction, gated, END and variable-bound kernels at kernel level; and the two levels
// against each other on equivalent graphs.
#include "compiler/interp/interp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "compiler/support/strings.h"
#include "tests/unit/compiler/passes/kernel_builder.h"

namespace uop {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// Builds tensor-level graphs tersely.
struct T {
  Graph g;
  const UOp* dev = g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{"CPU:0"}});
  int64_t uniques = 0;
  absl::flat_hash_map<const UOp*, HostTensor> inputs;

  // A BUFFER holding `data` (bound as its input); shaped with reshape() as needed.
  const UOp* input(const HostTensor& data) {
    const UOp* u = g.make(Op::UNIQUE, dtypes::void_, {}, IntArg{uniques++});
    const UOp* b = g.make(Op::BUFFER, DType(data.dtype), {u, dev}, BufferArg{data.numel()});
    inputs[b] = data;
    return b;
  }
  // A BUFFER with `data`, reshaped to data's shape.
  const UOp* tensor(const HostTensor& data) { return reshape(input(data), data.shape); }
  const UOp* shape(std::vector<int64_t> dims) {
    VConstArg a;
    for (int64_t d : dims) a.values.push_back(ConstValue::Int(d));
    return g.make(Op::VCONST, DType(Scalar::Index, static_cast<uint32_t>(dims.size())), {}, std::move(a));
  }
  const UOp* reshape(const UOp* x, std::vector<int64_t> s) { return g.make(Op::RESHAPE, x->dtype(), {x, shape(s)}); }
  const UOp* expand(const UOp* x, std::vector<int64_t> s) { return g.make(Op::EXPAND, x->dtype(), {x, shape(s)}); }
  const UOp* permute(const UOp* x, std::vector<int64_t> p) { return g.make(Op::PERMUTE, x->dtype(), {x}, IntsArg{p}); }
  const UOp* pad(const UOp* x, std::vector<int64_t> b, std::vector<int64_t> e) {
    return g.make(Op::PAD, x->dtype(), {x, shape(b), shape(e)});
  }
  const UOp* shrink(const UOp* x, std::vector<int64_t> b, std::vector<int64_t> e) {
    return g.make(Op::SHRINK, x->dtype(), {x, shape(b), shape(e)});
  }
  const UOp* flip(const UOp* x, std::vector<bool> f) { return g.make(Op::FLIP, x->dtype(), {x}, BoolsArg{f}); }
  const UOp* reduce(const UOp* x, ReduceOp op, std::vector<int64_t> axes) {
    return g.make(Op::REDUCE_AXIS, x->dtype(), {x}, ReduceAxisArg{op, axes});
  }
  const UOp* cast(const UOp* x, Scalar s) { return g.make(Op::CAST, DType(s), {x}); }
  const UOp* bitcast(const UOp* x, Scalar s) { return g.make(Op::BITCAST, DType(s), {x}); }

  absl::StatusOr<std::vector<HostTensor>> run(std::vector<const UOp*> outs, InterpOptions o = {}) {
    const UOp* sink = g.make(Op::SINK, dtypes::void_, outs, KernelInfoArg{});
    return interpret(g, sink, inputs, o);
  }
  // The one output of `out`, or a failed test.
  HostTensor eval(const UOp* out) {
    auto r = run({out});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return HostTensor::zeros(Scalar::Int8, {0});
    return (*r)[0];
  }
  absl::Status error(const UOp* out, InterpOptions o = {}) {
    auto r = run({out}, o);
    return r.ok() ? absl::OkStatus() : r.status();
  }
};

HostTensor I32(std::vector<int64_t> shape, std::initializer_list<double> v) { return HostTensor::of(Scalar::Int32, shape, v); }
HostTensor F32(std::vector<int64_t> shape, std::initializer_list<double> v) { return HostTensor::of(Scalar::Float32, shape, v); }
HostTensor Bool(std::vector<int64_t> shape, std::initializer_list<double> v) { return HostTensor::of(Scalar::Bool, shape, v); }
HostTensor iota(Scalar s, std::vector<int64_t> shape) {
  HostTensor t = HostTensor::zeros(s, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, ConstValue::Int(i));
  return t;
}

#define EXPECT_TENSOR(got, want)                                     \
  do {                                                               \
    CompareResult r_ = compare((want), (got), Tolerance::exact());   \
    EXPECT_TRUE(r_.ok) << r_.message << "\n  got " << (got).str(64); \
  } while (0)

#define ASSERT_OK(status)            \
  do {                               \
    absl::Status s_ = (status);      \
    ASSERT_TRUE(s_.ok()) << s_;      \
  } while (0)

#define EXPECT_ERROR(status, code_, text)                                            \
  do {                                                                               \
    absl::Status s_ = (status);                                                      \
    EXPECT_EQ(s_.code(), absl::StatusCode::code_) << s_;                             \
    EXPECT_NE(std::string(s_.message()).find(text), std::string::npos) << s_;        \
  } while (0)

// ---------------------------------------------------------------------------------------
// Tensor level: movement

TEST(InterpTensor, Reshape) {
  T t;
  const UOp* x = t.tensor(iota(Scalar::Int32, {3, 2}));
  EXPECT_TENSOR(t.eval(t.reshape(x, {2, 3})), I32({2, 3}, {0, 1, 2, 3, 4, 5}));
  EXPECT_TENSOR(t.eval(t.reshape(x, {6})), I32({6}, {0, 1, 2, 3, 4, 5}));
  EXPECT_TENSOR(t.eval(t.reshape(t.reshape(x, {1, 6, 1}), {3, 2})), iota(Scalar::Int32, {3, 2}));
}

TEST(InterpTensor, Permute) {
  T t;
  const UOp* x = t.tensor(iota(Scalar::Int32, {2, 3}));
  EXPECT_TENSOR(t.eval(t.permute(x, {1, 0})), I32({3, 2}, {0, 3, 1, 4, 2, 5}));
  // NumPy: np.arange(8).reshape(2, 2, 2).transpose(2, 0, 1)
  const UOp* y = t.tensor(iota(Scalar::Int32, {2, 2, 2}));
  EXPECT_TENSOR(t.eval(t.permute(y, {2, 0, 1})), I32({2, 2, 2}, {0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_TENSOR(t.eval(t.permute(y, {0, 1, 2})), iota(Scalar::Int32, {2, 2, 2}));
}

TEST(InterpTensor, Expand) {
  T t;
  const UOp* row = t.tensor(I32({1, 3}, {1, 2, 3}));
  EXPECT_TENSOR(t.eval(t.expand(row, {2, 3})), I32({2, 3}, {1, 2, 3, 1, 2, 3}));
  const UOp* col = t.tensor(I32({2, 1}, {1, 2}));
  EXPECT_TENSOR(t.eval(t.expand(col, {2, 3})), I32({2, 3}, {1, 1, 1, 2, 2, 2}));
  const UOp* one = t.tensor(I32({1, 1}, {7}));
  EXPECT_TENSOR(t.eval(t.expand(one, {2, 2})), I32({2, 2}, {7, 7, 7, 7}));
  EXPECT_TENSOR(t.eval(t.expand(one, {0, 3})), I32({0, 3}, {}));
}

TEST(InterpTensor, PadFillsWithZeroFalseAndPositiveZero) {
  T t;
  const UOp* x = t.tensor(I32({2, 2}, {1, 2, 3, 4}));
  EXPECT_TENSOR(t.eval(t.pad(x, {1, 0}, {0, 1})), I32({3, 3}, {0, 0, 0, 1, 2, 0, 3, 4, 0}));
  const UOp* b = t.tensor(Bool({2}, {1, 1}));
  EXPECT_TENSOR(t.eval(t.pad(b, {1}, {2})), Bool({5}, {0, 1, 1, 0, 0}));
  const UOp* f = t.tensor(F32({1}, {-1}));
  HostTensor padded = t.eval(t.pad(f, {1}, {0}));
  EXPECT_EQ(padded.data, HostTensor::of(Scalar::Float32, {2}, {0.0, -1.0}).data);  // +0.0, bit for bit
  const UOp* e = t.tensor(HostTensor::zeros(Scalar::Int32, {0, 2}));
  EXPECT_TENSOR(t.eval(t.pad(e, {1, 0}, {0, 0})), I32({1, 2}, {0, 0}));
}

TEST(InterpTensor, Shrink) {
  T t;
  const UOp* x = t.tensor(iota(Scalar::Int32, {3, 3}));
  EXPECT_TENSOR(t.eval(t.shrink(x, {1, 1}, {3, 2})), I32({2, 1}, {4, 7}));
  EXPECT_TENSOR(t.eval(t.shrink(x, {0, 0}, {3, 3})), iota(Scalar::Int32, {3, 3}));
  EXPECT_TENSOR(t.eval(t.shrink(x, {2, 1}, {2, 3})), I32({0, 2}, {}));
}

TEST(InterpTensor, Flip) {
  T t;
  const UOp* x = t.tensor(iota(Scalar::Int32, {2, 3}));
  EXPECT_TENSOR(t.eval(t.flip(x, {true, false})), I32({2, 3}, {3, 4, 5, 0, 1, 2}));
  EXPECT_TENSOR(t.eval(t.flip(x, {false, true})), I32({2, 3}, {2, 1, 0, 5, 4, 3}));
  EXPECT_TENSOR(t.eval(t.flip(x, {true, true})), I32({2, 3}, {5, 4, 3, 2, 1, 0}));
}

TEST(InterpTensor, ScalarsAndZeroSizeInputs) {
  T t;
  const UOp* c = t.g.cnst(dtypes::float32, 2.5);
  EXPECT_TENSOR(t.eval(c), F32({}, {2.5}));
  EXPECT_TENSOR(t.eval(t.expand(t.reshape(c, {1, 1}), {2, 2})), F32({2, 2}, {2.5, 2.5, 2.5, 2.5}));
  const UOp* e = t.input(HostTensor::zeros(Scalar::Float32, {0}));
  EXPECT_TENSOR(t.eval(t.g.alu(Op::ADD, {t.reshape(e, {0, 3}), t.reshape(e, {0, 3})})), F32({0, 3}, {}));
}

// ---------------------------------------------------------------------------------------
// Tensor level: reductions

TEST(InterpTensor, ReduceEachOpOverEachAxisSet) {
  T t;
  const UOp* x = t.tensor(I32({2, 3}, {1, 2, 3, 4, 5, 6}));
  struct Case {
    ReduceOp op;
    std::vector<int64_t> axes;
    HostTensor want;
  } cases[] = {
      {ReduceOp::Add, {0}, I32({1, 3}, {5, 7, 9})},     {ReduceOp::Add, {1}, I32({2, 1}, {6, 15})},
      {ReduceOp::Add, {0, 1}, I32({1, 1}, {21})},       {ReduceOp::Add, {}, I32({2, 3}, {1, 2, 3, 4, 5, 6})},
      {ReduceOp::Mul, {0}, I32({1, 3}, {4, 10, 18})},   {ReduceOp::Mul, {1}, I32({2, 1}, {6, 120})},
      {ReduceOp::Mul, {1, 0}, I32({1, 1}, {720})},      {ReduceOp::Max, {0}, I32({1, 3}, {4, 5, 6})},
      {ReduceOp::Max, {1}, I32({2, 1}, {3, 6})},        {ReduceOp::Max, {0, 1}, I32({1, 1}, {6})},
      {ReduceOp::Min, {0}, I32({1, 3}, {1, 2, 3})},     {ReduceOp::Min, {1}, I32({2, 1}, {1, 4})},
      {ReduceOp::Min, {0, 1}, I32({1, 1}, {1})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(cat(reduce_op_name(c.op), " axes ", join(c.axes, ",")));
    EXPECT_TENSOR(t.eval(t.reduce(x, c.op, c.axes)), c.want);
  }
}

TEST(InterpTensor, ReduceFloatsPropagateNaN) {
  T t;
  const UOp* x = t.tensor(F32({2, 2}, {1, kNaN, 3, 4}));
  EXPECT_TENSOR(t.eval(t.reduce(x, ReduceOp::Max, {1})), F32({2, 1}, {kNaN, 4}));
  EXPECT_TENSOR(t.eval(t.reduce(x, ReduceOp::Add, {0})), F32({1, 2}, {4, kNaN}));
  EXPECT_TENSOR(t.eval(t.reduce(x, ReduceOp::Min, {0, 1})), F32({1, 1}, {kNaN}));
  EXPECT_TENSOR(t.eval(t.reduce(x, ReduceOp::Mul, {0})), F32({1, 2}, {3, kNaN}));
}

TEST(InterpTensor, ReduceFoldsInIncreasingIndexOrder) {
  T t;
  // ((0 + 1e8) + 1) + -1e8 + 1 in float32: the first 1 is lost next to 1e8, the last is not.
  const UOp* x = t.tensor(F32({4}, {1e8, 1, -1e8, 1}));
  EXPECT_TENSOR(t.eval(t.reduce(x, ReduceOp::Add, {0})), F32({1}, {1}));
}

TEST(InterpTensor, ReduceBoolsAndIdentitiesOfEmptyAxes) {
  T t;
  const UOp* b = t.tensor(Bool({2, 2}, {1, 0, 0, 0}));
  EXPECT_TENSOR(t.eval(t.reduce(b, ReduceOp::Max, {1})), Bool({2, 1}, {1, 0}));
  EXPECT_TENSOR(t.eval(t.reduce(b, ReduceOp::Min, {1})), Bool({2, 1}, {0, 0}));
  EXPECT_ERROR(t.error(t.reduce(b, ReduceOp::Add, {1})), kInvalidArgument, "Add is not defined on bool");

  const UOp* ef = t.tensor(HostTensor::zeros(Scalar::Float32, {0, 3}));
  EXPECT_TENSOR(t.eval(t.reduce(ef, ReduceOp::Add, {0})), F32({1, 3}, {0, 0, 0}));
  EXPECT_TENSOR(t.eval(t.reduce(ef, ReduceOp::Mul, {0})), F32({1, 3}, {1, 1, 1}));
  EXPECT_TENSOR(t.eval(t.reduce(ef, ReduceOp::Max, {0})), F32({1, 3}, {-INFINITY, -INFINITY, -INFINITY}));
  EXPECT_TENSOR(t.eval(t.reduce(ef, ReduceOp::Min, {0, 1})), F32({1, 1}, {INFINITY}));
  EXPECT_TENSOR(t.eval(t.reduce(ef, ReduceOp::Max, {1})), F32({0, 1}, {}));
  const UOp* ei = t.tensor(HostTensor::zeros(Scalar::Int32, {0}));
  EXPECT_TENSOR(t.eval(t.reduce(ei, ReduceOp::Max, {0})), I32({1}, {-2147483648.0}));
  EXPECT_TENSOR(t.eval(t.reduce(ei, ReduceOp::Min, {0})), I32({1}, {2147483647}));
  const UOp* eu = t.tensor(HostTensor::zeros(Scalar::UInt8, {0}));
  EXPECT_TENSOR(t.eval(t.reduce(eu, ReduceOp::Min, {0})), HostTensor::of(Scalar::UInt8, {1}, {255}));
  EXPECT_TENSOR(t.eval(t.reduce(eu, ReduceOp::Max, {0})), HostTensor::of(Scalar::UInt8, {1}, {0}));
  const UOp* eb = t.tensor(HostTensor::zeros(Scalar::Bool, {0}));
  EXPECT_TENSOR(t.eval(t.reduce(eb, ReduceOp::Min, {0})), Bool({1}, {1}));
}

TEST(InterpTensor, IntegerReductionsWrap) {
  T t;
  const UOp* x = t.tensor(HostTensor::of(Scalar::Int8, {3}, {100, 100, -1}));
  EXPECT_TENSOR(t.eval(t.reduce(x, ReduceOp::Add, {0})), HostTensor::of(Scalar::Int8, {1}, {-57}));
}

// ---------------------------------------------------------------------------------------
// Tensor level: ALU, broadcasting, casts

// A (M, K) @ B (K, N) as the frontend writes it: both expanded to (M, K, N), multiplied,
// summed over K.
const UOp* matmul(T& t, const UOp* a, const UOp* b, int64_t m, int64_t k, int64_t n) {
  const UOp* ae = t.expand(t.reshape(a, {m, k, 1}), {m, k, n});
  const UOp* be = t.expand(t.reshape(b, {1, k, n}), {m, k, n});
  return t.reshape(t.reduce(t.g.alu(Op::MUL, {ae, be}), ReduceOp::Add, {1}), {m, n});
}

TEST(InterpTensor, MatmulMatchesATripleLoop) {
  const int64_t M = 4, K = 7, N = 5;
  HostTensor a = HostTensor::random(Scalar::Float32, {M, K}, 1), b = HostTensor::random(Scalar::Float32, {K, N}, 2);
  T t;
  HostTensor got = t.eval(matmul(t, t.tensor(a), t.tensor(b), M, K, N));
  HostTensor want = HostTensor::zeros(Scalar::Float32, {M, N});
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += static_cast<float>(a.get(i * K + k).as_float()) * static_cast<float>(b.get(k * N + j).as_float());
      want.set(i * N + j, ConstValue::Float(acc));
    }
  EXPECT_TENSOR(got, want);
}

TEST(InterpTensor, BroadcastingAddAndWhere) {
  T t;
  const UOp* x = t.tensor(I32({2, 3}, {1, 2, 3, 4, 5, 6}));
  const UOp* y = t.expand(t.reshape(t.tensor(I32({3}, {10, 20, 30})), {1, 3}), {2, 3});
  EXPECT_TENSOR(t.eval(t.g.alu(Op::ADD, {x, y})), I32({2, 3}, {11, 22, 33, 14, 25, 36}));
  const UOp* three = t.expand(t.reshape(t.g.cnst_int(dtypes::int32, 3), {1, 1}), {2, 3});
  const UOp* lt = t.g.alu(Op::CMPLT, {x, three});
  EXPECT_TENSOR(t.eval(lt), Bool({2, 3}, {1, 1, 0, 0, 0, 0}));
  EXPECT_TENSOR(t.eval(t.g.alu(Op::WHERE, {lt, x, y})), I32({2, 3}, {1, 2, 30, 10, 20, 30}));
  EXPECT_TENSOR(t.eval(t.g.alu(Op::IDIV, {t.g.alu(Op::NEG, {x}), three})), I32({2, 3}, {0, 0, -1, -1, -1, -2}));
}

TEST(InterpTensor, CastAndBitcast) {
  T t;
  const UOp* x = t.tensor(F32({4}, {1.5, -2.7, kNaN, 1e10}));
  EXPECT_TENSOR(t.eval(t.cast(x, Scalar::Int32)), I32({4}, {1, -2, 0, 2147483647}));
  EXPECT_TENSOR(t.eval(t.cast(x, Scalar::Bool)), Bool({4}, {1, 1, 1, 1}));
  EXPECT_TENSOR(t.eval(t.cast(x, Scalar::Float16)), HostTensor::of(Scalar::Float16, {4}, {1.5, -2.69921875, kNaN, INFINITY}));
  const UOp* one = t.tensor(F32({2}, {1.0, -0.0}));
  EXPECT_TENSOR(t.eval(t.bitcast(one, Scalar::UInt32)), HostTensor::of(Scalar::UInt32, {2}, {0x3f800000, 0x80000000}));
  const UOp* h = t.tensor(HostTensor::of(Scalar::UInt16, {1}, {0x3c00}));
  EXPECT_TENSOR(t.eval(t.bitcast(h, Scalar::Float16)), HostTensor::of(Scalar::Float16, {1}, {1.0}));
  EXPECT_ERROR(t.error(t.bitcast(x, Scalar::Int16)), kInvalidArgument, "cannot bitcast float32 to int16");
}

// ---------------------------------------------------------------------------------------
// Tensor level: symbolic dims

TEST(InterpTensor, SymbolicBatchDimFromBind) {
  T t;
  // Inputs are allocated at the variable's maximum: 8 rows of 2; the graph takes B rows.
  const UOp* var = t.g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"B", 1, 8});
  const UOp* bound = t.g.make(Op::BIND, dtypes::index, {var, t.g.idx(3)});
  const UOp* buf = t.input(iota(Scalar::Float32, {16}));
  const UOp* rows = t.g.make(Op::SHRINK, dtypes::float32, {buf, t.g.idx(0), t.g.alu(Op::MUL, {bound, t.g.idx(2)})});
  const UOp* bx2 = t.g.make(Op::VECTORIZE, DType(Scalar::Index, 2), {bound, t.g.idx(2)});
  const UOp* x = t.g.make(Op::RESHAPE, dtypes::float32, {rows, bx2});
  EXPECT_TENSOR(t.eval(t.reduce(x, ReduceOp::Add, {1})), F32({3, 1}, {1, 5, 9}));
  EXPECT_TENSOR(t.eval(bound), HostTensor::of(Scalar::Index, {}, {3}));
}

TEST(InterpTensor, VariableErrors) {
  T t;
  const UOp* var = t.g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"B", 1, 8});
  EXPECT_ERROR(t.error(var), kInvalidArgument, "variable 'B' has no BIND in the graph");
  const UOp* too_big = t.g.make(Op::BIND, dtypes::index, {var, t.g.idx(9)});
  EXPECT_ERROR(t.error(too_big), kInvalidArgument, "value 9 of 'B' is outside [1, 8]");
}

// ---------------------------------------------------------------------------------------
// Tensor level: refusals

TEST(InterpTensor, Refusals) {
  T t;
  const UOp* x = t.tensor(F32({4}, {1, 2, 3, 4}));
  const UOp* ar = t.g.make(Op::ALLREDUCE, dtypes::float32, {x, t.dev}, ReduceOpArg{ReduceOp::Add});
  // The interpreter evaluates ALLREDUCE, but only over a multi-device value.
  EXPECT_ERROR(t.error(ar), kInvalidArgument, "(ALLREDUCE): its source RESHAPE is not a multi-device value");
  EXPECT_ERROR(t.error(x, InterpOptions{.max_elements = 3}), kResourceExhausted, "over the interpreter's limit of 3");
  // An input that does not match its BUFFER.
  T u;
  const UOp* b = u.input(F32({4}, {1, 2, 3, 4}));
  u.inputs[b] = F32({3}, {1, 2, 3});
  EXPECT_ERROR(u.error(b), kInvalidArgument, "the BUFFER holds 4 x float32");
  u.inputs.erase(b);
  EXPECT_ERROR(u.error(b), kInvalidArgument, "(BUFFER): no input tensor is bound");
}

TEST(InterpTensor, DeepChainsDoNotRecurse) {
  T t;
  const UOp* x = t.tensor(F32({1}, {0}));
  const UOp* one = t.expand(t.reshape(t.g.cnst(dtypes::float32, 1.0), {1}), {1});
  for (int i = 0; i < 100000; ++i) x = t.g.alu(Op::ADD, {x, one});
  EXPECT_TENSOR(t.eval(x), F32({1}, {100000}));
}

TEST(InterpTensor, SeveralOutputs) {
  T t;
  const UOp* x = t.tensor(I32({2}, {1, 2}));
  auto r = t.run({x, t.g.alu(Op::MUL, {x, x}), x});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_TENSOR((*r)[1], I32({2}, {1, 4}));
  EXPECT_TENSOR((*r)[2], I32({2}, {1, 2}));
  // A root that is one tensor rather than a SINK.
  auto one = interpret(t.g, t.g.alu(Op::ADD, {x, x}), t.inputs);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_TENSOR((*one)[0], I32({2}, {2, 4}));
}

// ---------------------------------------------------------------------------------------
// Kernel level

// Builds kernel-level graphs tersely: the pass tests' builder, with params by scalar type
// and accesses that take a gate and an alternative value of their own.
struct K : testing::KernelBuilder {
  using KernelBuilder::param;
  const UOp* param(int64_t slot, Scalar s, int64_t size) { return param(slot, DType(s), size); }
  const UOp* idx(int64_t v) { return g.idx(v); }
  const UOp* index(const UOp* buf, const UOp* i, const UOp* gate = nullptr) {
    DType dt(buf->dtype().scalar);
    if (gate) return g.make(Op::INDEX, dt, {buf, i, gate});
    return g.make(Op::INDEX, dt, {buf, i});
  }
  const UOp* load(const UOp* buf, const UOp* i, const UOp* gate = nullptr, const UOp* alt = nullptr) {
    DType dt(buf->dtype().scalar);
    if (alt) return g.make(Op::LOAD, dt, {buf, index(buf, i, gate), alt});
    return g.make(Op::LOAD, dt, {buf, index(buf, i, gate)});
  }
  const UOp* store(const UOp* buf, const UOp* i, const UOp* v, std::vector<const UOp*> ranges, const UOp* gate = nullptr) {
    std::vector<const UOp*> src{index(buf, i, gate), v};
    src.insert(src.end(), ranges.begin(), ranges.end());
    return g.make(Op::STORE, dtypes::void_, src);
  }
  const UOp* kernel(std::vector<const UOp*> stores) {
    return g.make(Op::SINK, dtypes::void_, stores, KernelInfoArg{true, "k"});
  }
  const UOp* add(const UOp* a, const UOp* b) { return g.alu(Op::ADD, {a, b}); }
  const UOp* mul(const UOp* a, const UOp* b) { return g.alu(Op::MUL, {a, b}); }
};

absl::Status run_kernel(const UOp* k, std::vector<HostTensor*> params, absl::flat_hash_map<std::string, int64_t> vars = {},
                        InterpOptions o = {}) {
  return interpret_kernel(k, params, vars, o);
}

TEST(InterpKernel, Elementwise) {
  K k;
  const UOp *out = k.param(0, Scalar::Float32, 16), *in = k.param(1, Scalar::Float32, 16);
  const UOp* r = k.range(16);
  const UOp* v = k.add(k.load(in, r), k.g.cnst(dtypes::float32, 1.0));
  const UOp* sink = k.kernel({k.store(out, r, k.mul(v, v), {r})});
  HostTensor o = HostTensor::zeros(Scalar::Float32, {16}), i = iota(Scalar::Float32, {16});
  ASSERT_OK(run_kernel(sink, {&o, &i}));
  HostTensor want = HostTensor::zeros(Scalar::Float32, {16});
  for (int64_t j = 0; j < 16; ++j) want.set(j, ConstValue::Float((j + 1.0) * (j + 1.0)));
  EXPECT_TENSOR(o, want);
}

TEST(InterpKernel, ReductionInsideStore) {
  K k;
  const UOp *out = k.param(0, Scalar::Int32, 3), *in = k.param(1, Scalar::Int32, 12);
  const UOp *r0 = k.range(3), *r1 = k.range(4);
  const UOp* sum = k.reduce(ReduceOp::Add, k.load(in, k.add(k.mul(r0, k.idx(4)), r1)), {r1});
  const UOp* mx = k.reduce(ReduceOp::Max, k.load(in, k.add(k.mul(r0, k.idx(4)), r1)), {r1});
  HostTensor o = HostTensor::zeros(Scalar::Int32, {3}), i = iota(Scalar::Int32, {12});
  ASSERT_OK(run_kernel(k.kernel({k.store(out, r0, sum, {r0})}), {&o, &i}));
  EXPECT_TENSOR(o, I32({3}, {6, 22, 38}));
  ASSERT_OK(run_kernel(k.kernel({k.store(out, r0, k.add(sum, mx), {r0})}), {&o, &i}));
  EXPECT_TENSOR(o, I32({3}, {9, 29, 49}));
  // A reduction of an empty range is its identity.
  const UOp* empty = k.range(int64_t{0});
  const UOp* none = k.reduce(ReduceOp::Min, k.load(in, k.add(r0, empty)), {empty});
  ASSERT_OK(run_kernel(k.kernel({k.store(out, r0, none, {r0})}), {&o, &i}));
  EXPECT_TENSOR(o, I32({3}, {2147483647, 2147483647, 2147483647}));
}

TEST(InterpKernel, GatedLoadAndStore) {
  K k;
  const UOp *out = k.param(0, Scalar::Float32, 8), *in = k.param(1, Scalar::Float32, 13);
  const UOp* r = k.range(8);
  // in[r + 10] only for r < 3: the other addresses are out of bounds and never touched.
  const UOp* ok = k.g.alu(Op::CMPLT, {r, k.idx(3)});
  const UOp* v = k.load(in, k.add(r, k.idx(10)), ok, k.g.cnst(dtypes::float32, -1.0));
  // Stores only even r.
  const UOp* even = k.g.alu(Op::CMPEQ, {k.g.alu(Op::MOD, {r, k.idx(2)}), k.idx(0)});
  HostTensor o = HostTensor::of(Scalar::Float32, {8}, {9, 9, 9, 9, 9, 9, 9, 9}), i = iota(Scalar::Float32, {13});
  ASSERT_OK(run_kernel(k.kernel({k.store(out, r, v, {r}, even)}), {&o, &i}));
  EXPECT_TENSOR(o, F32({8}, {10, 9, 12, 9, -1, 9, -1, 9}));
  // Without alt a gated-off load reads 0.
  const UOp* v0 = k.load(in, k.add(r, k.idx(10)), ok);
  ASSERT_OK(run_kernel(k.kernel({k.store(out, r, v0, {r})}), {&o, &i}));
  EXPECT_TENSOR(o, F32({8}, {10, 11, 12, 0, 0, 0, 0, 0}));
}

TEST(InterpKernel, EndClosesRangesAroundAStore) {
  K k;
  const UOp* out = k.param(0, Scalar::Int32, 6);
  const UOp *r0 = k.range(2), *r1 = k.range(3);
  const UOp* st = k.store(out, k.add(k.mul(r0, k.idx(3)), r1), k.g.alu(Op::SUB, {r1, r0}), {});
  const UOp* end = k.g.make(Op::END, dtypes::void_, {st, r0, r1});
  // The STORE's ranges are index-typed; the buffer is int32.
  HostTensor o = HostTensor::zeros(Scalar::Int32, {6});
  absl::Status s = run_kernel(k.kernel({end}), {&o});
  EXPECT_ERROR(s, kInvalidArgument, "stores index into a int32 buffer");
  const UOp* st32 = k.store(out, k.add(k.mul(r0, k.idx(3)), r1), k.g.make(Op::CAST, dtypes::int32, {k.g.alu(Op::SUB, {r1, r0})}), {});
  ASSERT_OK(run_kernel(k.kernel({k.g.make(Op::END, dtypes::void_, {st32, r0, r1})}), {&o}));
  EXPECT_TENSOR(o, I32({6}, {0, 1, 2, -1, 0, 1}));
  // END outside, STORE closing the inner range.
  HostTensor o2 = HostTensor::zeros(Scalar::Int32, {6});
  const UOp* inner = k.store(out, k.add(k.mul(r0, k.idx(3)), r1), k.g.make(Op::CAST, dtypes::int32, {r1}), {r1});
  ASSERT_OK(run_kernel(k.kernel({k.g.make(Op::END, dtypes::void_, {inner, r0})}), {&o2}));
  EXPECT_TENSOR(o2, I32({6}, {0, 1, 2, 0, 1, 2}));
}

TEST(InterpKernel, VariableLoopBound) {
  K k;
  const UOp* out = k.param(0, Scalar::Int64, 8);
  const UOp* n = k.g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"n", 1, 8});
  const UOp* r = k.range(n);
  const UOp* sink = k.kernel({k.store(out, r, k.g.make(Op::CAST, dtypes::int64, {k.mul(r, n)}), {r})});
  HostTensor o = HostTensor::zeros(Scalar::Int64, {8});
  ASSERT_OK(run_kernel(sink, {&o}, {{"n", 5}}));
  EXPECT_TENSOR(o, HostTensor::of(Scalar::Int64, {8}, {0, 5, 10, 15, 20, 0, 0, 0}));
  EXPECT_ERROR(run_kernel(sink, {&o}), kInvalidArgument, "no value is given for the variable 'n'");
  EXPECT_ERROR(run_kernel(sink, {&o}, {{"n", 9}}), kInvalidArgument, "the value 9 of 'n' is outside [1, 8]");
}

TEST(InterpKernel, OutOfBoundsIndexIsAnErrorNotACrash) {
  K k;
  const UOp *out = k.param(0, Scalar::Float32, 16), *in = k.param(1, Scalar::Float32, 16);
  const UOp* r = k.range(16);
  const UOp* sink = k.kernel({k.store(out, r, k.load(in, k.add(r, k.idx(1))), {r})});
  HostTensor o = HostTensor::zeros(Scalar::Float32, {16}), i = iota(Scalar::Float32, {16});
  EXPECT_ERROR(run_kernel(sink, {&o, &i}), kInvalidArgument,
               "(INDEX): index 16 is outside the buffer at slot 1 of 16 elements");
  const UOp* neg = k.kernel({k.store(out, k.g.alu(Op::SUB, {r, k.idx(1)}), k.load(in, r), {r})});
  EXPECT_ERROR(run_kernel(neg, {&o, &i}), kInvalidArgument, "index -1 is outside the buffer at slot 0");
}

TEST(InterpKernel, MalformedKernels) {
  K k;
  const UOp* out = k.param(0, Scalar::Float32, 4);
  const UOp* r = k.range(4);
  const UOp* one = k.g.cnst(dtypes::float32, 1.0);
  HostTensor o = HostTensor::zeros(Scalar::Float32, {4});
  // A range nothing loops over.
  EXPECT_ERROR(run_kernel(k.kernel({k.store(out, r, one, {})}), {&o}), kInvalidArgument,
               "(RANGE): is used outside any STORE / END / REDUCE");
  // A buffer of the wrong dtype or size, or none.
  HostTensor small = HostTensor::zeros(Scalar::Float32, {3}), ints = HostTensor::zeros(Scalar::Int32, {4});
  const UOp* sink = k.kernel({k.store(out, r, one, {r})});
  EXPECT_ERROR(run_kernel(sink, {&small}), kInvalidArgument, "slot 0 needs 4 x float32, the buffer is float32[3]");
  EXPECT_ERROR(run_kernel(sink, {&ints}), kInvalidArgument, "slot 0 needs 4 x float32");
  EXPECT_ERROR(run_kernel(sink, {}), kInvalidArgument, "no buffer is bound to slot 0");
  // A range closed inside its own loop.
  const UOp* twice = k.kernel({k.store(out, r, k.reduce(ReduceOp::Add, one, {r}), {r})});
  EXPECT_ERROR(run_kernel(twice, {&o}), kInvalidArgument, "is looped over again inside its own loop");
  // Runaway loops stop at the step limit.
  EXPECT_ERROR(run_kernel(sink, {&o}, {}, InterpOptions{.max_steps = 3}), kResourceExhausted, "more than 3 loop iterations");
  // Ops outside kernel-level semantics.
  const UOp* source = k.g.make(Op::SOURCE, dtypes::void_, {}, StrArg{"x"});
  EXPECT_ERROR(run_kernel(k.kernel({source}), {&o}), kInvalidArgument, "(SOURCE): is not supported by the kernel interpreter");
}

TEST(InterpKernel, StoresAreSeenByLaterLoads) {
  K k;
  const UOp* buf = k.param(0, Scalar::Int32, 4);
  const UOp* r = k.range(4);
  // buf[r] = buf[r] + 1, then buf[0] = sum(buf): the second STORE must see the first.
  const UOp* inc = k.store(buf, r, k.add(k.load(buf, r), k.g.cnst_int(dtypes::int32, 1)), {r});
  const UOp* r2 = k.range(4);
  const UOp* total = k.store(buf, k.idx(0), k.reduce(ReduceOp::Add, k.load(buf, r2), {r2}), {});
  HostTensor b = I32({4}, {1, 2, 3, 4});
  ASSERT_OK(run_kernel(k.kernel({inc, total}), {&b}));
  EXPECT_TENSOR(b, I32({4}, {14, 3, 4, 5}));
  // A prefix sum through memory: each step reads what the previous one wrote.
  const UOp* r3 = k.range(3);
  const UOp* next = k.add(r3, k.idx(1));
  const UOp* scan = k.store(buf, next, k.add(k.load(buf, r3), k.load(buf, next)), {r3});
  HostTensor c = I32({4}, {1, 2, 3, 4});
  ASSERT_OK(run_kernel(k.kernel({scan}), {&c}));
  EXPECT_TENSOR(c, I32({4}, {1, 3, 6, 10}));
}

TEST(InterpKernel, NestedReductions) {
  K k;
  const UOp *out = k.param(0, Scalar::Float32, 1), *in = k.param(1, Scalar::Float32, 6);
  const UOp *ri = k.range(2), *rj = k.range(3);
  // max over i of (sum over j of in[3i + j])
  const UOp* row = k.reduce(ReduceOp::Add, k.load(in, k.add(k.mul(ri, k.idx(3)), rj)), {rj});
  const UOp* best = k.reduce(ReduceOp::Max, row, {ri});
  HostTensor o = HostTensor::zeros(Scalar::Float32, {1}), i = F32({6}, {1, 2, 3, -4, 5, 10});
  ASSERT_OK(run_kernel(k.kernel({k.store(out, k.idx(0), best, {})}), {&o, &i}));
  EXPECT_TENSOR(o, F32({1}, {11}));
  // Both ranges in one REDUCE, and a triangular loop whose end depends on the outer range.
  const UOp* all = k.reduce(ReduceOp::Mul, k.load(in, k.add(k.mul(ri, k.idx(3)), rj)), {ri, rj});
  ASSERT_OK(run_kernel(k.kernel({k.store(out, k.idx(0), all, {})}), {&o, &i}));
  EXPECT_TENSOR(o, F32({1}, {-1200}));
  const UOp* rt = k.range(k.add(ri, k.idx(1)));  // j < i + 1
  const UOp* tri = k.reduce(ReduceOp::Add, k.load(in, k.add(k.mul(ri, k.idx(3)), rt)), {ri, rt});
  ASSERT_OK(run_kernel(k.kernel({k.store(out, k.idx(0), tri, {})}), {&o, &i}));
  EXPECT_TENSOR(o, F32({1}, {1 + -4 + 5}));
}

TEST(InterpKernel, DeepAndSharedExpressions) {
  K k;
  const UOp *out = k.param(0, Scalar::Int64, 2), *in = k.param(1, Scalar::Int64, 4);
  // 100k nodes deep: no recursion.
  const UOp* deep = k.g.cnst_int(dtypes::int64, 0);
  for (int i = 0; i < 100000; ++i) deep = k.add(deep, k.g.cnst_int(dtypes::int64, 1));
  // 60 levels of y + y over a shared REDUCE: each node is evaluated once, not 2^60 times.
  const UOp* r = k.range(4);
  const UOp* y = k.reduce(ReduceOp::Add, k.load(in, r), {r});
  for (int i = 0; i < 60; ++i) y = k.add(y, y);
  HostTensor o = HostTensor::zeros(Scalar::Int64, {2}), i = HostTensor::of(Scalar::Int64, {4}, {0, 0, 1, 0});
  ASSERT_OK(run_kernel(k.kernel({k.store(out, k.idx(0), deep, {}), k.store(out, k.idx(1), y, {})}), {&o, &i}));
  EXPECT_TENSOR(o, HostTensor::of(Scalar::Int64, {2}, {100000, std::ldexp(1.0, 60)}));
}

// ---------------------------------------------------------------------------------------
// The two levels agree

TEST(InterpCrossCheck, MatmulKernelEqualsTensorGraph) {
  const int64_t M = 3, Kd = 5, N = 4;
  HostTensor a = HostTensor::random(Scalar::Float32, {M, Kd}, 11), b = HostTensor::random(Scalar::Float32, {Kd, N}, 12);
  T t;
  HostTensor want = t.eval(matmul(t, t.tensor(a), t.tensor(b), M, Kd, N));

  K k;
  const UOp *out = k.param(0, Scalar::Float32, M * N), *pa = k.param(1, Scalar::Float32, M * Kd),
            *pb = k.param(2, Scalar::Float32, Kd * N);
  const UOp *i = k.range(M), *j = k.range(N), *r = k.range(Kd);
  const UOp* prod = k.mul(k.load(pa, k.add(k.mul(i, k.idx(Kd)), r)), k.load(pb, k.add(k.mul(r, k.idx(N)), j)));
  const UOp* sink = k.kernel({k.store(out, k.add(k.mul(i, k.idx(N)), j), k.reduce(ReduceOp::Add, prod, {r}), {i, j})});
  HostTensor got = HostTensor::zeros(Scalar::Float32, {M * N});
  HostTensor fa = a, fb = b;
  ASSERT_OK(run_kernel(sink, {&got, &fa, &fb}));
  got.shape = {M, N};
  EXPECT_TENSOR(got, want);
}

TEST(InterpCrossCheck, FlipThenColumnMaxEqualsKernel) {
  HostTensor x = HostTensor::random(Scalar::Int32, {4, 3}, 5);
  T t;
  // max over rows of flip(x, axis 1) * 2
  const UOp* f = t.flip(t.tensor(x), {false, true});
  const UOp* two = t.expand(t.reshape(t.g.cnst_int(dtypes::int32, 2), {1, 1}), {4, 3});
  HostTensor want = t.eval(t.reduce(t.g.alu(Op::MUL, {f, two}), ReduceOp::Max, {0}));

  K k;
  const UOp *out = k.param(0, Scalar::Int32, 3), *in = k.param(1, Scalar::Int32, 12);
  const UOp *c = k.range(3), *row = k.range(4);
  const UOp* v = k.load(in, k.add(k.mul(row, k.idx(3)), k.g.alu(Op::SUB, {k.idx(2), c})));
  const UOp* m = k.reduce(ReduceOp::Max, k.mul(v, k.g.cnst_int(dtypes::int32, 2)), {row});
  HostTensor got = HostTensor::zeros(Scalar::Int32, {3});
  ASSERT_OK(run_kernel(k.kernel({k.store(out, c, m, {c})}), {&got, &x}));
  got.shape = {1, 3};
  EXPECT_TENSOR(got, want);
}

TEST(InterpCrossCheck, PadEqualsGatedLoadWithAlt) {
  HostTensor x = HostTensor::random(Scalar::Float32, {5}, 8);
  T t;
  const UOp* p = t.pad(t.tensor(x), {2}, {1});
  HostTensor want = t.eval(t.g.alu(Op::ADD, {p, p}));

  K k;
  const UOp *out = k.param(0, Scalar::Float32, 8), *in = k.param(1, Scalar::Float32, 5);
  const UOp* r = k.range(8);
  const UOp* src = k.g.alu(Op::SUB, {r, k.idx(2)});
  const UOp* inside = k.g.alu(Op::AND, {k.g.alu(Op::CMPLT, {k.idx(1), r}), k.g.alu(Op::CMPLT, {src, k.idx(5)})});
  const UOp* v = k.load(in, src, inside, k.g.cnst(dtypes::float32, 0.0));
  HostTensor got = HostTensor::zeros(Scalar::Float32, {8});
  ASSERT_OK(run_kernel(k.kernel({k.store(out, r, k.add(v, v), {r})}), {&got, &x}));
  EXPECT_TENSOR(got, want);
}

}  // namespace
}  // namespace uop
