// uopd as its clients see it: one real uopd (with its uop-worker) started for the whole
// binary on loopback, driven through the C++ client library, each figure against a peer
// measured in the same process:
//   BM_CachedRun            latency of a Run whose plan and kernel are cached, p50 / p99,
//                           vs a bare gRPC echo of the same request bytes (ratio_vs_grpc_echo)
//   BM_CachedRunThroughput  cached Runs per second from 16 clients at once
//   BM_CompileCold / BM_CompileCached
//                           Compile of a graph never seen vs the same graph again
//   BM_Upload / BM_Download 256 MiB through Session::upload / download, vs memcpy
//
// The echo is measured interleaved with the Runs, one round trip before each Run, so a
// busy moment of the machine weighs on both alike; memcpy is measured once per process
// and cached (as in bench_cpu.cc). Each ratio compares two figures taken on the same
// machine in the same run. Latencies are
// collected per call and reported as nearest-rank percentiles; the mean Time column is
// Google Benchmark's. Not part of ctest: speed is measured here, never asserted.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/uopd.pb.h"

#ifndef UOPD_BINARY
#error "UOPD_BINARY (the path of the uopd to start) must be defined by the build"
#endif

namespace uop {
namespace {

using Clock = std::chrono::steady_clock;
using client::Client;
using client::ClientOptions;
using client::Session;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void skip(benchmark::State& state, const absl::Status& s) { state.SkipWithError(s.ToString().c_str()); }

// Nearest-rank percentile of `v` (sorted in place).
double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// Peers are measured once per process and key, then reused by every benchmark that
// compares with them.
double cached_peer(const std::string& key, const std::function<double()>& measure) {
  static std::map<std::string, double> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, measure()).first;
  return it->second;
}

// ---------------------------------------------------------------------------------------
// The one uopd of this process.

struct Service {
  std::string cache_dir;
  std::unique_ptr<client::EmbeddedServer> proc;
  std::unique_ptr<Client> client;
};
Service* g_service = nullptr;  // set by main() before any benchmark runs

// Started from main(): EmbeddedServer asks for SIGTERM when the thread that started it
// dies, so it must not be started from a benchmark's worker thread. A fresh cache
// directory makes the first compile of every graph a real miss (no disk hits from
// earlier runs). One worker: the figures are for one device's path, and the machine
// this runs on may have few cores to share between client, scheduler and worker.
// $UOPD_BENCH_ARGS (space-separated) adds uopd flags: `--exec-lane=grpc` measures the
// worker hop over gRPC, for comparison.
absl::StatusOr<std::unique_ptr<Service>> start_service() {
  auto svc = std::make_unique<Service>();
  std::string tmpl = (std::filesystem::temp_directory_path() / "uopd-bench-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) return absl::InternalError(cat("mkdtemp ", tmpl, ": ", std::strerror(errno)));
  svc->cache_dir = tmpl;
  std::vector<std::string> args = {"--cache-dir=" + svc->cache_dir, "--workers=1"};
  if (const char* extra = std::getenv("UOPD_BENCH_ARGS"))
    for (std::string_view rest = extra; !rest.empty();) {
      const size_t sp = rest.find(' ');
      if (sp != 0) args.emplace_back(rest.substr(0, sp));
      rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
    }
  auto proc = client::EmbeddedServer::start(UOPD_BINARY, args);
  if (!proc.ok()) return proc.status();
  svc->proc = std::move(*proc);
  ClientOptions o;
  o.address = svc->proc->address();
  auto c = Client::connect(o);
  if (!c.ok()) return c.status();
  svc->client = std::move(*c);
  return svc;
}

// A failed call with uopd's own words appended when uopd is no longer there to ask.
absl::Status with_log(const absl::Status& s) {
  if (s.ok() || s.code() != absl::StatusCode::kUnavailable) return s;
  return absl::Status(s.code(), cat(s.message(), "\nuopd log tail:\n", g_service->proc->log_tail(1500)));
}

// ---------------------------------------------------------------------------------------
// The small elementwise graph: c = a * k + b over kElems float32, one kernel. k is a
// constant of the graph, so a new k is a new kernel (BM_CompileCold); k = 1.5 is the graph
// every cached benchmark uses.

constexpr int64_t kElems = 1024;  // 4 KiB per tensor: a request of ~8 KiB of inline data

struct Elementwise {
  Graph g;
  const UOp* root = nullptr;
  Names names;
  HostTensor a, b;
  std::vector<client::Input> inputs;

  explicit Elementwise(double k) {
    TensorBuilder tb(g);
    const UOp* x = tb.input(Scalar::Float32, {kElems});
    const UOp* y = tb.input(Scalar::Float32, {kElems});
    const UOp* c = tb.alu(Op::ADD, {tb.alu(Op::MUL, {x, tb.full(Scalar::Float32, k, {kElems})}), y});
    root = tb.sink({c});
    names = {{"a", tb.buffer_of(x)}, {"b", tb.buffer_of(y)}, {"c", c}};
    a = HostTensor::random(Scalar::Float32, {kElems}, 1);
    b = HostTensor::random(Scalar::Float32, {kElems}, 2);
    inputs = {{"a", a}, {"b", b}};
  }
};

// The graph of every cached benchmark, built on first use. A Graph is for one thread at a
// time (digests are memoized on first use), so the threaded benchmark gives each thread
// its own copy: equal graphs, equal digests, the same cached plan and kernel.
const Elementwise& cached_graph() {
  static Elementwise e(1.5);
  return e;
}

// The RunRequest Session::run sends for cached_graph(), built the way client.cc builds
// it (encode_proto, inputs bound by name with inline tensors), serialized: the echo's
// payload, byte for byte what a cached Run carries.
std::string run_request_bytes(const std::string& session_id) {
  const Elementwise& e = cached_graph();
  ::uopd::v1::RunRequest req;
  req.set_session_id(session_id);
  encode_proto(e.root, e.names, req.mutable_graph());
  req.set_keep_outputs(false);
  for (const auto& [name, t] : {std::pair<std::string, const HostTensor*>{"a", &e.a}, {"b", &e.b}}) {
    ::uopd::v1::Binding* b = req.add_inputs();
    b->set_name(name);
    b->mutable_tensor()->set_dtype(::uop::v1::DType::FLOAT32);
    for (int64_t d : t->shape) b->mutable_tensor()->add_shape(d);
    b->mutable_tensor()->set_data(t->data);
  }
  return req.SerializeAsString();
}

// One run of the cached graph, checked: outputs correct (first call only; later calls
// check the size), every kernel a memory hit.
absl::Status cached_run(Session& s, const Elementwise& e, client::RunResult* out = nullptr, bool check_values = false) {
  auto r = s.run(e.root, e.names, e.inputs);
  if (!r.ok()) return with_log(r.status());
  if (r->outputs.size() != 1 || r->outputs[0].tensor.nbytes() != kElems * 4)
    return absl::InternalError("a cached run returned the wrong outputs");
  for (const client::Kernel& k : r->kernels)
    if (k.status != client::CacheStatus::Hit)
      return absl::InternalError(cat("kernel ", k.name, " of a cached run: ", client::describe_cache(k)));
  if (check_values) {
    const float* a = reinterpret_cast<const float*>(e.a.data.data());
    const float* b = reinterpret_cast<const float*>(e.b.data.data());
    const float* c = reinterpret_cast<const float*>(r->outputs[0].tensor.data.data());
    for (int64_t i = 0; i < kElems; ++i)
      if (std::fabs(c[i] - (a[i] * 1.5f + b[i])) > 1e-5f)
        return absl::InternalError(cat("c[", i, "] = ", c[i], ", want ", a[i] * 1.5f + b[i]));
  }
  if (out) *out = std::move(*r);
  return absl::OkStatus();
}

// Compiles (and so caches) the cached graph once, whichever benchmark comes first.
absl::Status warm_cached_graph() {
  static absl::Status warmed = [] {
    const Elementwise& e = cached_graph();
    auto r = g_service->client->compile(e.root, e.names);
    return r.ok() ? absl::OkStatus() : with_log(r.status());
  }();
  return warmed;
}

// ---------------------------------------------------------------------------------------
// The echo peer: an in-process gRPC server whose one (generic) method answers each
// request with its own bytes. A callback generic service, because gRPC offers no
// synchronous generic one; it is the least a server can do per call, so what uopd adds
// on top of it is the cost of the service itself (decode, plan lookup, the worker hop,
// the response), not of gRPC.

class EchoService final : public grpc::CallbackGenericService {
  // One reactor per call: read the request, write it back, finish.
  class Echo final : public grpc::ServerGenericBidiReactor {
   public:
    Echo() { StartRead(&buf_); }
    void OnReadDone(bool ok) override {
      if (!ok) return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
      StartWrite(&buf_);
    }
    void OnWriteDone(bool ok) override { Finish(ok ? grpc::Status::OK : grpc::Status(grpc::StatusCode::UNKNOWN, "write failed")); }
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer buf_;
  };

 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override { return new Echo; }
};

struct EchoServer {
  EchoService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

EchoServer* g_echo = nullptr;  // started on first use; shut down by main()

EchoServer& echo_server() {
  static EchoServer* e = [] {
    auto* s = g_echo = new EchoServer;
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &s->port);
    b.RegisterCallbackGenericService(&s->service);
    b.SetMaxReceiveMessageSize(-1);
    s->server = b.BuildAndStart();
    return s;
  }();
  return *e;
}

// Round trips of one request through the echo, one at a time on the calling thread. The
// client side mirrors the client library's: a channel made the same way, a context with a
// deadline per call, and the calling thread waiting on the completion itself (the
// generated synchronous stub does the same), so no thread hand-off is added.
class EchoClient {
 public:
  // Connects, checks that the first reply is the request byte for byte (the peer must
  // really carry the payload) and warms up as the Run side does.
  static absl::StatusOr<std::unique_ptr<EchoClient>> connect(const std::string& request) {
    std::unique_ptr<EchoClient> c(new EchoClient(request));
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    auto channel = grpc::CreateCustomChannel(cat("127.0.0.1:", echo_server().port), grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
      return absl::UnavailableError("the echo server is not reachable");
    c->stub_ = std::make_unique<grpc::GenericStub>(channel);
    grpc::ByteBuffer first;
    if (absl::Status s = c->call(&first); !s.ok()) return s;
    std::vector<grpc::Slice> slices;
    (void)first.Dump(&slices);
    std::string echoed;
    for (const grpc::Slice& sl : slices) echoed.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    if (echoed != request) return absl::InternalError("echo: the reply differs from the request");
    for (int i = 0; i < 100; ++i) {
      grpc::ByteBuffer r;
      if (absl::Status s = c->call(&r); !s.ok()) return s;
    }
    return c;
  }
  ~EchoClient() { cq_.Shutdown(); }

  // One round trip, in µs.
  absl::StatusOr<double> round_trip_us() {
    grpc::ByteBuffer r;
    auto t0 = Clock::now();
    if (absl::Status s = call(&r); !s.ok()) return s;
    return seconds_since(t0) * 1e6;
  }

 private:
  explicit EchoClient(std::string request) : request_(std::move(request)) {}
  absl::Status call(grpc::ByteBuffer* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::Slice slice(request_);  // copies, as serializing a message into a call does
    grpc::ByteBuffer req(&slice, 1);
    auto rpc = stub_->PrepareUnaryCall(&ctx, "/bench.Echo/Echo", req, &cq_);
    rpc->StartCall();
    grpc::Status status;
    rpc->Finish(response, &status, reinterpret_cast<void*>(1));
    void* tag;
    bool ok;
    if (!cq_.Next(&tag, &ok) || !ok) return absl::InternalError("echo: the completion queue failed");
    if (!status.ok()) return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    if (response->Length() != request_.size()) return absl::InternalError("echo: the reply differs in size");
    return absl::OkStatus();
  }
  std::string request_;
  std::unique_ptr<grpc::GenericStub> stub_;
  grpc::CompletionQueue cq_;
};

// ---------------------------------------------------------------------------------------
// Cached Run latency vs the echo.

void BM_CachedRun(benchmark::State& state) {
  if (absl::Status s = warm_cached_graph(); !s.ok()) return skip(state, s);
  auto session = g_service->client->create_session();
  if (!session.ok()) return skip(state, with_log(session.status()));
  client::RunResult r;
  if (absl::Status s = cached_run(*session, cached_graph(), &r, /*check_values=*/true); !s.ok()) return skip(state, s);
  for (int i = 0; i < 100; ++i)  // warm-up: connection, allocator, the worker's program
    if (absl::Status s = cached_run(*session, cached_graph()); !s.ok()) return skip(state, s);

  // The peer sends what this session's Run sends. Checked first: the same bytes sent to
  // uopd's Run must be a valid cached Run, or the comparison would be of unequal things.
  // Each iteration makes one echo round trip, then one Run: the two see the same machine
  // (a busy moment slows both), which a peer measured apart from the Runs would not.
  const std::string request = run_request_bytes(session->id());
  auto echo = EchoClient::connect(request);
  if (!echo.ok()) return skip(state, echo.status());

  std::vector<double> us, echo_us, plan_us, compile_us, run_us;
  for (auto _ : state) {
    auto e = (*echo)->round_trip_us();
    if (!e.ok()) return skip(state, e.status());
    echo_us.push_back(*e);
    auto t0 = Clock::now();
    absl::Status s = cached_run(*session, cached_graph(), &r);
    const double dt = seconds_since(t0);
    if (!s.ok()) return skip(state, s);
    state.SetIterationTime(dt);  // the Run alone
    us.push_back(dt * 1e6);
    plan_us.push_back(r.plan_ms * 1e3);
    compile_us.push_back(r.compile_ms * 1e3);
    run_us.push_back(r.run_ms * 1e3);
  }
  const double p50 = percentile(us, 0.5), echo_p50 = percentile(echo_us, 0.5);
  state.counters["p50_us"] = p50;
  state.counters["p99_us"] = percentile(us, 0.99);
  state.counters["echo_p50_us"] = echo_p50;
  state.counters["echo_p99_us"] = percentile(echo_us, 0.99);
  state.counters["ratio_vs_grpc_echo"] = p50 / echo_p50;
  // Where a Run's time goes inside uopd, as it reports it (medians): planning (a plan
  // cache hit), the kernel cache lookup, and the worker's part (dispatch + the kernel +
  // the outputs coming back). The rest of p50_us is gRPC, encoding and decoding.
  state.counters["srv_plan_us"] = percentile(plan_us, 0.5);
  state.counters["srv_compile_us"] = percentile(compile_us, 0.5);
  state.counters["srv_run_us"] = percentile(run_us, 0.5);
  state.counters["request_bytes"] = static_cast<double>(request.size());
  state.SetLabel(cat(r.kernels.size(), " kernel(s) ", client::describe_cache(r.kernels.at(0)), ", echo interleaved"));
}
BENCHMARK(BM_CachedRun)->MinTime(3)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------------------------------
// Throughput: 16 clients, each its own Client (channel) and Session, issuing cached Runs
// back to back. Google Benchmark sums the runs of all threads and divides by the threads'
// mean wall time, so runs_per_s is the aggregate rate. A fixed count per thread keeps the
// setup (16 connections and sessions) to one round.

void BM_CachedRunThroughput(benchmark::State& state) {
  // Whichever thread comes first compiles the graph; the others wait for it (a static's
  // initialization), so every Run below is a cached one.
  if (absl::Status s = warm_cached_graph(); !s.ok()) return skip(state, s);
  const Elementwise mine(1.5);
  ClientOptions o;
  o.address = g_service->proc->address();
  auto c = Client::connect(o);
  if (!c.ok()) return skip(state, c.status());
  auto session = (*c)->create_session();
  if (!session.ok()) return skip(state, with_log(session.status()));
  if (absl::Status s = cached_run(*session, mine); !s.ok()) return skip(state, s);
  std::vector<double> us;
  us.reserve(state.max_iterations);
  for (auto _ : state) {
    auto t0 = Clock::now();
    if (absl::Status s = cached_run(*session, mine); !s.ok()) return skip(state, s);
    us.push_back(seconds_since(t0) * 1e6);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["runs_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  // Each thread's own latency median, averaged over the threads: what one client of 16
  // waits per Run while the others keep the server busy.
  state.counters["p50_us"] = benchmark::Counter(percentile(us, 0.5), benchmark::Counter::kAvgThreads);
  state.counters["p99_us"] = benchmark::Counter(percentile(us, 0.99), benchmark::Counter::kAvgThreads);
}
BENCHMARK(BM_CachedRunThroughput)->Threads(16)->Iterations(300)->UseRealTime()->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------------------------------
// Compile: cold (a graph never seen: plan, lower, LLVM, store in the memory and disk
// tiers) vs cached (the same graph again: the plan cache and a memory hit). Only the
// Compile call is timed (manual time); building the graph is the caller's business.

// Per-call ms of the cold runs, for BM_CompileCached's ratio (measured there when
// BM_CompileCold was filtered out).
std::vector<double>& cold_ms() {
  static std::vector<double> v;
  return v;
}

// A constant no earlier call of this process used: with a fresh cache directory, its
// kernel has never been compiled anywhere. Multiples of 2^-20 are exact in float32, so
// no two values collapse into one constant.
double fresh_constant() {
  static int64_t n = 0;
  return 2.0 + static_cast<double>(++n) / (1 << 20);
}

// One cold Compile in ms, checked to be cold, with uopd's own compile time (the sum over
// its kernels of lowering + code generation) in `server_ms`.
absl::StatusOr<double> cold_compile(double* server_ms) {
  Elementwise e(fresh_constant());
  auto t0 = Clock::now();
  auto r = g_service->client->compile(e.root, e.names);
  double ms = seconds_since(t0) * 1e3;
  if (!r.ok()) return with_log(r.status());
  if (r->plan_cached) return absl::InternalError("a graph never seen came from the plan cache");
  *server_ms = 0;
  for (const client::Kernel& k : r->kernels) {
    if (k.status != client::CacheStatus::Miss)
      return absl::InternalError(cat("kernel ", k.name, " of a new graph: ", client::describe_cache(k)));
    *server_ms += k.compile_ms;
  }
  return ms;
}

void BM_CompileCold(benchmark::State& state) {
  double server_ms = 0;
  if (auto w = cold_compile(&server_ms); !w.ok()) return skip(state, w.status());  // warm-up: the path, not a kernel
  std::vector<double> ms, srv;
  for (auto _ : state) {
    auto t = cold_compile(&server_ms);
    if (!t.ok()) return skip(state, t.status());
    state.SetIterationTime(*t * 1e-3);
    ms.push_back(*t);
    srv.push_back(server_ms);
  }
  cold_ms() = ms;
  state.counters["median_ms"] = percentile(ms, 0.5);
  state.counters["p90_ms"] = percentile(ms, 0.9);
  // uopd's lowering + code generation alone; the rest of median_ms is planning, the cache
  // (lookups, stores to memory and disk), loading and gRPC.
  state.counters["srv_compile_median_ms"] = percentile(srv, 0.5);
}
BENCHMARK(BM_CompileCold)->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_CompileCached(benchmark::State& state) {
  if (cold_ms().empty()) {
    for (int i = 0; i < 10; ++i) {
      double server_ms;
      auto t = cold_compile(&server_ms);
      if (!t.ok()) return skip(state, t.status());
      cold_ms().push_back(*t);
    }
  }
  if (absl::Status s = warm_cached_graph(); !s.ok()) return skip(state, s);
  const Elementwise& e = cached_graph();
  std::vector<double> ms;
  for (auto _ : state) {
    auto t0 = Clock::now();
    auto r = g_service->client->compile(e.root, e.names);
    double t = seconds_since(t0) * 1e3;
    if (!r.ok()) return skip(state, with_log(r.status()));
    if (!r->plan_cached) return skip(state, absl::InternalError("a graph compiled before missed the plan cache"));
    for (const client::Kernel& k : r->kernels)
      if (k.status != client::CacheStatus::Hit || k.tier != "memory")
        return skip(state, absl::InternalError(cat("kernel ", k.name, " compiled before: ", client::describe_cache(k))));
    state.SetIterationTime(t * 1e-3);
    ms.push_back(t);
  }
  const double med = percentile(ms, 0.5);
  const double cold = percentile(cold_ms(), 0.5);
  state.counters["median_ms"] = med;
  state.counters["p90_ms"] = percentile(ms, 0.9);
  state.counters["cold_median_ms"] = cold;
  state.counters["ratio_vs_cold"] = cold / med;
}
BENCHMARK(BM_CompileCached)->MinTime(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------
// Bulk transfer: 256 MiB into and out of a session buffer (client -> uopd -> worker and
// back, each hop a gRPC stream of chunks), vs memcpy of 256 MiB on one thread in this
// process (a transfer is one stream, so one thread is the fair peer). Rates come from
// the best call on each side, as in bench_cpu.cc: on a shared machine other work only
// adds time; the median is reported beside it.

constexpr size_t kBulkBytes = size_t{256} << 20;

// 256 MiB of non-zero, non-repeating bytes (so nothing along the way can shortcut them).
const std::string& bulk_data() {
  static const std::string d = [] {
    std::string s(kBulkBytes, '\0');
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < s.size(); i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(&s[i], &x, 8);
    }
    return s;
  }();
  return d;
}

double memcpy_seconds() {
  return cached_peer("memcpy/256MiB", [] {
    const std::string& src = bulk_data();
    std::string dst(kBulkBytes, '\0');  // touched: no page faults in the timing
    double best = 1e300;
    for (int i = 0; i < 10; ++i) {
      auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), kBulkBytes);
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
      best = std::min(best, seconds_since(t0));
    }
    return best;
  });
}

// A client whose transfers use `chunk_bytes` chunks (the library's default: 1 MiB).
absl::StatusOr<std::unique_ptr<Client>> client_with_chunks(uint32_t chunk_bytes) {
  ClientOptions o;
  o.address = g_service->proc->address();
  o.chunk_bytes = chunk_bytes;
  return Client::connect(o);
}

void report_transfer(benchmark::State& state, std::vector<double>& seconds, uint32_t chunk_bytes) {
  const double peer = memcpy_seconds();
  const double best = *std::min_element(seconds.begin(), seconds.end());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBulkBytes));
  state.counters["GB_per_s"] = kBulkBytes / best * 1e-9;
  state.counters["median_GB_per_s"] = kBulkBytes / percentile(seconds, 0.5) * 1e-9;
  state.counters["memcpy_GB_per_s"] = kBulkBytes / peer * 1e-9;
  state.counters["ratio_vs_memcpy"] = peer / best;
  state.SetLabel(cat(client::effective_chunk_bytes(chunk_bytes) >> 10, " KiB chunks"));
}

void BM_Upload(benchmark::State& state, uint32_t chunk_bytes) {
  auto c = client_with_chunks(chunk_bytes);
  if (!c.ok()) return skip(state, c.status());
  auto session = (*c)->create_session();
  if (!session.ok()) return skip(state, with_log(session.status()));
  auto buf = session->create_buffer(Scalar::Float32, kBulkBytes / 4);
  if (!buf.ok()) return skip(state, with_log(buf.status()));
  const std::string& data = bulk_data();
  memcpy_seconds();  // the peer first, so its 512 MiB are not measured during ours
  if (absl::Status s = session->upload(*buf, data); !s.ok()) return skip(state, with_log(s));  // warm-up
  std::vector<double> seconds;
  for (auto _ : state) {
    auto t0 = Clock::now();
    if (absl::Status s = session->upload(*buf, data); !s.ok()) return skip(state, with_log(s));
    seconds.push_back(seconds_since(t0));
  }
  // What arrived is what was sent: checked once, after the timing.
  auto back = session->download(*buf, 0, kBulkBytes);
  if (!back.ok()) return skip(state, with_log(back.status()));
  if (*back != data) return skip(state, absl::DataLossError("the uploaded buffer reads back different"));
  report_transfer(state, seconds, chunk_bytes);
}
BENCHMARK_CAPTURE(BM_Upload, 256MiB, 0)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);
// The largest chunks the server takes: how much of the time is per-chunk overhead.
BENCHMARK_CAPTURE(BM_Upload, 256MiB_4MiB_chunks, client::kMaxChunkBytes)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Download(benchmark::State& state, uint32_t chunk_bytes) {
  auto c = client_with_chunks(chunk_bytes);
  if (!c.ok()) return skip(state, c.status());
  auto session = (*c)->create_session();
  if (!session.ok()) return skip(state, with_log(session.status()));
  auto buf = session->create_buffer(Scalar::Float32, kBulkBytes / 4);
  if (!buf.ok()) return skip(state, with_log(buf.status()));
  const std::string& data = bulk_data();
  if (absl::Status s = session->upload(*buf, data); !s.ok()) return skip(state, with_log(s));
  memcpy_seconds();
  // Warm-up, and the check that the bytes come back as they went in.
  auto first = session->download(*buf, 0, kBulkBytes);
  if (!first.ok()) return skip(state, with_log(first.status()));
  if (*first != data) return skip(state, absl::DataLossError("the downloaded buffer differs from the upload"));
  first->clear();
  first->shrink_to_fit();
  std::vector<double> seconds;
  for (auto _ : state) {
    // The length is given, as download_tensor gives it, so the client sizes its string
    // once; the 256 MiB string is allocated and filled inside the timing, as a caller's
    // would be.
    auto t0 = Clock::now();
    auto d = session->download(*buf, 0, kBulkBytes);
    double dt = seconds_since(t0);
    if (!d.ok()) return skip(state, with_log(d.status()));
    if (d->size() != kBulkBytes) return skip(state, absl::DataLossError("short download"));
    seconds.push_back(dt);
  }
  report_transfer(state, seconds, chunk_bytes);
}
BENCHMARK_CAPTURE(BM_Download, 256MiB, 0)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Download, 256MiB_4MiB_chunks, client::kMaxChunkBytes)->Iterations(5)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace uop

// Google Benchmark's main, with uopd started before the first benchmark and stopped (and
// its cache directory removed) after the last.
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  auto svc = uop::start_service();
  if (!svc.ok()) {
    std::fprintf(stderr, "bench_service: cannot start uopd (%s): %s\n", UOPD_BINARY, svc.status().ToString().c_str());
    return 1;
  }
  uop::g_service = svc->get();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  int rc = 0;
  (*svc)->client.reset();
  if (absl::Status s = (*svc)->proc->stop(); !s.ok()) {
    std::fprintf(stderr, "bench_service: uopd did not stop cleanly: %s\n%s\n", s.ToString().c_str(),
                 (*svc)->proc->log_tail().c_str());
    rc = 1;
  }
  std::error_code ec;
  std::filesystem::remove_all((*svc)->cache_dir, ec);
  if (uop::g_echo) uop::g_echo->server->Shutdown();
  return rc;
}
