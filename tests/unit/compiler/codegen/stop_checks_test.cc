// Stop checks (compiler/codegen/stop_checks.h): which loops read the stop word, that the
// CPU backend renders exactly those reads and says so in the kernel's ABI, and that an
// endless kernel returns once its word is set, on one thread or split over a pool.
#include "compiler/codegen/stop_checks.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "compiler/abi/kernel_abi.h"
#include "compiler/codegen/llvm_cpu.h"
#include "compiler/support/strings.h"
#include "tests/unit/compiler/codegen/linear_builder.h"
#include "worker/cpu/thread_pool.h"

namespace uop {
namespace {

using testing::LinearBuilder;

size_t count(const std::string& text, std::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// out[r0 * 16 + r1] = r0 + r1 for r0 < n (a variable), r1 < 16.
TEST(StopChecks, AVariableLoopIsCheckedItsSmallConstantInnerLoopIsNot) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::index, 16 * 1000);
  const UOp* n = lb.var("n", 0, 1000);
  const UOp* r0 = lb.range(n, 0);
  const UOp* r1 = lb.range(lb.idx(16), 1);
  const UOp* i = lb.alu(Op::ADD, {lb.alu(Op::MUL, {r0, lb.idx(16)}), r1});
  lb.end(lb.end(lb.store(lb.index(out, i), lb.alu(Op::ADD, {r0, r1})), r1), r0);
  StopCheckPlan plan = plan_stop_checks(lb.linear());
  ASSERT_EQ(plan.size(), 1u);
  ASSERT_TRUE(plan.contains(r0));
  // An iteration of r0 is 16 light iterations of r1: it is checked once per chunk of
  // many iterations, not each.
  EXPECT_GT(plan.at(r0), 1);
  EXPECT_LE(plan.at(r0), (int64_t{1} << 16) / 16);
}

TEST(StopChecks, SmallConstantLoopsAreNotChecked) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::index, 64 * 64);
  const UOp* r0 = lb.range(lb.idx(64), 0);
  const UOp* r1 = lb.range(lb.idx(64), 1);
  const UOp* i = lb.alu(Op::ADD, {lb.alu(Op::MUL, {r0, lb.idx(64)}), r1});
  lb.end(lb.end(lb.store(lb.index(out, i), i), r1), r0);
  EXPECT_TRUE(plan_stop_checks(lb.linear()).empty());
}

// A RANGE to 2^63 - 1 is in bounds and endless: it is checked. Around a large inner
// loop (itself checked), an outer loop is checked every iteration.
TEST(StopChecks, LargeConstantLoopsAreCheckedOuterOnesEveryIteration) {
  {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::index, 1);
    const UOp* r = lb.range(lb.idx(INT64_MAX), 0);
    lb.end(lb.store(lb.index(out, lb.idx(0)), r), r);
    StopCheckPlan plan = plan_stop_checks(lb.linear());
    ASSERT_EQ(plan.size(), 1u);
    EXPECT_GT(plan.at(r), 1);
  }
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::index, 4096 << 20);
  const UOp* r0 = lb.range(lb.idx(4096), 0, AxisType::Thread);
  const UOp* r1 = lb.range(lb.idx(1 << 20), 1);
  const UOp* i = lb.alu(Op::ADD, {lb.alu(Op::MUL, {r0, lb.idx(1 << 20)}), r1});
  lb.end(lb.end(lb.store(lb.index(out, i), i), r1), r0);
  StopCheckPlan plan = plan_stop_checks(lb.linear());
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_GT(plan.at(r1), 1);
  EXPECT_EQ(plan.at(r0), 1);
  // A smaller budget checks more often, never less than each iteration.
  StopCheckPlan tight = plan_stop_checks(lb.linear(), {.work_between_checks = 8});
  EXPECT_LT(tight.at(r1), plan.at(r1));
  EXPECT_GE(tight.at(r1), 1);
}

// The rendered kernel reads the word once per planned loop (a relaxed atomic load), and
// its ABI says it has one; without checks there is no read and no stop word.
TEST(StopChecks, RenderedAsOneRelaxedLoadPerCheckedLoop) {
  // r0 < n (a Thread range) { r1 < 16 { out[r0 * 16 + r1] = ... } r2 < 2^63 - 1 { out[0] = r2 } }
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::index, 4096 * 16);
  const UOp* n = lb.var("n", 0, 4096);
  const UOp* r0 = lb.range(n, 0, AxisType::Thread);
  const UOp* r1 = lb.range(lb.idx(16), 1);
  const UOp* i = lb.alu(Op::ADD, {lb.alu(Op::MUL, {r0, lb.idx(16)}), r1});
  lb.end(lb.store(lb.index(out, i), i), r1);
  const UOp* r2 = lb.range(lb.idx(INT64_MAX), 2);
  lb.end(lb.end(lb.store(lb.index(out, lb.idx(0)), r2), r2), r0);
  const UOp* linear = lb.linear();
  StopCheckPlan plan = plan_stop_checks(linear);
  ASSERT_EQ(plan.size(), 2u);  // r0 and r2
  EXPECT_TRUE(plan.contains(r0) && plan.contains(r2));
  auto checked = compile_cpu(linear, CpuTarget::host(), {.emit_ir_text = true});
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(count(checked->ir_text, "load atomic i32"), 2u) << checked->ir_text;
  EXPECT_EQ(count(checked->ir_text, " monotonic"), 2u);
  EXPECT_TRUE(checked->abi.stop_word);
  // A compiled kernel's text has the work estimate (the newest version), whose stop line
  // says whether the kernel checks the word.
  EXPECT_EQ(checked->abi.serialize().rfind(cat("uopd-abi ", kAbiVersion, "\n"), 0), 0u) << checked->abi.serialize();
  EXPECT_NE(checked->abi.serialize().find("\nstop 1\n"), std::string::npos) << checked->abi.serialize();
  auto unchecked = compile_cpu(linear, CpuTarget::host(), {.emit_ir_text = true, .stop_checks = false});
  ASSERT_TRUE(unchecked.ok()) << unchecked.status();
  EXPECT_EQ(count(unchecked->ir_text, "load atomic"), 0u);
  EXPECT_FALSE(unchecked->abi.stop_word);
  EXPECT_NE(unchecked->abi.serialize().find("\nstop 0\n"), std::string::npos) << unchecked->abi.serialize();
  // Another ABI, another backend version: the cache key of a kernel changes with both.
  EXPECT_NE(compiler_build_id().find(cat("abi-", kAbiVersion)), std::string::npos) << compiler_build_id();
}

// out[r % 1024] = r for r up to 2^63 - 1, as a plain loop or a Thread range.
const UOp* endless_kernel(LinearBuilder& lb, AxisType type) {
  const UOp* out = lb.param(0, dtypes::int64, 1024);
  const UOp* r = lb.range(lb.idx(INT64_MAX), 0, type);
  const UOp* slot = lb.alu(Op::AND, {r, lb.idx(1023)});
  lb.end(lb.store(lb.index(out, slot), lb.cast(r, dtypes::int64)), r);
  return lb.linear();
}

// Runs `prog` on its own thread, waits until the kernel has visibly written something,
// sets the word, and expects the launch to return.
void expect_stops(const CpuProgram& prog, ThreadPool* pool) {
  std::vector<int64_t> out(1024, 0);
  std::atomic<uint32_t> word{0};
  void* bufs[] = {out.data()};
  auto running = std::async(std::launch::async, [&] { return prog.run(bufs, {}, pool, 0, &word); });
  auto wrote = [&] {
    for (size_t i = 1; i < out.size(); ++i)
      if (std::atomic_ref<int64_t>(out[i]).load(std::memory_order_relaxed) != 0) return true;
    return false;
  };
  while (!wrote()) std::this_thread::yield();  // the kernel is under way
  word.store(1, std::memory_order_relaxed);
  // Bounded only so that a kernel that never stops fails the test instead of hanging it.
  ASSERT_EQ(running.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the kernel did not stop";
  EXPECT_TRUE(running.get().ok());
}

TEST(StopChecks, AnEndlessKernelReturnsOnceItsWordIsSet) {
  LinearBuilder lb;
  auto prog = testing::build(endless_kernel(lb, AxisType::Loop));
  ASSERT_TRUE(prog);
  expect_stops(*prog, nullptr);
}

TEST(StopChecks, EveryTaskOfAnEndlessKernelReturnsOnceTheSharedWordIsSet) {
  LinearBuilder lb;
  auto prog = testing::build(endless_kernel(lb, AxisType::Thread));
  ASSERT_TRUE(prog);
  ASSERT_TRUE(prog->abi().has_thread_range);
  ThreadPool pool(4);
  expect_stops(*prog, &pool);
}

// A kernel with its word set before it starts does nothing past its first check.
TEST(StopChecks, AKernelWhoseWordIsSetStopsAtItsFirstCheck) {
  LinearBuilder lb;
  auto prog = testing::build(endless_kernel(lb, AxisType::Loop));
  ASSERT_TRUE(prog);
  std::vector<int64_t> out(1024, -1);
  std::atomic<uint32_t> word{2};
  void* bufs[] = {out.data()};
  ASSERT_TRUE(prog->run(bufs, {}, nullptr, 0, &word).ok());
  EXPECT_EQ(out, std::vector<int64_t>(1024, -1));
}

TEST(KernelAbi, StopWordTravelsInVersion3) {
  KernelAbi abi;
  abi.params.push_back({0, dtypes::float32, 8, true, true});
  abi.vars.push_back({"n", 0, 8});
  abi.stop_word = true;
  std::string text = abi.serialize();
  EXPECT_EQ(text.rfind("uopd-abi 3\n", 0), 0u) << text;
  EXPECT_NE(text.find("\nstop 1\n"), std::string::npos) << text;
  auto back = parse_abi(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(*back, abi);
  // With GPU dims too.
  abi.gpu.emplace();
  abi.gpu->block[0] = LaunchExpr::constant(128);
  text = abi.serialize();
  back = parse_abi(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(*back, abi);
  // Without a stop word the text is what it always was.
  abi.stop_word = false;
  EXPECT_EQ(abi.serialize().rfind("uopd-abi 2\n", 0), 0u);
  abi.gpu.reset();
  EXPECT_EQ(abi.serialize().rfind("uopd-abi 1\n", 0), 0u);
  // Version 3 without its stop line, or with another value, does not parse.
  KernelAbi stopped;
  stopped.stop_word = true;
  std::string good = stopped.serialize();
  for (std::string bad : {good.substr(0, good.find("stop 1")), good.replace(good.find("stop 1"), 6, "stop 0")})
    EXPECT_FALSE(parse_abi(bad).ok()) << bad;
}

}  // namespace
}  // namespace uop
