// The GPU emulator (compiler/gpu_emu) without a GPU:
//   * every case of the CUDA corpus (tests/gpu/cuda_corpus.h: the kernel corpus, every ALU
//     op / CAST / BITCAST on every dtype, float16 / bfloat16 tensor-core matmuls, group
//     reductions, a batch bound at run time) lowered for sm_80 and sm_90 and run on the
//     emulator matches the reference interpreter under cuda_gpu_test's tolerances, and so
//     do 800 random graphs (random_graph.h) under the tolerances the generator derives;
//   * each choice of optimize_gpu (tensor cores, group reduce with and without a masked
//     tail, the 16-byte upcast, the grid's x / y / z and its serial loops, the split of
//     blockIdx.x with a clamped tail, other block sizes, a run-time extent) on a few
//     shapes, odd ones included, lowered by the CUDA backend and emulated, agrees with the
//     interpreter on the kernel before lowering, and the choice is seen in the LINEAR;
//   * the GPU's schedule steps (loop_schedule.h) given as schedules, each alone and in
//     combination: splits into local / group_reduce / upcast, grid, tc, the shared-memory
//     GEMM tiles (tile: float32, batched, either operand layout, an epilogue; tc_tile:
//     float16 / bfloat16 on the tensor cores, a float16 result), emulated against the
//     interpreter with the staging (two shared arrays, one barrier per k step) seen in the
//     LINEAR; and what a schedule may not say, refused naming the step;
//   * seeded bugs in hand-built LINEARs (a write-write race in shared memory, a read
//     before the barrier that publishes it, a barrier some threads skip, out-of-bounds
//     shared and global indices, a read of unwritten shared memory, a race between
//     blocks, a WMMA in a partial warp) each fail naming the node and the threads, and
//     so does the backend's own group reduction with any one of its barriers left out,
//     and its tiled GEMM without its barrier.
#include "compiler/gpu_emu/gpu_emu.h"

#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "compiler/backends/cuda/cuda_backend.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/interp/interp.h"
#include "compiler/passes/loop_schedule.h"
#include "compiler/passes/gemm_tiles.h"
#include "compiler/passes/optimize.h"
#include "compiler/pipeline.h"
#include "compiler/ir/verifier.h"
#include "compiler/ir/printer.h"
#include "tests/gpu/cuda_corpus.h"
#include "tests/gpu/emu_runner.h"
#include "tests/unit/compiler/codegen/linear_builder.h"
#include "tests/unit/compiler/passes/interp_check.h"
#include "tests/unit/compiler/passes/kernel_builder.h"
#include "tests/unit/compiler/random_graph.h"

namespace uop {
namespace {

using testing::KernelBuilder;
using testing::LinearBuilder;

CudaTarget target(const char* arch) {
  auto t = CudaTarget::parse(arch);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

int count_ops(const UOp* linear, const std::function<bool(const UOp*)>& pred) {
  int n = 0;
  for (const UOp* u : linear->src()) n += pred(u);
  return n;
}
int count_op(const UOp* linear, Op op) {
  return count_ops(linear, [op](const UOp* u) { return u->op() == op; });
}

// ---------------------------------------------------------------------------------------
// The corpus.

class GpuEmuCorpus : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuEmuCorpus, EveryCaseMatchesTheInterpreter) {
  gputest::EmuRunner emu(target(GetParam()));
  int cases = 0;
  int64_t matmul_wmmas = 0, reduce_barriers = 0;
  for (cudatest::Case& c : cudatest::corpus()) {
    SCOPED_TRACE(c.name);
    auto want = interpret(*c.g, c.sink, c.inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    const GpuEmuStats before = emu.totals();
    auto got = emu.run(*c.g, c.sink, c.inputs);
    ASSERT_TRUE(got.ok()) << c.name << ": " << got.status();
    EXPECT_EQ(cudatest::compare_outputs(c, *want, *got), "") << c.name;
    if (c.name.starts_with("matmul_f16") || c.name == "matmul_bf16") {
      const int64_t wmmas = emu.totals().wmmas - before.wmmas;
      // 10 x 12 x 6 fits no m16n8k16 tile; the others run on the tensor cores.
      if (c.name == "matmul_f16_odd") {
        EXPECT_EQ(wmmas, 0);
      } else {
        EXPECT_GT(wmmas, 0) << "no tensor cores";
      }
      matmul_wmmas += wmmas;
    }
    if (c.name == "sum_all" || c.name == "sum_rows") reduce_barriers += emu.totals().barriers - before.barriers;
    ++cases;
  }
  EXPECT_GT(cases, 60);
  EXPECT_GT(matmul_wmmas, 0);
  EXPECT_GT(reduce_barriers, 0) << "the group reductions synchronize through shared memory";
  std::cout << GetParam() << ": " << cases << " cases, " << emu.launches() << " launches, " << emu.totals().blocks
            << " blocks, " << emu.totals().steps << " ops, " << emu.totals().barriers << " barriers, "
            << emu.totals().wmmas << " WMMAs\n";
}

INSTANTIATE_TEST_SUITE_P(Arches, GpuEmuCorpus, ::testing::Values("sm_80", "sm_90"));

// The random graph of `seed` (its wide inputs given edge values) on `emu` against the
// interpreter: "" when every output is within the generator's tolerance, else why not and
// the graph.
std::string check_random_graph(gputest::EmuRunner& emu, uint64_t seed) {
  Graph g;
  TensorBuilder tb(g);
  randgraph::RandomGraph rg = randgraph::generate(tb, seed);
  difftest::Inputs in = difftest::random_inputs(tb, rg.inputs, seed * 1000);
  for (size_t i = 0; i < rg.inputs.size(); ++i)
    if (rg.wide[i]) {
      HostTensor& t = in.at(tb.buffer_of(rg.inputs[i]));
      t = difftest::edge_tensor(t.dtype, t.shape, seed * 1000 + i);
    }
  auto want = interpret(g, rg.sink, in);
  if (!want.ok()) return cat("the interpreter: ", want.status().ToString());
  auto got = emu.run(g, rg.sink, in);
  std::string why = !got.ok() ? got.status().ToString() : "";
  if (got.ok())
    for (size_t i = 0; i < want->size(); ++i)
      if (std::string w = difftest::compare_output((*want)[i], (*got)[i], rg.tolerances[i]); !w.empty())
        why += cat("output ", i, " (", rg.notes[i], "): ", w, "\n");
  return why.empty() ? why : cat(why, print_tree(rg.sink));
}

// Random graphs (random_graph.h: every dtype, broadcasts, movement ops, reductions feeding
// reductions) through the CUDA lowering on the emulator, under the tolerance the generator
// derives for each output (its reassociation bounds hold for the group reductions too).
TEST(GpuEmuRandom, GraphsMatchTheInterpreter) {
  gputest::EmuRunner emu(target("sm_80"));
  constexpr uint64_t kBase = 0x9e0e0000, kCount = 800;
  int failures = 0;
  for (uint64_t seed = kBase; seed < kBase + kCount && failures < 5; ++seed) {
    if (std::string why = check_random_graph(emu, seed); !why.empty()) {
      ++failures;
      ADD_FAILURE() << "seed " << seed << ": " << why;
    }
  }
  std::cout << kCount << " random graphs: " << emu.launches() << " launches, " << emu.totals().barriers
            << " barriers\n";
}

// A GPU schedule drawn at random from the steps that fit `kernel`: for a matmul, a GEMM
// tile that fits it half the time; else up to three splits (output axes into local, upcast
// or loop ranges, reduce axes into one group_reduce or reduce range; a gated axis only
// into upcast lanes by a divisor) within the block's 1024 threads, three thread ranges and
// 256 lanes, then a grid of up to three plain output loops. The generator keeps what each
// step does to the trip counts, so every schedule it makes applies (a refusal is a
// failure). No output's upcast lanes beside a group_reduce range (apply_schedule refuses
// them); a reduce loop's may.
std::string random_gpu_schedule(const UOp* kernel, uint64_t seed) {
  std::vector<const UOp*> axes = schedule_axes(kernel);
  if (axes.empty()) return "";
  randgraph::Rng rng(seed);
  if (rng.chance(0.5))
    for (GemmTile t : {GemmTile{16, 16, 4, 2, 2}, GemmTile{32, 32, 8, 4, 4}, GemmTile{32, 32, 16, 16, 16, true}})
      if (gemm_tile_misfit(kernel, t).empty()) return t.str();
  const size_t outputs = closed_ranges(kernel->src(0)).size();
  std::vector<int64_t> trip;
  std::vector<bool> output, plain, gated;
  for (size_t i = 0; i < axes.size(); ++i) {
    trip.push_back(const_end(axes[i]));
    output.push_back(i < outputs);
    plain.push_back(axes[i]->arg_as<RangeArg>().type == AxisType::Loop);
    bool nested = false;
    for (const UOp* x : toposort(axes[i]->src(0))) nested |= x->op() == Op::RANGE;
    if (nested) plain.back() = false;
    gated.push_back(!can_mask(kernel, axes[i]));
  }
  int64_t threads = 1, thread_ranges = 0, lanes = 1;
  bool grouped = false, output_lanes = false;
  LoopSchedule s;
  for (int64_t n = rng.range(0, 3); n > 0; --n) {
    std::vector<int64_t> can;
    for (size_t a = 0; a < trip.size(); ++a)
      if (trip[a] >= 2) can.push_back(static_cast<int64_t>(a));
    if (can.empty()) break;
    const int64_t a = rng.pick(can);
    int64_t f = rng.range(2, std::min<int64_t>(trip[a], 40));
    while (gated[a] && trip[a] % f != 0) --f;
    if (f < 2) continue;
    AxisType t = output[a] ? (rng.chance(0.5) ? AxisType::Local : rng.chance(0.5) ? AxisType::Upcast : AxisType::Loop)
                           : (rng.chance(0.6) && !grouped ? AxisType::GroupReduce : AxisType::Reduce);
    if (gated[a]) t = AxisType::Upcast;
    if (!output[a] && rng.chance(0.3)) t = AxisType::Upcast;
    if (t == AxisType::Upcast && (lanes * f > 256 || (output[a] && grouped))) continue;
    if (t == AxisType::GroupReduce && output_lanes) t = AxisType::Reduce;
    const bool thread = t == AxisType::Local || t == AxisType::GroupReduce;
    if (thread && (threads * f > 1024 || thread_ranges == 3)) continue;
    if (thread) threads *= f, ++thread_ranges;
    if (t == AxisType::Upcast) lanes *= f;
    output_lanes |= t == AxisType::Upcast && output[a];
    grouped |= t == AxisType::GroupReduce;
    s.steps.push_back(LoopStep{.kind = LoopStep::Kind::Split, .axis = a, .factor = f, .type = t});
    trip[a] = (trip[a] + f - 1) / f;
    trip.push_back(f);
    output.push_back(output[a]);
    plain.push_back(false);
    gated.push_back(gated[a]);
  }
  if (rng.chance(0.8)) {
    LoopStep grid{.kind = LoopStep::Kind::Grid};
    for (size_t a = outputs; a-- > 0 && grid.order.size() < 3;)
      if (plain[a] && (grid.order.empty() || (trip[a] >= 0 && trip[a] <= 65535)) && rng.chance(0.8))
        grid.order.push_back(static_cast<int64_t>(a));
    if (!grid.order.empty()) s.steps.push_back(grid);
  }
  return s.str();
}

// Random graphs under random GPU schedules, each kernel's drawn from the seed and its
// digest, through the CUDA lowering on the emulator against the interpreter.
TEST(GpuEmuRandom, GraphsUnderRandomSchedulesMatchTheInterpreter) {
  constexpr uint64_t kBase = 0x6a5c0000, kCount = 300;
  int failures = 0, kernels = 0;
  std::string log;
  for (uint64_t seed = kBase; seed < kBase + kCount && failures < 5; ++seed) {
    gputest::EmuRunner emu(target("sm_80"));
    log.clear();
    emu.set_schedules([&](const UOp* kernel) {
      uint64_t h = seed;
      for (uint8_t b : kernel->digest().bytes) h = h * 1099511628211ULL + b;
      std::string s = random_gpu_schedule(kernel, h);
      log += cat("kernel ", kernel->digest().short_hex(), ": \"", s, "\"\n");
      ++kernels;
      return s;
    });
    if (std::string why = check_random_graph(emu, seed); !why.empty()) {
      ++failures;
      ADD_FAILURE() << "seed " << seed << ": " << why << log;
    }
  }
  EXPECT_GT(kernels, static_cast<int>(kCount));
  std::cout << kCount << " random graphs under random GPU schedules: " << kernels << " kernels\n";
}

// ---------------------------------------------------------------------------------------
// optimize_gpu's choices, on kernels built by hand.

// out[i] = a[i] * 2 + b[i] over n (float32).
const UOp* axpy(KernelBuilder& k, int64_t n) {
  const UOp* out = k.param(0, dtypes::float32, n);
  const UOp* a = k.param(1, dtypes::float32, n);
  const UOp* b = k.param(2, dtypes::float32, n);
  const UOp* i = k.range(n);
  return k.sink({k.store(out, i, k.alu(Op::ADD, k.alu(Op::MUL, k.load(a, i), k.f32(2)), k.load(b, i)), {i})});
}

// out[flat] = in[flat] + 1 over the dims given, row-major (one output loop per dim).
const UOp* plus_one(KernelBuilder& k, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  const UOp* out = k.param(0, dtypes::float32, n);
  const UOp* in = k.param(1, dtypes::float32, n);
  std::vector<const UOp*> rs;
  const UOp* flat = nullptr;
  for (int64_t d : dims) {
    rs.push_back(k.range(d));
    flat = flat ? k.alu(Op::ADD, k.alu(Op::MUL, flat, k.ix(d)), rs.back()) : rs.back();
  }
  return k.sink({k.store(out, flat, k.alu(Op::ADD, k.load(in, flat), k.f32(1)), rs)});
}

// The kernel lowered by `backend` and emulated against the interpreter on the kernel
// itself, from the same params; the LINEAR comes back for the caller's checks.
// With `schedule`, the kernel is lowered with that loop schedule, and `applied` (when not
// null) gets the text of the one the optimize stage applied.
const UOp* expect_emulator_agrees(KernelBuilder& k, const UOp* kernel, const CudaBackend& backend,
                                  const testing::Slots& slots, Tolerance tol,
                                  const absl::flat_hash_map<std::string, int64_t>& vars = {},
                                  std::string_view schedule = {}, std::string* applied = nullptr) {
  PipelineOptions opts;
  opts.schedule = std::string(schedule);
  opts.applied_schedule = applied;
  auto linear = backend.lower(k.g, kernel, opts, "probe");
  EXPECT_TRUE(linear.ok()) << linear.status();
  if (!linear.ok()) return nullptr;
  std::vector<HostTensor> want = testing::params_for(slots), got = want;
  absl::Status a = interpret_kernel(kernel, testing::pointers(want), vars);
  EXPECT_TRUE(a.ok()) << a;
  std::vector<HostTensor*> ptrs = testing::pointers(got);
  auto st = emulate_gpu(*linear, ptrs, vars);
  EXPECT_TRUE(st.ok()) << st.status() << "\n" << print_tree(*linear);
  if (!st.ok()) return *linear;
  EXPECT_GT(st->blocks, 0);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(difftest::compare_output(want[i], got[i], tol), "") << "slot " << i;
  return *linear;
}

int specials(const UOp* linear, std::string_view name) {
  return count_ops(linear, [&](const UOp* u) { return u->is(Op::SPECIAL) && u->arg_as<StrArg>().value == name; });
}
int vector_accesses(const UOp* linear) {
  return count_ops(linear, [](const UOp* u) {
    return (u->is(Op::LOAD) && u->dtype().count > 1) || (u->is(Op::STORE) && u->src(1)->dtype().count > 1);
  });
}

TEST(GpuEmuOptimize, TensorCoresOnSm80AndTheFallbacksWithout) {
  const CudaBackend sm80(target("sm_80")), sm75(target("sm_75")), off(target("sm_90"), /*tensor_cores=*/false);
  for (auto [M, N, K] : {std::array<int64_t, 3>{16, 8, 16}, {32, 16, 32}, {48, 24, 64}, {64, 32, 16}}) {
    SCOPED_TRACE(cat(M, " x ", N, " x ", K));
    KernelBuilder k;
    const UOp* mm = testing::matmul(k, dtypes::float16, M, N, K);
    const testing::Slots slots = {{Scalar::Float32, M * N}, {Scalar::Float16, M * K}, {Scalar::Float16, K * N}};
    const Tolerance tol = difftest::add_reduction(Scalar::Float32, K, 4.0 * K);
    const UOp* tc = expect_emulator_agrees(k, mm, sm80, slots, tol);
    ASSERT_NE(tc, nullptr);
    EXPECT_GE(count_op(tc, Op::WMMA), 1) << "sm_80: mma.sync";
    for (const CudaBackend* b : {&sm75, &off}) {
      const UOp* plain = expect_emulator_agrees(k, mm, *b, slots, tol);
      ASSERT_NE(plain, nullptr);
      EXPECT_EQ(count_op(plain, Op::WMMA), 0);
    }
  }
}

TEST(GpuEmuOptimize, GroupReductionsWithAndWithoutAMaskedTail) {
  const CudaBackend cuda(target("sm_90"));
  struct Shape { ReduceOp op; int64_t rows, K; };
  // 1024: L = 256 divides it; 1000 and 333: no L does (masked tails); 70: L = ceil.
  for (Shape s : {Shape{ReduceOp::Add, 4, 1024},
                  {ReduceOp::Add, 3, 1000},
                  {ReduceOp::Max, 5, 333},
                  {ReduceOp::Add, 2, 70},
                  {ReduceOp::Min, 7, 64}}) {
    SCOPED_TRACE(cat(s.rows, " x ", s.K));
    KernelBuilder k;
    const UOp* linear = expect_emulator_agrees(k, testing::row_reduce(k, s.op, s.rows, s.K), cuda,
                                               {{Scalar::Float32, s.rows}, {Scalar::Float32, s.rows * s.K}},
                                               difftest::add_reduction(Scalar::Float32, s.K, 2.0 * s.K));
    ASSERT_NE(linear, nullptr);
    EXPECT_EQ(count_op(linear, Op::DEFINE_LOCAL), 1) << "group reduce: one shared array";
    EXPECT_GT(count_op(linear, Op::BARRIER), 1);
  }
  // Many short contiguous rows (softmax's row max and sum): a warp per row, eight rows per
  // block (threadIdx.y), each row's own shared array; rows and K that 8 and 32 do not
  // divide are masked.
  for (auto [rows, K] : {std::pair<int64_t, int64_t>{4096, 64}, {2051, 40}, {2300, 255}}) {
    SCOPED_TRACE(cat(rows, " short rows of ", K));
    KernelBuilder k;
    std::string applied;
    const UOp* linear = expect_emulator_agrees(k, testing::row_reduce(k, ReduceOp::Max, rows, K), cuda,
                                               {{Scalar::Float32, rows}, {Scalar::Float32, rows * K}}, Tolerance::exact(),
                                               {}, "", &applied);
    ASSERT_NE(linear, nullptr);
    EXPECT_EQ(applied, "split(0,8,local);split(1,32,group_reduce);grid(0)");
    EXPECT_EQ(count_op(linear, Op::DEFINE_LOCAL), 1);
    EXPECT_EQ(specials(linear, "threadIdx.y"), 1);
  }
  // Many outputs with a short reduction: per-thread accumulators, no shared memory.
  KernelBuilder k;
  const UOp* linear = expect_emulator_agrees(k, testing::row_reduce(k, ReduceOp::Add, 4096, 8), cuda,
                                             {{Scalar::Float32, 4096}, {Scalar::Float32, 4096 * 8}},
                                             difftest::add_reduction(Scalar::Float32, 8, 16));
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(count_op(linear, Op::DEFINE_LOCAL), 0);
  EXPECT_EQ(count_op(linear, Op::BARRIER), 0);
}

// Softmax-shaped graphs (a row max, then exp of each element less it, a row sum, then
// each element over its row's sum) from short rows to long: every row reduction folds in
// shared memory (a warp per row for many short rows, a block per row for long ones), and
// the outputs match the interpreter's.
TEST(GpuEmuOptimize, SoftmaxRowsFromShortToLongReduceInSharedMemory) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{4096, 64}, {3000, 100}, {8, 4096}, {2, 65536}}) {
    SCOPED_TRACE(cat(rows, " rows of ", cols));
    gputest::EmuRunner emu(target("sm_90"));
    Graph g;
    TensorBuilder tb(g);
    const UOp* x = tb.input(Scalar::Float32, {rows, cols});
    const UOp* e = tb.alu(Op::EXP2, {tb.alu(Op::SUB, {x, tb.reduce(x, ReduceOp::Max, {1})})});
    const UOp* sink = tb.sink({tb.alu(Op::FDIV, {e, tb.reduce(e, ReduceOp::Add, {1})})});
    difftest::Inputs in = difftest::random_inputs(tb, {x}, 7);
    auto want = interpret(g, sink, in);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = emu.run(g, sink, in);
    ASSERT_TRUE(got.ok()) << got.status();
    // exp2 within a few ULP, a sum of `cols` positive terms reassociated.
    EXPECT_EQ(difftest::compare_output((*want)[0], (*got)[0], difftest::add_reduction(Scalar::Float32, cols, 8.0 * cols)), "");
    // Every block (eight short rows, or one long row) passes barriers in each reduction.
    EXPECT_GE(emu.totals().barriers, 2 * (rows > 2048 ? rows / 8 : rows)) << "the max and the sum fold across threads";
  }
}

TEST(GpuEmuOptimize, UpcastAndTheSplitOfBlockIdxX) {
  const CudaBackend cuda(target("sm_80"));
  // 4096 and 1000: 4-lane vectors (16 bytes) with >= 64 threads left; 1001 and 37 cannot
  // be upcast; 1001 is no multiple of a block (a clamped, gated tail), 37 is one block.
  for (int64_t n : {4096, 1000, 1001, 37}) {
    SCOPED_TRACE(n);
    KernelBuilder k;
    const UOp* linear = expect_emulator_agrees(
        k, axpy(k, n), cuda, {{Scalar::Float32, n}, {Scalar::Float32, n}, {Scalar::Float32, n}}, Tolerance::exact());
    ASSERT_NE(linear, nullptr);
    EXPECT_EQ(vector_accesses(linear) > 0, n % 4 == 0) << print_tree(linear);
    EXPECT_EQ(specials(linear, "threadIdx.x"), 1);
    if (n == 1001) {
      EXPECT_GT(count_op(linear, Op::MIN), 0) << "the clamped tail";
    }
  }
}

TEST(GpuEmuOptimize, TheGridTakesXYZAndLeavesTheRestSerial) {
  const CudaBackend cuda(target("sm_90"));
  // The innermost loop is blockIdx.x split into threads (threadIdx.x alone when it fits
  // one block), the next two blockIdx.y / z when they fit 65535; the rest stay loops.
  struct G { std::vector<int64_t> dims; int serial; };
  for (const G& c : {G{{5, 7, 9}, 0}, G{{3, 4, 5, 6}, 1}, G{{70000, 2}, 1}, G{{2, 3}, 0}, G{{3, 600}, 0}}) {
    SCOPED_TRACE(c.dims.size());
    KernelBuilder k;
    int64_t n = 1;
    for (int64_t d : c.dims) n *= d;
    const UOp* linear = expect_emulator_agrees(k, plus_one(k, c.dims), cuda,
                                               {{Scalar::Float32, n}, {Scalar::Float32, n}}, Tolerance::exact());
    ASSERT_NE(linear, nullptr);
    EXPECT_EQ(specials(linear, "threadIdx.x"), 1);
    EXPECT_EQ(count_op(linear, Op::RANGE), c.serial) << print_tree(linear);
    const int grid = (specials(linear, "blockIdx.x") > 0) + (specials(linear, "blockIdx.y") > 0) +
                     (specials(linear, "blockIdx.z") > 0);
    EXPECT_EQ(grid + 1, static_cast<int>(c.dims.size()) - c.serial + (specials(linear, "blockIdx.x") > 0))
        << "each parallel loop a dim";
  }
}

TEST(GpuEmuOptimize, OtherBlockSizesAndARunTimeExtent) {
  for (int threads : {32, 64, 1024}) {
    SCOPED_TRACE(threads);
    const CudaBackend cuda(target("sm_80"), true, threads);
    KernelBuilder k;
    ASSERT_NE(expect_emulator_agrees(k, testing::row_reduce(k, ReduceOp::Add, 3, 2048), cuda,
                                     {{Scalar::Float32, 3}, {Scalar::Float32, 3 * 2048}},
                                     difftest::add_reduction(Scalar::Float32, 2048, 4096)),
              nullptr);
    KernelBuilder k2;
    ASSERT_NE(expect_emulator_agrees(k2, axpy(k2, 5000), cuda,
                                     {{Scalar::Float32, 5000}, {Scalar::Float32, 5000}, {Scalar::Float32, 5000}},
                                     Tolerance::exact()),
              nullptr);
  }
  // out[i] = in[i] + 1 for i < n, n bound at run time: the grid is ceil(n / L) blocks.
  const CudaBackend cuda(target("sm_90"));
  for (int64_t n : {1, 255, 777, 5000}) {
    SCOPED_TRACE(n);
    KernelBuilder k;
    const UOp* out = k.param(0, dtypes::float32, 5000);
    const UOp* in = k.param(1, dtypes::float32, 5000);
    const UOp* i = k.range(k.var("n", 1, 5000));
    const UOp* kernel = k.sink({k.store(out, i, k.alu(Op::ADD, k.load(in, i), k.f32(1)), {i})});
    ASSERT_NE(expect_emulator_agrees(k, kernel, cuda, {{Scalar::Float32, 5000}, {Scalar::Float32, 5000}},
                                     Tolerance::exact(), {{"n", n}}),
              nullptr);
  }
}

// ---------------------------------------------------------------------------------------
// The GPU's schedule steps (loop_schedule.h: split into local / group_reduce / upcast,
// grid, tc, tile), each alone and in combination, given as a schedule and emulated.

int void_barriers(const UOp* linear) {
  return count_ops(linear, [](const UOp* u) { return u->is(Op::BARRIER) && u->dtype().is_void(); });
}

// C[m, n] = sum over k of A * B, float32, A read at (m, k) or (k, m) (`a_k_major`: A is
// stored K x M, so its staging walks m), with `batch` batches and, with `relu`, the
// epilogue max(sum, 0) (f of the matmul's STORE).
struct Mm {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  bool a_k_major = false, relu = false;
};
const UOp* float_matmul(KernelBuilder& k, const Mm& s) {
  const UOp* c = k.param(0, dtypes::float32, s.batch * s.M * s.N);
  const UOp* a = k.param(1, dtypes::float32, s.batch * s.M * s.K);
  const UOp* b = k.param(2, dtypes::float32, s.batch * s.K * s.N);
  const UOp* bt = s.batch > 1 ? k.range(s.batch) : nullptr;
  const UOp* m = k.range(s.M);
  const UOp* n = k.range(s.N);
  const UOp* r = k.range(s.K, AxisType::Reduce);
  auto plus = [&](const UOp* x, const UOp* y) { return k.alu(Op::ADD, x, y); };
  auto times = [&](const UOp* x, int64_t c) { return k.alu(Op::MUL, x, k.ix(c)); };
  const UOp* ai = s.a_k_major ? plus(times(r, s.M), m) : plus(times(m, s.K), r);
  const UOp* bi = plus(times(r, s.N), n);
  const UOp* ci = plus(times(m, s.N), n);
  if (bt) {
    ai = plus(times(bt, s.M * s.K), ai);
    bi = plus(times(bt, s.K * s.N), bi);
    ci = plus(times(bt, s.M * s.N), ci);
  }
  const UOp* sum = k.reduce(ReduceOp::Add, k.alu(Op::MUL, k.load(a, ai), k.load(b, bi)), {r});
  if (s.relu) sum = k.alu(Op::MAX, sum, k.f32(0));
  std::vector<const UOp*> outs;
  if (bt) outs.push_back(bt);
  outs.push_back(m);
  outs.push_back(n);
  return k.sink({k.store(c, ci, sum, outs)});
}
testing::Slots mm_slots(const Mm& s) {
  return {{Scalar::Float32, s.batch * s.M * s.N}, {Scalar::Float32, s.batch * s.M * s.K}, {Scalar::Float32, s.batch * s.K * s.N}};
}

TEST(GpuEmuSchedule, TiledMatmulsStageThroughSharedMemoryAndMatchTheInterpreter) {
  const CudaBackend cuda(target("sm_90"));
  struct C { Mm mm; std::string schedule, want; };
  for (const C& c : {C{{1, 64, 64, 32}, "", "tile(32,32,8,4,4)"},
                     C{{1, 64, 64, 32}, "tile(16,16,4,2,2)", ""},
                     C{{1, 32, 64, 16}, "tile(32,64,8,4,8)", ""},
                     C{{1, 96, 64, 24}, "tile(32,32,8,4,4)", ""},
                     C{{1, 128, 128, 16}, "tile(128,128,8,8,8)", ""},
                     C{{1, 64, 32, 16, true}, "", "tile(32,32,8,4,4)"},
                     C{{3, 32, 32, 16, false, true}, "", "tile(32,32,8,4,4)"},
                     C{{2, 64, 32, 8, true, true}, "tile(32,16,8,2,2)", ""}}) {
    SCOPED_TRACE(cat(c.mm.batch, " x ", c.mm.M, " x ", c.mm.N, " x ", c.mm.K, " ", c.schedule));
    KernelBuilder k;
    std::string applied;
    const UOp* linear = expect_emulator_agrees(k, float_matmul(k, c.mm), cuda, mm_slots(c.mm),
                                               difftest::add_reduction(Scalar::Float32, c.mm.K, 2.0 * c.mm.K), {},
                                               c.schedule, &applied);
    ASSERT_NE(linear, nullptr);
    EXPECT_EQ(applied, c.schedule.empty() ? c.want : c.schedule);
    EXPECT_EQ(count_op(linear, Op::DEFINE_LOCAL), 2) << "A's and B's tiles";
    EXPECT_EQ(void_barriers(linear), 1) << "double-buffered: one barrier per k step";
    EXPECT_EQ(specials(linear, "threadIdx.y"), 1);
    EXPECT_EQ(specials(linear, "blockIdx.z"), c.mm.batch > 1 ? 1 : 0) << "the batch loop";
    EXPECT_EQ(count_op(linear, Op::WMMA), 0);
  }
  // A half matmul where there are no tensor cores (sm_75) is tiled on its widened values.
  const CudaBackend sm75(target("sm_75"));
  KernelBuilder k;
  std::string applied;
  const UOp* linear = expect_emulator_agrees(k, testing::matmul(k, dtypes::float16, 64, 32, 16), sm75,
                                             {{Scalar::Float32, 64 * 32}, {Scalar::Float16, 64 * 16}, {Scalar::Float16, 16 * 32}},
                                             difftest::add_reduction(Scalar::Float32, 16, 64.0), {}, "", &applied);
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(applied, "tile(32,32,8,4,4)");
  EXPECT_EQ(count_op(linear, Op::DEFINE_LOCAL), 2);
}

TEST(GpuEmuSchedule, EveryStepAloneAndCombinedMatchesTheInterpreter) {
  const CudaBackend cuda(target("sm_80"));
  auto check = [&](KernelBuilder& k, const UOp* kernel, const testing::Slots& slots, Tolerance tol,
                   const std::string& schedule) {
    SCOPED_TRACE(schedule);
    std::string applied;
    const UOp* linear = expect_emulator_agrees(k, kernel, cuda, slots, tol, {}, schedule, &applied);
    EXPECT_EQ(applied, schedule);
    return linear;
  };
  const int64_t n = 4096;
  const testing::Slots three = {{Scalar::Float32, n}, {Scalar::Float32, n}, {Scalar::Float32, n}};
  for (const char* s : {"grid(0)", "split(0,4,upcast);grid(0)", "split(0,128,local);grid(0)",
                        "split(0,4,upcast);split(0,64,local);grid(0)", "split(0,100,local);grid(0)", "split(0,64,local)"}) {
    KernelBuilder k;
    const UOp* linear = check(k, axpy(k, n), three, Tolerance::exact(), s);
    ASSERT_NE(linear, nullptr);
    const std::string text(s);
    EXPECT_EQ(specials(linear, "blockIdx.x") > 0, text.find("grid") != std::string::npos);
    EXPECT_EQ(vector_accesses(linear) > 0, text.find("upcast") != std::string::npos);
  }
  for (const char* s : {"split(1,128,group_reduce);grid(0)", "split(1,96,group_reduce);grid(0)",
                        "split(1,4,upcast);split(1,64,group_reduce);grid(0)", "split(1,8,upcast);split(1,32,group_reduce)",
                        "split(1,250,reduce);split(1,2,group_reduce);grid(0)", "split(0,3,local);split(1,64,group_reduce)"}) {
    KernelBuilder k;
    const UOp* linear = check(k, testing::row_reduce(k, ReduceOp::Add, 3, 1000),
                              {{Scalar::Float32, 3}, {Scalar::Float32, 3000}},
                              difftest::add_reduction(Scalar::Float32, 1000, 2000.0), s);
    ASSERT_NE(linear, nullptr);
    EXPECT_EQ(count_op(linear, Op::DEFINE_LOCAL), 1);
    EXPECT_EQ(vector_accesses(linear) > 0, std::string(s).find("upcast") != std::string::npos) << "vector loads";
  }
  for (const char* s : {"grid(3,2,1)", "grid(3)", "grid(2,3)", "split(3,2,local);grid(3,1)"}) {
    KernelBuilder k;
    ASSERT_NE(check(k, plus_one(k, {3, 4, 5, 6}), {{Scalar::Float32, 360}, {Scalar::Float32, 360}}, Tolerance::exact(), s),
              nullptr);
  }
  for (const char* s : {"tc(1)", "tc(2)", "tc(4)", "tc_tile(32,32,16,16,16)", "tc_tile(32,32,32,32,8)",
                        "tc_tile(32,32,16,16,32)"}) {
    KernelBuilder k;
    const UOp* linear = check(k, testing::matmul(k, dtypes::float16, 32, 32, 32),
                              {{Scalar::Float32, 1024}, {Scalar::Float16, 1024}, {Scalar::Float16, 1024}},
                              difftest::add_reduction(Scalar::Float32, 32, 128.0), s);
    ASSERT_NE(linear, nullptr);
    const std::string text(s);
    // A warp's (WM / 16) x (WN / 8) mma tiles; tc: one.
    const int tiles = text == "tc_tile(32,32,16,16,16)" ? 2 : text == "tc_tile(32,32,32,32,8)" ? 2
                      : text == "tc_tile(32,32,16,16,32)" ? 4 : 1;
    EXPECT_EQ(count_op(linear, Op::WMMA), tiles);
    EXPECT_EQ(count_op(linear, Op::DEFINE_LOCAL), text.starts_with("tc_tile") ? 2 : 0);
  }
}

// C = sum over k of A * B on `in` (float16 / bfloat16) values, `batch` batches, the sum
// and C in float32 (widened operands) or, with !f32, in `in` itself.
const UOp* half_matmul(KernelBuilder& k, DType in, int64_t batch, int64_t M, int64_t N, int64_t K, bool f32) {
  const DType out = f32 ? dtypes::float32 : in;
  const UOp* c = k.param(0, out, batch * M * N);
  const UOp* a = k.param(1, in, batch * M * K);
  const UOp* b = k.param(2, in, batch * K * N);
  const UOp* bt = k.range(batch);
  const UOp* m = k.range(M);
  const UOp* n = k.range(N);
  const UOp* r = k.range(K, AxisType::Reduce);
  auto plus = [&](const UOp* x, const UOp* y) { return k.alu(Op::ADD, x, y); };
  auto times = [&](const UOp* x, int64_t v) { return k.alu(Op::MUL, x, k.ix(v)); };
  const UOp* av = k.load(a, plus(times(bt, M * K), plus(times(m, K), r)));
  const UOp* bv = k.load(b, plus(times(bt, K * N), plus(times(r, N), n)));
  if (f32) {
    av = k.g.make(Op::CAST, dtypes::float32, {av});
    bv = k.g.make(Op::CAST, dtypes::float32, {bv});
  }
  const UOp* sum = k.reduce(ReduceOp::Add, k.alu(Op::MUL, av, bv), {r});
  return k.sink({k.store(c, plus(times(bt, M * N), plus(times(m, N), n)), sum, {bt, m, n})});
}

// The tensor cores fed from shared memory (tc_tile) on the heuristic's and given tiles,
// float16 and bfloat16, batched, a float16 result (rounded once from the float32
// accumulators), a block of 8 warps of 4 x 4 mma tiles each.
TEST(GpuEmuSchedule, TensorCoreTilesStageThroughSharedMemoryAndMatchTheInterpreter) {
  const CudaBackend cuda(target("sm_80"));
  struct C { const char* name; DType in; int64_t batch, M, N, K; bool f32; std::string schedule, want; };
  for (const C& c : {C{"f16", dtypes::float16, 1, 64, 128, 64, true, "", "tc_tile(32,32,16,16,16)"},
                     C{"bf16", dtypes::bfloat16, 1, 128, 64, 64, true, "tc_tile(64,64,32,32,32)", ""},
                     C{"f16 out", dtypes::float16, 1, 64, 64, 32, false, "tc_tile(64,32,16,32,16)", ""},
                     C{"batched", dtypes::float16, 3, 32, 32, 48, true, "", "tc_tile(32,32,16,16,16)"},
                     C{"big warps", dtypes::float16, 1, 128, 128, 64, true, "tc_tile(128,128,32,64,32)", ""}}) {
    SCOPED_TRACE(c.name);
    KernelBuilder k;
    const Scalar in = c.in.scalar, out = c.f32 ? Scalar::Float32 : in;
    std::string applied;
    const UOp* linear = expect_emulator_agrees(
        k, half_matmul(k, c.in, c.batch, c.M, c.N, c.K, c.f32), cuda,
        {{out, c.batch * c.M * c.N}, {in, c.batch * c.M * c.K}, {in, c.batch * c.K * c.N}},
        difftest::add_reduction(out, c.K, 4.0 * c.K), {}, c.schedule, &applied);
    ASSERT_NE(linear, nullptr);
    EXPECT_EQ(applied, c.schedule.empty() ? c.want : c.schedule);
    EXPECT_EQ(count_op(linear, Op::DEFINE_LOCAL), 2) << "A's and B's tiles";
    EXPECT_EQ(void_barriers(linear), 1) << "double-buffered: one barrier per k step";
    EXPECT_GE(count_op(linear, Op::WMMA), 1);
    EXPECT_EQ(specials(linear, "blockIdx.z"), c.batch > 1 ? 1 : 0);
  }
}

// What a schedule may not say on the GPU, each refused naming the step; the text forms
// print back as they were given.
TEST(GpuEmuSchedule, StepsTheKernelOrTheTargetCannotTakeAreRefused) {
  for (const char* text : {"grid(0)", "grid(2,0,1)", "tc(4)", "tile(128,128,8,8,8)", "tc_tile(128,128,32,64,32)", "split(0,64,local);grid(0)",
                           "split(1,256,group_reduce)"}) {
    auto s = parse_loop_schedule(text);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status();
    EXPECT_EQ(s->str(), text);
  }
  for (const char* text : {"grid()", "grid(0,1,2,3)", "tc()", "tc(1,2)", "tile(1,2,3,4)", "tile(01,2,3,4,5)"})
    EXPECT_FALSE(parse_loop_schedule(text).ok()) << text;
  const CudaBackend cuda(target("sm_90")), sm75(target("sm_75"));
  struct Bad { const UOp* (*make)(KernelBuilder&); const CudaBackend* backend; const char* schedule; const char* says; };
  auto mm = [](KernelBuilder& k) { return float_matmul(k, {1, 64, 64, 32}); };
  auto half = [](KernelBuilder& k) { return testing::matmul(k, dtypes::float16, 32, 32, 32); };
  auto ax = [](KernelBuilder& k) { return axpy(k, 4096); };
  auto rows = [](KernelBuilder& k) { return testing::row_reduce(k, ReduceOp::Add, 3, 1000); };
  auto dims = [](KernelBuilder& k) { return plus_one(k, {3, 70000}); };
  for (const Bad& b : {Bad{mm, &cuda, "tile(48,32,8,4,4)", "does not divide"},
                       Bad{mm, &cuda, "tile(32,32,8,1,1)", "1024 threads"},
                       Bad{mm, &cuda, "tile(32,32,2,2,2)", "whole loads"},
                       Bad{mm, &cuda, "tile(32,32,8,4,4);grid(0)", "last"},
                       Bad{ax, &cuda, "tile(32,32,8,4,4)", "no float matmul"},
                       Bad{half, &cuda, "tc(3)", "warps"},
                       Bad{half, &sm75, "tc(1)", "sm_75"},
                       Bad{half, &sm75, "tc_tile(32,32,16,16,16)", "sm_75"},
                       Bad{half, &cuda, "tc_tile(32,32,16,8,16)", "whole 16 x 8 mma tiles"},
                       Bad{mm, &cuda, "tc_tile(32,32,16,16,16)", "float16 or both bfloat16"},
                       Bad{mm, &cuda, "tc(1)", "float16"},
                       Bad{ax, &cuda, "thread(0)", "thread pool"},
                       Bad{ax, &cuda, "grid(0);grid(0)", "one grid step"},
                       Bad{ax, &cuda, "split(0,2048,local)", "1024 threads"},
                       Bad{rows, &cuda, "grid(1)", "reduce axis"},
                       Bad{rows, &cuda, "split(0,3,group_reduce)", "an output axis splits into"},
                       Bad{dims, &cuda, "grid(0,1)", "65535"},
                       Bad{dims, &cuda, "grid(1,1)", "named twice"},
                       Bad{rows, &cuda, "split(0,3,upcast);split(1,64,group_reduce)", "not supported"},
                       Bad{rows, &cuda, "split(0,3,upcast);split(1,4,upcast);split(1,64,group_reduce)", "not supported"}}) {
    SCOPED_TRACE(b.schedule);
    KernelBuilder k;
    PipelineOptions opts;
    opts.schedule = b.schedule;
    auto linear = b.backend->lower(k.g, b.make(k), opts, "probe");
    ASSERT_FALSE(linear.ok());
    EXPECT_EQ(linear.status().code(), absl::StatusCode::kInvalidArgument) << linear.status();
    EXPECT_NE(linear.status().message().find(b.says), std::string::npos) << linear.status();
  }
  // The CPU has no GPU steps.
  auto cpu = parse_loop_schedule("grid(0)");
  ASSERT_TRUE(cpu.ok());
  KernelBuilder k;
  auto st = apply_schedule(k.g, axpy(k, 64), *cpu);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("no GPU"), std::string::npos) << st.status();
}

// ---------------------------------------------------------------------------------------
// Seeded bugs in hand-built LINEARs: each fails naming the node (its position in the
// LINEAR and its op) and the threads.

int position(const UOp* linear, const UOp* u) {
  for (size_t i = 0; i < linear->num_src(); ++i)
    if (linear->src(i) == u) return static_cast<int>(i);
  return -1;
}

// The emulator's error for `linear` with one output of `out_size` floats at slot 0.
absl::Status emulate_one(const UOp* linear, int64_t out_size = 64) {
  HostTensor out = HostTensor::zeros(Scalar::Float32, {out_size});
  HostTensor* p[] = {&out};
  return emulate_gpu(linear, p, {}).status();
}

void expect_error(const absl::Status& st, const UOp* linear, const UOp* at, std::string_view rule,
                  std::vector<std::string> also = {}) {
  ASSERT_FALSE(st.ok()) << "no error, expected " << rule;
  std::string msg(st.message());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << msg;
  EXPECT_TRUE(msg.starts_with(cat("node ", position(linear, at), " (", op_name(at->op()), "): "))) << msg;
  EXPECT_NE(msg.find(cat("[", rule, "]")), std::string::npos) << msg;
  for (const std::string& s : also) EXPECT_NE(msg.find(s), std::string::npos) << "no '" << s << "' in " << msg;
}

struct Block {
  LinearBuilder b;
  const UOp* tid = nullptr;
  const UOp* out = nullptr;
  const UOp* smem = nullptr;
  explicit Block(int64_t threads, int64_t out_size = 64, int64_t smem_size = 32) {
    out = b.param(0, dtypes::float32, out_size);
    smem = b.add(b.g.make(Op::DEFINE_LOCAL, dtypes::float32.ptr_to(AddrSpace::Local, smem_size), {}, IntArg{0}));
    tid = special("threadIdx.x", threads);
  }
  const UOp* special(const char* name, int64_t extent) {
    return b.add(b.g.make(Op::SPECIAL, dtypes::index, {b.idx(extent)}, StrArg{name}));
  }
  const UOp* barrier(const UOp* after) { return b.make(Op::BARRIER, dtypes::void_, {after}); }
  // IF (threadIdx.x < n) BARRIER(after) ENDIF: a barrier the other threads skip.
  const UOp* barrier_below(int64_t n, const UOp* after) {
    const UOp* iff = b.make(Op::IF, dtypes::void_, {b.alu(Op::CMPLT, {tid, b.idx(n)})});
    const UOp* bar = barrier(after);
    b.make(Op::ENDIF, dtypes::void_, {iff});
    return bar;
  }
  // smem, ordered after `bar`
  const UOp* shared_after(const UOp* bar) { return b.after(smem, {bar}); }
  const UOp* as_float(const UOp* x) { return b.cast(x, dtypes::float32); }
  // smem[i] (after `dep`, if given), and smem[i] = v (gated, if given).
  const UOp* read_shared(const UOp* i, const UOp* dep = nullptr) {
    const UOp* buf = dep ? shared_after(dep) : smem;
    return b.load(buf, b.index(buf, i));
  }
  const UOp* write_shared(const UOp* i, const UOp* v, const UOp* dep = nullptr, const UOp* gate = nullptr) {
    const UOp* buf = dep ? shared_after(dep) : smem;
    return b.store(b.index(buf, i, gate), v);
  }
  // smem[t] = t, each thread its own element; out[t] = v.
  const UOp* write_own() { return write_shared(tid, as_float(tid)); }
  const UOp* write_out(const UOp* v) { return b.store(b.index(out, tid), v); }
  // The LINEAR made so far fails at `at` with `rule` and each of `also` in its message.
  void expect_fails_at(const UOp* at, std::string_view rule, std::vector<std::string> also) {
    const UOp* linear = b.linear();
    expect_error(emulate_one(linear, out->arg_as<ParamArg>().size), linear, at, rule, std::move(also));
  }
};

TEST(GpuEmuSeeded, ACorrectExchangeThroughSharedMemoryRuns) {
  // smem[t] = t; barrier; out[t] = smem[31 - t]
  Block k(32);
  auto& b = k.b;
  const UOp* bar = k.barrier(k.write_own());
  k.write_out(k.read_shared(b.alu(Op::SUB, {b.idx(31), k.tid}), bar));
  const UOp* linear = b.linear();
  HostTensor out = HostTensor::zeros(Scalar::Float32, {64});
  HostTensor* p[] = {&out};
  auto stats = emulate_gpu(linear, p, {});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->barriers, 1);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out.get(i).as_float(), 31 - i);
}

TEST(GpuEmuSeeded, TwoThreadsWritingOneSharedElementRace) {
  Block k(32);
  auto& b = k.b;
  const UOp* st = k.write_shared(b.idx(0), k.as_float(k.tid));  // every thread, element 0
  k.write_out(k.read_shared(b.idx(0), k.barrier(st)));
  k.expect_fails_at(
      st, "emu.race",
      {"thread (1, 0, 0) of block (0, 0, 0) writes element 0", "thread (0, 0, 0) of block (0, 0, 0) wrote"});
}

TEST(GpuEmuSeeded, AReadBeforeTheBarrierThatPublishesItRaces) {
  Block k(32);
  auto& b = k.b;
  const UOp* st = k.write_own();
  // Thread t reads smem[t - 1] (thread 0: its own): no barrier between.
  const UOp* ld = k.read_shared(b.alu(Op::MAX, {b.alu(Op::SUB, {k.tid, b.idx(1)}), b.idx(0)}), st);
  k.write_out(ld);
  // Thread 0 writes smem[0] and reads it; thread 1 reads smem[0], which thread 0 wrote.
  k.expect_fails_at(
      ld, "emu.race",
      {"thread (1, 0, 0) of block (0, 0, 0) reads element 0", "thread (0, 0, 0) of block (0, 0, 0) wrote"});
}

TEST(GpuEmuSeeded, AWriteOverWhatAnotherThreadReadRaces) {
  Block k(32);
  auto& b = k.b;
  const UOp* bar = k.barrier(k.write_own());
  // Every thread reads smem[0]; then thread 31 writes it, with no barrier between.
  const UOp* ld = k.read_shared(b.idx(0), bar);
  const UOp* st2 = k.write_shared(b.idx(0), b.alu(Op::ADD, {ld, b.f32(1)}), bar, b.alu(Op::CMPEQ, {k.tid, b.idx(31)}));
  k.expect_fails_at(
      st2, "emu.race",
      {"thread (31, 0, 0) of block (0, 0, 0) writes element 0", "thread (0, 0, 0) of block (0, 0, 0) read"});
}

TEST(GpuEmuSeeded, ABarrierSomeThreadsSkipIsAnError) {
  Block k(32);
  const UOp* bar = k.barrier_below(16, k.write_own());
  k.write_out(k.as_float(k.tid));
  k.expect_fails_at(bar, "emu.barrier",
                    {"thread (0, 0, 0) of block (0, 0, 0) waits here", "thread (16, 0, 0) of block (0, 0, 0) ended"});
}

TEST(GpuEmuSeeded, ThreadsWaitingAtDifferentBarriersIsAnError) {
  Block k(32);
  auto& b = k.b;
  const UOp* first = k.barrier_below(8, k.write_own());
  const UOp* second = k.barrier(k.write_out(k.as_float(k.tid)));
  k.expect_fails_at(
      first, "emu.barrier",
      {"thread (8, 0, 0) of block (0, 0, 0) waits at " + cat("node ", position(b.linear(), second), " (BARRIER)")});
}

TEST(GpuEmuSeeded, OutOfBoundsSharedAndGlobalIndices) {
  {
    Block k(32);  // smem of 32; thread 31 writes element 32
    auto& b = k.b;
    const UOp* st = k.write_shared(b.alu(Op::ADD, {k.tid, b.idx(1)}), k.as_float(k.tid));
    k.barrier(st);
    k.expect_fails_at(st, "emu.bounds",
                      {"thread (31, 0, 0) of block (0, 0, 0) writes element 32",
                       cat("shared memory node ", position(b.linear(), k.smem), " (DEFINE_LOCAL)"), "which holds 32"});
  }
  {
    Block k(64, /*out_size=*/48);  // out of 48; thread 48 writes past it
    const UOp* st = k.write_out(k.as_float(k.tid));
    k.expect_fails_at(st, "emu.bounds",
                      {"thread (48, 0, 0) of block (0, 0, 0) writes element 48", "the buffer at slot 0"});
  }
  {
    Block k(32);  // a gated read past the end is no access
    auto& b = k.b;
    const UOp* past = b.alu(Op::ADD, {k.tid, b.idx(1000)});
    const UOp* gate = b.alu(Op::CMPLT, {k.tid, b.idx(0)});
    const UOp* v = b.load(k.out, b.index(k.out, past, gate), dtypes::float32, b.f32(5));
    k.write_out(v);
    HostTensor out = HostTensor::zeros(Scalar::Float32, {64});
    HostTensor* p[] = {&out};
    auto st = emulate_gpu(b.linear(), p, {});
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(out.get(31).as_float(), 5.0);
  }
}

TEST(GpuEmuSeeded, AReadOfSharedMemoryNoThreadWroteIsAnError) {
  Block k(32);
  const UOp* ld = k.read_shared(k.tid);
  k.write_out(ld);
  k.expect_fails_at(ld, "emu.uninit", {"thread (0, 0, 0) of block (0, 0, 0) reads element 0"});
}

TEST(GpuEmuSeeded, BlocksWritingOneGlobalElementRace) {
  Block k(32);
  const UOp* block = k.special("blockIdx.x", 2);  // both blocks write out[t]
  const UOp* st = k.write_out(k.as_float(block));
  k.expect_fails_at(
      st, "emu.race",
      {"thread (0, 0, 0) of block (1, 0, 0) writes element 0", "thread (0, 0, 0) of block (0, 0, 0) wrote"});
}

TEST(GpuEmuSeeded, AWmmaNeedsAWholeWarp) {
  Block k(16);  // a block of 16 threads: half a warp
  auto& b = k.b;
  auto splat = [&](DType d, double v) {
    return b.add(b.g.make(Op::VCONST, d, {}, VConstArg{std::vector<ConstValue>(d.count, ConstValue::Float(v))}));
  };
  const UOp* a = splat(dtypes::float16.vec(8), 1.0);
  const UOp* bb = splat(dtypes::float16.vec(4), 1.0);
  const UOp* c = splat(dtypes::float32.vec(4), 0.0);
  WmmaArg w;
  w.name = "probe";
  w.n = 8, w.m = 16, w.k = 16, w.dtype_in = Scalar::Float16, w.dtype_out = Scalar::Float32, w.device = "CUDA",
  w.threads = 32;
  const UOp* mma = b.make(Op::WMMA, dtypes::float32.vec(4), std::vector<const UOp*>{a, bb, c}, w);
  k.write_out(b.make(Op::GEP, dtypes::float32, std::vector<const UOp*>{mma}, IntsArg{{0}}));
  k.expect_fails_at(mma, "emu.wmma", {"a warp of 16 threads"});
}

// `linear` with its k-th BARRIER left out: what waited for it waits for the barrier's own
// source instead (a lowering that forgot one barrier).
const UOp* without_barrier(Graph& g, const UOp* linear, int k) {
  absl::flat_hash_map<const UOp*, const UOp*> as;
  std::vector<const UOp*> ops;
  absl::flat_hash_set<const UOp*> listed;
  int seen = 0;
  for (const UOp* u : linear->src()) {
    std::vector<const UOp*> src;
    for (const UOp* s : u->src()) src.push_back(as.at(s));
    if (u->is(Op::BARRIER) && u->dtype().is_void() && seen++ == k) {
      as[u] = src[0];
      continue;
    }
    const UOp* v = g.replace_src(u, src);
    as[u] = v;
    if (listed.insert(v).second) ops.push_back(v);
  }
  return g.make(Op::LINEAR, dtypes::void_, ops);
}

// The group reduction as the CUDA backend lowers it (256 threads a row), then with each of
// its barriers left out in turn: every one of them is needed, and the emulator says where
// the race is.
TEST(GpuEmuSeeded, AGroupReductionWithABarrierLeftOutRaces) {
  KernelBuilder k;
  const UOp* kernel = testing::row_reduce(k, ReduceOp::Add, 2, 256);
  PipelineOptions opts;
  opts.schedule = "split(1,256,group_reduce);grid(0)";
  auto linear = CudaBackend(target("sm_90")).lower(k.g, kernel, opts, "probe");
  ASSERT_TRUE(linear.ok()) << linear.status();
  const int barriers = count_ops(*linear, [](const UOp* u) { return u->is(Op::BARRIER) && u->dtype().is_void(); });
  ASSERT_GE(barriers, 8) << "the first store and one per step of the tree";
  std::vector<HostTensor> params = testing::params_for({{Scalar::Float32, 2}, {Scalar::Float32, 512}});
  ASSERT_TRUE(emulate_gpu(*linear, testing::pointers(params), {}).ok());
  for (int b = 0; b < barriers; ++b) {
    SCOPED_TRACE(b);
    const UOp* bad = without_barrier(k.g, *linear, b);
    ASSERT_TRUE(verify_linear(bad).ok()) << verify_linear(bad);
    auto st = emulate_gpu(bad, testing::pointers(params), {});
    ASSERT_FALSE(st.ok()) << "no race without barrier " << b;
    const std::string msg(st.status().message());
    // A read the barrier would have ordered after another thread's write: the write
    // happened unpublished (a race), or, the threads running in order, not yet.
    EXPECT_TRUE(msg.find("[emu.race]") != std::string::npos || msg.find("[emu.uninit]") != std::string::npos) << msg;
    EXPECT_TRUE(msg.find("(LOAD): thread") != std::string::npos || msg.find("(STORE): thread") != std::string::npos)
        << msg;
    EXPECT_NE(msg.find("of shared memory node"), std::string::npos) << msg;
  }
}

// The tiled GEMM with its one barrier left out: a thread reads a tile element another
// thread has not yet stored (or stored unpublished).
TEST(GpuEmuSeeded, ATiledMatmulWithoutItsBarrierRaces) {
  KernelBuilder k;
  const Mm mm{1, 32, 32, 16};
  PipelineOptions opts;
  opts.schedule = "tile(32,32,8,4,4)";
  auto linear = CudaBackend(target("sm_90")).lower(k.g, float_matmul(k, mm), opts, "probe");
  ASSERT_TRUE(linear.ok()) << linear.status();
  ASSERT_EQ(void_barriers(*linear), 1);
  std::vector<HostTensor> params = testing::params_for(mm_slots(mm));
  ASSERT_TRUE(emulate_gpu(*linear, testing::pointers(params), {}).ok());
  const UOp* bad = without_barrier(k.g, *linear, 0);
  ASSERT_TRUE(verify_linear(bad).ok()) << verify_linear(bad);
  auto st = emulate_gpu(bad, testing::pointers(params), {});
  ASSERT_FALSE(st.ok()) << "no race without the barrier";
  const std::string msg(st.status().message());
  EXPECT_TRUE(msg.find("[emu.race]") != std::string::npos || msg.find("[emu.uninit]") != std::string::npos) << msg;
  EXPECT_NE(msg.find("of shared memory node"), std::string::npos) << msg;
}

TEST(GpuEmuSeeded, TheLaunchIsCheckedAsTheWorkerChecksIt) {
  LinearBuilder b;
  const UOp* out = b.param(0, dtypes::float32, 8);
  const UOp* n = b.var("n", 1, 8);
  const UOp* t = b.add(b.g.make(Op::SPECIAL, dtypes::index, {n}, StrArg{"blockIdx.x"}));
  b.store(b.index(out, t), b.f32(1));
  const UOp* linear = b.linear();
  HostTensor buf = HostTensor::zeros(Scalar::Float32, {8});
  HostTensor* p[] = {&buf};
  auto missing = emulate_gpu(linear, p, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("no value is given for the variable 'n'"), std::string::npos);
  auto outside = emulate_gpu(linear, p, {{"n", 9}});
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(std::string(outside.status().message()).find("outside [1, 8]"), std::string::npos) << outside.status();
  auto ran = emulate_gpu(linear, p, {{"n", 3}});
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->blocks, 3);
  EXPECT_EQ(buf.get(2).as_float(), 1.0);
  EXPECT_EQ(buf.get(3).as_float(), 0.0);
  HostTensor small = HostTensor::zeros(Scalar::Float32, {4});
  HostTensor* q[] = {&small};
  auto too_small = emulate_gpu(linear, q, {{"n", 3}});
  ASSERT_FALSE(too_small.ok());
  EXPECT_NE(std::string(too_small.status().message()).find("[emu.launch]"), std::string::npos) << too_small.status();
  // A step budget ends a launch that runs too long; CUDA's grid limits hold.
  GpuEmuOptions few;
  few.max_steps = 2;
  auto long_run = emulate_gpu(linear, p, {{"n", 8}}, few);
  ASSERT_FALSE(long_run.ok());
  EXPECT_EQ(long_run.status().code(), absl::StatusCode::kResourceExhausted) << long_run.status();
  {
    LinearBuilder w;
    const UOp* o = w.param(0, dtypes::float32, 1);
    w.add(w.g.make(Op::SPECIAL, dtypes::index, {w.idx(70000)}, StrArg{"blockIdx.y"}));
    w.store(w.index(o, w.idx(0)), w.f32(1));
    HostTensor one = HostTensor::zeros(Scalar::Float32, {1});
    HostTensor* r[] = {&one};
    auto wide = emulate_gpu(w.linear(), r, {});
    ASSERT_FALSE(wide.ok());
    EXPECT_NE(std::string(wide.status().message()).find("grid dim y of 70000, over CUDA's 65535 [emu.launch]"),
              std::string::npos)
        << wide.status();
  }
  {  // a block's values over the budget are refused, not allocated
    Block k(32);
    k.b.store(k.b.index(k.out, k.tid), k.as_float(k.tid));
    GpuEmuOptions tight;
    tight.max_values = 64;
    HostTensor o = HostTensor::zeros(Scalar::Float32, {64});
    HostTensor* r[] = {&o};
    auto big = emulate_gpu(k.b.linear(), r, {}, tight);
    ASSERT_FALSE(big.ok());
    EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  }
  // Bad LINEAR gets the verifier's status, as the renderers give it.
  auto not_linear = emulate_gpu(out, p, {});
  ASSERT_FALSE(not_linear.ok());
  EXPECT_NE(std::string(not_linear.status().message()).find("needs a LINEAR"), std::string::npos);
}

}  // namespace
}  // namespace uop
