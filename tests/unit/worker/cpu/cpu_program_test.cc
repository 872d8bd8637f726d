// The CPU runtime: the thread pool, and loading, running and unloading compiled kernels
// (many, concurrently, with the same symbol name), and refusing bad launches.
#include "worker/cpu/cpu_program.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "tests/unit/compiler/codegen/linear_builder.h"

namespace uop {
namespace {

using testing::LinearBuilder;

TEST(ThreadPool, RunsEveryTaskOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads=" << threads << " n=" << n;
    }
  }
  ThreadPool zero(0);
  EXPECT_EQ(zero.size(), 1);
}

TEST(ThreadPool, ConcurrentCallersAllFinish) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 6; ++c)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) pool.parallel_for(13, [&](int64_t i) { total.fetch_add(i + 1); });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 6 * 200 * (13 * 14 / 2));
}

// out[i] = in[i] * k + i, k baked into the code so that programs differ.
CpuArtifact scale_kernel(int k) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::int32, 64);
  const UOp* in = lb.param(1, dtypes::int32, 64);
  const UOp* n = lb.var("n", 0, 64);
  const UOp* r = lb.range(n, 0, AxisType::Thread);
  const UOp* x = lb.load(in, lb.index(in, r));
  const UOp* y = lb.alu(Op::ADD, {lb.alu(Op::MUL, {x, lb.cnst(dtypes::int32, ConstValue::Int(k))}), lb.cast(r, dtypes::int32)});
  lb.end(lb.store(lb.index(out, r), y), r);
  auto art = compile_cpu(lb.linear(), CpuTarget::host());
  EXPECT_TRUE(art.ok()) << art.status();
  return art.ok() ? *std::move(art) : CpuArtifact{};
}

void expect_runs(const CpuProgram& prog, int k, ThreadPool* pool = nullptr) {
  std::vector<int32_t> out(64, -1), in(64);
  for (int i = 0; i < 64; ++i) in[i] = i * 3 - 50;
  void* bufs[] = {out.data(), in.data()};
  ASSERT_TRUE(prog.run(bufs, std::array<int64_t, 1>{64}, pool).ok());
  for (int i = 0; i < 64; ++i) ASSERT_EQ(out[i], in[i] * k + i) << "k=" << k;
}

size_t count_lines(const char* path) {
  std::ifstream f(path);
  std::string line;
  size_t n = 0;
  while (std::getline(f, line)) ++n;
  return n;
}

TEST(CpuProgram, LoadRunUnloadManyDoesNotLeak) {
  CpuArtifact art = scale_kernel(3);
  for (int i = 0; i < 100; ++i) {  // warm up allocator and JIT state
    auto p = CpuProgram::load(art.object, art.abi);
    ASSERT_TRUE(p.ok()) << p.status();
    expect_runs(**p, 3);
  }
  size_t maps_before = count_lines("/proc/self/maps");
  for (int i = 0; i < 2000; ++i) {
    auto p = CpuProgram::load(art.object, art.abi);
    ASSERT_TRUE(p.ok()) << p.status();
    if (i % 100 == 0) expect_runs(**p, 3);
  }
  // Each program maps its own code pages; kept programs would add thousands of mappings.
  EXPECT_LT(count_lines("/proc/self/maps"), maps_before + 50);
}

TEST(CpuProgram, ManyProgramsWithTheSameSymbolAtOnce) {
  std::vector<std::unique_ptr<CpuProgram>> progs;
  for (int k = 0; k < 40; ++k) {
    CpuArtifact art = scale_kernel(k);
    auto p = CpuProgram::load(art.object, art.abi);
    ASSERT_TRUE(p.ok()) << p.status();
    progs.push_back(*std::move(p));
  }
  ThreadPool pool(4);
  for (int k = 0; k < 40; ++k) expect_runs(*progs[k], k, &pool);
  progs.erase(progs.begin(), progs.begin() + 20);  // unloading some leaves the others intact
  for (int k = 20; k < 40; ++k) expect_runs(*progs[k - 20], k);
}

TEST(CpuProgram, ConcurrentCompilesAndLoads) {
  std::vector<CpuArtifact> arts(4);
  {
    std::vector<std::thread> ts;
    for (int k = 0; k < 4; ++k) ts.emplace_back([&, k] { arts[k] = scale_kernel(k + 2); });
    for (auto& t : ts) t.join();
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&, t] {
      for (int rep = 0; rep < 25; ++rep) {
        int k = (t + rep) % 4;
        auto p = CpuProgram::load(arts[k].object, arts[k].abi);
        if (!p.ok()) {
          failures.fetch_add(1);
          continue;
        }
        std::vector<int32_t> out(64), in(64, 1);
        void* bufs[] = {out.data(), in.data()};
        if (!(*p)->run(bufs, std::array<int64_t, 1>{64}, nullptr).ok() || out[10] != k + 2 + 10) failures.fetch_add(1);
      }
    });
  for (auto& th : ts) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(CpuProgram, RefusesBadLaunches) {
  CpuArtifact art = scale_kernel(2);
  auto p = CpuProgram::load(art.object, art.abi);
  ASSERT_TRUE(p.ok()) << p.status();
  const CpuProgram& prog = **p;
  std::vector<int32_t> out(64), in(64);
  void* two[] = {out.data(), in.data()};
  void* one[] = {out.data()};
  void* three[] = {out.data(), in.data(), in.data()};
  void* null_in[] = {out.data(), nullptr};
  void* aliased[] = {out.data(), out.data() + 10};
  void* misaligned[] = {out.data(), reinterpret_cast<char*>(in.data()) + 1};
  auto code = [](absl::Status s) { return s.code(); };
  const auto kBad = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(prog.run(one, std::array<int64_t, 1>{64}, nullptr)), kBad);
  EXPECT_EQ(code(prog.run(three, std::array<int64_t, 1>{64}, nullptr)), kBad);
  EXPECT_EQ(code(prog.run(two, {}, nullptr)), kBad);
  EXPECT_EQ(code(prog.run(two, std::array<int64_t, 2>{64, 1}, nullptr)), kBad);
  EXPECT_EQ(code(prog.run(two, std::array<int64_t, 1>{65}, nullptr)), kBad);
  EXPECT_EQ(code(prog.run(two, std::array<int64_t, 1>{-1}, nullptr)), kBad);
  EXPECT_EQ(code(prog.run(null_in, std::array<int64_t, 1>{64}, nullptr)), kBad);
  EXPECT_EQ(code(prog.run(aliased, std::array<int64_t, 1>{64}, nullptr)), kBad);
  EXPECT_EQ(code(prog.run(misaligned, std::array<int64_t, 1>{64}, nullptr)), kBad);
  EXPECT_TRUE(prog.run(two, std::array<int64_t, 1>{0}, nullptr).ok());
  EXPECT_TRUE(prog.run(two, std::array<int64_t, 1>{64}, nullptr).ok());
}

TEST(CpuProgram, RefusesObjectsThatDoNotLink) {
  CpuArtifact art = scale_kernel(2);
  EXPECT_EQ(CpuProgram::load("", art.abi).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CpuProgram::load("not an object file at all", art.abi).status().code(), absl::StatusCode::kInvalidArgument);
  std::string cut = art.object.substr(0, art.object.size() / 2);
  EXPECT_FALSE(CpuProgram::load(cut, art.abi).ok());
}

}  // namespace
}  // namespace uop
