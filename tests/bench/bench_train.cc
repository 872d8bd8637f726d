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
//   p50_step_ms   the median warm step
//   sent_data_bytes, sent_graph_bytes  what the client sent uopd per warm step (Stats):
//                 data uploaded or inline, and graphs (a held graph goes by its digest):
//                 0 and 0 with the batch kept, the batch's bytes and 0 with a new one
//                 per step (BM_TrainStep/2/0/1)
// and the first (cold) step of a fresh server, whose kernels all compile, as cold_*.
// Two models, batch 256: the demo's 2-32-32-2 spirals MLP and a wide 784-1024-1024-10 one
// on random data (7 MiB of gradients). The peer, measured in the same run before uopd
// starts: torch DistributedDataParallel over Gloo, two processes on this host
// (torch_ddp_step.py, python3-torch from deploy/setup.sh --bench), the same MLP, batch and
// SGD; ratio_vs_torch_ddp = p50_step_ms / torch's p50 per warm step, on two devices. One
// thread per uopd worker and per torch process.
// One real uopd with three embedded workers, started by main(); BM_TrainStep/N/M/F uses N
// of them for model M, F=1 with a new batch every step. Not part of ctest: speed is measured
// here, never asserted.
//
//   build/release/tests/bench/bench_train --benchmark_counters_tabular=true
//
// $UOPD_BENCH_UOPD measures another uopd build (its own uop-worker beside it) the same way.
//
// Across hosts: $UOPD_BENCH_ACROSS_HOSTS=HOST:PORT names a uopd whose CPU:0 and CPU:1
// workers are on two other hosts (deploy/cluster.sh --netns up; `--netns bench` runs this
// on its scheduler's host), so its allreduces go over Gloo. BM_TrainStepAcrossHosts/M
// steps model M there and on a peer started here on one host (two embedded workers, Execute
// over gRPC as to remote workers, allreduces over the shared-memory ring), a step on each
// in turn, and reports both p50s and ratio_vs_one_host (across / one host), both
// allreduce_ms, and same_losses (1: every step's loss the same double on both).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "client/client.h"
#include "client/demo/spirals.h"
#include "client/embedded_server.h"
#include "compiler/support/strings.h"

#ifndef TORCH_DDP_SCRIPT
#error "TORCH_DDP_SCRIPT (tests/bench/torch_ddp_step.py) must be defined by the build"
#endif
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
// With $UOPD_BENCH_ACROSS_HOSTS: the uopd there (a client only) and the one-host peer.
Service* g_across = nullptr;
Service* g_one_host = nullptr;

// The models: the demo's spirals MLP, and a wide one whose gradients are megabytes.
struct Model {
  const char* name;
  int64_t inputs, hidden, classes;
};
constexpr Model kModels[] = {{"spirals 2-32-32-2", 2, 32, 2}, {"wide 784-1024-1024-10", 784, 1024, 10}};
constexpr int64_t kBatch = 256;
constexpr int kThreads = 1;  // per uopd worker and per torch process

// The peer: torch DDP over Gloo, two processes (torch_ddp_step.py), its p50 per warm step
// for each model, measured by main() before the benchmarks; 0 where it did not run.
double g_torch_p50[std::size(kModels)] = {};

double torch_ddp_p50(const Model& m) {
  std::string cmd = cat("/usr/bin/python3 ", TORCH_DDP_SCRIPT, " --world 2 --threads ", kThreads, " --batch ", kBatch,
                        " --inputs ", m.inputs, " --hidden ", m.hidden, " --classes ", m.classes,
                        " --steps ", m.hidden > 100 ? 40 : 300, " --warmup ", m.hidden > 100 ? 5 : 30, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return 0;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int rc = pclose(p);
  auto at = out.find("\"p50_ms\": ");
  if (rc != 0 || at == std::string::npos) {
    std::fprintf(stderr, "bench_train: torch DDP peer failed (%s):\n%s\n", cmd.c_str(), out.c_str());
    return 0;
  }
  return std::stod(out.substr(at + 10));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

demo::TrainOptions train_options(int devices, const Model& m) {
  demo::TrainOptions opts;
  opts.devices.clear();
  for (int i = 0; i < devices; ++i) opts.devices.push_back(cat("CPU:", i));
  opts.points_per_class = kBatch / 2;
  opts.inputs = m.inputs;
  opts.hidden = m.hidden;
  opts.classes = m.classes;
  opts.learning_rate = m.hidden > 100 ? 0.05 : 0.5;
  return opts;
}

// Arguments: devices, model (an index into kModels), and 1 for a new batch every step
// (sent inline with the step's Run; 0: one batch kept in the session, as torch's peer).
void BM_TrainStep(benchmark::State& state) {
  const int devices = static_cast<int>(state.range(0));
  const size_t model = static_cast<size_t>(state.range(1));
  const bool fresh = state.range(2) != 0;
  const Model& m = kModels[model];
  demo::TrainOptions opts = train_options(devices, m);
  opts.fresh_batches = fresh;
  state.SetLabel(fresh ? cat(m.name, ", a new batch per step") : std::string(m.name));
  auto session = g_service->client->create_session(opts.devices);
  if (!session.ok()) return state.SkipWithError(session.status().ToString().c_str());
  demo::SpiralsTrainer trainer(*session, opts);
  auto first = trainer.step();
  if (!first.ok()) return state.SkipWithError(first.status().ToString().c_str());
  // Google Benchmark calls this more than once per argument: only the first call's first
  // step meets a server that has never seen the graph (each device count is its own graph).
  static std::map<std::tuple<int, size_t, bool>, demo::StepReport> cold_steps;
  const demo::StepReport* cold = &cold_steps.emplace(std::make_tuple(devices, model, fresh), *first).first->second;
  double plan = 0, compile = 0, run = 0, allreduce = 0, client_side = 0, wall = 0;
  int64_t misses = 0;
  std::vector<double> walls;
  auto stats_before = g_service->client->stats();
  if (!stats_before.ok()) return state.SkipWithError(stats_before.status().ToString().c_str());
  for (auto _ : state) {
    auto r = trainer.step();
    if (!r.ok()) return state.SkipWithError(r.status().ToString().c_str());
    plan += r->plan_ms;
    compile += r->compile_ms;
    run += r->run_ms;
    allreduce += r->allreduce_ms;
    client_side += r->client_ms;
    wall += r->wall_ms;
    walls.push_back(r->wall_ms);
    misses += r->cache_misses;
  }
  const double n = static_cast<double>(state.iterations());
  auto stats_after = g_service->client->stats();
  if (!stats_after.ok()) return state.SkipWithError(stats_after.status().ToString().c_str());
  // What the client sent per warm step besides the requests' framing: data (uploads and
  // inline inputs) and graphs. A warm step names its held graph by digest, and its
  // parameters are session buffers: 0 and 0 with the batch kept in the session.
  state.counters["sent_data_bytes"] = static_cast<double>(stats_after->bytes_uploaded - stats_before->bytes_uploaded) / n;
  state.counters["sent_graph_bytes"] = static_cast<double>(stats_after->run_graph_bytes - stats_before->run_graph_bytes) / n;
  state.counters["plan_ms"] = plan / n;
  state.counters["compile_ms"] = compile / n;
  state.counters["run_ms"] = run / n;
  state.counters["allreduce_ms"] = allreduce / n;
  state.counters["client_ms"] = client_side / n;
  state.counters["other_ms"] = (wall - plan - compile - run - allreduce - client_side) / n;
  state.counters["step_ms"] = wall / n;
  state.counters["p50_step_ms"] = median(walls);
  state.counters["allreduce_share"] = allreduce / wall;
  state.counters["cache_misses"] = static_cast<double>(misses);  // 0: every warm step was all hits
  state.counters["kernels"] = cold->kernels;
  state.counters["cold_plan_ms"] = cold->plan_ms;
  state.counters["cold_compile_ms"] = cold->compile_ms;
  state.counters["cold_run_ms"] = cold->run_ms;
  state.counters["cold_allreduce_ms"] = cold->allreduce_ms;
  state.counters["cold_step_ms"] = cold->wall_ms;
  if (devices == 2 && !fresh && g_torch_p50[model] > 0) {
    state.counters["torch_ddp_p50_ms"] = g_torch_p50[model];
    state.counters["ratio_vs_torch_ddp"] = median(walls) / g_torch_p50[model];
  }
}
BENCHMARK(BM_TrainStep)
    ->Args({2, 0, 0})
    ->Args({2, 0, 1})
    ->Args({3, 0, 0})
    ->Args({2, 1, 0})
    ->MinTime(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Argument: model. Two devices, on other hosts (g_across) and on one (g_one_host), stepped
// in turn so that both see the same load on this machine.
void BM_TrainStepAcrossHosts(benchmark::State& state) {
  if (!g_across) return state.SkipWithError("set $UOPD_BENCH_ACROSS_HOSTS (deploy/cluster.sh --netns bench)");
  const Model& m = kModels[static_cast<size_t>(state.range(0))];
  const demo::TrainOptions opts = train_options(2, m);
  state.SetLabel(m.name);
  auto across_session = g_across->client->create_session(opts.devices);
  auto one_session = g_one_host->client->create_session(opts.devices);
  if (!across_session.ok()) return state.SkipWithError(across_session.status().ToString().c_str());
  if (!one_session.ok()) return state.SkipWithError(one_session.status().ToString().c_str());
  demo::SpiralsTrainer across(*across_session, opts), one(*one_session, opts);
  std::vector<double> across_walls, one_walls;
  double across_allreduce = 0, one_allreduce = 0;
  bool same_losses = true;
  // A step on each, in turn; the first (every kernel compiled, or found) is not timed.
  auto both = [&](bool timed) {
    auto a = across.step();
    auto o = one.step();
    if (!a.ok() || !o.ok()) {
      state.SkipWithError((a.ok() ? o.status() : a.status()).ToString().c_str());
      return false;
    }
    same_losses &= a->loss == o->loss;
    if (timed) {
      across_walls.push_back(a->wall_ms);
      one_walls.push_back(o->wall_ms);
      across_allreduce += a->allreduce_ms;
      one_allreduce += o->allreduce_ms;
    }
    return true;
  };
  if (!both(false)) return;
  for (auto _ : state)
    if (!both(true)) return;
  const double n = static_cast<double>(across_walls.size());
  state.counters["p50_step_ms"] = median(across_walls);
  state.counters["one_host_p50_step_ms"] = median(one_walls);
  state.counters["ratio_vs_one_host"] = median(across_walls) / median(one_walls);
  state.counters["allreduce_ms"] = across_allreduce / n;
  state.counters["one_host_allreduce_ms"] = one_allreduce / n;
  state.counters["same_losses"] = same_losses ? 1 : 0;
}
BENCHMARK(BM_TrainStepAcrossHosts)->Arg(0)->MinTime(2)->UseRealTime()->Unit(benchmark::kMillisecond);
// The wide model's steps take about half a second each: long enough for eight or so.
BENCHMARK(BM_TrainStepAcrossHosts)->Arg(1)->MinTime(10)->UseRealTime()->Unit(benchmark::kMillisecond);

// A client of the uopd at `address`; on failure a message and null.
std::unique_ptr<client::Client> connect_to(const std::string& address) {
  client::ClientOptions o;
  o.address = address;
  auto c = client::Client::connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "bench_train: %s: %s\n", address.c_str(), c.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*c);
}

}  // namespace
}  // namespace uop

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  uop::Service svc, across, one_host;
  // The peer first, alone on the machine (uopd is not started yet), where BM_TrainStep's
  // two-device runs are selected.
  const std::string filter = benchmark::GetBenchmarkFilter();
  bool torch = filter.empty() || filter == "all";
  try {
    torch = torch || std::regex_search("BM_TrainStep/2/0", std::regex(filter));
  } catch (const std::regex_error&) {
    torch = true;  // Google Benchmark names what is wrong with it
  }
  if (torch)
    for (size_t m = 0; m < std::size(uop::kModels); ++m) uop::g_torch_p50[m] = uop::torch_ddp_p50(uop::kModels[m]);
  // No disk cache: the cold step compiles for real whatever ran before.
  const char* other = std::getenv("UOPD_BENCH_UOPD");  // another uopd build, measured the same way
  auto proc = uop::client::EmbeddedServer::start(other && *other ? other : UOPD_BINARY, {"--workers=3", "--cache-dir=", uop::cat("--worker-threads=", uop::kThreads)});
  if (!proc.ok()) {
    std::fprintf(stderr, "bench_train: cannot start uopd (%s): %s\n", UOPD_BINARY, proc.status().ToString().c_str());
    return 1;
  }
  svc.proc = std::move(*proc);
  svc.client = uop::connect_to(svc.proc->address());
  if (!svc.client) return 1;
  uop::g_service = &svc;
  if (const char* a = std::getenv("UOPD_BENCH_ACROSS_HOSTS"); a && *a) {
    across.client = uop::connect_to(a);
    auto peer = uop::client::EmbeddedServer::start(other && *other ? other : UOPD_BINARY,
                                                   {"--workers=2", "--cache-dir=", "--exec-lane=grpc",
                                                    uop::cat("--worker-threads=", uop::kThreads)});
    if (!peer.ok()) std::fprintf(stderr, "bench_train: the one-host peer: %s\n", peer.status().ToString().c_str());
    if (peer.ok()) one_host.proc = std::move(*peer);
    if (one_host.proc) one_host.client = uop::connect_to(one_host.proc->address());
    if (!across.client || !one_host.client) return 1;
    uop::g_across = &across;
    uop::g_one_host = &one_host;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  svc.client.reset();
  across.client.reset();
  one_host.client.reset();
  int rc = 0;
  if (one_host.proc) (void)one_host.proc->stop();
  if (absl::Status s = svc.proc->stop(); !s.ok()) {
    std::fprintf(stderr, "bench_train: uopd did not stop cleanly: %s\n", s.ToString().c_str());
    rc = 1;
  }
  return rc;
}
