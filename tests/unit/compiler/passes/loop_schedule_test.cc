// Loop schedules (compiler/passes/loop_schedule.h) and the CPU heuristic that chooses them
// (optimize.h): the text parses strictly and prints back what it read; every step alone
// and in combination, on kernels built by hand with odd, dividing, size-1 and size-0
// trip counts, computes what the interpreter computes on the kernel before, both as the
// scheduled kernel (which the interpreter runs) and through the CPU backend's whole
// lowering (expand, lower_reduce, the bounds proof, LLVM); steps that do not fit are
// refused naming the step; the heuristic's schedules on dividing sizes are what optimize
// always chose, and odd sizes now vectorize; the schedule is part of the cache key and
// of the ABI, not of the kernel's digest.
#include "compiler/passes/loop_schedule.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/backends/cpu/cpu_backend.h"
#include "compiler/passes/optimize.h"
#include "compiler/pipeline.h"
#include "compiler/support/strings.h"
#include "tests/unit/compiler/passes/interp_check.h"
#include "tests/unit/compiler/passes/kernel_builder.h"
#include "tests/unit/compiler/passes/run_on_cpu.h"

namespace uop {
namespace {

using testing::KernelBuilder;
using testing::Slots;

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
bool contains(absl::string_view s, std::string_view part) { return contains(std::string_view(s.data(), s.size()), part); }
bool contains(const std::string& s, std::string_view part) { return contains(std::string_view(s), part); }

// out[cols i + j] = in[cols i + j] * 3 + 1 over rows x cols (axes 0, 1).
const UOp* elementwise(KernelBuilder& k, DType dt, int64_t rows, int64_t cols) {
  const UOp* out = k.param(0, dt, rows * cols);
  const UOp* in = k.param(1, dt, rows * cols);
  const UOp* i = k.range(rows);
  const UOp* j = k.range(cols);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(cols)), j);
  auto c = [&](int64_t x) { return dt.is_float() ? k.g.cnst(dt, static_cast<double>(x)) : k.g.cnst_int(dt, x); };
  const UOp* v = k.alu(Op::ADD, k.alu(Op::MUL, k.load(in, at), c(3)), c(1));
  return k.sink({k.store(out, at, v, {i, j})});
}
Slots elementwise_slots(Scalar s, int64_t rows, int64_t cols) { return {{s, rows * cols}, {s, rows * cols}}; }

// C[n i + j] = sum_r A[k i + r] * B[n r + j], int32 (exact in any order): axes i 0, j 1, r 2.
const UOp* matmul(KernelBuilder& k, int64_t m, int64_t n, int64_t kk) {
  const UOp* c = k.param(0, dtypes::int32, m * n);
  const UOp* a = k.param(1, dtypes::int32, m * kk);
  const UOp* b = k.param(2, dtypes::int32, kk * n);
  const UOp* i = k.range(m);
  const UOp* j = k.range(n);
  const UOp* r = k.range(kk, AxisType::Reduce);
  const UOp* prod = k.alu(Op::MUL, k.load(a, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(kk)), r)),
                          k.load(b, k.alu(Op::ADD, k.alu(Op::MUL, r, k.ix(n)), j)));
  return k.sink({k.store(c, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(n)), j), k.reduce(ReduceOp::Add, prod, {r}), {i, j})});
}
Slots matmul_slots(int64_t m, int64_t n, int64_t kk) {
  return {{Scalar::Int32, m * n}, {Scalar::Int32, m * kk}, {Scalar::Int32, kk * n}};
}

// out[0] = op over in[0 .. n-1] (axis 0, a reduce axis).
const UOp* full_reduction(KernelBuilder& k, DType dt, ReduceOp op, int64_t n) {
  const UOp* out = k.param(0, dt, 1);
  const UOp* in = k.param(1, dt, n);
  const UOp* r = k.range(n, AxisType::Reduce);
  return k.sink({k.store(out, k.ix(0), k.reduce(op, k.load(in, r), {r}), {})});
}

LoopSchedule parsed(std::string_view text) {
  auto s = parse_loop_schedule(text);
  EXPECT_TRUE(s.ok()) << text << ": " << s.status();
  return s.ok() ? *s : LoopSchedule{};
}

// The CPU backend's whole lowering of `kernel` with `schedule` (bounds proof included),
// and what the schedule applied.
absl::StatusOr<const UOp*> lower(Graph& g, const UOp* kernel, std::string_view schedule, std::string* applied = nullptr,
                                 PipelineLimits limits = {}) {
  PipelineOptions po;
  po.schedule = std::string(schedule);
  po.applied_schedule = applied;
  po.limits = limits;
  return host_cpu_backend()->lower(g, kernel, po, "probe");
}

bool has_vector_alu(const UOp* linear) {
  for (const UOp* u : linear->src())
    if (is_alu(u->op()) && u->dtype().count > 1) return true;
  return false;
}

// `kernel` scheduled agrees with the interpreter on the kernel before it: the scheduled
// kernel interpreted, and the CPU backend's lowering with the schedule compiled and run.
void expect_schedule_agrees(KernelBuilder& k, const UOp* kernel, std::string_view text, const Slots& slots) {
  SCOPED_TRACE(cat("schedule \"", text, "\""));
  auto after = apply_schedule(k.g, kernel, parsed(text), cpu_schedule_limits());
  ASSERT_TRUE(after.ok()) << after.status();
  testing::expect_interpreter_agrees(kernel, *after, slots);
  std::string applied;
  auto linear = lower(k.g, kernel, text, &applied);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(applied, text);
  testing::expect_cpu_matches_interpreter(kernel, *linear, slots);
}

// --- text ------------------------------------------------------------------------------

TEST(LoopScheduleText, ParsesAndPrintsBackExactly) {
  for (std::string_view text : {"", "split(0,4,upcast)", "thread(3)", "reorder(0)", "reorder(2,0,1)",
                                "split(0,4,upcast);split(1,8,upcast);reorder(1,0,2);thread(0)",
                                "split(1,3,loop);split(2,7,reduce);split(0,2147483648,group_reduce)",
                                "split(10,2,global);split(0,2,local);split(1,2,unroll);split(2,2,warp);split(3,2,thread)"}) {
    auto s = parse_loop_schedule(text);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status();
    EXPECT_EQ(s->str(), text);
    auto again = parse_loop_schedule(s->str());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *s);
  }
  LoopSchedule s = parsed("split(0,4,upcast);reorder(1,0,2);thread(0)");
  ASSERT_EQ(s.steps.size(), 3u);
  EXPECT_EQ(s.steps[0].kind, LoopStep::Kind::Split);
  EXPECT_EQ(s.steps[0].axis, 0);
  EXPECT_EQ(s.steps[0].factor, 4);
  EXPECT_EQ(s.steps[0].type, AxisType::Upcast);
  EXPECT_EQ(s.steps[1].order, (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(s.steps[2].kind, LoopStep::Kind::Thread);
}

// Anything but the canonical text is refused, naming the step and what is wrong.
TEST(LoopScheduleText, AnythingElseIsRefusedNamingTheStep) {
  struct Case {
    std::string text;
    std::string says;
  };
  std::vector<Case> cases = {
      {"split(0,4)", "step 0 \"split(0,4)\": split takes 3 arguments"},
      {"split(0,4,upcast);", "step 1 is empty"},
      {";split(0,4,upcast)", "step 0 is empty"},
      {"split(0, 4,upcast)", "factor \" 4\" is not a decimal number"},
      {"split(0,04,upcast)", "factor \"04\""},
      {"split(0,-4,upcast)", "factor \"-4\""},
      {"split(0,2147483649,upcast)", "factor \"2147483649\""},
      {"split(0,99999999999999999999,upcast)", "factor"},
      {"split(x,4,upcast)", "axis \"x\""},
      {"split(0,4,vector)", "type \"vector\" is not one of loop, global"},
      {"split(0,4,Upcast)", "type \"Upcast\""},
      {"Split(0,4,upcast)", "unknown step \"Split\""},
      {"thread(0);unroll(0,4)", "step 1 \"unroll(0,4)\": unknown step"},
      {"thread(0)x", "a step is NAME(ARGS)"},
      {"thread 0", "a step is NAME(ARGS)"},
      {"thread()", "axis \"\""},
      {"thread(0,1)", "thread takes 1 argument"},
      {"reorder()", "axis \"\""},
      {"reorder(0,,1)", "axis \"\""},
      {"split(0,4,upcast) ", "step 0"},
  };
  std::string many;
  for (int i = 0; i < 65; ++i) many += i ? ";thread(0)" : "thread(0)";
  cases.push_back({many, "65 steps, at most 64"});
  cases.push_back({std::string(5000, 'x'), "5000 characters, at most 4096"});
  for (const Case& c : cases) {
    auto s = parse_loop_schedule(c.text);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(contains(s.status().message(), c.says)) << c.text << ": " << s.status();
  }
}

// --- axes --------------------------------------------------------------------------------

// The STORE's ranges in the order it closes them, then the REDUCE's: whatever ids the
// ranges carry. A kernel of two STOREs has none.
TEST(ScheduleAxes, StoreRangesThenReduceRangesWhateverTheirIds) {
  KernelBuilder k;
  const UOp* c = k.param(0, dtypes::int32, 12);
  const UOp* a = k.param(1, dtypes::int32, 60);
  const UOp* r = k.range(5, AxisType::Reduce);  // id 0
  const UOp* j = k.range(4);                    // id 1
  const UOp* i = k.range(3);                    // id 2
  const UOp* v = k.reduce(ReduceOp::Add, k.load(a, k.alu(Op::ADD, k.alu(Op::MUL, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(4)), j), k.ix(5)), r)), {r});
  const UOp* kernel = k.sink({k.store(c, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(4)), j), v, {i, j})});
  EXPECT_EQ(schedule_axes(kernel), (std::vector<const UOp*>{i, j, r}));

  const UOp* out = k.param(0, dtypes::int32, 8);
  const UOp* s = k.range(4);
  const UOp* t = k.range(4);
  EXPECT_TRUE(schedule_axes(k.sink({k.store(out, s, k.i32(1), {s}), k.store(out, k.alu(Op::ADD, t, k.ix(4)), k.i32(2), {t})})).empty());
}

// --- steps, alone and together -----------------------------------------------------------

// Elementwise kernels of odd, dividing and degenerate sizes: each step alone, and
// together, gated tails included (a factor that does not divide).
TEST(ApplySchedule, EveryStepOnElementwiseKernelsMatchesTheInterpreter) {
  for (int64_t cols : {7, 49, 112, 1000}) {
    for (Scalar s : {Scalar::Float32, Scalar::Int16}) {
      SCOPED_TRACE(cat(scalar_name(s), " 3 x ", cols));
      KernelBuilder k;
      const UOp* kernel = elementwise(k, DType(s), 3, cols);
      const Slots slots = elementwise_slots(s, 3, cols);
      for (std::string_view text : {"split(1,8,upcast)", "split(1,7,upcast)", "split(1,4,loop)", "split(0,2,upcast)",
                                    "split(0,3,loop)", "reorder(1,0)", "thread(0)",
                                    "split(1,3,upcast);split(0,2,loop);reorder(1,0,2,3)",
                                    "split(1,6,upcast);split(2,2,upcast);thread(0)",
                                    "split(1,5,loop);split(1,2,upcast);reorder(1,0,3,2);thread(1)",
                                    "reorder(1,0);thread(1);split(1,2,loop)"}) {
        if (cols < 8 && (contains(text, "split(1,8") || contains(text, "split(1,5"))) continue;
        expect_schedule_agrees(k, kernel, text, slots);
      }
    }
  }
}

// A size-1 output loop cannot be split (no factor in [2, 1]), the other one can; a
// size-0 loop makes a kernel that stores nothing, scheduled or not.
TEST(ApplySchedule, SizeOneAndSizeZeroLoops) {
  KernelBuilder k;
  const UOp* one = elementwise(k, dtypes::float32, 1, 9);
  expect_schedule_agrees(k, one, "split(1,4,upcast);reorder(1,0,2);thread(1)", elementwise_slots(Scalar::Float32, 1, 9));
  auto alone = apply_schedule(k.g, one, parsed("thread(0)"), cpu_schedule_limits());
  EXPECT_TRUE(contains(alone.status().message(), "axis 0 has 1 iteration: nothing to share among threads")) << alone.status();
  auto refused = apply_schedule(k.g, one, parsed("split(0,2,upcast)"), cpu_schedule_limits());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(refused.status().message(), "the factor must be in [2, 1]")) << refused.status();
  // Interpreted only: a hand-built kernel over buffers of 0 elements is refused by the
  // bounds proof whatever its schedule (symbolic folds its empty loop away and leaves the
  // index); graphs with empty tensors never plan such a kernel (the random graphs'
  // zero dims in RandomSchedules go through the whole pipeline).
  const UOp* none = elementwise(k, dtypes::float32, 0, 9);
  for (std::string_view text : {"reorder(1,0)", "split(1,4,upcast)", "split(1,3,upcast);reorder(1,0,2)"}) {
    auto after = apply_schedule(k.g, none, parsed(text), cpu_schedule_limits());
    ASSERT_TRUE(after.ok()) << text << ": " << after.status();
    testing::expect_interpreter_agrees(none, *after, elementwise_slots(Scalar::Float32, 0, 9));
  }
}

// A matmul of odd sizes: output tiles, a split reduce loop (upcast: vector accumulators,
// masked to 0 past the end), the lane loop outermost, threads.
TEST(ApplySchedule, EveryStepOnAnOddMatmulMatchesTheInterpreter) {
  for (auto [m, n, kk] : std::vector<std::array<int64_t, 3>>{{7, 13, 5}, {8, 16, 8}, {1, 9, 11}}) {
    SCOPED_TRACE(cat(m, " x ", n, " x ", kk));
    KernelBuilder k;
    const UOp* kernel = matmul(k, m, n, kk);
    const Slots slots = matmul_slots(m, n, kk);
    for (std::string_view text : {"split(1,8,upcast)", "split(2,4,upcast)", "split(2,2,reduce)", "reorder(1,0)",
                                  "split(1,4,loop);split(2,3,upcast)"}) {
      if (contains(text, "split(1,8") && n < 8) continue;
      expect_schedule_agrees(k, kernel, text, slots);
    }
    if (m >= 4 && n >= 8) {
      expect_schedule_agrees(k, kernel, "split(0,4,upcast);split(1,8,upcast);reorder(1,0,3,4)", slots);
      expect_schedule_agrees(k, kernel, "split(0,4,upcast);split(1,8,upcast);reorder(1,0,3,4);thread(1);split(2,3,upcast)",
                             slots);
      expect_schedule_agrees(k, kernel, "split(0,2,loop);thread(0);split(1,4,upcast);split(2,2,upcast)", slots);
    }
  }
}

// One change away: each split's factor halved and doubled, the last step dropped, in that
// order; nothing else moves.
TEST(ScheduleNeighbours, EachSplitHalvedAndDoubledAndTheLastStepDropped) {
  std::vector<std::string> got;
  for (const LoopSchedule& s : schedule_neighbours(parsed("split(0,32,upcast);split(1,2,upcast);reorder(1,0,2,3,4);thread(1)")))
    got.push_back(s.str());
  EXPECT_EQ(got, (std::vector<std::string>{
                     "split(0,16,upcast);split(1,2,upcast);reorder(1,0,2,3,4);thread(1)",
                     "split(0,64,upcast);split(1,2,upcast);reorder(1,0,2,3,4);thread(1)",
                     "split(0,32,upcast);split(1,4,upcast);reorder(1,0,2,3,4);thread(1)",
                     "split(0,32,upcast);split(1,2,upcast);reorder(1,0,2,3,4)",
                 }));
  EXPECT_TRUE(schedule_neighbours(LoopSchedule{}).empty());
}

// The heuristic's tile of a 3x3 convolution on a 7 x 7 map (AVX-512) takes every lane a
// schedule may have: no split candidate_steps lists can be added to it, so a search that
// only extends could never change the tile. Its neighbours can: some that change a
// split's factor apply, and each neighbour that applies computes what the interpreter
// computes.
TEST(ScheduleNeighbours, TradeLanesWhereNoStepCanBeAdded) {
  KernelBuilder k;
  const UOp* kernel = testing::conv3x3(k, 64, 4, 7);
  OptimizeOptions o;
  o.vector_bits = 512;
  const ScheduleLimits limits = cpu_schedule_limits(o);
  const LoopSchedule h = heuristic_schedule(kernel, o);
  ASSERT_FALSE(h.empty());
  for (const LoopStep& st : candidate_steps(kernel, h, limits)) {
    if (st.kind != LoopStep::Kind::Split) continue;
    LoopSchedule s = h;
    s.steps.push_back(st);
    EXPECT_FALSE(apply_schedule(k.g, kernel, s, limits).ok()) << s.str() << " applies: the test's premise is gone";
  }
  const Slots slots{{Scalar::Int32, 64 * 49}, {Scalar::Int32, 4 * 81}, {Scalar::Int32, 64 * 4 * 9}};
  size_t retiled = 0;
  for (const LoopSchedule& s : schedule_neighbours(h)) {
    auto after = apply_schedule(k.g, kernel, s, limits);
    if (!after.ok()) continue;
    retiled += s.steps.size() == h.steps.size();
    SCOPED_TRACE(s.str());
    testing::expect_interpreter_agrees(kernel, *after, slots);
  }
  EXPECT_GE(retiled, 2u) << "neighbours of " << h.str() << " with another tile";
}

// What a search may try after the heuristic's schedule (candidate_steps): every step it
// lists either is refused by apply_schedule or, added to the schedule, computes what the
// interpreter computes on the kernel, compiled for the CPU too; splits by each factor,
// reorders and a Thread loop are among them.
TEST(CandidateSteps, EveryListedStepIsRefusedOrMatchesTheInterpreter) {
  for (auto [m, n, kk] : std::vector<std::array<int64_t, 3>>{{7, 13, 5}, {8, 16, 8}}) {
    SCOPED_TRACE(cat(m, " x ", n, " x ", kk));
    KernelBuilder k;
    const UOp* kernel = matmul(k, m, n, kk);
    const Slots slots = matmul_slots(m, n, kk);
    for (const LoopSchedule& start : {LoopSchedule{}, heuristic_schedule(kernel)}) {
      std::vector<LoopStep> steps = candidate_steps(kernel, start, cpu_schedule_limits());
      ASSERT_FALSE(steps.empty());
      size_t applied = 0;
      bool split = false, reorder = false, thread = false;
      for (const LoopStep& st : steps) {
        LoopSchedule s = start;
        s.steps.push_back(st);
        if (!apply_schedule(k.g, kernel, s, cpu_schedule_limits()).ok()) continue;
        ++applied;
        split |= st.kind == LoopStep::Kind::Split;
        reorder |= st.kind == LoopStep::Kind::Reorder;
        thread |= st.kind == LoopStep::Kind::Thread;
        expect_schedule_agrees(k, kernel, s.str(), slots);
      }
      EXPECT_GT(applied, steps.size() / 3) << "most listed steps fit the kernel";
      EXPECT_TRUE(split);
      if (start.empty()) {
        EXPECT_TRUE(reorder && thread);
      }
    }
  }
  KernelBuilder k;
  EXPECT_TRUE(candidate_steps(k.sink({}), {}, cpu_schedule_limits()).empty()) << "not one STORE: nothing to try";
}

// A reduction's masked tail folds in the op's identity: -inf for a float Max, the
// largest value for an int Min, 1 for an int Mul (wrapping, so exact in any order).
TEST(ApplySchedule, AMaskedReductionFoldsInTheIdentity) {
  struct Case {
    DType dt;
    ReduceOp op;
  };
  for (Case c : {Case{dtypes::float32, ReduceOp::Max}, Case{dtypes::int32, ReduceOp::Min}, Case{dtypes::int32, ReduceOp::Mul},
                 Case{dtypes::int32, ReduceOp::Add}}) {
    for (int64_t n : {7, 37, 997}) {
      SCOPED_TRACE(cat(reduce_op_name(c.op), " of ", n));
      KernelBuilder k;
      const UOp* kernel = full_reduction(k, c.dt, c.op, n);
      const Slots slots{{c.dt.scalar, 1}, {c.dt.scalar, n}};
      for (std::string_view text : {"split(0,2,upcast)", "split(0,4,reduce)", "split(0,6,upcast)", "split(0,5,reduce);split(1,4,upcast)"})
        expect_schedule_agrees(k, kernel, text, slots);
    }
  }
}

// A copy upcast along a loop that strides (a scatter: one store per lane) stores one
// element per lane: the stored LOAD is already a vector when its STORE is rewritten.
TEST(ApplySchedule, AStridedCopyStoresOneElementPerLane) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::uint32, 336);
  const UOp* in = k.param(1, dtypes::uint32, 336);
  const UOp* r0 = k.range(16);
  const UOp* r1 = k.range(7);
  const UOp* r2 = k.range(3);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::ADD, r0, k.alu(Op::MUL, r1, k.ix(16))), k.alu(Op::MUL, r2, k.ix(112)));
  const UOp* kernel = k.sink({k.store(out, at, k.load(in, at), {r2, r1, r0})});
  for (std::string_view text : {"split(0,3,upcast)", "split(1,7,upcast)", "split(1,4,upcast);reorder(2,1,3,0)"})
    expect_schedule_agrees(k, kernel, text, {{Scalar::UInt32, 336}, {Scalar::UInt32, 336}});
}

// A loop a load's gate reads (a padded read: 1 <= j < 9) splits only into Upcast lanes by
// divisors of its trip count: the gate is what proves the read in bounds, and it narrows
// j exactly where j is a loop plus a lane's constant, not where it is a sum of two loops
// or clamped. The heuristic picks a divisor.
TEST(ApplySchedule, ALoopAGateReadsSplitsOnlyIntoUpcastLanes) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 3 * 10);
  const UOp* in = k.param(1, dtypes::float32, 3 * 8);
  const UOp* i = k.range(3);
  const UOp* j = k.range(10);
  const UOp* gate = k.between(0, j, 9);
  const UOp* v = k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(8)), k.alu(Op::SUB, j, k.ix(1))), gate);
  const UOp* kernel = k.sink({k.store(out, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(10)), j), v, {i, j})});
  const Slots slots{{Scalar::Float32, 30}, {Scalar::Float32, 24}};
  EXPECT_FALSE(can_mask(kernel, j));
  EXPECT_TRUE(can_mask(kernel, i));
  for (std::string_view text : {"split(1,5,loop)", "split(1,4,loop)", "split(1,2,upcast);split(1,5,loop)"}) {
    auto refused = apply_schedule(k.g, kernel, parsed(text), cpu_schedule_limits());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(contains(refused.status().message(), "an access's gate reads axis 1: it splits only into upcast lanes"))
        << refused.status();
  }
  EXPECT_FALSE(split_range(k.g, kernel, j, 4, AxisType::Loop).ok()) << "split_range gives no loop a gate reads a tail";
  // Lanes that do not divide the loop: a tail gated, not clamped, on the load and the store
  // alike (lanes 10 and 11 of 3 x 4 neither read past the row nor write into the next).
  auto tail = split_range(k.g, kernel, j, 4, AxisType::Upcast);
  ASSERT_TRUE(tail.ok()) << tail.status();
  for (const UOp* u : toposort(*tail))
    EXPECT_NE(u->op(), Op::MIN) << "a gated loop is not clamped";
  expect_schedule_agrees(k, kernel, "split(1,4,upcast)", slots);
  expect_schedule_agrees(k, kernel, "split(1,3,upcast);thread(0)", slots);
  expect_schedule_agrees(k, kernel, "split(1,5,upcast)", slots);
  expect_schedule_agrees(k, kernel, "split(1,2,upcast);split(0,2,loop);thread(0)", slots);
  OptimizeOptions avx2;
  avx2.vector_bits = 256;
  EXPECT_EQ(heuristic_schedule(kernel, avx2).str(), "split(1,5,upcast)");
  avx2.vector_bits = 512;  // 16 lanes: the whole loop of 10
  EXPECT_EQ(heuristic_schedule(kernel, avx2).str(), "split(1,10,upcast)");
}

// --- refusals ----------------------------------------------------------------------------

TEST(ApplySchedule, AStepThatDoesNotFitIsRefusedNamingIt) {
  KernelBuilder k;
  const UOp* mm = matmul(k, 8, 16, 8);
  const UOp* var_rows = [&] {
    const UOp* out = k.param(0, dtypes::float32, 64);
    const UOp* r = k.range(k.var("n", 1, 64));
    return k.sink({k.store(out, r, k.f32(1), {r})});
  }();
  const UOp* out = k.param(0, dtypes::int32, 8);
  const UOp* s = k.range(4);
  const UOp* t = k.range(4);
  const UOp* two_stores = k.sink({k.store(out, s, k.i32(1), {s}), k.store(out, k.alu(Op::ADD, t, k.ix(4)), k.i32(2), {t})});
  struct Case {
    const UOp* kernel;
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {mm, "split(3,2,upcast)", "step 0 \"split(3,2,upcast)\": the kernel has no axis 3 (it has 3)"},
      {mm, "split(0,1,upcast)", "the factor must be in [2, 8]"},
      {mm, "split(0,0,upcast)", "the factor must be in [2, 8]"},
      {mm, "split(1,17,upcast)", "the factor must be in [2, 16]"},
      {mm, "split(0,2,reduce)", "an output axis splits into loop, upcast on this target, not reduce"},
      {mm, "split(2,2,loop)", "a reduce axis splits into reduce, upcast on this target, not loop"},
      {mm, "split(0,2,group_reduce)", "not group_reduce"},
      {mm, "split(0,2,thread)", "not thread"},
      {mm, "thread(2)", "axis 2 is a reduce axis"},
      {mm, "split(1,16,upcast);split(0,8,upcast);split(2,4,upcast)",
       "step 2 \"split(2,4,upcast)\": the Upcast ranges would make 512 lanes, at most 256"},
      {mm, "split(1,16,upcast);split(2,8,upcast);split(0,4,upcast)", "would make 512 lanes, at most 256"},
      {mm, "reorder(0)", "the STORE closes axes (0,1): a reorder lists each of them once"},
      {mm, "reorder(0,0)", "the STORE closes axes (0,1)"},
      {mm, "reorder(0,2)", "the STORE closes axes (0,1)"},
      {mm, "split(0,2,loop);reorder(0,1)", "step 1 \"reorder(0,1)\": the STORE closes axes (0,3,1)"},
      {mm, "thread(1)", "axis 1 is not the STORE's outermost loop"},
      {mm, "split(0,2,upcast);reorder(3,0,1);thread(3)", "axis 3 is Upcast"},
      {mm, "thread(0);thread(0)", "step 1 \"thread(0)\": axis 0 runs on threads already"},
      {mm, "thread(0);split(0,8,loop)", "step 1 \"split(0,8,loop)\": axis 0 runs on threads: it would keep one iteration"},
      {mm, "thread(0);reorder(1,0)", "step 1 \"reorder(1,0)\": axis 0 runs on threads: it stays the outermost loop"},
      {mm, "thread(0);split(0,2,loop);reorder(0,1)", "reorder(0,1)\": the STORE closes axes (0,3,1)"},
      {var_rows, "split(0,2,upcast)", "axis 0's trip count is not a constant"},
      {two_stores, "thread(0)", "the kernel is not one STORE"},
  };
  for (const Case& c : cases) {
    auto got = apply_schedule(k.g, c.kernel, parsed(c.text), cpu_schedule_limits());
    ASSERT_FALSE(got.ok()) << c.text;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(contains(got.status().message(), c.says)) << c.text << ": " << got.status();
    // The same through the backend's lowering: the stage says it, nothing crashes.
    auto lowered = lower(k.g, c.kernel, c.text);
    EXPECT_EQ(lowered.status().code(), absl::StatusCode::kInvalidArgument) << c.text << ": " << lowered.status();
  }
  // The empty schedule leaves any kernel as it is, two STOREs too.
  auto same = apply_schedule(k.g, two_stores, {}, cpu_schedule_limits());
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, two_stores);
}

// A schedule within the lane limit whose vectors make a kernel too big for the code
// generator is refused by the pipeline's kernel_ops bound, before LLVM sees it.
TEST(ApplySchedule, ASchedulePastTheKernelOpsLimitIsRefusedBeforeCodegen) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 128 * 128);
  const UOp* in = k.param(1, dtypes::float32, 128 * 128);
  const UOp* i = k.range(128);
  const UOp* j = k.range(128);
  // Read transposed: every lane of a row loads on its own (a gather).
  const UOp* v = k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, j, k.ix(128)), i));
  const UOp* kernel = k.sink({k.store(out, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(128)), j), v, {i, j})});
  PipelineLimits limits;
  limits.kernel_ops = 500;
  auto got = lower(k.g, kernel, "split(0,128,upcast)", nullptr, limits);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
  EXPECT_TRUE(contains(got.status().message(), "kernel_ops")) << got.status();
  EXPECT_TRUE(lower(k.g, kernel, "split(1,8,upcast)", nullptr, limits).ok());
}

// --- the heuristic -------------------------------------------------------------------------

// Sizes the width divides: the schedules optimize always chose.
TEST(HeuristicSchedule, DividingSizesGetTheSchedulesOptimizeAlwaysChose) {
  OptimizeOptions avx2;
  avx2.vector_bits = 256;
  {
    KernelBuilder k;
    EXPECT_EQ(heuristic_schedule(elementwise(k, dtypes::float32, 4, 16), avx2).str(), "split(1,8,upcast)");
  }
  {
    KernelBuilder k;
    EXPECT_EQ(heuristic_schedule(matmul(k, 8, 16, 8), avx2).str(), "split(0,4,upcast);split(1,16,upcast);reorder(1,0,3,4)");
  }
  {
    KernelBuilder k;
    EXPECT_EQ(heuristic_schedule(full_reduction(k, dtypes::float32, ReduceOp::Add, 64), avx2).str(), "split(0,32,upcast)");
  }
  {
    KernelBuilder k;
    OptimizeOptions low = avx2;
    low.min_parallel_work = 64;
    EXPECT_EQ(heuristic_schedule(elementwise(k, dtypes::float32, 16, 64), low).str(), "split(1,8,upcast);thread(0)");
  }
  {
    KernelBuilder k;
    OptimizeOptions off = avx2;
    off.vector_bits = 0;
    EXPECT_EQ(heuristic_schedule(elementwise(k, dtypes::float32, 4, 16), off).str(), "");
  }
}

// A matmul's tile of accumulators is half the register file: 8 AVX2 registers (4 rows x
// 2 vectors of 8), 16 of AVX-512's 32 (8 rows x 2 vectors of 16); the column panel loop
// outermost. The AVX-512 tile, 256 lanes, within the CPU's lane limit, runs as the
// interpreter does.
TEST(HeuristicSchedule, AMatmulTileIsHalfTheRegisterFile) {
  struct Case {
    int bits;
    std::string schedule;
  };
  for (const Case& c : {Case{256, "split(0,4,upcast);split(1,16,upcast);reorder(1,0,3,4)"},
                        Case{512, "split(0,8,upcast);split(1,32,upcast);reorder(1,0,3,4)"}}) {
    SCOPED_TRACE(cat(c.bits, " bits"));
    KernelBuilder k;
    const UOp* kernel = matmul(k, 16, 64, 8);
    EXPECT_EQ(heuristic_schedule(kernel, OptimizeOptions{.vector_bits = c.bits}).str(), c.schedule);
    expect_schedule_agrees(k, kernel, c.schedule, matmul_slots(16, 64, 8));
  }
  // Fewer rows than the tile's: the rows the trip count allows, the rest not taken.
  KernelBuilder k;
  const UOp* kernel = matmul(k, 4, 64, 8);
  EXPECT_EQ(heuristic_schedule(kernel, OptimizeOptions{.vector_bits = 512}).str(),
            "split(0,4,upcast);split(1,32,upcast);reorder(1,0,3,4)");
}

// Trip counts the width does not divide vectorize too: a divisor above half the width
// where there is one (no mask), else the width with a masked tail, or the whole loop
// when it is shorter than a vector; through the CPU backend, with vector ALU ops.
TEST(HeuristicSchedule, OddSizesVectorizeAndStayInBounds) {
  OptimizeOptions avx2;
  avx2.vector_bits = 256;
  struct Case {
    int64_t cols;
    std::string schedule;
  };
  for (const Case& c : {Case{7, "split(1,7,upcast)"}, Case{49, "split(1,7,upcast)"}, Case{112, "split(1,8,upcast)"},
                        Case{1000, "split(1,8,upcast)"}, Case{997, "split(1,8,upcast)"}, Case{12, "split(1,6,upcast)"},
                        Case{3, "split(1,3,upcast)"}}) {
    SCOPED_TRACE(cat("3 x ", c.cols));
    KernelBuilder k;
    const UOp* kernel = elementwise(k, dtypes::float32, 3, c.cols);
    EXPECT_EQ(heuristic_schedule(kernel, avx2).str(), c.schedule);
    // The host's own width may differ: what the backend chooses, run, with vectors.
    std::string applied;
    auto linear = lower(k.g, kernel, "", &applied);
    ASSERT_TRUE(linear.ok()) << linear.status();
    EXPECT_EQ(applied, heuristic_schedule(kernel, OptimizeOptions{.vector_bits = host_cpu_backend()->target().vector_bits()}).str());
    EXPECT_TRUE(has_vector_alu(*linear)) << applied;
    testing::expect_cpu_matches_interpreter(kernel, *linear, elementwise_slots(Scalar::Float32, 3, c.cols));
  }
  for (int64_t n : {1000, 997, 50}) {
    SCOPED_TRACE(cat("sum of ", n));
    KernelBuilder k;
    const UOp* kernel = full_reduction(k, dtypes::int32, ReduceOp::Add, n);
    EXPECT_TRUE(contains(heuristic_schedule(kernel, avx2).str(), "upcast")) << heuristic_schedule(kernel, avx2).str();
    auto linear = lower(k.g, kernel, "");
    ASSERT_TRUE(linear.ok()) << linear.status();
    testing::expect_cpu_matches_interpreter(kernel, *linear, {{Scalar::Int32, 1}, {Scalar::Int32, n}});
  }
}

// The kernel shapes of real models, built as the pipeline gives them to optimize (a
// convolution's padded input realized, so no gate): each gets its tile, asserted as text
// for AVX2 and run through the CPU backend against the interpreter, both with that text
// and with the host's own choice. int32, so that any order of the sums is exact.
struct ShapeCase {
  std::string name;
  std::function<const UOp*(KernelBuilder&)> build;
  Slots slots;
  std::string avx2;  // heuristic_schedule's text at 256 bits
};

using testing::affine;
using testing::conv3x3;

// out[c, y, x] = op over u, v of in[c, y + u, x + v] (times w[c, u, v] for a depthwise
// convolution): every operand reads the channel.
const UOp* window(KernelBuilder& k, int64_t C, int64_t H, int64_t W, bool depthwise) {
  const int64_t PH = H + 2, PW = W + 2;
  const UOp* out = k.param(0, dtypes::int32, C * H * W);
  const UOp* in = k.param(1, dtypes::int32, C * PH * PW);
  const UOp* c = k.range(C);
  const UOp* y = k.range(H);
  const UOp* x = k.range(W);
  const UOp* u = k.range(3, AxisType::Reduce);
  const UOp* v = k.range(3, AxisType::Reduce);
  const UOp* val = k.load(in, affine(k, affine(k, c, PH, k.alu(Op::ADD, y, u)), PW, k.alu(Op::ADD, x, v)));
  if (depthwise) val = k.alu(Op::MUL, val, k.load(k.param(2, dtypes::int32, C * 9), affine(k, affine(k, c, 3, u), 3, v)));
  const UOp* r = k.reduce(depthwise ? ReduceOp::Add : ReduceOp::Max, val, {u, v});
  return k.sink({k.store(out, affine(k, affine(k, c, H, y), W, x), r, {c, y, x})});
}

// out[b, i, j] = sum over d of q[b, i, d] * kk[b, j, d]: attention's scores, the second
// operand transposed.
const UOp* attention_scores(KernelBuilder& k, int64_t B, int64_t T, int64_t D) {
  const UOp* out = k.param(0, dtypes::int32, B * T * T);
  const UOp* q = k.param(1, dtypes::int32, B * T * D);
  const UOp* kk = k.param(2, dtypes::int32, B * T * D);
  const UOp* b = k.range(B);
  const UOp* i = k.range(T);
  const UOp* j = k.range(T);
  const UOp* d = k.range(D, AxisType::Reduce);
  const UOp* prod = k.alu(Op::MUL, k.load(q, affine(k, affine(k, b, T, i), D, d)), k.load(kk, affine(k, affine(k, b, T, j), D, d)));
  return k.sink({k.store(out, affine(k, affine(k, b, T, i), T, j), k.reduce(ReduceOp::Add, prod, {d}), {b, i, j})});
}

// out[j] = sum over i of x[i, j]: a reduction over axis 0.
const UOp* column_sum(KernelBuilder& k, int64_t I, int64_t J) {
  const UOp* out = k.param(0, dtypes::int32, J);
  const UOp* x = k.param(1, dtypes::int32, I * J);
  const UOp* j = k.range(J);
  const UOp* i = k.range(I, AxisType::Reduce);
  return k.sink({k.store(out, j, k.reduce(ReduceOp::Add, k.load(x, affine(k, i, J, j)), {i}), {j})});
}

TEST(HeuristicSchedule, KernelShapesOfRealModelsGetTheirTiles) {
  OptimizeOptions avx2;
  avx2.vector_bits = 256;
  auto i32 = [](int64_t n) { return std::pair<Scalar, int64_t>{Scalar::Int32, n}; };
  const std::vector<ShapeCase> cases = {
      // Output channels x (rows x columns of the 14-wide map): the width gives 4 lanes (a
      // masked tail), the height fills the vector, one channel's pixels to a vector, the
      // channels take the rest of the 64-lane tile (half of AVX2's registers); the map's
      // rows (7 blocks) outermost.
      {"conv 3x3", [](KernelBuilder& k) { return conv3x3(k, 32, 4, 14); }, {i32(32 * 196), i32(4 * 256), i32(32 * 4 * 9)},
       "split(0,8,upcast);split(1,2,upcast);split(2,4,upcast);reorder(1,0,6,7,2,8)"},
      // A 56-wide map: 8 lanes of the width, 8 channels, the rows outermost.
      {"conv 3x3 wide", [](KernelBuilder& k) { return conv3x3(k, 16, 2, 56); }, {i32(16 * 56 * 56), i32(2 * 58 * 58), i32(16 * 2 * 9)},
       "split(0,8,upcast);split(2,8,upcast);reorder(1,0,6,2,7)"},
      // The same read through gated loads, or clamped ones: a 256-lane tile, all 16
      // channels.
      {"conv 3x3 gated", [](KernelBuilder& k) { return conv3x3(k, 16, 2, 56, dtypes::int32, testing::ConvRead::Gated); }, {i32(16 * 56 * 56), i32(2 * 56 * 56), i32(16 * 2 * 9)},
       "split(0,16,upcast);split(2,8,upcast);reorder(1,0,6,2,7)"},
      {"conv 3x3 clamped", [](KernelBuilder& k) { return conv3x3(k, 16, 2, 56, dtypes::int32, testing::ConvRead::Clamped); }, {i32(16 * 56 * 56), i32(2 * 56 * 56), i32(16 * 2 * 9)},
       "split(0,16,upcast);split(2,8,upcast);reorder(1,0,6,2,7)"},
      // Two vectors of the width, 4 independent rows of the height.
      {"depthwise 3x3", [](KernelBuilder& k) { return window(k, 8, 16, 16, true); }, {i32(8 * 256), i32(8 * 18 * 18), i32(8 * 9)},
       "split(1,4,upcast);split(2,16,upcast)"},
      // 4 lanes of the 12-wide map filled with 2 rows, 4 channels in flight.
      {"max pool 3x3", [](KernelBuilder& k) { return window(k, 4, 8, 12, false); }, {i32(4 * 96), i32(4 * 10 * 14)},
       "split(0,4,upcast);split(1,2,upcast);split(2,4,upcast)"},
      // Lanes along d (both operands contiguous there), 2 x 4 scores around them.
      {"attention q k^T", [](KernelBuilder& k) { return attention_scores(k, 2, 8, 16); }, {i32(2 * 64), i32(2 * 128), i32(2 * 128)},
       "split(1,2,upcast);split(2,4,upcast);split(3,8,upcast)"},
      // The kept axis is the contiguous one: lanes along it, the sum over rows a loop.
      {"sum over axis 0", [](KernelBuilder& k) { return column_sum(k, 16, 40); }, {i32(40), i32(16 * 40)}, "split(0,8,upcast)"},
  };
  for (const ShapeCase& c : cases) {
    SCOPED_TRACE(c.name);
    {
      KernelBuilder k;
      const UOp* kernel = c.build(k);
      EXPECT_EQ(heuristic_schedule(kernel, avx2).str(), c.avx2);
      expect_schedule_agrees(k, kernel, c.avx2, c.slots);
    }
    KernelBuilder k;
    const UOp* kernel = c.build(k);
    std::string applied;
    auto linear = lower(k.g, kernel, "", &applied);
    ASSERT_TRUE(linear.ok()) << linear.status();
    EXPECT_TRUE(has_vector_alu(*linear)) << applied;
    testing::expect_cpu_matches_interpreter(kernel, *linear, c.slots);
  }
}

// --- plumbing ------------------------------------------------------------------------------

// The schedule names the artifact, not the kernel: two schedules of one kernel are two
// cache keys of one digest; no schedule ("" the heuristic's) keeps the key it had.
TEST(ScheduleKeys, TwoSchedulesTwoKeysOneDigest) {
  KernelBuilder k;
  const UOp* kernel = elementwise(k, dtypes::float32, 4, 16);
  const Digest d = kernel->digest();
  const Backend& b = *host_cpu_backend();
  const std::string heuristic = b.cache_key(d, false);
  EXPECT_EQ(b.cache_key(d, false, "", ""), heuristic);
  EXPECT_EQ(b.cache_key(d, false), heuristic) << "the default key is a function of the kernel and the target alone";
  const std::string a = b.cache_key(d, false, "", "split(1,8,upcast)");
  const std::string c = b.cache_key(d, false, "", "split(1,4,upcast)");
  EXPECT_NE(a, heuristic);
  EXPECT_NE(a, c);
  EXPECT_NE(b.cache_key(d, false, "tenant", "split(1,8,upcast)"), a);
  // Scheduling never touches the kernel the digest names.
  ASSERT_TRUE(lower(k.g, kernel, "split(1,8,upcast)").ok());
  EXPECT_EQ(kernel->digest(), d);
}

// The ABI carries the schedule a kernel was compiled with, through its text form; an
// older text (version 4) has none.
TEST(ScheduleAbi, TheAbiCarriesTheSchedule) {
  KernelBuilder k;
  const UOp* kernel = elementwise(k, dtypes::float32, 4, 16);
  std::string applied;
  auto linear = lower(k.g, kernel, "split(1,4,upcast);thread(0)", &applied);
  ASSERT_TRUE(linear.ok()) << linear.status();
  auto art = host_cpu_backend()->render(*linear);
  ASSERT_TRUE(art.ok()) << art.status();
  art->abi.schedule = applied;
  const std::string text = art->abi.serialize();
  EXPECT_TRUE(text.starts_with(cat("uopd-abi ", kAbiVersion, "\n"))) << text;
  EXPECT_TRUE(contains(text, "schedule 27:split(1,4,upcast);thread(0)\n")) << text;
  auto back = parse_abi(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->schedule, "split(1,4,upcast);thread(0)");
  EXPECT_EQ(back->schedule_str(), "split(1,4,upcast);thread(0)");
  EXPECT_EQ(*back, art->abi);
  // Version 4: the same without the schedule line.
  std::string v4 = text;
  v4.replace(0, cat("uopd-abi ", kAbiVersion).size(), "uopd-abi 4");
  v4.erase(v4.find("schedule 27:"), std::string("schedule 27:split(1,4,upcast);thread(0)\n").size());
  auto old = parse_abi(v4);
  ASSERT_TRUE(old.ok()) << old.status() << "\n" << v4;
  EXPECT_EQ(old->schedule, "");
  EXPECT_EQ(old->schedule_str(), "-");
  // A schedule line that lies about its length is malformed, not read past.
  std::string lying = text;
  lying.replace(lying.find("schedule 27:"), 12, "schedule 99:");
  EXPECT_FALSE(parse_abi(lying).ok());
}

// A 3x3 convolution's padded window read through gated loads, plain or clamped into the
// buffer as the tinygrad bridge sends them, under the AVX2 heuristic's schedule: the
// input is read by masked vector loads (a gate per lane), which the bounds stage proves
// (each lane's index through both its row's and its column's gate), and the kernel computes
// what the interpreter does.
TEST(LoopSchedule, AConvolutionsPaddedWindowIsReadByMaskedVectorLoads) {
  for (auto read : {testing::ConvRead::Gated, testing::ConvRead::Clamped}) {
    SCOPED_TRACE(read == testing::ConvRead::Gated ? "gated" : "clamped");
    KernelBuilder k;
    const UOp* kernel = conv3x3(k, 16, 2, 24, dtypes::int32, read);
    auto linear = lower(k.g, kernel, "split(0,16,upcast);split(2,8,upcast);reorder(1,0,6,2,7)");
    ASSERT_TRUE(linear.ok()) << linear.status();
    int masked = 0;
    for (const UOp* u : (*linear)->src())
      masked += u->op() == Op::INDEX && u->num_src() == 3 && u->dtype().count == 8 && u->src(2)->dtype().count == 8;
    EXPECT_GT(masked, 0);
    testing::expect_cpu_matches_interpreter(kernel, *linear, {{Scalar::Int32, 16 * 24 * 24}, {Scalar::Int32, 2 * 24 * 24}, {Scalar::Int32, 16 * 2 * 9}});
  }
}

// A dot tile (operands contiguous along the reduction: Q K^T, dY W^T) holds as many
// accumulators as a matmul's tile: 4 x 2 dots of a vector with AVX2's 16 registers, 4 x 4
// with AVX-512's 32; and the AVX-512 one computes what the interpreter does.
TEST(HeuristicSchedule, ADotTileHoldsAsManyAccumulatorsAsAMatmulsTile) {
  OptimizeOptions avx2, avx512;
  avx2.vector_bits = 256;
  avx512.vector_bits = 512;
  {
    KernelBuilder k;
    EXPECT_EQ(heuristic_schedule(attention_scores(k, 1, 64, 64), avx2).str(), "split(1,2,upcast);split(2,4,upcast);split(3,8,upcast)");
  }
  KernelBuilder k;
  const UOp* kernel = attention_scores(k, 1, 64, 64);
  const std::string s = heuristic_schedule(kernel, avx512).str();
  EXPECT_EQ(s, "split(1,4,upcast);split(2,4,upcast);split(3,16,upcast)");
  auto i32 = [](int64_t n) { return std::pair<Scalar, int64_t>{Scalar::Int32, n}; };
  expect_schedule_agrees(k, kernel, s, {i32(64 * 64), i32(64 * 64), i32(64 * 64)});
}

}  // namespace
}  // namespace uop
