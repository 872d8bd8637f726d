// How long a client's small uncached Run takes while two other clients bomb uopd's
// compile pool, against the same Run on an idle server (ratio_vs_idle), in the same run.
//
//   BM_SmallRunDuringBomb/legal   each bomber sends a graph of 48 distinct kernels of
//                                 ~2400 ops: legal, under every bound, just a lot of LLVM
//   BM_SmallRunDuringBomb/huge    each sends one kernel of 30,000 leaves (120,000 ops),
//                                 the probe: refused over --max-kernel-ops
//
// One uopd (memory cache only, 2 compile threads) for the binary: $UOPD_BENCH_UOPD when
// set (to measure another build, e.g. one from before the fair pool), else the build's.
// Each iteration starts both bombers on connections of their own, waits until the
// server has started compiling (Stats.compiles grew by 2, or both bombs were answered),
// then times the small Run, then cancels the bombers. A server whose compiles do not
// stop when their client leaves makes later iterations wait for the last one's left-overs
// too: run one iteration against such a build ($UOPD_BENCH_ITERATIONS=1, default 3).
// Not part of ctest: speed is measured here, never asserted.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"
#include "tests/e2e/background_call.h"
#include "tests/unit/compiler/bomb_graphs.h"

#ifndef UOPD_BINARY
#error "UOPD_BINARY (the path of the uopd to start) must be defined by the build"
#endif

namespace uop {

using Clock = std::chrono::steady_clock;
namespace pb = ::uopd::v1;

namespace {

client::EmbeddedServer& server() {
  static std::unique_ptr<client::EmbeddedServer> s = [] {
    const char* other = std::getenv("UOPD_BENCH_UOPD");
    auto started = client::EmbeddedServer::start(other && *other ? other : UOPD_BINARY,
                                                 {"--workers=1", "--compile-threads=2", "--cache-dir="});
    if (!started.ok()) {
      std::fprintf(stderr, "bench_compile_bomb: %s\n", std::string(started.status().message()).c_str());
      std::exit(1);
    }
    return std::move(*started);
  }();
  return *s;
}

std::unique_ptr<client::Client> connect() {
  auto c = client::Client::connect({.address = server().address(), .deadline = absl::Minutes(10)});
  if (!c.ok()) return nullptr;
  return std::move(*c);
}

// The small Run: x * x + salt on 16 floats, a graph (and kernel) never seen before.
absl::StatusOr<double> small_run_seconds(client::Session& session, double salt) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {16});
  const UOp* root = tb.sink({tb.alu(Op::ADD, {tb.alu(Op::MUL, {x, x}), tb.full(Scalar::Float32, salt, {16})})});
  auto t0 = Clock::now();
  auto r = session.run(root, {}, {{tb.buffer_of(x), HostTensor::random(Scalar::Float32, {16}, 1)}});
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!r.ok()) return r.status();
  return s;
}

pb::CompileRequest compile_request(const UOp* root) {
  pb::CompileRequest req;
  encode_proto(root, {}, req.mutable_graph());
  return req;
}

}  // namespace

void BM_SmallRunDuringBomb(benchmark::State& state, int kernels, int leaves) {
  auto observer = connect();
  auto small = connect();
  if (!observer || !small) return state.SkipWithError("cannot connect");
  auto session = small->create_session();
  if (!session.ok()) return state.SkipWithError(std::string(session.status().message()).c_str());
  static double salt = 0.25;
  std::vector<double> idle, bombed;
  for (auto _ : state) {
    auto alone = small_run_seconds(*session, salt += 1);
    if (!alone.ok()) return state.SkipWithError(std::string(alone.status().message()).c_str());
    idle.push_back(*alone);

    Graph ga, gb;
    TensorBuilder ta(ga), tb(gb);
    const UOp* a = testing::sums_of_leaves(ta, kernels, leaves, salt += 1000);
    const UOp* b = testing::sums_of_leaves(tb, kernels, leaves, salt += 1000);
    auto before = observer->stats();
    if (!before.ok()) return state.SkipWithError("stats");
    testing::BackgroundCall bomb_a(server().address(), "", compile_request(a), &pb::Uopd::Stub::Compile);
    testing::BackgroundCall bomb_b(server().address(), "", compile_request(b), &pb::Uopd::Stub::Compile);
    while (!(bomb_a.done() && bomb_b.done())) {
      auto now = observer->stats();
      if (now.ok() && now->compiles >= before->compiles + 2) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    auto during = small_run_seconds(*session, salt += 1);
    if (!during.ok()) return state.SkipWithError(std::string(during.status().message()).c_str());
    state.SetIterationTime(*during);
    bombed.push_back(*during);
    state.counters["bomb_refused"] = bomb_a.done() && !bomb_a.finish().ok();
    bomb_a.cancel();
    bomb_b.cancel();
  }
  double i = 0, b = 0;
  for (double v : idle) i += v;
  for (double v : bombed) b += v;
  state.counters["idle_run_ms"] = 1000 * i / idle.size();
  state.counters["bombed_run_ms"] = 1000 * b / bombed.size();
  state.counters["ratio_vs_idle"] = b / i;
}
}  // namespace uop

int main(int argc, char** argv) {
  const char* n = std::getenv("UOPD_BENCH_ITERATIONS");
  const int iterations = n && std::atoi(n) > 0 ? std::atoi(n) : 3;
  for (auto [name, kernels, leaves] : {std::tuple{"BM_SmallRunDuringBomb/legal", 48, 600},
                                       std::tuple{"BM_SmallRunDuringBomb/huge", 1, 30000}})
    benchmark::RegisterBenchmark(name, [kernels = kernels, leaves = leaves](benchmark::State& st) {
      uop::BM_SmallRunDuringBomb(st, kernels, leaves);
    })->Iterations(iterations)->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
