// Allreduce between two worker-like processes, the shared-memory ring against Gloo over
// loopback TCP in the same run:
//   BM_Allreduce/<transport>/<bytes>   float32 ADD of <bytes> in place, 1 KiB to 256 MiB
//
// Figures are nccl-tests': algbw = bytes / time, busbw = algbw x 2 (n - 1) / n (with n = 2
// the same number; what a ring moves per link). The shm rows carry ratio_vs_gloo, their
// busbw over Gloo's at the same size, measured earlier in the same run. Groups are joined
// (shm) or connected (Gloo) before the timed loop, as a training loop reuses its group;
// the per-call join of run_collective is BM_AllreduceWithJoin/shm.
//
// Rank 0 is this process; rank 1 is a child forked by main() before Google Benchmark or
// gRPC start, and the Rendezvous service another child. Each benchmark call tells rank 1
// over a pipe what to run and how many times (state.max_iterations, known before the
// loop), then both loop; rank 1 answers on a second pipe when done. Not part of ctest:
// speed is measured here, never asserted.
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "compiler/support/strings.h"
#include "tests/unit/server/open_groups_rendezvous.h"
#include "worker/collectives/collective.h"
#include "worker/collectives/gloo_allreduce.h"
#include "worker/collectives/shm_ring.h"

namespace uop {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMembers = 2;

struct Command {
  char transport[16];  // "shm", "gloo", "shm_join", or "" to quit
  char group[96];
  uint64_t bytes;
  int64_t iterations;
};
struct Reply {
  int code;
  char message[512];
};

// UOPD_BENCH_SHM_SLOT_KIB / UOPD_BENCH_SHM_SLOTS override the ring's message size and
// depth (for tuning; rank 1 inherits them with the environment).
ShmRingOptions shm_options(const std::string& group, int rank) {
  ShmRingOptions o;
  o.group = group;
  o.rank = rank;
  o.size = kMembers;
  if (const char* kib = getenv("UOPD_BENCH_SHM_SLOT_KIB")) o.slot_bytes = std::strtoull(kib, nullptr, 10) << 10;
  if (const char* slots = getenv("UOPD_BENCH_SHM_SLOTS")) o.slots = std::atoi(slots);
  return o;
}

int g_to_peer = -1, g_from_peer = -1;
pid_t g_peer = -1, g_rendezvous_pid = -1;
std::string g_rendezvous;

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w <= 0) return false;
    c += w, n -= static_cast<size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r, n -= static_cast<size_t>(r);
  }
  return true;
}

// One member's loop of `iterations` allreduces of `bytes` over `transport`, group joined
// first (except shm_join, which joins in every call as the Collective RPC does).
absl::Status run_member(const std::string& transport, const std::string& group, int rank, uint64_t bytes,
                        int64_t iterations, float* data) {
  const uint64_t elements = bytes / sizeof(float);
  if (transport == "shm") {
    auto ring = ShmRing::join(shm_options(group, rank));
    if (!ring.ok()) return ring.status();
    for (int64_t i = 0; i < iterations; ++i) {
      if (absl::Status st = (*ring)->allreduce(data, elements, ReduceOp::Add, Scalar::Float32); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (transport == "gloo") {
    GlooOptions o;
    o.group = group;
    o.rank = rank;
    o.size = kMembers;
    o.rendezvous = g_rendezvous;
    auto g = GlooGroup::connect(o);
    if (!g.ok()) return g.status();
    for (int64_t i = 0; i < iterations; ++i) {
      if (absl::Status st = (*g)->allreduce(data, elements, ReduceOp::Add, Scalar::Float32); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (transport == "shm_join") {
    for (int64_t i = 0; i < iterations; ++i) {
      CollectiveSpec s;
      s.group = cat(group, "/", i);
      s.rank = rank;
      s.size = kMembers;
      s.op = "add";
      s.dtype = "float32";
      s.elements = elements;
      s.transport = "shm";
      if (absl::Status st = run_collective(s, data, bytes); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(cat("no transport ", transport));
}

// Rank 1: runs what rank 0 asks for until the pipe closes or says quit.
void peer_main(int in, int out) {
  std::vector<float> data;
  Command c;
  while (read_all(in, &c, sizeof c) && c.transport[0]) {
    data.assign(c.bytes / sizeof(float), 0.0f);
    absl::Status st = run_member(c.transport, c.group, 1, c.bytes, c.iterations, data.data());
    Reply r{};
    r.code = static_cast<int>(st.code());
    std::snprintf(r.message, sizeof r.message, "%s", std::string(st.message()).c_str());
    if (!write_all(out, &r, sizeof r)) break;
  }
}

// Bus bandwidth (bytes/s) of the last finished run of each (transport, bytes): the last
// run of a benchmark is the one Google Benchmark reports.
std::map<std::pair<std::string, uint64_t>, double>& busbw_of() {
  static auto* m = new std::map<std::pair<std::string, uint64_t>, double>();
  return *m;
}

void BM_Allreduce(benchmark::State& state, const std::string& transport) {
  static int calls = 0;
  const uint64_t bytes = static_cast<uint64_t>(state.range(0));
  const std::string group = cat("bench-", getpid(), "-", transport, "-", bytes, "-", ++calls);
  Command c{};
  std::snprintf(c.transport, sizeof c.transport, "%s", transport.c_str());
  std::snprintf(c.group, sizeof c.group, "%s", group.c_str());
  c.bytes = bytes;
  c.iterations = static_cast<int64_t>(state.max_iterations);
  if (!write_all(g_to_peer, &c, sizeof c)) return state.SkipWithError("rank 1 is gone");
  std::vector<float> data(bytes / sizeof(float), 0.0f);

  // Join or connect outside the timed loop (except shm_join, where joining is the point).
  std::unique_ptr<ShmRing> ring;
  std::unique_ptr<GlooGroup> gloo;
  absl::Status st;
  if (transport == "shm") {
    auto r = ShmRing::join(shm_options(group, 0));
    if (r.ok()) ring = std::move(*r); else st = r.status();
  } else if (transport == "gloo") {
    GlooOptions o;
    o.group = group;
    o.rank = 0;
    o.size = kMembers;
    o.rendezvous = g_rendezvous;
    auto g = GlooGroup::connect(o);
    if (g.ok()) gloo = std::move(*g); else st = g.status();
  }
  const uint64_t elements = bytes / sizeof(float);
  int64_t i = 0;
  Clock::time_point t0 = Clock::now();
  for (auto _ : state) {
    if (!st.ok()) break;
    if (ring) {
      st = ring->allreduce(data.data(), elements, ReduceOp::Add, Scalar::Float32);
    } else if (gloo) {
      st = gloo->allreduce(data.data(), elements, ReduceOp::Add, Scalar::Float32);
    } else {
      CollectiveSpec s;
      s.group = cat(group, "/", i);
      s.rank = 0;
      s.size = kMembers;
      s.op = "add";
      s.dtype = "float32";
      s.elements = elements;
      s.transport = "shm";
      st = run_collective(s, data.data(), bytes);
    }
    ++i;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  Reply r{};
  if (!read_all(g_from_peer, &r, sizeof r)) return state.SkipWithError("rank 1 is gone");
  if (!st.ok()) return state.SkipWithError(st.ToString().c_str());
  if (r.code != 0) return state.SkipWithError(cat("rank 1: ", r.message).c_str());

  const double algbw = static_cast<double>(bytes) * static_cast<double>(i) / seconds;
  const double busbw = algbw * 2.0 * (kMembers - 1) / kMembers;
  busbw_of()[{transport, bytes}] = busbw;
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * static_cast<int64_t>(i));
  state.counters["algbw_GBps"] = algbw / 1e9;
  state.counters["busbw_GBps"] = busbw / 1e9;
  if (transport != "gloo") {
    auto g = busbw_of().find({"gloo", bytes});
    if (g != busbw_of().end() && g->second > 0) state.counters["ratio_vs_gloo"] = busbw / g->second;
  }
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t s = 1 << 10; s <= int64_t{256} << 20; s *= 4) b->Arg(s);
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

// The Rendezvous service in a child of its own (a process forked from one that started
// gRPC cannot use it); its port comes back through shared memory.
bool start_rendezvous() {
  auto* port = static_cast<std::atomic<int>*>(
      mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (port) std::atomic<int>(0);
  g_rendezvous_pid = fork();
  if (g_rendezvous_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    testing::OpenGroupsRendezvous service;
    grpc::ServerBuilder b;
    int bound = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &bound);
    b.RegisterService(&service);
    auto server = b.BuildAndStart();
    port->store(server ? bound : -1);
    if (server)
      for (;;) pause();
    _exit(1);
  }
  while (port->load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (port->load() < 0) return false;
  g_rendezvous = cat("127.0.0.1:", port->load());
  return true;
}

bool start_peer() {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return false;
  g_peer = fork();
  if (g_peer == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(down[1]);
    close(up[0]);
    peer_main(down[0], up[1]);
    _exit(0);
  }
  close(down[0]);
  close(up[1]);
  g_to_peer = down[1];
  g_from_peer = up[0];
  return g_peer > 0;
}

}  // namespace
}  // namespace uop

int main(int argc, char** argv) {
  using namespace uop;
  // Children first: neither gRPC nor Gloo's threads may exist in the process they fork from.
  if (!start_rendezvous() || !start_peer()) {
    std::fprintf(stderr, "bench_allreduce: cannot start the rendezvous or rank 1\n");
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  // Gloo first, so that each shm row finds Gloo's figure for its size.
  benchmark::RegisterBenchmark("BM_Allreduce/gloo", BM_Allreduce, std::string("gloo"))->Apply(sizes);
  benchmark::RegisterBenchmark("BM_Allreduce/shm", BM_Allreduce, std::string("shm"))->Apply(sizes);
  benchmark::RegisterBenchmark("BM_AllreduceWithJoin/shm", BM_Allreduce, std::string("shm_join"))->Apply(sizes);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  Command quit{};
  write_all(g_to_peer, &quit, sizeof quit);
  close(g_to_peer);
  waitpid(g_peer, nullptr, 0);
  kill(g_rendezvous_pid, SIGKILL);
  waitpid(g_rendezvous_pid, nullptr, 0);
  return 0;
}
