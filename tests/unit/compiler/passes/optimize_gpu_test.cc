// optimize for CUDA (compiler/passes/optimize_gpu.h) on kernels built by hand: its rules
// in order. A half matmul on sm_80 takes tensor cores (not on sm_75, not when they are
// off); a reduction with few outputs, or a long contiguous one, is split into a serial
// Reduce part and a GroupReduce range of L threads (the largest of 256 .. 32 that divides
// it; a loop none divides gets ceil(K / L) x L with a masked tail), a contiguous one that
// 32 vectors divide loaded in 4-lane vectors, many short rows a warp each; a contiguous output
// loop long enough is upcast by a 16-byte vector's lanes; and last the output loops become
// Global, the contiguous one with the largest axis id (blockIdx.x), at most three, and y / z
// only when they fit 65535. Each kernel the rules make (before group_reduce and gpu_dims
// lower it to what only a GPU runs) computes what the interpreter computes on the kernel
// before: the interpreter runs every axis type as a plain loop. A kernel of two stores comes
// back as it is.
#include "compiler/passes/optimize_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "tests/unit/compiler/passes/interp_check.h"
#include "tests/unit/compiler/passes/kernel_builder.h"

namespace uop {
namespace {

using testing::KernelBuilder;

// The Global ranges, blockIdx.x first (the largest axis id first).
std::vector<const UOp*> globals_of(const UOp* k) {
  std::vector<const UOp*> out;
  for (const UOp* r : testing::nodes_of(k, Op::RANGE))
    if (r->arg_as<RangeArg>().type == AxisType::Global) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const UOp* a, const UOp* b) { return a->arg_as<RangeArg>().axis_id > b->arg_as<RangeArg>().axis_id; });
  return out;
}

// out[i] = sum over r of in[K i + r] (rows x K, float32).
const UOp* row_sums(KernelBuilder& k, int64_t rows, int64_t K) { return testing::row_reduce(k, ReduceOp::Add, rows, K); }
using testing::matmul;

TEST(OptimizeGpu, AHalfMatmulTakesTensorCoresOnSm80Only) {
  KernelBuilder k;
  const UOp* before = matmul(k, dtypes::float16, 32, 16, 32);
  auto on80 = optimize_gpu(k.g, before, {});
  ASSERT_TRUE(on80.ok()) << on80.status();
  EXPECT_FALSE(testing::nodes_of(*on80, Op::WMMA).empty()) << "sm_80: tensor cores";

  GpuOptimizeOptions sm75;
  sm75.sm = 75;
  auto on75 = optimize_gpu(k.g, before, sm75);
  ASSERT_TRUE(on75.ok()) << on75.status();
  EXPECT_TRUE(testing::nodes_of(*on75, Op::WMMA).empty()) << "sm_75 has no mma.sync m16n8k16";
  GpuOptimizeOptions off;
  off.tensor_cores = false;
  auto without = optimize_gpu(k.g, before, off);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_TRUE(testing::nodes_of(*without, Op::WMMA).empty());
  EXPECT_EQ(*without, *on75) << "without tensor cores the other rules decide, whatever the sm";
  EXPECT_FALSE(globals_of(*without).empty());
}

// 4 rows of 1024: few outputs, a long contiguous loop. Each thread loads 4-lane vectors
// (Upcast 4), and L = 256 divides the 256 vectors: Reduce 1 x GroupReduce 256 x Upcast 4;
// then the row loop is blockIdx.x.
TEST(OptimizeGpu, AReductionWithFewOutputsIsSpreadOverABlock) {
  KernelBuilder k;
  const UOp* before = row_sums(k, 4, 1024);
  auto after = optimize_gpu(k.g, before, {});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testing::trips_of(*after, AxisType::GroupReduce), std::vector<int64_t>{256});
  EXPECT_EQ(testing::trips_of(*after, AxisType::Reduce), std::vector<int64_t>{1});
  EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), std::vector<int64_t>{4});
  auto g = globals_of(*after);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(testing::trip_of(g[0]), 4);
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 4}, {Scalar::Float32, 4096}});

  // max_threads bounds L: 64 threads make Reduce 4 x GroupReduce 64 x Upcast 4.
  GpuOptimizeOptions small;
  small.max_threads = 64;
  auto narrow = optimize_gpu(k.g, before, small);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ(testing::trips_of(*narrow, AxisType::GroupReduce), std::vector<int64_t>{64});
  EXPECT_EQ(testing::trips_of(*narrow, AxisType::Reduce), std::vector<int64_t>{4});
  testing::expect_interpreter_agrees(before, *narrow, {{Scalar::Float32, 4}, {Scalar::Float32, 4096}});
}

// K = 1000: none of 256, 128, 64, 32 divides it. ceil(1000 / 256) = 4 x 256 threads, the
// 24 past the end masked to the identity: the sums stay right.
TEST(OptimizeGpu, AReduceLoopNoBlockDividesHasItsTailMasked) {
  KernelBuilder k;
  const UOp* before = row_sums(k, 3, 1000);
  auto after = optimize_gpu(k.g, before, {});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testing::trips_of(*after, AxisType::GroupReduce), std::vector<int64_t>{256});
  EXPECT_EQ(testing::trips_of(*after, AxisType::Reduce), std::vector<int64_t>{4});
  EXPECT_EQ(testing::nodes_of(*after, Op::WHERE).size(), 1u) << "the tail's mask";
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 3}, {Scalar::Float32, 3000}});
}

// No GroupReduce: too few values per output (16 < 64), or too many outputs (4096 > 2048)
// with a reduce loop no load walks contiguously (column sums). The output loops are Global.
// Many contiguous rows of 32 .. 255 take a warp each, eight rows to a block.
TEST(OptimizeGpu, ShortOrStridedReductionsStayPerThread) {
  {
    KernelBuilder k;
    const UOp* before = row_sums(k, 8, 16);
    auto after = optimize_gpu(k.g, before, {});
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_TRUE(testing::trips_of(*after, AxisType::GroupReduce).empty());
    EXPECT_EQ(testing::trips_of(*after, AxisType::Reduce), std::vector<int64_t>{16});
    EXPECT_EQ(globals_of(*after).size(), 1u);
    testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 8}, {Scalar::Float32, 128}});
  }
  {
    KernelBuilder k;
    const int64_t N = 4096, K = 64;
    const UOp* out = k.param(0, dtypes::float32, N);
    const UOp* in = k.param(1, dtypes::float32, N * K);
    const UOp* j = k.range(N);
    const UOp* r = k.range(K, AxisType::Reduce);
    const UOp* before = k.sink({k.store(out, j, k.reduce(ReduceOp::Add, k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, r, k.ix(N)), j)), {r}), {j})});
    auto after = optimize_gpu(k.g, before, {});
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_TRUE(testing::trips_of(*after, AxisType::GroupReduce).empty());
    EXPECT_EQ(testing::trips_of(*after, AxisType::Reduce), std::vector<int64_t>{K});
  }
  {
    KernelBuilder k;
    const UOp* before = row_sums(k, 4096, 64);
    auto after = optimize_gpu(k.g, before, {});
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(testing::trips_of(*after, AxisType::GroupReduce), std::vector<int64_t>{32});
    EXPECT_EQ(testing::trips_of(*after, AxisType::Local), std::vector<int64_t>{8});
    EXPECT_EQ(testing::trips_of(*after, AxisType::Reduce), std::vector<int64_t>{2});
    testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 4096}, {Scalar::Float32, 4096 * 64}});
  }
}

// out[1024 i + j] float32: 16 bytes are 4 lanes, 1024 / 4 = 256 threads' worth: j is upcast
// by 4 and its outer half is blockIdx.x. With 128 columns (32 vectors, fewer than 64) it is not.
TEST(OptimizeGpu, ALongContiguousOutputLoopIsUpcastByAVectorsLanes) {
  for (int64_t cols : {1024, 128}) {
    KernelBuilder k;
    const UOp* out = k.param(0, dtypes::float32, 2 * cols);
    const UOp* in = k.param(1, dtypes::float32, 2 * cols);
    const UOp* i = k.range(2);
    const UOp* j = k.range(cols);
    const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(cols)), j);
    const UOp* before = k.sink({k.store(out, at, k.alu(Op::MUL, k.load(in, at), k.f32(3)), {i, j})});
    auto after = optimize_gpu(k.g, before, {});
    ASSERT_TRUE(after.ok()) << after.status();
    auto g = globals_of(*after);
    ASSERT_EQ(g.size(), 2u);
    if (cols == 1024) {
      EXPECT_EQ(testing::trips_of(*after, AxisType::Upcast), std::vector<int64_t>{4});
      EXPECT_EQ(testing::trip_of(g[0]), 256) << "blockIdx.x is the contiguous loop's outer half";
    } else {
      EXPECT_TRUE(testing::trips_of(*after, AxisType::Upcast).empty());
      EXPECT_EQ(testing::trip_of(g[0]), 128);
    }
    EXPECT_EQ(testing::trip_of(g[1]), 2);
    testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 2 * cols}, {Scalar::Float32, 2 * cols}});
  }
}

// Four output loops a, b, c, d (d contiguous): d is blockIdx.x, then c and b (innermost
// first) are y and z; a stays a serial loop. A y candidate over 65535 is passed over.
TEST(OptimizeGpu, TheGridTakesTheContiguousLoopAsXAndAtMostThreeLoops) {
  {
    KernelBuilder k;
    const UOp* out = k.param(0, dtypes::int32, 2 * 3 * 5 * 7);
    const UOp* a = k.range(2);
    const UOp* b = k.range(3);
    const UOp* c = k.range(5);
    const UOp* d = k.range(7);
    const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, k.alu(Op::ADD, k.alu(Op::MUL, k.alu(Op::ADD, k.alu(Op::MUL, a, k.ix(3)), b), k.ix(5)), c), k.ix(7)), d);
    const UOp* before = k.sink({k.store(out, at, k.g.make(Op::CAST, dtypes::int32, {at}), {a, b, c, d})});
    auto after = optimize_gpu(k.g, before, {});
    ASSERT_TRUE(after.ok()) << after.status();
    auto g = globals_of(*after);
    ASSERT_EQ(g.size(), 3u);
    EXPECT_EQ(testing::trip_of(g[0]), 7) << "x";
    EXPECT_EQ(testing::trip_of(g[1]), 5) << "y";
    EXPECT_EQ(testing::trip_of(g[2]), 3) << "z";
    EXPECT_EQ(testing::trips_of(*after, AxisType::Loop), std::vector<int64_t>{2});
    testing::expect_interpreter_agrees(before, *after, {{Scalar::Int32, 210}});
  }
  {
    KernelBuilder k;
    const int64_t big = 70000;
    const UOp* out = k.param(0, dtypes::int32, 2 * big * 4);
    const UOp* a = k.range(2);
    const UOp* b = k.range(big);
    const UOp* c = k.range(4);
    const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, k.alu(Op::ADD, k.alu(Op::MUL, a, k.ix(big)), b), k.ix(4)), c);
    const UOp* before = k.sink({k.store(out, at, k.i32(1), {a, b, c})});
    auto after = optimize_gpu(k.g, before, {});
    ASSERT_TRUE(after.ok()) << after.status();
    auto g = globals_of(*after);
    ASSERT_EQ(g.size(), 2u);
    EXPECT_EQ(testing::trip_of(g[0]), 4);
    EXPECT_EQ(testing::trip_of(g[1]), 2) << "70000 does not fit blockIdx.y: the next loop out takes it";
    EXPECT_EQ(testing::trips_of(*after, AxisType::Loop), std::vector<int64_t>{big});
  }
}

// Two stores: every loop stays serial, in one thread.
TEST(OptimizeGpu, AKernelOfTwoStoresIsLeftAlone) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 64);
  const UOp* r = k.range(32);
  const UOp* s = k.range(32);
  const UOp* before = k.sink({k.store(out, r, k.f32(1), {r}), k.store(out, k.alu(Op::ADD, s, k.ix(32)), k.f32(2), {s})});
  auto after = optimize_gpu(k.g, before, {});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, before);
}

}  // namespace
}  // namespace uop
