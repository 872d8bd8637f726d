// WorkerRuntime without a socket (buffers, bounds, programs, launches and their refusals)
// with real kernels compiled by the LLVM CPU backend, and the gRPC adapter's streaming
// calls over an in-process server on an ephemeral port.
#include "worker/worker_service.h"

#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "compiler/support/strings.h"
#include "compiler/support/status_macros.h"
#include "tests/unit/compiler/codegen/linear_builder.h"
#include "tests/unit/worker/collectives/collective_testing.h"
#include "transport/lane_messages.h"

namespace uop {
namespace {

using testing::LinearBuilder;
namespace wv1 = uopd::worker::v1;

constexpr int64_t N = 64;

// out[i] = in[i] * k + i for i < n; two int32 buffers of N elements.
CpuArtifact scale_kernel(int k) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::int32, N);
  const UOp* in = lb.param(1, dtypes::int32, N);
  const UOp* n = lb.var("n", 0, N);
  const UOp* r = lb.range(n, 0, AxisType::Thread);
  const UOp* x = lb.load(in, lb.index(in, r));
  const UOp* y = lb.alu(Op::ADD, {lb.alu(Op::MUL, {x, lb.cnst(dtypes::int32, ConstValue::Int(k))}), lb.cast(r, dtypes::int32)});
  lb.end(lb.store(lb.index(out, r), y), r);
  auto art = compile_cpu(lb.linear(), CpuTarget::host());
  EXPECT_TRUE(art.ok()) << art.status();
  return art.ok() ? *std::move(art) : CpuArtifact{};
}

// out[0] = 1 + 1 + ... (n times) in float32: a loop whose length the caller picks.
CpuArtifact count_kernel() {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::float32, 1);
  const UOp* n = lb.var("n", 0, int64_t{1} << 40);
  const UOp* acc = lb.reg(dtypes::float32, 1);
  const UOp* row = lb.range(lb.idx(1), 0, AxisType::Thread);
  const UOp* init = lb.store(lb.index(acc, lb.idx(0)), lb.f32(0));
  const UOp* k = lb.range(n, 1, AxisType::Reduce);
  const UOp* acc_in = lb.index(lb.after(acc, {init, k}), lb.idx(0));
  const UOp* upd = lb.store(acc_in, lb.alu(Op::ADD, {lb.load(acc, acc_in), lb.f32(1)}));
  const UOp* done = lb.end(upd, k);
  const UOp* total = lb.load(acc, lb.index(lb.after(acc, {done}), lb.idx(0)));
  lb.end(lb.store(lb.index(out, row), total), row);
  auto art = compile_cpu(lb.linear(), CpuTarget::host());
  EXPECT_TRUE(art.ok()) << art.status();
  return art.ok() ? *std::move(art) : CpuArtifact{};
}

std::string bytes_of(const std::vector<int32_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
}

std::vector<int32_t> ints_of(std::string_view b) {
  std::vector<int32_t> v(b.size() / sizeof(int32_t));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(int32_t));
  return v;
}

std::vector<int32_t> read_ints(const WorkerRuntime& rt, uint64_t id) {
  auto s = rt.read_buffer(id, 0, 0);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? ints_of(s->bytes()) : std::vector<int32_t>{};
}

std::vector<int32_t> iota_input() {
  std::vector<int32_t> in(N);
  for (int i = 0; i < N; ++i) in[i] = i * 3 - 50;
  return in;
}

WorkerRuntime make_runtime(uint64_t budget = 0) {
  return WorkerRuntime(WorkerRuntimeOptions{.device = "CPU:0", .target = "test", .threads = 3, .max_buffer_bytes = budget});
}

TEST(WorkerRuntime, BuffersRoundTripAtOffsets) {
  WorkerRuntime rt = make_runtime();
  ASSERT_TRUE(rt.alloc_buffer(7, 100).ok());
  auto fresh = rt.read_buffer(7, 0, 0);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->bytes(), std::string(100, '\0'));  // new buffers are zeroed
  EXPECT_EQ(reinterpret_cast<uintptr_t>(fresh->bytes().data()) % 64, 0u);
  ASSERT_TRUE(rt.write_buffer(7, 0, "hello").ok());
  ASSERT_TRUE(rt.write_buffer(7, 95, "world").ok());
  ASSERT_TRUE(rt.write_buffer(7, 100, "").ok());  // empty at the very end is inside
  auto a = rt.read_buffer(7, 0, 5);
  auto b = rt.read_buffer(7, 95, 0);
  auto mid = rt.read_buffer(7, 3, 4);
  ASSERT_TRUE(a.ok() && b.ok() && mid.ok());
  EXPECT_EQ(a->bytes(), "hello");
  EXPECT_EQ(b->bytes(), "world");
  EXPECT_EQ(mid->bytes(), std::string("lo\0\0", 4));
  auto end = rt.read_buffer(7, 100, 0);
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->length, 0u);
  // A slice keeps the memory alive after the buffer is freed.
  EXPECT_EQ(rt.free_buffers(std::vector<uint64_t>{7, 8}), 1u);
  EXPECT_EQ(a->bytes(), "hello");
  EXPECT_EQ(rt.read_buffer(7, 0, 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRuntime, RefusesBadIdsAndOutOfRangeAccess) {
  WorkerRuntime rt = make_runtime();
  ASSERT_TRUE(rt.alloc_buffer(3, 16).ok());
  EXPECT_EQ(rt.alloc_buffer(3, 16).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(rt.alloc_buffer(0, 16).code(), absl::StatusCode::kInvalidArgument);

  absl::Status missing = rt.write_buffer(99, 0, "x");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("buffer 99"), std::string::npos) << missing;
  EXPECT_EQ(rt.read_buffer(99, 0, 0).status().code(), absl::StatusCode::kNotFound);

  absl::Status past = rt.write_buffer(3, 10, "0123456789");
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange);
  for (const char* part : {"buffer 3", "10", "16 bytes"})
    EXPECT_NE(past.message().find(part), std::string::npos) << past;
  EXPECT_EQ(rt.write_buffer(3, 17, "").code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(rt.write_buffer(3, UINT64_MAX, "x").code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(rt.write_buffer(3, UINT64_MAX - 1, "xyz").code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(rt.read_buffer(3, 8, 9).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(rt.read_buffer(3, 17, 0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(rt.read_buffer(3, 1, UINT64_MAX).status().code(), absl::StatusCode::kOutOfRange);
  // A refused write leaves the buffer as it was.
  auto s = rt.read_buffer(3, 0, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->bytes(), std::string(16, '\0'));
}

TEST(WorkerRuntime, ByteBudget) {
  WorkerRuntime rt = make_runtime(1000);
  ASSERT_TRUE(rt.alloc_buffer(1, 600).ok());
  absl::Status over = rt.alloc_buffer(2, 401);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_EQ(rt.alloc_buffer(3, UINT64_MAX).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(rt.alloc_buffer(2, 400).ok());
  EXPECT_EQ(rt.info().buffer_bytes, 1000u);
  EXPECT_EQ(rt.free_buffers(std::vector<uint64_t>{1}), 1u);
  EXPECT_TRUE(rt.alloc_buffer(4, 600).ok());
  WorkerInfo i = rt.info();
  EXPECT_EQ(i.buffers, 2u);
  EXPECT_EQ(i.buffer_bytes, 1000u);
  EXPECT_EQ(i.threads, 3);
  EXPECT_EQ(i.device, "CPU:0");
  EXPECT_EQ(i.backend, "cpu");
}

TEST(WorkerRuntime, LoadsByKeyAndRunsLaunchesInOrder) {
  WorkerRuntime rt = make_runtime();
  CpuArtifact times2 = scale_kernel(2), times5 = scale_kernel(5);
  ASSERT_TRUE(rt.load_program("k2", times2.object, times2.abi.serialize()).ok());
  ASSERT_TRUE(rt.load_program("k5", times5.object, times5.abi.serialize()).ok());
  // Idempotent by key: the second load does not even look at the object.
  ASSERT_TRUE(rt.load_program("k2", "garbage", "garbage").ok());
  EXPECT_EQ(rt.info().programs, 2u);
  for (uint64_t id : {1, 2, 3}) ASSERT_TRUE(rt.alloc_buffer(id, N * 4).ok());
  std::vector<int32_t> in = iota_input();
  ASSERT_TRUE(rt.write_buffer(1, 0, bytes_of(in)).ok());
  // 2 = 1 * 2 + i, then 3 = 2 * 5 + i: the second reads what the first wrote.
  std::vector<LaunchSpec> launches = {{"k2", {2, 1}, {N}}, {"k5", {3, 2}, {N}}};
  auto ms = rt.execute(launches);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0);
  std::vector<int32_t> mid = read_ints(rt, 2), out = read_ints(rt, 3);
  for (int i = 0; i < N; ++i) {
    ASSERT_EQ(mid[i], in[i] * 2 + i);
    ASSERT_EQ(out[i], (in[i] * 2 + i) * 5 + i);
  }
  // n < N touches only the first n elements.
  ASSERT_TRUE(rt.free_buffers(std::vector<uint64_t>{3}) == 1 && rt.alloc_buffer(3, N * 4).ok());
  ASSERT_TRUE(rt.execute(std::vector<LaunchSpec>{{"k5", {3, 1}, {10}}}).ok());
  out = read_ints(rt, 3);
  for (int i = 0; i < N; ++i) ASSERT_EQ(out[i], i < 10 ? in[i] * 5 + i : 0) << i;
}

// A collective in a batch (worker.proto's Launch.collective) runs where it stands: after
// the launches before it, before those after it, with its peer's batch in another process
// at the same time. Two members, each: mid = in * 2 + i, the allreduce (add) of mid, then
// out = mid * 5 + i, read back; the oracle is that arithmetic on the host. Only the
// kernels are timed per launch.
TEST(WorkerRuntime, ABatchRunsACollectiveWhereItStandsAmongItsLaunches) {
  const CpuArtifact times2 = scale_kernel(2), times5 = scale_kernel(5);
  testing::SharedMemory results(2 * N * sizeof(int32_t));
  const std::string group = cat("batch-collective-", getpid());
  auto input = [](int rank) {
    std::vector<int32_t> in = iota_input();
    for (int32_t& v : in) v *= rank + 1;
    return in;
  };
  auto reports = testing::run_members(2, [&](int rank) -> absl::Status {
    WorkerRuntime rt = make_runtime();
    RETURN_IF_ERROR(rt.load_program("k2", times2.object, times2.abi.serialize()));
    RETURN_IF_ERROR(rt.load_program("k5", times5.object, times5.abi.serialize()));
    const std::string in = bytes_of(input(rank));
    ExecuteBatch b;
    b.allocs = {{1, N * 4, in}, {2, N * 4, {}}, {3, N * 4, {}}};
    CollectiveSpec c;
    c.group = group;
    c.rank = rank;
    c.size = 2;
    c.op = "add";
    c.dtype = "int32";
    c.elements = N;
    c.transport = "shm";
    b.launches = {{"k2", {2, 1}, {N}}, {"", {2}, {}, c}, {"k5", {3, 2}, {N}}};
    b.read_back = {3};
    b.profile = true;
    auto r = rt.execute(b);
    if (!r.ok()) return r.status();
    if (r->launch_ms.size() != 2) return absl::InternalError(cat(r->launch_ms.size(), " launches timed, not the 2 kernels"));
    if (r->outputs.size() != 1 || r->outputs[0].length != N * 4) return absl::InternalError("no output read back");
    std::memcpy(results.data() + rank * N * 4, r->outputs[0].data, N * 4);
    return absl::OkStatus();
  });
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(reports[r].status().ok()) << "rank " << r << ": " << reports[r].status();
  const std::vector<int32_t> in0 = input(0), in1 = input(1);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<int32_t> out = ints_of(std::string_view(reinterpret_cast<const char*>(results.data()) + rank * N * 4, N * 4));
    for (int i = 0; i < N; ++i) {
      const int32_t sum = (in0[i] * 2 + i) + (in1[i] * 2 + i);
      ASSERT_EQ(out[i], sum * 5 + i) << "rank " << rank << ", element " << i;
    }
  }
}

// Timed only when asked: one time per launch, in order, which together fit in the time the
// launches took; an untimed execute, and an ExecuteBatch without `profile`, time none.
TEST(WorkerRuntime, TimesEachLaunchOnlyWhenAsked) {
  WorkerRuntime rt = make_runtime();
  CpuArtifact times2 = scale_kernel(2), times5 = scale_kernel(5);
  ASSERT_TRUE(rt.load_program("k2", times2.object, times2.abi.serialize()).ok());
  ASSERT_TRUE(rt.load_program("k5", times5.object, times5.abi.serialize()).ok());
  for (uint64_t id : {1, 2, 3}) ASSERT_TRUE(rt.alloc_buffer(id, N * 4).ok());
  std::vector<LaunchSpec> launches = {{"k2", {2, 1}, {N}}, {"k5", {3, 2}, {N}}, {"k2", {2, 3}, {N}}};
  std::vector<double> each;
  auto total = rt.execute(launches, {}, absl::InfiniteFuture(), &each);
  ASSERT_TRUE(total.ok()) << total.status();
  ASSERT_EQ(each.size(), launches.size());
  double sum = 0;
  for (double ms : each) {
    EXPECT_GE(ms, 0);
    sum += ms;
  }
  EXPECT_LE(sum, *total);

  ExecuteBatch batch;
  batch.launches = launches;
  auto untimed = rt.execute(batch);
  ASSERT_TRUE(untimed.ok()) << untimed.status();
  EXPECT_TRUE(untimed->launch_ms.empty());
  batch.profile = true;
  auto timed = rt.execute(batch);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_EQ(timed->launch_ms.size(), launches.size());
}

TEST(WorkerRuntime, ALoopKernelCounts) {
  WorkerRuntime rt = make_runtime();
  CpuArtifact art = count_kernel();
  ASSERT_TRUE(rt.load_program("count", art.object, art.abi.serialize()).ok());
  ASSERT_TRUE(rt.alloc_buffer(1, 4).ok());
  ASSERT_TRUE(rt.execute(std::vector<LaunchSpec>{{"count", {1}, {12345}}}).ok());
  auto s = rt.read_buffer(1, 0, 0);
  ASSERT_TRUE(s.ok());
  float got = 0;
  std::memcpy(&got, s->bytes().data(), 4);
  EXPECT_EQ(got, 12345.0f);
}

TEST(WorkerRuntime, RefusesLaunchesThatCouldTouchMemoryOutsideTheirBuffers) {
  WorkerRuntime rt = make_runtime();
  CpuArtifact art = scale_kernel(3);
  ASSERT_TRUE(rt.load_program("k3", art.object, art.abi.serialize()).ok());
  ASSERT_TRUE(rt.alloc_buffer(1, N * 4).ok());
  ASSERT_TRUE(rt.alloc_buffer(2, N * 4).ok());
  ASSERT_TRUE(rt.alloc_buffer(3, N * 4 - 1).ok());  // one byte short of 64 int32
  ASSERT_TRUE(rt.write_buffer(1, 0, bytes_of(iota_input())).ok());
  auto run = [&](LaunchSpec l) { return rt.execute(std::vector<LaunchSpec>{std::move(l)}).status(); };

  absl::Status small_out = run({"k3", {3, 1}, {N}});
  EXPECT_EQ(small_out.code(), absl::StatusCode::kInvalidArgument) << small_out;
  for (const char* part : {"launch 0", "k3", "buffer 3", "slot 0", "255 bytes", "needs 256"})
    EXPECT_NE(small_out.message().find(part), std::string::npos) << part << ": " << small_out;
  // Even with n small enough that the kernel would stay inside: the ABI's size is the rule.
  EXPECT_EQ(run({"k3", {3, 1}, {1}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run({"k3", {2, 3}, {N}}).code(), absl::StatusCode::kInvalidArgument);  // small input
  EXPECT_EQ(read_ints(rt, 2), std::vector<int32_t>(N, 0));                         // nothing ran
  EXPECT_EQ(run({"k3", {2, 0}, {N}}).code(), absl::StatusCode::kInvalidArgument);  // no input buffer
  EXPECT_EQ(run({"k3", {2}, {N}}).code(), absl::StatusCode::kInvalidArgument);     // too few slots
  EXPECT_EQ(run({"k3", {2, 1, 1}, {N}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run({"k3", {2, 1}, {}}).code(), absl::StatusCode::kInvalidArgument);      // no n
  EXPECT_EQ(run({"k3", {2, 1}, {N + 1}}).code(), absl::StatusCode::kInvalidArgument); // n out of bounds
  EXPECT_EQ(run({"k3", {1, 1}, {N}}).code(), absl::StatusCode::kInvalidArgument);     // written buffer aliased
  absl::Status unknown = run({"k3", {2, 42}, {N}});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("buffer 42"), std::string::npos) << unknown;
  EXPECT_TRUE(run({"k3", {2, 1}, {N}}).ok());
}

TEST(WorkerRuntime, UnloadedProgramsAndBadArtifacts) {
  WorkerRuntime rt = make_runtime();
  ASSERT_TRUE(rt.alloc_buffer(1, N * 4).ok());
  absl::Status st = rt.execute(std::vector<LaunchSpec>{{"nope", {1, 1}, {N}}}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("program nope not loaded"), std::string::npos) << st;

  CpuArtifact art = scale_kernel(1);
  EXPECT_EQ(rt.load_program("bad-abi", art.object, "not an abi").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.load_program("bad-object", "not an object", art.abi.serialize()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.load_program("", art.object, art.abi.serialize()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(rt.has_program("bad-abi"));
  EXPECT_FALSE(rt.has_program("bad-object"));
  EXPECT_EQ(rt.info().programs, 0u);
}

TEST(WorkerRuntime, StopsAtTheFirstFailedLaunch) {
  WorkerRuntime rt = make_runtime();
  CpuArtifact art = scale_kernel(2);
  ASSERT_TRUE(rt.load_program("k2", art.object, art.abi.serialize()).ok());
  for (uint64_t id : {1, 2, 3}) ASSERT_TRUE(rt.alloc_buffer(id, N * 4).ok());
  ASSERT_TRUE(rt.write_buffer(1, 0, bytes_of(iota_input())).ok());
  // Every program is looked up before anything runs: one not loaded runs nothing.
  std::vector<LaunchSpec> launches = {{"k2", {2, 1}, {N}}, {"missing", {3, 1}, {N}}, {"k2", {3, 1}, {N}}};
  absl::Status st = rt.execute(launches).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("launch 1 (program missing): program missing not loaded"), std::string::npos) << st;
  EXPECT_EQ(read_ints(rt, 2), std::vector<int32_t>(N, 0));
  // A launch that fails as it runs (a buffer that does not exist): the ones before it ran.
  launches = {{"k2", {2, 1}, {N}}, {"k2", {3, 42}, {N}}, {"k2", {3, 1}, {N}}};
  st = rt.execute(launches).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("launch 1"), std::string::npos) << st;
  EXPECT_NE(read_ints(rt, 2), std::vector<int32_t>(N, 0));  // the first ran
  EXPECT_EQ(read_ints(rt, 3), std::vector<int32_t>(N, 0));  // the third did not

  bool asked = false;
  absl::Status cancelled = rt.execute(launches, [&] { return asked = true; }).status();
  EXPECT_TRUE(asked);
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled);
}

// A launch that runs past its deadline is stopped (the kernel reads its stop word) and
// fails with DEADLINE_EXCEEDED naming it; the runtime then runs the next launch as ever.
TEST(WorkerRuntime, StopsALaunchAtItsDeadline) {
  WorkerRuntime rt = make_runtime();
  CpuArtifact count = count_kernel(), scale = scale_kernel(2);
  ASSERT_TRUE(count.abi.stop_word);
  ASSERT_TRUE(rt.load_program("count", count.object, count.abi.serialize()).ok());
  ASSERT_TRUE(rt.load_program("k2", scale.object, scale.abi.serialize()).ok());
  for (uint64_t id : {1, 2, 3}) ASSERT_TRUE(rt.alloc_buffer(id, N * 4).ok());
  // 2^40 additions: many minutes of work.
  auto st = rt.execute(std::vector<LaunchSpec>{{"count", {1}, {int64_t{1} << 40}}}, {}, absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(st.status().code(), absl::StatusCode::kDeadlineExceeded) << st.status();
  EXPECT_NE(st.status().message().find("launch 0 (program count)"), std::string::npos) << st.status();
  // A deadline already past runs nothing.
  auto late = rt.execute(std::vector<LaunchSpec>{{"k2", {3, 2}, {N}}}, {}, absl::Now() - absl::Seconds(1));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_EQ(read_ints(rt, 3), std::vector<int32_t>(N, 0));
  ASSERT_TRUE(rt.write_buffer(2, 0, bytes_of(iota_input())).ok());
  ASSERT_TRUE(rt.execute(std::vector<LaunchSpec>{{"k2", {3, 2}, {N}}}, {}, absl::Now() + absl::Seconds(60)).ok());
  std::vector<int32_t> want;
  for (int i = 0; i < N; ++i) want.push_back(iota_input()[i] * 2 + i);
  EXPECT_EQ(read_ints(rt, 3), want);
}

// A caller that goes away while its launch runs stops it: CANCELLED naming the launch.
TEST(WorkerRuntime, StopsALaunchWhoseCallerWentAway) {
  WorkerRuntime rt = make_runtime();
  CpuArtifact count = count_kernel();
  ASSERT_TRUE(rt.load_program("count", count.object, count.abi.serialize()).ok());
  ASSERT_TRUE(rt.alloc_buffer(1, 4).ok());
  // Asked first before the launch (still there), then while it runs (gone).
  std::atomic<int> asked{0};
  auto gone = [&] { return asked.fetch_add(1) >= 1; };
  auto st = rt.execute(std::vector<LaunchSpec>{{"count", {1}, {int64_t{1} << 40}}}, gone);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kCancelled) << st.status();
  EXPECT_NE(st.status().message().find("launch 0 (program count)"), std::string::npos) << st.status();
  EXPECT_GE(asked.load(), 2);
}

// Code that never reads the stop word (here a CUSTOM call into this test binary that
// blocks until released) is reported stuck once the grace period after its deadline has
// passed: uop-worker then exits; here on_stuck releases it instead, and the launch still
// fails with its deadline.
std::atomic<bool> block_released{false};
std::atomic<bool> block_entered{false};
extern "C" [[gnu::visibility("default"), gnu::used]] int32_t worker_test_block_until_released(int32_t v) {
  block_entered = true;
  while (!block_released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return v;
}

TEST(WorkerRuntime, ALaunchThatDoesNotStopIsReportedStuck) {
  std::string stuck;
  WorkerRuntimeOptions o{.device = "CPU:0", .target = "test", .threads = 1};
  o.watchdog.grace = absl::Milliseconds(100);
  o.watchdog.on_stuck = [&](const std::string& what) {
    stuck = what;
    block_released = true;
  };
  WorkerRuntime rt(o);
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::int32, 1);
  const UOp* call = lb.make(Op::CUSTOM, dtypes::int32, std::array{lb.cnst(dtypes::int32, ConstValue::Int(7))},
                            StrArg{"worker_test_block_until_released({0})"});
  lb.store(lb.index(out, lb.idx(0)), call);
  auto art = compile_cpu(lb.linear(), CpuTarget::host());
  ASSERT_TRUE(art.ok()) << art.status();
  ASSERT_TRUE(rt.load_program("blocks", art->object, art->abi.serialize()).ok());
  ASSERT_TRUE(rt.alloc_buffer(1, 4).ok());
  auto st = rt.execute(std::vector<LaunchSpec>{{"blocks", {1}, {}}}, {}, absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(block_entered.load());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kDeadlineExceeded) << st.status();
  EXPECT_NE(stuck.find("launch 0 (program blocks) did not stop within 100ms"), std::string::npos) << stuck;
}

// The one-round-trip form of a cached Run: allocate (an input with data, an output
// zeroed), launch, read back, free, in one call; and a failure at any step still frees.
TEST(WorkerRuntime, ABatchAllocatesLaunchesReadsBackAndFrees) {
  WorkerRuntime rt = make_runtime();
  CpuArtifact art = scale_kernel(3);
  ASSERT_TRUE(rt.load_program("k3", art.object, art.abi.serialize()).ok());
  const std::vector<int32_t> in = iota_input();
  const std::string in_bytes = bytes_of(in);
  ExecuteBatch batch;
  batch.allocs = {{10, N * 4, in_bytes}, {11, N * 4, {}}};
  batch.launches = {{"k3", {11, 10}, {N}}};
  batch.read_back = {11, 10};
  batch.free_after = {10, 11, 999};  // 999 was never allocated: skipped
  auto r = rt.execute(batch);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 2u);
  ASSERT_EQ(r->outputs[0].length, N * 4u);
  std::vector<int32_t> out(N);
  std::memcpy(out.data(), r->outputs[0].data, N * 4);  // still valid: the slice holds the memory
  for (int i = 0; i < N; ++i) ASSERT_EQ(out[i], in[i] * 3 + i) << i;
  EXPECT_EQ(r->outputs[1].bytes(), in_bytes);
  EXPECT_EQ(rt.info().buffers, 0u);  // both freed
  EXPECT_EQ(rt.info().buffer_bytes, 0u);

  // A failed launch: the allocations made by the batch are freed anyway, the error says
  // which launch, and nothing is read back.
  batch.launches = {{"k3", {11, 10}, {N}}, {"k3", {11, 42}, {N}}};
  r = rt.execute(batch);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("launch 1"), std::string::npos) << r.status();
  EXPECT_EQ(rt.info().buffers, 0u);

  // A program not loaded: nothing of the batch happens (no allocation, no free), and the
  // answer names it, once however often it is launched.
  ASSERT_TRUE(rt.alloc_buffer(10, 4).ok());
  batch.launches = {{"k3", {11, 10}, {N}}, {"missing", {11, 10}, {N}}, {"missing", {11, 10}, {N}}};
  r = rt.execute(batch);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->missing_programs, std::vector<std::string>{"missing"});
  EXPECT_TRUE(r->outputs.empty());
  EXPECT_EQ(rt.info().buffers, 1u);  // 10 not freed, 11 not allocated
  EXPECT_EQ(rt.read_buffer(11, 0, 0).status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(rt.free_buffers(std::vector<uint64_t>{10}), 1u);

  // A failed allocation (the id is taken by a buffer the batch does not free): named, and
  // the buffers allocated before it are freed; the other buffer is untouched.
  ASSERT_TRUE(rt.alloc_buffer(11, 8).ok());
  batch.launches = {{"k3", {11, 10}, {N}}};
  batch.free_after = {10};
  r = rt.execute(batch);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(r.status().message().find("allocating buffer 11"), std::string::npos) << r.status();
  EXPECT_EQ(rt.info().buffers, 1u);
  EXPECT_EQ(rt.info().buffer_bytes, 8u);

  // More data than the buffer holds: refused before anything is allocated for it.
  batch.allocs = {{12, 4, "12345678"}};
  batch.launches.clear();
  batch.read_back.clear();
  batch.free_after = {12};
  r = rt.execute(batch);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("8 bytes of data for a buffer of 4"), std::string::npos) << r.status();
  EXPECT_EQ(rt.info().buffers, 1u);
}

// Past the program budget the least recently launched program goes (never the one being
// loaded); a batch that launches it does nothing and names it; loaded again, it runs.
TEST(WorkerRuntime, ProgramBudgetUnloadsTheLeastRecentlyLaunched) {
  CpuArtifact k1 = scale_kernel(1), k2 = scale_kernel(2), k3 = scale_kernel(3);
  auto charge = [](const CpuArtifact& a) { return WorkerRuntime::program_charge(a.object.size()); };
  // Room for any two of the three, never for all three.
  const uint64_t budget = std::max({charge(k1) + charge(k2), charge(k1) + charge(k3), charge(k2) + charge(k3)});
  ASSERT_LT(budget, charge(k1) + charge(k2) + charge(k3));
  WorkerRuntime rt(WorkerRuntimeOptions{.device = "CPU:0", .target = "test", .threads = 1, .max_program_bytes = budget});
  const std::vector<int32_t> in = iota_input();
  ASSERT_TRUE(rt.alloc_buffer(1, N * 4).ok());
  ASSERT_TRUE(rt.alloc_buffer(2, N * 4).ok());
  ASSERT_TRUE(rt.write_buffer(1, 0, bytes_of(in)).ok());

  std::vector<std::string> unloaded;
  ASSERT_TRUE(rt.load_program("k1", k1.object, k1.abi.serialize(), &unloaded).ok());
  ASSERT_TRUE(rt.load_program("k2", k2.object, k2.abi.serialize(), &unloaded).ok());
  EXPECT_TRUE(unloaded.empty());
  // k1 launched after k2 was loaded: k2 is now the least recently used.
  ASSERT_TRUE(rt.execute(std::vector<LaunchSpec>{{"k1", {2, 1}, {N}}}).ok());
  ASSERT_TRUE(rt.load_program("k3", k3.object, k3.abi.serialize(), &unloaded).ok());
  EXPECT_EQ(unloaded, std::vector<std::string>{"k2"});
  EXPECT_TRUE(rt.has_program("k1"));
  EXPECT_FALSE(rt.has_program("k2"));
  EXPECT_TRUE(rt.has_program("k3"));
  WorkerInfo info = rt.info();
  EXPECT_EQ(info.programs, 2u);
  EXPECT_EQ(info.program_bytes, charge(k1) + charge(k3));
  EXPECT_EQ(info.programs_unloaded, 1u);

  ExecuteBatch batch;
  batch.allocs = {{5, 16, {}}};
  batch.launches = {{"k3", {2, 1}, {N}}, {"k2", {2, 1}, {N}}};
  batch.read_back = {2};
  batch.free_after = {1};
  auto r = rt.execute(batch);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->missing_programs, std::vector<std::string>{"k2"});
  EXPECT_EQ(rt.read_buffer(5, 0, 0).status().code(), absl::StatusCode::kNotFound);  // not allocated
  EXPECT_EQ(read_ints(rt, 1), in);                                                 // not freed
  EXPECT_EQ(read_ints(rt, 2), [&] {  // k3 did not run either: still k1's output
    std::vector<int32_t> v(N);
    for (int i = 0; i < N; ++i) v[i] = in[i] + i;
    return v;
  }());

  // Loaded again, k2 pushes out k1, the least recently used now (k3 was just looked up).
  unloaded.clear();
  ASSERT_TRUE(rt.load_program("k2", k2.object, k2.abi.serialize(), &unloaded).ok());
  EXPECT_EQ(unloaded, std::vector<std::string>{"k1"});
  batch.launches = {{"k2", {2, 1}, {N}}};
  r = rt.execute(batch);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->missing_programs.empty());
  ASSERT_EQ(r->outputs.size(), 1u);
  std::vector<int32_t> out = ints_of(r->outputs[0].bytes());
  for (int i = 0; i < N; ++i) ASSERT_EQ(out[i], in[i] * 2 + i) << i;
  EXPECT_EQ(rt.read_buffer(1, 0, 0).status().code(), absl::StatusCode::kNotFound);  // freed this time

  // A budget smaller than one program still holds the one just loaded.
  WorkerRuntime tiny(WorkerRuntimeOptions{.device = "CPU:0", .target = "test", .threads = 1, .max_program_bytes = 1});
  ASSERT_TRUE(tiny.load_program("k1", k1.object, k1.abi.serialize()).ok());
  unloaded.clear();
  ASSERT_TRUE(tiny.load_program("k2", k2.object, k2.abi.serialize(), &unloaded).ok());
  EXPECT_EQ(unloaded, std::vector<std::string>{"k1"});
  EXPECT_TRUE(tiny.has_program("k2"));
  EXPECT_EQ(tiny.info().programs, 1u);
}

// The adapter over a real (in-process) gRPC server: chunked streaming both ways.
TEST(WorkerService, StreamsBuffersInChunks) {
  WorkerRuntime rt = make_runtime();
  WorkerService service(&rt);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_TRUE(server);
  ASSERT_NE(port, 0);
  auto stub = wv1::Worker::NewStub(grpc::CreateChannel(cat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

  {
    grpc::ClientContext ctx;
    wv1::AllocBufferRequest req;
    req.set_buffer_id(5);
    req.set_bytes(10000);
    wv1::AllocBufferResponse resp;
    ASSERT_TRUE(stub->AllocBuffer(&ctx, req, &resp).ok());
  }
  std::string data(10000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 1);
  {
    grpc::ClientContext ctx;
    wv1::WriteBufferResponse resp;
    auto w = stub->WriteBuffer(&ctx, &resp);
    for (size_t off = 0; off < data.size(); off += 3000) {
      wv1::WriteChunk c;
      if (off == 0) c.set_buffer_id(5);
      c.set_offset(off);
      c.set_data(data.substr(off, 3000));
      ASSERT_TRUE(w->Write(c));
    }
    w->WritesDone();
    grpc::Status st = w->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.bytes(), data.size());
  }
  {
    grpc::ClientContext ctx;
    wv1::ReadBufferRequest req;
    req.set_buffer_id(5);
    req.set_offset(100);
    req.set_chunk_bytes(777);
    auto r = stub->ReadBuffer(&ctx, req);
    wv1::ReadChunk c;
    std::string got;
    int chunks = 0;
    while (r->Read(&c)) {
      EXPECT_EQ(c.offset(), 100 + got.size());
      got += c.data();
      ++chunks;
    }
    ASSERT_TRUE(r->Finish().ok());
    EXPECT_EQ(got, data.substr(100));
    EXPECT_EQ(chunks, (9900 + 776) / 777);
  }
  {  // a chunk past the end fails the whole write, with the code and the numbers
    grpc::ClientContext ctx;
    wv1::WriteBufferResponse resp;
    auto w = stub->WriteBuffer(&ctx, &resp);
    wv1::WriteChunk c;
    c.set_buffer_id(5);
    c.set_offset(9999);
    c.set_data("ab");
    w->Write(c);
    w->WritesDone();
    grpc::Status st = w->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::OUT_OF_RANGE);
    EXPECT_NE(st.error_message().find("buffer 5"), std::string::npos) << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    wv1::ExecuteRequest req;
    auto* l = req.add_launches();
    l->set_key("absent");
    wv1::ExecuteResponse resp;
    grpc::Status st = stub->Execute(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();  // done nothing, saying what to load first
    ASSERT_EQ(resp.missing_programs_size(), 1);
    EXPECT_EQ(resp.missing_programs(0), "absent");
  }
  {
    grpc::ClientContext ctx;
    wv1::InfoResponse info;
    ASSERT_TRUE(stub->Info(&ctx, wv1::InfoRequest(), &info).ok());
    EXPECT_EQ(info.device(), "CPU:0");
    EXPECT_EQ(info.buffers(), 1u);
    EXPECT_EQ(info.pid(), getpid());
  }
  server->Shutdown();
}

}  // namespace
}  // namespace uop

namespace uop {
namespace {

// The execute lane's handler, called as a lane slot thread calls it: one buffer of slot
// bytes holds the request and then the reply (lane_messages.h's framing).
struct LaneSlot {
  explicit LaneSlot(size_t bytes) : buf(bytes, '\0') {}
  // `abandoned` as the lane would say it: uopd stopped waiting.
  absl::StatusOr<std::string> call(const ExecLane::Handler& h, std::string_view request,
                                   const std::function<bool()>& abandoned = [] { return false; }) {
    std::memcpy(buf.data(), request.data(), request.size());
    auto n = h(std::string_view(buf.data(), request.size()), std::span<char>(buf.data(), buf.size()), abandoned,
               absl::InfiniteFuture());
    if (!n.ok()) return n.status();
    return buf.substr(0, *n);
  }
  std::string buf;
};

std::string lane_write(uint64_t id, uint64_t offset, std::string_view data) {
  std::string r(lane::kWriteHeader, '\0');
  lane::encode_write_header(std::span<char>(r.data(), r.size()), id, offset);
  return r.append(data);
}

std::string lane_read(uint64_t id, uint64_t offset, uint64_t length) {
  std::string r(lane::kReadRequest, '\0');
  lane::encode_read(std::span<char>(r.data(), r.size()), {id, offset, length});
  return r;
}

std::string lane_execute(const wv1::ExecuteRequest& req) {
  return std::string(1, static_cast<char>(lane::Kind::Execute)) + req.SerializeAsString();
}

std::string lane_message(lane::Kind kind, const google::protobuf::MessageLite& req) {
  return std::string(1, static_cast<char>(kind)) + req.SerializeAsString();
}

// Writes and reads at offsets reach the runtime's buffers as write_buffer / read_buffer
// would, with their errors (unknown buffer, out of range) as the runtime says them.
TEST(LaneHandler, WritesAndReadsBuffersAtOffsets) {
  WorkerRuntime rt = make_runtime();
  ExecLane::Handler h = lane_handler(&rt);
  LaneSlot slot(4096);
  ASSERT_TRUE(rt.alloc_buffer(5, 256).ok());
  std::string data(100, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 1);
  auto w = slot.call(h, lane_write(5, 100, data));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, "");
  auto whole = rt.read_buffer(5, 0, 0);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->bytes().substr(100, 100), data);
  EXPECT_EQ(whole->bytes().substr(0, 100), std::string(100, '\0'));  // untouched, still zero

  auto r = slot.call(h, lane_read(5, 150, 50));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, data.substr(50, 50));

  EXPECT_EQ(slot.call(h, lane_write(6, 0, "x")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(slot.call(h, lane_write(5, 250, "0123456789")).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(slot.call(h, lane_read(6, 0, 4)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(slot.call(h, lane_read(5, 200, 100)).status().code(), absl::StatusCode::kOutOfRange);
}

// What is not a lane request, or asks for more than the slot holds, is refused with
// INVALID_ARGUMENT (RESOURCE_EXHAUSTED for an Execute whose reply would not fit), and the
// buffers are untouched.
TEST(LaneHandler, RefusesMalformedRequests) {
  WorkerRuntime rt = make_runtime();
  ExecLane::Handler h = lane_handler(&rt);
  LaneSlot slot(300);
  ASSERT_TRUE(rt.alloc_buffer(5, 1000).ok());
  ASSERT_TRUE(rt.write_buffer(5, 0, std::string(1000, 'a')).ok());
  for (const std::string& bad : {std::string(), std::string("\x09hello"), std::string("\x02short"),
                                 lane_read(5, 0, 8).substr(0, 20), lane_read(5, 0, 8) + "x", lane_read(5, 0, 0),
                                 lane_read(5, 0, 301), std::string("\x01not a protobuf \xff\xff\xff"),
                                 std::string("\x04not a protobuf \xff\xff\xff"), std::string("\x05not a protobuf \xff\xff\xff"),
                                 std::string("\x06")}) {
    auto r = slot.call(h, bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << absl::CEscape(bad) << ": " << r.status();
  }
  // An Execute reading back 1000 bytes into a 300-byte slot.
  wv1::ExecuteRequest req;
  req.add_read_back(5);
  auto r = slot.call(h, lane_execute(req));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  auto still = rt.read_buffer(5, 0, 0);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->bytes(), std::string(1000, 'a'));
}

// An Execute through the lane runs as the gRPC Execute does: allocations with their
// data, the launch, the outputs read back (parsed from the reply), the frees.
TEST(LaneHandler, ExecutesABatch) {
  WorkerRuntime rt = make_runtime();
  CpuArtifact art = scale_kernel(5);
  ASSERT_TRUE(rt.load_program("k5", art.object, art.abi.serialize()).ok());
  ExecLane::Handler h = lane_handler(&rt);
  LaneSlot slot(8192);
  const std::vector<int32_t> in = iota_input();
  wv1::ExecuteRequest req;
  wv1::BufferInit* a = req.add_allocs();
  a->set_buffer_id(10);
  a->set_bytes(N * 4);
  a->set_data(bytes_of(in));
  a = req.add_allocs();
  a->set_buffer_id(11);
  a->set_bytes(N * 4);
  wv1::Launch* l = req.add_launches();
  l->set_key("k5");
  l->add_buffer_ids(11);
  l->add_buffer_ids(10);
  l->add_vars(N);
  req.add_read_back(11);
  req.add_free_after(10);
  req.add_free_after(11);
  auto r = slot.call(h, lane_execute(req));
  ASSERT_TRUE(r.ok()) << r.status();
  wv1::ExecuteResponse resp;
  ASSERT_TRUE(resp.ParseFromString(*r));
  ASSERT_EQ(resp.outputs_size(), 1);
  std::vector<int32_t> out = ints_of(resp.outputs(0));
  ASSERT_EQ(out.size(), static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) EXPECT_EQ(out[i], in[i] * 5 + i) << i;
  EXPECT_EQ(rt.info().buffers, 0u);
  // A launch of a program not loaded: as over gRPC, nothing happens (no allocation), and
  // the answer names the program.
  req.mutable_launches(0)->set_key("missing");
  r = slot.call(h, lane_execute(req));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(resp.ParseFromString(*r));
  ASSERT_EQ(resp.missing_programs_size(), 1);
  EXPECT_EQ(resp.missing_programs(0), "missing");
  EXPECT_EQ(resp.outputs_size(), 0);
  EXPECT_EQ(rt.info().buffers, 0u);
}

// A Free through the lane frees what FreeBuffers would (unknown ids skipped) and says how
// many it freed.
TEST(LaneHandler, FreesBuffers) {
  WorkerRuntime rt = make_runtime();
  ExecLane::Handler h = lane_handler(&rt);
  LaneSlot slot(4096);
  for (uint64_t id : {1, 2, 3}) ASSERT_TRUE(rt.alloc_buffer(id, 64).ok());
  wv1::FreeBuffersRequest req;
  for (uint64_t id : {1, 3, 99}) req.add_buffer_ids(id);
  auto r = slot.call(h, lane_message(lane::Kind::Free, req));
  ASSERT_TRUE(r.ok()) << r.status();
  wv1::FreeBuffersResponse resp;
  ASSERT_TRUE(resp.ParseFromString(*r));
  EXPECT_EQ(resp.freed(), 2u);
  EXPECT_EQ(rt.info().buffers, 1u);
  EXPECT_TRUE(rt.read_buffer(2, 0, 0).ok());
  EXPECT_EQ(rt.read_buffer(1, 0, 0).status().code(), absl::StatusCode::kNotFound);
}

// A Collective through the lane runs as the gRPC Collective does: a member alone reduces
// nothing and answers, an unknown buffer is NOT_FOUND naming it, and a member whose peer
// never comes stops waiting once uopd abandons the call (CANCELLED), long before the
// collective's own timeout.
TEST(LaneHandler, RunsACollectiveAndStopsWhenAbandoned) {
  WorkerRuntime rt = make_runtime();
  ExecLane::Handler h = lane_handler(&rt);
  LaneSlot slot(4096);
  ASSERT_TRUE(rt.alloc_buffer(7, 4 * 16).ok());
  const std::vector<float> ones(16, 1.0f);
  ASSERT_TRUE(rt.write_buffer(7, 0, std::string_view(reinterpret_cast<const char*>(ones.data()), 64)).ok());
  wv1::CollectiveRequest req;
  req.set_group("lane-handler-test-" + std::to_string(getpid()));
  req.set_rank(0);
  req.set_size(1);
  req.set_op("add");
  req.set_dtype("float32");
  req.set_elements(16);
  req.set_buffer_id(7);
  req.set_transport("shm");
  auto r = slot.call(h, lane_message(lane::Kind::Collective, req));
  ASSERT_TRUE(r.ok()) << r.status();
  wv1::CollectiveResponse resp;
  EXPECT_TRUE(resp.ParseFromString(*r));
  auto after = rt.read_buffer(7, 0, 0);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->bytes(), std::string(reinterpret_cast<const char*>(ones.data()), 64));

  req.set_buffer_id(8);
  r = slot.call(h, lane_message(lane::Kind::Collective, req));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_NE(r.status().message().find("8"), std::string::npos) << r.status();

  // Two members, the second never coming; the call is abandoned after a few questions.
  req.set_buffer_id(7);
  req.set_size(2);
  req.set_group("lane-handler-test-alone-" + std::to_string(getpid()));
  req.set_timeout_ms(600000);
  std::atomic<int> asked{0};
  r = slot.call(h, lane_message(lane::Kind::Collective, req), [&] { return asked.fetch_add(1) >= 3; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_GE(asked.load(), 4);
}

}  // namespace
}  // namespace uop
