// optimize for the CPU (compiler/passes/optimize.h) on kernels built by hand, for given
// vector widths: the innermost contiguous output loop is split into an outer loop and an
// Upcast range of the vector's lanes (twice that when the kernel reduces, with a second
// output loop upcast by 4 and the lane loop moved outermost); a full reduction upcasts its
// reduce loop by 4 vectors, or fewer where that divides; a loop whose trip count the width
// does not divide is split by a divisor above half the width, or by the width with its tail
// masked; the outermost output loop runs on threads only when the kernel does enough work.
// Each optimized kernel computes what the interpreter computes on the kernel before (the
// matmul also through expand, lower_reduce, linearize and the CPU backend). split_range on
// its own, a factor that does not divide (a masked tail), and its refusals.
#include "compiler/passes/optimize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "compiler/passes/expand.h"
#include "compiler/passes/linearize.h"
#include "compiler/passes/lower_reduce.h"
#include "tests/unit/compiler/passes/interp_check.h"
#include "tests/unit/compiler/passes/kernel_builder.h"
#include "tests/unit/compiler/passes/run_on_cpu.h"

namespace uop {
namespace {

using testing::KernelBuilder;

const UOp* range_with_id(const UOp* k, int64_t id) {
  for (const UOp* r : testing::nodes_of(k, Op::RANGE))
    if (r->arg_as<RangeArg>().axis_id == id) return r;
  return nullptr;
}

OptimizeOptions with_bits(int bits) {
  OptimizeOptions o;
  o.vector_bits = bits;
  return o;
}

// The optimized kernel through the rest of the CPU lowering (expand, lower_reduce,
// linearize) and the CPU backend computes what the interpreter computes on `before`.
void expect_lowered_on_cpu_agrees(KernelBuilder& k, const UOp* before, const UOp* after, const testing::Slots& slots) {
  auto expanded = expand_upcasts(k.g, after);
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  auto lowered = lower_reduce(k.g, *expanded);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  auto linear = linearize(k.g, *lowered);
  ASSERT_TRUE(linear.ok()) << linear.status();
  testing::expect_cpu_matches_interpreter(before, *linear, slots);
}

// out[cols i + j] = in[cols i + j] + 1 over rows x cols, of `dt`.
const UOp* elementwise(KernelBuilder& k, DType dt, int64_t rows, int64_t cols) {
  const UOp* out = k.param(0, dt, rows * cols);
  const UOp* in = k.param(1, dt, rows * cols);
  const UOp* i = k.range(rows);
  const UOp* j = k.range(cols);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(cols)), j);
  const UOp* one = dt.is_float() ? k.g.cnst(dt, 1.0) : k.g.cnst_int(dt, 1);
  return k.sink({k.store(out, at, k.alu(Op::ADD, k.load(in, at), one), {i, j})});
}

// float32 with 256-bit vectors: 8 lanes. The contiguous loop j (axis 1) of 16 becomes
// 2 x Upcast 8; i, which strides by 16, is not touched.
TEST(Optimize, TheContiguousOutputLoopIsUpcastByTheVectorsLanes) {
  KernelBuilder k;
  const UOp* before = elementwise(k, dtypes::float32, 4, 16);
  auto after = optimize_cpu(k.g, before, with_bits(256));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), std::vector<int64_t>{8});
  EXPECT_EQ(testing::trips_of(*after, AxisType::Loop), (std::vector<int64_t>{2, 4}));
  ASSERT_NE(range_with_id(*after, 1), nullptr);
  EXPECT_EQ(testing::trip_of(range_with_id(*after, 1)), 2) << "j keeps its id as the outer half";
  EXPECT_EQ(testing::trip_of(range_with_id(*after, 0)), 4);
  EXPECT_TRUE(testing::trips_of(*after, AxisType::Thread).empty()) << "64 elements are not worth threads";
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 64}, {Scalar::Float32, 64}});
}

// The lanes follow the width and the element size: 512 bits of float32 are 16 lanes, 256
// bits of int8 are 32.
TEST(Optimize, TheLanesAreTheVectorWidthOverTheElementSize) {
  {
    KernelBuilder k;
    const UOp* before = elementwise(k, dtypes::float32, 2, 32);
    auto after = optimize_cpu(k.g, before, with_bits(512));
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), std::vector<int64_t>{16});
  }
  {
    KernelBuilder k;
    const UOp* before = elementwise(k, dtypes::int8, 2, 64);
    auto after = optimize_cpu(k.g, before, with_bits(256));
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), std::vector<int64_t>{32});
    testing::expect_interpreter_agrees(before, *after, {{Scalar::Int8, 128}, {Scalar::Int8, 128}});
  }
}

// A trip count the width does not divide still vectorizes: 12 columns and 8 lanes split by
// 6, a divisor above half the width (no mask); 13 columns by 8, with the 3 lanes past the
// end masked: the STORE is gated and every index clamped below 13.
TEST(Optimize, ALoopTheWidthDoesNotDivideIsSplitByADivisorOrMasked) {
  KernelBuilder k;
  const UOp* before = elementwise(k, dtypes::float32, 4, 12);
  auto after = optimize_cpu(k.g, before, with_bits(256));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), std::vector<int64_t>{6});
  EXPECT_EQ(testing::count_of(*after, [](const UOp* u) { return u->op() == Op::INDEX && u->num_src() > 2; }), 0);
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 48}, {Scalar::Float32, 48}});

  const UOp* odd = elementwise(k, dtypes::float32, 4, 13);
  auto masked = optimize_cpu(k.g, odd, with_bits(256));
  ASSERT_TRUE(masked.ok()) << masked.status();
  EXPECT_EQ(testing::trips_of(*masked, AxisType::Upcast), std::vector<int64_t>{8});
  EXPECT_EQ(testing::trips_of(*masked, AxisType::Loop), (std::vector<int64_t>{2, 4}));
  const UOp* index = (*masked)->src(0)->src(0);
  ASSERT_EQ(index->op(), Op::INDEX);
  EXPECT_EQ(index->num_src(), 3u) << "the STORE is gated";
  testing::expect_interpreter_agrees(odd, *masked, {{Scalar::Float32, 52}, {Scalar::Float32, 52}});
}

// Upcasting off (vector_bits 0): the kernel comes back.
TEST(Optimize, NoVectorsNoUpcast) {
  KernelBuilder k;
  const UOp* before = elementwise(k, dtypes::float32, 4, 16);
  auto after = optimize_cpu(k.g, before, with_bits(0));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, before);
}

// C[16 i + j] = sum over r of A[8 i + r] * B[16 r + j], 8 x 16 x 8, float32, 256 bits: a
// reducing kernel upcasts j by 2 x 8 = 16 and i by 4 (a 4 x 16 tile of accumulators), and
// j's loop goes outermost in the STORE. Values through the CPU backend too.
TEST(Optimize, AMatmulKeepsATileOfAccumulators) {
  KernelBuilder k;
  const UOp* c = k.param(0, dtypes::float32, 128);
  const UOp* a = k.param(1, dtypes::float32, 64);
  const UOp* b = k.param(2, dtypes::float32, 128);
  const UOp* i = k.range(8);
  const UOp* j = k.range(16);
  const UOp* r = k.range(8, AxisType::Reduce);
  const UOp* prod = k.alu(Op::MUL, k.load(a, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(8)), r)),
                          k.load(b, k.alu(Op::ADD, k.alu(Op::MUL, r, k.ix(16)), j)));
  const UOp* before = k.sink({k.store(c, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(16)), j), k.reduce(ReduceOp::Add, prod, {r}), {i, j})});
  auto after = optimize_cpu(k.g, before, with_bits(256));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(testing::trips_of(*after, AxisType::Reduce), std::vector<int64_t>{8}) << "the reduce loop is not split";
  const UOp* store = (*after)->src(0);
  ASSERT_EQ(store->op(), Op::STORE);
  ASSERT_GE(store->num_src(), 3u);
  EXPECT_EQ(store->src(2)->arg_as<RangeArg>().axis_id, 1) << "the column-panel loop j is outermost";
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 128}, {Scalar::Float32, 64}, {Scalar::Float32, 128}});

  expect_lowered_on_cpu_agrees(k, before, *after, {{Scalar::Float32, 128}, {Scalar::Float32, 64}, {Scalar::Float32, 128}});
}

// A 3x3 convolution over a 7 x 7 map (ResNet's last stage), 512-bit vectors: no power of
// two divides 7, so the map's part of the tile is 4 columns x 4 rows with their tails
// masked (the STORE gated), a whole vector of pixels, and the channels the rest, 16: each
// weight loaded serves 16 pixels instead of one. Values by the interpreter and through the
// CPU backend.
TEST(Optimize, AConvolutionOverASmallOddMapMasksItsPixelTile) {
  KernelBuilder k;
  constexpr int64_t C = 64, K = 4, H = 7, P = H + 2;
  const UOp* before = testing::conv3x3(k, C, K, H);
  auto after = optimize_cpu(k.g, before, with_bits(512));
  ASSERT_TRUE(after.ok()) << after.status();
  std::vector<int64_t> upcast = testing::trips_of(*after, AxisType::Upcast);
  std::sort(upcast.begin(), upcast.end());
  EXPECT_EQ(upcast, (std::vector<int64_t>{4, 4, 16}));
  const UOp* index = (*after)->src(0)->src(0);
  ASSERT_EQ(index->op(), Op::INDEX);
  EXPECT_EQ(index->num_src(), 3u) << "the STORE is gated: 8 x 8 pixel slots for 7 x 7";
  const testing::Slots bufs{{Scalar::Int32, C * H * H}, {Scalar::Int32, K * P * P}, {Scalar::Int32, C * K * 9}};
  testing::expect_interpreter_agrees(before, *after, bufs);
  expect_lowered_on_cpu_agrees(k, before, *after, bufs);
}

// A full reduction has no output loop: its reduce loop is upcast by 4 x 8 = 32 lanes when
// 32 divides it (64), and by one vector of 8 when only that does (40).
TEST(Optimize, AFullReductionUpcastsItsReduceLoop) {
  for (int64_t n : {64, 40}) {
    KernelBuilder k;
    const UOp* out = k.param(0, dtypes::float32, 1);
    const UOp* in = k.param(1, dtypes::float32, n);
    const UOp* r = k.range(n, AxisType::Reduce);
    const UOp* before = k.sink({k.store(out, k.ix(0), k.reduce(ReduceOp::Add, k.load(in, r), {r}), {})});
    auto after = optimize_cpu(k.g, before, with_bits(256));
    ASSERT_TRUE(after.ok()) << after.status();
    if (n == 64) {
      EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), std::vector<int64_t>{32});
      EXPECT_EQ(testing::trips_of(*after, AxisType::Reduce), std::vector<int64_t>{2});
      testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 1}, {Scalar::Float32, n}});
    } else {
      EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), std::vector<int64_t>{8}) << "40 does not split by 32 or 16";
      EXPECT_EQ(testing::trips_of(*after, AxisType::Reduce), std::vector<int64_t>{5});
    }
    testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 1}, {Scalar::Float32, n}});
  }
}

// 16 x 64 float32: after the upcast, 16 x 8 vector iterations, 1024 elements, which is
// what an elementwise kernel's work is counted in. Worth threads at a threshold of 1024
// (the outermost output loop becomes Thread, its trip count kept), not at 1025 nor at the
// default.
TEST(Optimize, TheOutermostLoopRunsOnThreadsWhenTheWorkPaysForThem) {
  KernelBuilder k;
  const UOp* before = elementwise(k, dtypes::float32, 16, 64);
  OptimizeOptions low = with_bits(256);
  low.min_parallel_work = 1024;
  auto threaded = optimize_cpu(k.g, before, low);
  ASSERT_TRUE(threaded.ok()) << threaded.status();
  EXPECT_EQ(testing::trips_of(*threaded, AxisType::Thread), std::vector<int64_t>{16});
  ASSERT_NE(range_with_id(*threaded, 0), nullptr);
  EXPECT_EQ(range_with_id(*threaded, 0)->arg_as<RangeArg>().type, AxisType::Thread);
  testing::expect_interpreter_agrees(before, *threaded, {{Scalar::Float32, 1024}, {Scalar::Float32, 1024}});

  low.min_parallel_work = 1025;
  auto serial = optimize_cpu(k.g, before, low);
  ASSERT_TRUE(serial.ok()) << serial.status();
  EXPECT_TRUE(testing::trips_of(*serial, AxisType::Thread).empty()) << "1024 elements are below 1025";
  auto by_default = optimize_cpu(k.g, before, with_bits(256));
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_TRUE(testing::trips_of(*by_default, AxisType::Thread).empty());
}

// A recurrent cell's gates: out[j] = sum_k W[j, k] h[k] + sum_k W[128 + j, k] h[k] +
// sum_k W[256 + j, k] h[k], three sibling reductions of 128 over 128 outputs, 512-bit
// vectors. The weights are contiguous along each reduce loop and stride along j, so each
// reduce loop takes 16 lanes and j a tile of 4 dot products; the three reductions run one
// after another, so they are 3 x 128 x 128 / 16 iterations, too few for threads, and
// their lanes do not multiply (each value is at most 4 x 16 lanes, under the limit).
TEST(Optimize, SiblingReductionsShareADotTileAndAreNotWorthThreads) {
  KernelBuilder k;
  constexpr int64_t n = 128;
  const UOp* out = k.param(0, dtypes::float32, n);
  const UOp* w = k.param(1, dtypes::float32, 3 * n * n);
  const UOp* h = k.param(2, dtypes::float32, n);
  const UOp* j = k.range(n);
  const UOp* sum = nullptr;
  for (int64_t g = 0; g < 3; ++g) {
    const UOp* r = k.range(n, AxisType::Reduce);
    const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, k.alu(Op::ADD, j, k.ix(g * n)), k.ix(n)), r);
    const UOp* gate = k.reduce(ReduceOp::Add, k.alu(Op::MUL, k.load(w, at), k.load(h, r)), {r});
    sum = sum ? k.alu(Op::ADD, sum, gate) : gate;
  }
  const UOp* before = k.sink({k.store(out, j, sum, {j})});
  auto after = optimize_cpu(k.g, before, with_bits(512));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), (std::vector<int64_t>{4, 16, 16, 16}));
  EXPECT_TRUE(testing::trips_of(*after, AxisType::Thread).empty());
  const testing::Slots slots{{Scalar::Float32, n}, {Scalar::Float32, 3 * n * n}, {Scalar::Float32, n}};
  testing::expect_interpreter_agrees(before, *after, slots);
  expect_lowered_on_cpu_agrees(k, before, *after, slots);

  // It runs 32 output iterations plus 3 x 32 x 8 in the reductions: 800. At a threshold
  // of 800 it runs on threads, at 801 not, as it would had the sibling reduce loops been
  // counted as nested (32 x 8 x 8 x 8 = 16,384).
  OptimizeOptions low = with_bits(512);
  low.min_parallel_work = 800;
  auto threaded = optimize_cpu(k.g, before, low);
  ASSERT_TRUE(threaded.ok()) << threaded.status();
  EXPECT_FALSE(testing::trips_of(*threaded, AxisType::Thread).empty());
  low.min_parallel_work = 801;
  auto serial = optimize_cpu(k.g, before, low);
  ASSERT_TRUE(serial.ok()) << serial.status();
  EXPECT_TRUE(testing::trips_of(*serial, AxisType::Thread).empty());
}

// A reduction nested in another's body and reading its loop: out[j] = sum_r W[j, r] *
// (sum_s X[j, r + s]), a window of each row. Every load is contiguous along each loop, but a dot tile
// over both would make values of 4 x 16 x 16 lanes inside the inner one, past the limit:
// the heuristic does not give it one, and what it chooses applies and computes what the
// interpreter does.
TEST(Optimize, ANestedReductionGetsNoDotTileOverBothLoops) {
  KernelBuilder k;
  constexpr int64_t n = 64;
  const UOp* out = k.param(0, dtypes::float32, n);
  const UOp* w = k.param(1, dtypes::float32, n * n);
  const UOp* x = k.param(2, dtypes::float32, 2 * n * n);
  const UOp* j = k.range(n);
  const UOp* r = k.range(n, AxisType::Reduce);
  const UOp* t = k.range(n, AxisType::Reduce);
  const UOp* inner = k.reduce(ReduceOp::Add, k.load(x, k.alu(Op::ADD, k.alu(Op::MUL, j, k.ix(2 * n)), k.alu(Op::ADD, r, t))), {t});
  const UOp* outer = k.reduce(ReduceOp::Add, k.alu(Op::MUL, k.load(w, k.alu(Op::ADD, k.alu(Op::MUL, j, k.ix(n)), r)), inner), {r});
  const UOp* before = k.sink({k.store(out, j, outer, {j})});
  auto after = optimize_cpu(k.g, before, with_bits(512));
  ASSERT_TRUE(after.ok()) << after.status();
  const testing::Slots slots{{Scalar::Float32, n}, {Scalar::Float32, n * n}, {Scalar::Float32, 2 * n * n}};
  testing::expect_interpreter_agrees(before, *after, slots);
}

// A 1x1 convolution over shuffled channels (ShuffleNet's): out[c, p] = sum_k
// X[(k % 2) * 8 * 8 + (k / 2) * 8 + p] W[c, k]. The reduce loop k is split into 2 lanes,
// after the tile, so that the index is affine in both halves; values by the interpreter
// and through the CPU backend.
TEST(Optimize, AReduceLoopALoadDividesIsSplitByTheDivisor) {
  KernelBuilder k;
  constexpr int64_t c_out = 8, kk = 16, px = 8;
  const UOp* out = k.param(0, dtypes::float32, c_out * px);
  const UOp* x = k.param(1, dtypes::float32, kk * px);
  const UOp* w = k.param(2, dtypes::float32, c_out * kk);
  const UOp* c = k.range(c_out);
  const UOp* p = k.range(px);
  const UOp* r = k.range(kk, AxisType::Reduce);
  const UOp* shuffled = k.alu(Op::ADD, k.alu(Op::MUL, k.alu(Op::MOD, r, k.ix(2)), k.ix(kk / 2 * px)),
                              k.alu(Op::MUL, k.alu(Op::IDIV, r, k.ix(2)), k.ix(px)));
  const UOp* prod = k.alu(Op::MUL, k.load(x, k.alu(Op::ADD, shuffled, p)), k.load(w, k.alu(Op::ADD, k.alu(Op::MUL, c, k.ix(kk)), r)));
  const UOp* before = k.sink({k.store(out, k.alu(Op::ADD, k.alu(Op::MUL, c, k.ix(px)), p), k.reduce(ReduceOp::Add, prod, {r}), {c, p})});
  const LoopSchedule s = heuristic_schedule(before, with_bits(512));
  ASSERT_FALSE(s.steps.empty());
  EXPECT_EQ(s.steps.back().str(), "split(2,2,upcast)") << s.str();
  auto after = optimize_cpu(k.g, before, with_bits(512));
  ASSERT_TRUE(after.ok()) << after.status();
  const testing::Slots slots{{Scalar::Float32, c_out * px}, {Scalar::Float32, kk * px}, {Scalar::Float32, c_out * kk}};
  testing::expect_interpreter_agrees(before, *after, slots);
  expect_lowered_on_cpu_agrees(k, before, *after, slots);
}

// Only a kernel of one STORE is shaped: two stores come back as they are.
TEST(Optimize, AKernelOfTwoStoresIsLeftAlone) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 64);
  const UOp* r = k.range(32);
  const UOp* s = k.range(32);
  const UOp* before = k.sink({k.store(out, r, k.f32(1), {r}), k.store(out, k.alu(Op::ADD, s, k.ix(32)), k.f32(2), {s})});
  auto after = optimize_cpu(k.g, before, with_bits(256));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, before);
}

// split_range(r, 4): r0 keeps r's id and type with trip 8 / 4, r1 is a new id of the type
// asked, and where r was closed both are, r0 first. A factor that does not divide masks
// the tail; a factor below 2 or above the trip count, or a range whose trip count is no
// constant, is refused.
TEST(SplitRange, SplitsIntoAnOuterAndAnInnerRangeClosedInItsPlace) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 8);
  const UOp* r = k.range(8);
  const UOp* before = k.sink({k.store(out, r, k.i32(3), {r})});
  auto after = split_range(k.g, before, r, 4, AxisType::Unroll);
  ASSERT_TRUE(after.ok()) << after.status();
  const UOp* store = (*after)->src(0);
  ASSERT_EQ(store->num_src(), 4u);
  const UOp* r0 = store->src(2);
  const UOp* r1 = store->src(3);
  EXPECT_EQ(r0->arg_as<RangeArg>().axis_id, 0);
  EXPECT_EQ(r0->arg_as<RangeArg>().type, AxisType::Loop);
  EXPECT_EQ(testing::trip_of(r0), 2);
  EXPECT_EQ(r1->arg_as<RangeArg>().axis_id, 1);
  EXPECT_EQ(r1->arg_as<RangeArg>().type, AxisType::Unroll);
  EXPECT_EQ(testing::trip_of(r1), 4);
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Int32, 8}});

  auto odd = split_range(k.g, before, r, 3, AxisType::Upcast);
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ(testing::trips_of(*odd, AxisType::Loop), std::vector<int64_t>{3}) << "ceil(8 / 3)";
  EXPECT_EQ((*odd)->src(0)->src(0)->num_src(), 3u) << "the STORE is gated";
  testing::expect_interpreter_agrees(before, *odd, {{Scalar::Int32, 8}});
  for (int64_t f : {0, 1, 9}) {
    absl::Status bad = split_range(k.g, before, r, f, AxisType::Upcast).status();
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_NE(std::string(bad.message()).find("a factor in [2, n]"), std::string::npos) << bad;
  }
  const UOp* v = k.range(k.var("n", 1, 8));
  const UOp* varying = k.sink({k.store(out, v, k.i32(3), {v})});
  EXPECT_FALSE(split_range(k.g, varying, v, 2, AxisType::Upcast).ok());
}

}  // namespace
}  // namespace uop
