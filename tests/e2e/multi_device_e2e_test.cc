// Multi-device execution end to end: a real uopd with 2 or 3 embedded uop-worker
// processes (CPU:0, CPU:1, CPU:2) on loopback, driven through the client library and the
// tensor frontend. What the service promises: a sharded graph whose reduction over the
// shard axis becomes an ALLREDUCE between the workers gives the reference interpreter's
// values, for every reduce op; data-parallel training (client/demo/spirals.h) lowers its
// loss, keeps the parameter replicas bit-identical across the devices and, from its second
// step on, finds every kernel in the compile cache; a worker killed during an allreduce
// fails that step with UNAVAILABLE naming the device instead of hanging, and the next
// request succeeds once the worker has been restarted.
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <iostream>
#include <future>
#include <grpcpp/grpcpp.h>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/demo/spirals.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"
#include "tests/e2e/metrics_scrape.h"
#include "tests/e2e/scheduler_proc.h"
#include "tests/e2e/worker_proc.h"
#include "transport/cluster_auth.h"
#include "worker/worker_service.h"

namespace uop {
namespace {

using client::Client;
using client::EmbeddedServer;
using client::Session;

std::vector<std::string> cpu_devices(int n) {
  std::vector<std::string> d;
  for (int i = 0; i < n; ++i) d.push_back(cat("CPU:", i));
  return d;
}

// uopd with `workers` CPU workers, no disk cache (every compile in a test is its own),
// and a client.
struct Service {
  std::unique_ptr<EmbeddedServer> proc;
  std::unique_ptr<Client> client;

  explicit Service(int workers, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {cat("--workers=", workers), "--cache-dir=", "--worker-threads=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto p = EmbeddedServer::start(UOPD_BINARY, args);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return;
    proc = std::move(*p);
    client::ClientOptions o;
    o.address = proc->address();
    o.deadline = absl::Seconds(120);
    auto c = Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) client = std::move(*c);
  }
  bool ok() const { return client != nullptr; }
  Session session(int devices) {
    auto s = client->create_session(cpu_devices(devices));
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  client::WorkerStatus worker(const std::string& device) { return testing::worker_status(*client, device); }
};

// A multi-device graph and the data of its inputs, bound by name.
struct ShardedGraph {
  Graph g;
  const UOp* root = nullptr;
  Names names;
  absl::flat_hash_map<const UOp*, HostTensor> inputs;
  std::vector<client::Input> bindings;

  // The MULTI along axis 0 of one [rows, cols] input per device, each of random data
  // (kept near 1 for a floating Mul: products of many values in [-2, 2) run off to 0 or
  // infinity).
  const UOp* sharded_input(int devices, Scalar dtype, int64_t rows, int64_t cols, ReduceOp op, uint64_t seed) {
    std::vector<const UOp*> shards;
    for (int d = 0; d < devices; ++d) {
      TensorBuilder tb(g, cat("CPU:", d));
      const UOp* x = tb.input(dtype, {rows, cols});
      HostTensor data = HostTensor::random(dtype, {rows * cols}, seed + d);
      if (op == ReduceOp::Mul && scalar_is_float(dtype))
        for (int64_t i = 0; i < data.numel(); ++i) data.set(i, ConstValue::Float(1.0 + data.get(i).to_double() / 8));
      std::string name = cat("x", names.size());
      names.push_back({name, tb.buffer_of(x)});
      inputs[tb.buffer_of(x)] = data;
      bindings.push_back({name, data});
      shards.push_back(x);
    }
    return g.make(Op::MULTI, DType(dtype), shards, IntArg{0});
  }
};

// The multi-device graph of one reduce op: every device holds a [rows, 8] block of x
// (MULTI along axis 0); `reduced` is the reduction over the shard axis (per-device partials
// and an ALLREDUCE, replicated on every device) and `doubled` is x + x (sharded, one kernel
// per device).
struct ShardedReduce : ShardedGraph {
  ShardedReduce(int devices, ReduceOp op, int64_t rows, uint64_t seed) {
    const UOp* m = sharded_input(devices, Scalar::Float32, rows, 8, op, seed);
    const UOp* reduced = g.make(Op::REDUCE_AXIS, dtypes::float32, {m}, ReduceAxisArg{op, {0}});
    const UOp* doubled = g.make(Op::ADD, dtypes::float32, {m, m});
    root = g.make(Op::SINK, dtypes::void_, {reduced, doubled});
    names.push_back({"reduced", reduced});
    names.push_back({"doubled", doubled});
  }
};

// The parts of the outputs named `name` ("name" or "name@CPU:i"), in order.
std::vector<const client::RunOutput*> parts(const client::RunResult& r, const std::string& name) {
  std::vector<const client::RunOutput*> out;
  for (const auto& o : r.outputs)
    if (o.name == name || o.name.rfind(name + "@", 0) == 0) out.push_back(&o);
  return out;
}

void check_against_interpreter(Service& svc, int devices) {
  Session session = svc.session(devices);
  for (ReduceOp op : {ReduceOp::Add, ReduceOp::Mul, ReduceOp::Max, ReduceOp::Min}) {
    SCOPED_TRACE(cat("op ", static_cast<int>(op), " on ", devices, " devices"));
    ShardedReduce graph(devices, op, 5, 10 * static_cast<uint64_t>(op) + 1);
    auto want = interpret(graph.g, graph.root, graph.inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(want->size(), 2u);
    auto got = session.run(graph.root, graph.names, graph.bindings);
    ASSERT_TRUE(got.ok()) << got.status();
    // The reduction is replicated: every device's copy is the interpreter's value.
    auto reduced = parts(*got, "reduced");
    ASSERT_EQ(reduced.size(), static_cast<size_t>(devices));
    Tolerance tol = op == ReduceOp::Max || op == ReduceOp::Min ? Tolerance::exact() : Tolerance::for_dtype(Scalar::Float32);
    for (const client::RunOutput* o : reduced) {
      CompareResult c = compare((*want)[0], o->tensor, tol);
      EXPECT_TRUE(c.ok) << o->name << ": " << c.message;
      EXPECT_EQ(o->tensor.data, reduced[0]->tensor.data) << o->name << " differs from " << reduced[0]->name;
    }
    // x + x stays sharded: device i's block is rows [5i, 5i + 5) of the whole.
    auto doubled = parts(*got, "doubled");
    ASSERT_EQ(doubled.size(), static_cast<size_t>(devices));
    const std::string& whole = (*want)[1].data;
    const size_t block = whole.size() / devices;
    for (int d = 0; d < devices; ++d) {
      EXPECT_EQ((std::vector<int64_t>{5, 8}), doubled[d]->tensor.shape) << doubled[d]->name;
      EXPECT_EQ(doubled[d]->tensor.data, whole.substr(d * block, block)) << doubled[d]->name;
    }
  }
}

void check_against_interpreter(int devices, std::vector<std::string> flags = {}) {
  Service svc(devices, flags);
  ASSERT_TRUE(svc.ok());
  check_against_interpreter(svc, devices);
}

TEST(MultiDeviceE2E, AllreduceOfEveryOpMatchesTheInterpreterOnTwoWorkers) { check_against_interpreter(2); }
TEST(MultiDeviceE2E, AllreduceOfEveryOpMatchesTheInterpreterOnThreeWorkers) { check_against_interpreter(3); }
// The cross-host transport on one host: Gloo over TCP, the members meeting through the
// Rendezvous service that uopd serves on its internal listener.
TEST(MultiDeviceE2E, AllreduceOverGlooThroughTheSchedulersRendezvous) {
  check_against_interpreter(2, {"--collective-transport=gloo"});
}

// The same while the rendezvous is flooded: with the cluster secret, keys of groups made
// up (the names the old counter gave, and random ones), and without it, anything. Every
// junk key is refused, the store takes none of it, and the members' own rendezvous goes
// through: the allreduces match the interpreter.
TEST(MultiDeviceE2E, AllreduceOverGlooWhileTheRendezvousIsFlooded) {
  testing::ClusterSecret secret;
  Service svc(2, {"--collective-transport=gloo", secret.flag()});
  ASSERT_TRUE(svc.ok());
  const std::string internal = svc.proc->internal_address();
  ASSERT_FALSE(internal.empty());
  std::atomic<bool> done{false};
  std::atomic<int> sent{0}, accepted{0};
  auto flood = [&](cluster_auth::Dialer dial, grpc::StatusCode want) {
    auto stub = uopd::worker::v1::Rendezvous::NewStub(dial.channel(internal));
    const std::string junk(64 << 10, 'j');
    for (uint64_t n = 0; !done; ++n) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      uopd::worker::v1::RendezvousSetRequest req;
      req.set_key(n % 2 ? cat("uopd-", svc.proc->pid(), "-", n / 2 % 64, "-ar0/", n % 4 < 2 ? "0" : "rank_1")
                        : cat(cluster_auth::random_hex(16), "/0"));
      req.set_value(junk);
      uopd::worker::v1::RendezvousSetResponse resp;
      grpc::Status st = stub->Set(&ctx, req, &resp);
      if (st.ok()) ++accepted;
      EXPECT_EQ(st.error_code(), want) << st.error_message();
      ++sent;
    }
  };
  std::thread insider(flood, secret.dialer(), grpc::StatusCode::NOT_FOUND);
  std::thread stranger(flood, cluster_auth::Dialer{}, grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(testing::wait_until([&] { return sent.load() >= 100; })) << "the flood never got going";
  check_against_interpreter(svc, 2);
  done = true;
  insider.join();
  stranger.join();
  EXPECT_EQ(accepted.load(), 0);
  std::cout << "rendezvous flood: " << sent.load() << " junk keys of 64 KiB refused, none stored\n";
}

// Allreduces of every dtype the collectives reduce and every op, two of each (so that a
// bucket can hold several), each result also read by a kernel after it, beside kernels
// that need no collective (x + x): what bucketing and overlap reorder.
struct EveryAllreduce : ShardedGraph {
  static constexpr Scalar kDtypes[] = {Scalar::Float32, Scalar::Float64, Scalar::Float16, Scalar::BFloat16,
                                       Scalar::Int32,   Scalar::Int64,   Scalar::UInt8,   Scalar::Int8};
  static constexpr ReduceOp kOps[] = {ReduceOp::Add, ReduceOp::Mul, ReduceOp::Max, ReduceOp::Min};

  explicit EveryAllreduce(int devices) {
    std::vector<const UOp*> outs;
    uint64_t seed = 1;
    for (Scalar dtype : kDtypes)
      for (ReduceOp op : kOps)
        for (int copy = 0; copy < 2; ++copy) {
          const UOp* m = sharded_input(devices, dtype, 3, 4, op, seed += devices);
          const DType t(dtype);
          const UOp* reduced = g.make(Op::REDUCE_AXIS, t, {m}, ReduceAxisArg{op, {0}});
          outs.push_back(g.make(Op::ADD, t, {reduced, reduced}));  // a kernel after the allreduce
          outs.push_back(g.make(Op::ADD, t, {m, m}));              // one that needs none
        }
    root = g.make(Op::SINK, dtypes::void_, outs);
  }
};

// The same graph on uopd bucketed (--bucket-cap-mb=25) or not (0), its steps overlapped or
// sequential (--sequential-steps): every output the same bits in all four, and the
// interpreter's values.
TEST(MultiDeviceE2E, EveryDtypeAndOpGivesTheSameBitsBucketedOrNotOverlappedOrNot) {
  EveryAllreduce graph(2);
  auto want = interpret(graph.g, graph.root, graph.inputs);
  ASSERT_TRUE(want.ok()) << want.status();
  std::vector<std::vector<std::string>> got;
  for (const char* cap : {"--bucket-cap-mb=25", "--bucket-cap-mb=0"})
    for (bool sequential : {false, true}) {
      SCOPED_TRACE(cat(cap, sequential ? " --sequential-steps" : ""));
      std::vector<std::string> flags = {cap};
      if (sequential) flags.push_back("--sequential-steps");
      Service svc(2, flags);
      ASSERT_TRUE(svc.ok());
      Session session = svc.session(2);
      auto r = session.run(graph.root, graph.names, graph.bindings);
      ASSERT_TRUE(r.ok()) << r.status();
      std::vector<std::string> bits;
      for (const client::RunOutput& o : r->outputs) bits.push_back(o.tensor.data);
      got.push_back(std::move(bits));
      if (got.size() > 1) continue;
      // Against the interpreter once: output k is the k-th of the SINK, one part per device.
      ASSERT_EQ(r->outputs.size(), want->size() * 2);
      for (size_t k = 0; k < want->size(); ++k) {
        const HostTensor& whole = (*want)[k];
        const bool replicated = k % 2 == 0;
        for (size_t d = 0; d < 2; ++d) {
          const client::RunOutput& o = r->outputs[2 * k + d];
          if (!replicated) {  // x + x, device d's rows: exact in every dtype
            EXPECT_EQ(o.tensor.data, whole.data.substr(d * whole.data.size() / 2, whole.data.size() / 2)) << o.name;
            continue;
          }
          // Each device's partial is rounded to the dtype before the allreduce adds it (the
          // interpreter rounds once): for float16 / bfloat16 that is an ulp of a partial
          // sum of values in [-2, 2), more than the dtype's default tolerance.
          Tolerance tol = Tolerance::for_dtype(whole.dtype);
          if (whole.dtype == Scalar::Float16 || whole.dtype == Scalar::BFloat16) tol.atol *= 4;
          CompareResult c = compare(whole, o.tensor, tol);
          EXPECT_TRUE(c.ok) << o.name << " (" << scalar_name(whole.dtype) << "): " << c.message;
        }
      }
    }
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 1; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), got[0].size());
    for (size_t k = 0; k < got[0].size(); ++k) EXPECT_EQ(got[i][k], got[0][k]) << "configuration " << i << ", output " << k;
  }
}

void train(int devices, int steps) {
  Service svc(devices);
  ASSERT_TRUE(svc.ok());
  Session session = svc.session(devices);
  demo::TrainOptions opts;
  opts.devices = cpu_devices(devices);
  opts.points_per_class = 48;
  opts.hidden = 16;
  demo::SpiralsTrainer trainer(session, opts);
  std::vector<demo::StepReport> reports;
  for (int s = 0; s < steps; ++s) {
    auto r = trainer.step();
    ASSERT_TRUE(r.ok()) << "step " << s + 1 << ": " << r.status();
    reports.push_back(*r);
    ASSERT_TRUE(trainer.check_replicas().ok()) << "after step " << s + 1 << ": " << trainer.check_replicas();
  }
  EXPECT_GT(reports[0].cache_misses, 0);  // a fresh server compiles the first step
  for (const auto& r : reports) {
    EXPECT_GT(r.kernels, 0);
    if (r.step >= 2) EXPECT_EQ(r.cache_hits, r.kernels) << "step " << r.step << ": " << r.cache_misses << " misses";
  }
  EXPECT_LT(reports.back().loss, reports.front().loss);
}

TEST(MultiDeviceE2E, DataParallelTrainingOnTwoWorkers) { train(2, 5); }
TEST(MultiDeviceE2E, DataParallelTrainingOnThreeWorkers) { train(3, 3); }

// The worker's side of the Collective RPC, in process: it finds the buffer and hands it
// to the collectives library, and its mistakes come back as statuses naming the buffer.
TEST(MultiDeviceE2E, WorkerCollectiveChecksItsBufferAndRequest) {
  WorkerRuntime rt(WorkerRuntimeOptions{.device = "CPU:0", .target = "test", .threads = 1});
  ASSERT_TRUE(rt.alloc_buffer(7, 16).ok());
  HostTensor v = HostTensor::of(Scalar::Float32, {4}, {1, 2, 3, 4});
  ASSERT_TRUE(rt.write_buffer(7, 0, v.data).ok());
  CollectiveSpec spec;
  spec.group = cat("unit-", ::getpid());
  spec.op = "add";
  spec.dtype = "float32";
  spec.elements = 4;
  spec.transport = "shm";
  spec.timeout_ms = 5000;
  // A group of one: the reduction of one buffer is itself.
  auto ms = rt.collective(spec, 7);
  ASSERT_TRUE(ms.ok()) << ms.status();
  auto back = rt.read_buffer(7, 0, 0);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->bytes(), v.data);

  auto missing = rt.collective(spec, 8);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  CollectiveSpec too_many = spec;
  too_many.elements = 5;  // 20 bytes in a buffer of 16
  auto big = rt.collective(too_many, 7);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  EXPECT_NE(big.status().message().find("buffer 7"), std::string::npos) << big.status();
  CollectiveSpec bad_op = spec;
  bad_op.op = "xor";
  EXPECT_EQ(rt.collective(bad_op, 7).status().code(), absl::StatusCode::kInvalidArgument);
}

// A graph whose allreduce moves `elements` floats per device: each device broadcasts its
// one input value into a [1, elements] block, the blocks are summed across the devices
// (an ALLREDUCE of `elements` values) and each device then sums its copy to one value.
struct BigAllreduce {
  Graph g;
  const UOp* root = nullptr;
  Names names;
  BigAllreduce(int devices, int64_t elements) {
    std::vector<const UOp*> blocks;
    for (int d = 0; d < devices; ++d) {
      TensorBuilder tb(g, cat("CPU:", d));
      const UOp* x = tb.input(Scalar::Float32, {1});
      names.push_back({cat("x", d), tb.buffer_of(x)});
      blocks.push_back(tb.expand(tb.reshape(x, {1, 1}), {1, elements}));
    }
    const UOp* m = g.make(Op::MULTI, dtypes::float32, blocks, IntArg{0});
    const UOp* summed = g.make(Op::REDUCE_AXIS, dtypes::float32, {m}, ReduceAxisArg{ReduceOp::Add, {0}});
    const UOp* total = g.make(Op::REDUCE_AXIS, dtypes::float32, {summed}, ReduceAxisArg{ReduceOp::Add, {1}});
    root = g.make(Op::SINK, dtypes::void_, {total});
    names.push_back({"total", total});
  }
  std::vector<client::Input> bindings(int devices) const {
    std::vector<client::Input> b;
    for (int d = 0; d < devices; ++d) b.push_back({cat("x", d), HostTensor::of(Scalar::Float32, {1}, {0.25 * (d + 1)})});
    return b;
  }
};

TEST(MultiDeviceE2E, WorkerKilledDuringAllreduceFailsTheStepAndTheNextOneSucceeds) {
  // A short collective timeout: even a member waiting for a peer that never comes gives up
  // long before the client's deadline.
  Service svc(2, {"--collective-timeout-ms=15000", "--metrics-listen=127.0.0.1:0"});
  ASSERT_TRUE(svc.ok());
  const std::string metrics = testing::metrics_address(*svc.proc);
  ASSERT_FALSE(metrics.empty()) << svc.proc->log_tail();
  Session session = svc.session(2);
  const int64_t elements = int64_t{1} << 25;  // 128 MiB per device: an allreduce long enough to be caught in
  BigAllreduce big(2, elements);
  // Warm up: compile and load the kernels, so the next runs spend their time running.
  {
    auto r = session.run(big.root, big.names, big.bindings(2));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const int64_t pid0 = svc.worker("CPU:0").pid, pid1 = svc.worker("CPU:1").pid;
  ASSERT_GT(pid0, 0);
  ASSERT_GT(pid1, 0);

  absl::StatusOr<client::RunResult> failed;
  bool caught = false;
  auto killed_at = std::chrono::steady_clock::now();
  for (int attempt = 0; attempt < 10 && !caught; ++attempt) {
    auto running = std::async(std::launch::async, [&] { return session.run(big.root, big.names, big.bindings(2)); });
    // Kill CPU:1 once uopd is calling the members of the allreduce (the group has lived
    // since the warm-up, so each member knows the other's pid: a peer killed before or
    // during its part is a death either way).
    while (running.wait_for(std::chrono::microseconds(100)) != std::future_status::ready) {
      if (testing::metric(metrics, "uopd_collectives_running") > 0) {
        ::kill(static_cast<pid_t>(pid1), SIGKILL);
        killed_at = std::chrono::steady_clock::now();
        caught = true;
        break;
      }
    }
    failed = running.get();
  }
  ASSERT_TRUE(caught) << "never saw the allreduce running";
  // For the log (not asserted: tests do not time things): what the client was told, and
  // how long after the kill.
  std::cout << "killed CPU:1 during the allreduce; the step failed "
            << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed_at).count()
            << " ms later with: " << failed.status() << std::endl;
  ASSERT_FALSE(failed.ok());
  // Not DEADLINE_EXCEEDED: the step failed as soon as the worker was gone, without waiting.
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_NE(failed.status().message().find("CPU:1"), std::string::npos) << failed.status();
  EXPECT_NE(failed.status().message().find("allreduce"), std::string::npos) << failed.status();

  // The group died with its member: the next step forms another.
  const double formed = testing::metric(metrics, "uopd_collective_groups_formed_total");
  // The worker comes back; the next step (fresh inputs) succeeds on both devices.
  absl::StatusOr<client::RunResult> next;
  for (int i = 0; i < 100; ++i) {
    next = session.run(big.root, big.names, big.bindings(2));
    if (next.ok() || next.status().code() != absl::StatusCode::kUnavailable) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(next.ok()) << next.status();
  auto totals = parts(*next, "total");
  ASSERT_EQ(totals.size(), 2u);
  for (const client::RunOutput* o : totals) {
    double v = o->tensor.get(0).to_double(), want = 0.75 * static_cast<double>(elements);
    EXPECT_NEAR(v, want, want * 1e-3) << o->name;
  }
  EXPECT_EQ(testing::metric(metrics, "uopd_collective_groups_formed_total"), formed + 1);
  client::WorkerStatus w1 = svc.worker("CPU:1");
  EXPECT_EQ(w1.restarts, 1u);
  EXPECT_NE(w1.pid, pid1);
  EXPECT_EQ(svc.worker("CPU:0").pid, pid0);  // the survivor was not restarted

  // And training works again on the recovered service.
  demo::TrainOptions opts;
  opts.points_per_class = 16;
  opts.hidden = 8;
  demo::SpiralsTrainer trainer(session, opts);
  auto step = trainer.step();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(trainer.check_replicas().ok());
}

}  // namespace
}  // namespace uop
