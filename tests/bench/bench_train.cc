// A data-parallel training step through uopd (client/demo/spirals.h: an MLP on two
// spirals, the batch sharded over the devices, the gradients allreduced) and where its
// time goes, as counters per step:
//   plan_ms       the scheduler finding the graph's plan (a plan cache hit after step 1)
//   compile_ms    every kernel through the compile cache (all hits after step 1)
//   run_ms        the kernels on the workers, devices side by side
//   allreduce_ms  the collectives between them (shared-memory ring, one host)
//   client_ms     building the step's graph and its gradients on the client
//   other_ms      the rest of the step's wall time: the Run's transport, encoding, the
//                 loss download
//   allreduce_share  allreduce_ms / step time
// and the first (cold) step of a fresh server, whose kernels all compile, as cold_*.
// One real uopd with three embedded workers, started by main(); BM_TrainStep/N uses N of
// them. Not part of ctest: speed is measured here, never asserted.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/demo/spirals.h"
#include "client/embedded_server.h"
#include "compiler/support/strings.h"

#ifndef UOPD_BINARY
#error "UOPD_BINARY (the path of the uopd to start) must be defined by the build"
#endif

namespace uop {
namespace {

struct Service {
  std::unique_ptr<client::EmbeddedServer> proc;
  std::unique_ptr<client::Client> client;
};
Service* g_service = nullptr;  // started by main(): EmbeddedServer must outlive its starting thread

void BM_TrainStep(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(0));
  demo::TrainOptions opts;
  opts.devices.clear();
  for (int i = 0; i < devices; ++i) opts.devices.push_back(cat("CPU:", i));
  opts.points_per_class = 256;
  opts.hidden = 32;
  auto session = g_service->client->create_session(opts.devices);
  if (!session.ok()) return state.SkipWithError(session.status().ToString().c_str());
  demo::SpiralsTrainer trainer(*session, opts);
  auto first = trainer.step();
  if (!first.ok()) return state.SkipWithError(first.status().ToString().c_str());
  // Google Benchmark calls this more than once per argument: only the first call's first
  // step meets a server that has never seen the graph (each device count is its own graph).
  static std::map<int, demo::StepReport> cold_steps;
  const demo::StepReport* cold = &cold_steps.emplace(devices, *first).first->second;
  double plan = 0, compile = 0, run = 0, allreduce = 0, client_side = 0, wall = 0;
  int64_t misses = 0;
  for (auto _ : state) {
    auto r = trainer.step();
    if (!r.ok()) return state.SkipWithError(r.status().ToString().c_str());
    plan += r->plan_ms;
    compile += r->compile_ms;
    run += r->run_ms;
    allreduce += r->allreduce_ms;
    client_side += r->client_ms;
    wall += r->wall_ms;
    misses += r->cache_misses;
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["plan_ms"] = plan / n;
  state.counters["compile_ms"] = compile / n;
  state.counters["run_ms"] = run / n;
  state.counters["allreduce_ms"] = allreduce / n;
  state.counters["client_ms"] = client_side / n;
  state.counters["other_ms"] = (wall - plan - compile - run - allreduce - client_side) / n;
  state.counters["step_ms"] = wall / n;
  state.counters["allreduce_share"] = allreduce / wall;
  state.counters["cache_misses"] = static_cast<double>(misses);  // 0: every warm step was all hits
  state.counters["kernels"] = cold->kernels;
  state.counters["cold_plan_ms"] = cold->plan_ms;
  state.counters["cold_compile_ms"] = cold->compile_ms;
  state.counters["cold_run_ms"] = cold->run_ms;
  state.counters["cold_allreduce_ms"] = cold->allreduce_ms;
  state.counters["cold_step_ms"] = cold->wall_ms;
}
BENCHMARK(BM_TrainStep)->Arg(2)->Arg(3)->MinTime(2)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace uop

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  uop::Service svc;
  // No disk cache: the cold step compiles for real whatever ran before.
  auto proc = uop::client::EmbeddedServer::start(UOPD_BINARY, {"--workers=3", "--cache-dir="});
  if (!proc.ok()) {
    std::fprintf(stderr, "bench_train: cannot start uopd (%s): %s\n", UOPD_BINARY, proc.status().ToString().c_str());
    return 1;
  }
  svc.proc = std::move(*proc);
  uop::client::ClientOptions o;
  o.address = svc.proc->address();
  auto c = uop::client::Client::connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "bench_train: %s\n", c.status().ToString().c_str());
    return 1;
  }
  svc.client = std::move(*c);
  uop::g_service = &svc;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  svc.client.reset();
  int rc = 0;
  if (absl::Status s = svc.proc->stop(); !s.ok()) {
    std::fprintf(stderr, "bench_train: uopd did not stop cleanly: %s\n", s.ToString().c_str());
    rc = 1;
  }
  return rc;
}
