// uopd end to end: real uopd and uop-worker processes on 127.0.0.1 with ephemeral ports,
// driven through the client library (and, for malformed requests, the raw stub). What the
// service promises its users: results equal to the reference interpreter; each kernel
// compiled once however many requests ask for it, and cached in memory, on disk and in
// Redis; a corrupt cache entry detected and recompiled; a worker killed mid-run reported
// as UNAVAILABLE and replaced; bad input refused with a clear status while the server
// keeps serving.
#include <signal.h>
#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "tests/e2e/proc_status.h"
#include "tests/e2e/scheduler_proc.h"
#include "tests/e2e/softmax_model.h"

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/uopd.grpc.pb.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;
using client::Session;
using testing::RedisServer;

std::string scratch(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() / ("uopd-e2e-" + tag + "-" + std::to_string(::getpid()) + "-" +
                                                        std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

// One uopd process and a client connected to it.
struct Uopd {
  std::unique_ptr<EmbeddedServer> proc;
  std::unique_ptr<Client> client;

  static Uopd start(std::vector<std::string> args) {
    Uopd u;
    auto p = EmbeddedServer::start(UOPD_BINARY, args);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return u;
    u.proc = std::move(*p);
    ClientOptions o;
    o.address = u.proc->address();
    auto c = Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) u.client = std::move(*c);
    return u;
  }
  client::Stats stats() {
    auto s = client->stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : client::Stats{};
  }
};

using Model = testing::SoftmaxModel;

void expect_matches(const std::vector<HostTensor>& want, const client::RunResult& got) {
  ASSERT_EQ(want.size(), got.outputs.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CompareResult c = compare(want[i], got.outputs[i].tensor);
    EXPECT_TRUE(c.ok) << got.outputs[i].name << ": " << c.message;
  }
}

// The deliberately slow kernel: a sum of 2^38 broadcast values, seconds of work.
struct SlowGraph {
  Graph g;
  const UOp* root;
  const UOp* x;
  explicit SlowGraph(int log2_elements = 38) {
    TensorBuilder tb(g);
    const UOp* in = tb.input(Scalar::Float32, {1});
    x = tb.buffer_of(in);
    const UOp* big = tb.expand(tb.reshape(in, {1, 1}), {int64_t{1} << (log2_elements - 16), int64_t{1} << 16});
    root = tb.sink({tb.reduce(big, ReduceOp::Add, {0, 1})});
  }
};

TEST(Uopd, RunMatchesTheInterpreter) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("run")});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  for (uint64_t seed : {1, 2}) {
    Model m(seed * 10);
    auto got = session->run(m.root, m.names, m.bindings);
    ASSERT_TRUE(got.ok()) << got.status();
    expect_matches(m.expected(), *got);
    EXPECT_EQ(got->outputs[0].name, "probs");
  }
  // Inputs uploaded as session buffers, outputs kept in the session and downloaded.
  Model m(7);
  std::vector<client::Input> via_buffers;
  for (auto& in : m.bindings) {
    auto id = session->upload_tensor(std::get<HostTensor>(in.value));
    ASSERT_TRUE(id.ok()) << id.status();
    via_buffers.push_back({std::get<std::string>(in.node), *id});
  }
  auto kept = session->run(m.root, m.names, via_buffers, /*keep_outputs=*/true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(kept->outputs[0].kept());
  auto data = session->download_tensor(kept->outputs[0]);
  ASSERT_TRUE(data.ok()) << data.status();
  client::RunResult as_data = *kept;
  as_data.outputs[0].tensor = *data;
  expect_matches(m.expected(), as_data);
  EXPECT_EQ(u.stats().buffers, 4u);  // three inputs and the kept output
  ASSERT_TRUE(session->close().ok());
  EXPECT_EQ(u.stats().buffers, 0u);  // closing the session freed them
}

// Inline tensors larger than one Execute carries (Executor::kInlineBytes, 4 MiB): the
// input is allocated and streamed before the Execute, the output streamed back after it,
// the small ones travel inside it; all of it still matches the interpreter.
TEST(Uopd, LargeInlineTensorsStreamAroundTheExecute) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("large")});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  Model m(3, /*n=*/50000, /*k=*/24, /*m=*/24);  // x and probs: 4.8 MB each; w and b small
  ASSERT_GT(std::get<HostTensor>(m.bindings[0].value).nbytes(), int64_t{4} << 20);
  auto got = session->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_GT(got->outputs.at(0).tensor.nbytes(), int64_t{4} << 20);
  expect_matches(m.expected(), *got);
  // And a small run after it, on the same worker, is unaffected.
  Model small(4);
  auto again = session->run(small.root, small.names, small.bindings);
  ASSERT_TRUE(again.ok()) << again.status();
  expect_matches(small.expected(), *again);
}

// Execute reaches an embedded worker through its shared-memory execute lane; a request
// that does not fit a lane slot (a 2 MiB inline input: inside one Execute, over the 1 MiB
// slot) goes over gRPC, and so does everything with --exec-lane=grpc. The results match
// the interpreter whichever way they went, and Stats counts each way.
TEST(Uopd, EmbeddedWorkersExecuteThroughTheLaneOrGrpc) {
  for (std::string mode : {"shm", "grpc"}) {
    SCOPED_TRACE("--exec-lane=" + mode);
    Uopd u = Uopd::start({"--cache-dir=" + scratch("lane"), "--workers=1", "--exec-lane=" + mode});
    ASSERT_TRUE(u.client);
    auto session = u.client->create_session();
    ASSERT_TRUE(session.ok()) << session.status();
    for (uint64_t seed : {11, 12, 13}) {
      Model m(seed);
      auto got = session->run(m.root, m.names, m.bindings);
      ASSERT_TRUE(got.ok()) << got.status();
      expect_matches(m.expected(), *got);
    }
    client::Stats small = u.stats();
    EXPECT_EQ(small.worker_executes_lane, mode == "shm" ? 3u : 0u);
    EXPECT_EQ(small.worker_executes_grpc, mode == "shm" ? 0u : 3u);

    Model big(14, /*n=*/20000, /*k=*/24, /*m=*/24);  // x: 1.9 MB
    ASSERT_GT(std::get<HostTensor>(big.bindings[0].value).nbytes(), int64_t{1} << 20);
    auto got = session->run(big.root, big.names, big.bindings);
    ASSERT_TRUE(got.ok()) << got.status();
    expect_matches(big.expected(), *got);
    client::Stats after = u.stats();
    EXPECT_EQ(after.worker_executes_lane, small.worker_executes_lane);
    EXPECT_EQ(after.worker_executes_grpc, small.worker_executes_grpc + 1);

    // Buffer traffic takes the same way: 3 MiB up at an offset, in pieces of a slot or
    // less, and back down byte for byte.
    auto id = session->create_buffer(Scalar::UInt8, 3 << 20);
    ASSERT_TRUE(id.ok()) << id.status();
    std::string bytes(3 * (1 << 20) - 1000, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
    ASSERT_TRUE(session->upload(*id, bytes, 1000).ok());
    auto back = session->download(*id);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->size(), size_t{3} << 20);
    EXPECT_EQ(back->substr(0, 1000), std::string(1000, '\0'));
    EXPECT_TRUE(back->substr(1000) == bytes) << "the downloaded bytes differ from the uploaded ones";
  }
}

// Flags take their value after '=' or as the next argument (`--listen 0.0.0.0:7070` once
// failed with "unexpected argument"), and the values given that way are the ones used.
TEST(Uopd, FlagValuesMayFollowASpace) {
  Uopd u = Uopd::start({"--listen", "127.0.0.1:0", "--cache-dir", "", "--workers", "1", "--exec-lane", "grpc"});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  Model m(21);
  auto got = session->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(got.ok()) << got.status();
  expect_matches(m.expected(), *got);
  client::Stats st = u.stats();
  EXPECT_EQ(st.workers.size(), 1u);
  EXPECT_EQ(st.worker_executes_grpc, 1u);
  EXPECT_EQ(st.worker_executes_lane, 0u);
}

// Bad usage exits 2 before anything starts, naming the flag; --help lists every flag.
TEST(Uopd, UsageErrorsNameTheFlag) {
  auto run = [](const std::string& args) { return testing::run_command(UOPD_BINARY, args); };
  for (auto [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--bogus", "--bogus is not an option of 'uopd'"},
           {"stray", "unexpected argument 'stray' for 'uopd'"},
           {"--workers=two", "--workers takes a non-negative integer, got 'two'"},
           {"--exec-lane tcp", "--exec-lane takes shm or grpc, got 'tcp'"},
           {"--listen", "--listen needs a value"},
           {"--allow-custom=yes", "--allow-custom takes true or false, got 'yes'"}}) {
    auto [rc, out] = run(args);
    EXPECT_EQ(rc, 2) << args << ": " << out;
    EXPECT_NE(out.find(says), std::string::npos) << args << ": " << out;
  }
  auto [rc, out] = run("--help");
  EXPECT_EQ(rc, 0) << out;
  for (const char* flag : {"--listen=HOST:PORT", "--internal-listen=", "--workers=N", "--redis-tls ", "--tokens-file=",
                           "--tenant-worker-idle-s=N"})
    EXPECT_NE(out.find(flag), std::string::npos) << flag << "\n" << out;
}

TEST(Uopd, SecondCompileIsAHitAndCompilesNothing) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("hit")});
  ASSERT_TRUE(u.client);
  Model m(1);
  auto first = u.client->compile(m.root, m.names);
  ASSERT_TRUE(first.ok()) << first.status();
  for (const auto& k : first->kernels) EXPECT_EQ(k.status, client::CacheStatus::Miss) << k.name;
  uint64_t compiles = u.stats().compiles;
  EXPECT_EQ(compiles, first->kernels.size());
  auto second = u.client->compile(m.root, m.names);
  ASSERT_TRUE(second.ok()) << second.status();
  for (const auto& k : second->kernels) {
    EXPECT_EQ(k.status, client::CacheStatus::Hit) << k.name;
    EXPECT_EQ(k.tier, "memory");
  }
  EXPECT_EQ(u.stats().compiles, compiles);  // nothing compiled again
  EXPECT_TRUE(second->plan_cached);
}

// A loop schedule given with Compile (CompileRequest.schedules) makes its own cache entry
// of the same kernel digest, recorded in the kernel's ABI; schedules that are malformed,
// do not fit, name no kernel or name one twice are INVALID_ARGUMENT naming what is wrong,
// and the server goes on serving.
TEST(Uopd, SchedulesMakeTheirOwnEntriesAndHostileOnesAreRefused) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("sched")});
  ASSERT_TRUE(u.client);
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {4, 1000});
  const UOp* root = tb.sink({tb.alu(Op::MUL, {x, x})});
  auto plain = u.client->compile(root, {});
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(plain->kernels.size(), 1u);
  const client::Kernel& k = plain->kernels[0];
  auto scheduled = u.client->compile(root, {}, {}, false, false, {{"", "split(1,7,upcast);thread(0)"}});
  ASSERT_TRUE(scheduled.ok()) << scheduled.status();
  ASSERT_EQ(scheduled->kernels.size(), 1u);
  EXPECT_EQ(scheduled->kernels[0].digest, k.digest);
  EXPECT_NE(scheduled->kernels[0].cache_key, k.cache_key);
  EXPECT_EQ(scheduled->kernels[0].status, client::CacheStatus::Miss);
  EXPECT_NE(scheduled->kernels[0].abi.find("schedule 27:split(1,7,upcast);thread(0)\n"), std::string::npos)
      << scheduled->kernels[0].abi;
  auto by_digest = u.client->compile(root, {}, {}, false, false, {{k.digest.substr(0, 12), "split(1,7,upcast);thread(0)"}});
  ASSERT_TRUE(by_digest.ok()) << by_digest.status();
  EXPECT_EQ(by_digest->kernels[0].status, client::CacheStatus::Hit);

  struct Case {
    std::vector<client::KernelSchedule> schedules;
    std::string says;
  };
  std::string many_steps;
  for (int i = 0; i < 100; ++i) many_steps += "reorder(0,1);";
  const std::vector<Case> cases = {
      {{{"", std::string(1 << 20, 'x')}}, "1048576 characters, at most 4096"},
      {{{"", many_steps}}, "steps, at most 64"},
      {{{"", "split(1,2147483648,upcast)"}}, "the factor must be in [2, 1000]"},
      {{{"", "split(1,99999999999,upcast)"}}, "is not a decimal number"},
      {{{"", "split(1,1000,upcast)"}}, "the Upcast ranges would make 1000 lanes, at most 256"},
      {{{"", "split(0,4,upcast);split(1,125,upcast)"}}, "would make 500 lanes"},
      {{{"", "split(9,2,upcast)"}}, "the kernel has no axis 9"},
      {{{"", "thread(1)"}}, "is not the STORE's outermost loop"},
      {{{"", "split(1,8,upcast)"}, {k.digest, "split(1,4,upcast)"}}, "is given a schedule twice"},
      {{{std::string(64, 'f'), "split(1,8,upcast)"}}, "the graph has no kernel of digest 'ffff"},
      {{{"0", "split(1,8,upcast)"}}, "no kernel of digest '0'"},
      {{{std::string(100000, 'a'), "split(1,8,upcast)"}}, "...'"},
  };
  for (const Case& c : cases) {
    auto r = u.client->compile(root, {}, {}, false, false, c.schedules);
    ASSERT_FALSE(r.ok()) << c.says;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(std::string(r.status().message()).find(c.says), std::string::npos) << r.status();
    EXPECT_LT(r.status().message().size(), 2000u) << "a message never echoes a whole field";
  }
  // A graph of several kernels: a schedule must name its kernel.
  Model m(1);
  auto several = u.client->compile(m.root, m.names, {}, false, false, {{"", "thread(0)"}});
  EXPECT_EQ(several.status().code(), absl::StatusCode::kInvalidArgument) << several.status();
  EXPECT_NE(std::string(several.status().message()).find("names no kernel, and the graph has"), std::string::npos)
      << several.status();
  // Still serving: the plain compile is a hit.
  auto again = u.client->compile(root, {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->kernels[0].status, client::CacheStatus::Hit);
  EXPECT_EQ(again->kernels[0].cache_key, k.cache_key);
}

TEST(Uopd, ConcurrentIdenticalCompilesCompileOnce) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("coalesce"), "--compile-threads=2"});
  ASSERT_TRUE(u.client);
  Model m(1, 40);
  constexpr int kClients = 16;
  std::vector<std::future<absl::StatusOr<client::CompileResult>>> calls;
  for (int i = 0; i < kClients; ++i)
    calls.push_back(std::async(std::launch::async, [&] { return u.client->compile(m.root, m.names); }));
  size_t kernels = 0;
  for (auto& c : calls) {
    auto r = c.get();
    ASSERT_TRUE(r.ok()) << r.status();
    kernels = r->kernels.size();
  }
  client::Stats s = u.stats();
  EXPECT_EQ(s.compiles, kernels) << "each kernel compiled once";
  EXPECT_EQ(s.cache_coalesced + s.cache_hits_memory, (kClients - 1) * kernels);
}

TEST(Uopd, RestartedServerHitsItsDiskCache) {
  std::string dir = scratch("restart");
  Model m(1);
  {
    Uopd u = Uopd::start({"--cache-dir=" + dir});
    ASSERT_TRUE(u.client);
    ASSERT_TRUE(u.client->compile(m.root, m.names).ok());
    ASSERT_TRUE(u.proc->stop().ok()) << u.proc->log_tail();
  }
  Uopd u = Uopd::start({"--cache-dir=" + dir});
  ASSERT_TRUE(u.client);
  auto again = u.client->compile(m.root, m.names);
  ASSERT_TRUE(again.ok()) << again.status();
  for (const auto& k : again->kernels) {
    EXPECT_EQ(k.status, client::CacheStatus::Hit) << k.name;
    EXPECT_EQ(k.tier, "disk") << k.name;
  }
  EXPECT_EQ(u.stats().compiles, 0u);
}

TEST(Uopd, CorruptDiskEntryIsDetectedRecompiledAndCounted) {
  std::string dir = scratch("corrupt");
  Model m(3);
  {
    Uopd u = Uopd::start({"--cache-dir=" + dir});
    ASSERT_TRUE(u.client);
    ASSERT_TRUE(u.client->compile(m.root, m.names).ok());
    ASSERT_TRUE(u.proc->stop().ok());
  }
  int corrupted = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().parent_path() == dir) continue;  // entries, not the cache's key
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(e.file_size() / 2));
    f.put('\x5a' ^ static_cast<char>(corrupted + 1));
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  Uopd u = Uopd::start({"--cache-dir=" + dir});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok());
  auto got = session->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(got.ok()) << got.status();
  expect_matches(m.expected(), *got);  // results stay right
  for (const auto& k : got->kernels) EXPECT_EQ(k.status, client::CacheStatus::Miss) << k.name;
  client::Stats s = u.stats();
  EXPECT_GE(s.cache_errors, static_cast<uint64_t>(corrupted));
  EXPECT_EQ(s.compiles, got->kernels.size());
}

TEST(Uopd, WorkerKilledMidRunIsUnavailableThenRecovers) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("kill"), "--workers=1"});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok());
  client::Stats before = u.stats();
  ASSERT_EQ(before.workers.size(), 1u);
  ASSERT_GT(before.workers[0].pid, 0);
  const int64_t worker = before.workers[0].pid;
  const int64_t idle = testing::cpu_ticks(worker);
  SlowGraph slow;
  HostTensor one = HostTensor::of(Scalar::Float32, {1}, {1.0});
  auto running = std::async(std::launch::async, [&] { return session->run(slow.root, {}, {{slow.x, one}}); });
  // Kill the worker once its kernel runs (it takes seconds): then it burns CPU.
  ASSERT_TRUE(testing::burned({worker}, idle)) << "the worker never ran the kernel";
  ::kill(static_cast<pid_t>(worker), SIGKILL);
  auto r = running.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("CPU:0"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("signal 9"), std::string::npos) << r.status();
  // The next request succeeds on the restarted worker.
  Model m(5);
  auto next = session->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(next.ok()) << next.status();
  expect_matches(m.expected(), *next);
  client::Stats after = u.stats();
  EXPECT_EQ(after.workers[0].restarts, 1u);
  EXPECT_NE(after.workers[0].pid, before.workers[0].pid);
}

TEST(Uopd, TwoServersShareARedisCache) {
  if (!RedisServer::installed()) GTEST_SKIP() << "redis-server is not installed";
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  std::string flag = "--redis=127.0.0.1:" + std::to_string(redis.port());
  // Schedulers sharing a Redis share the key that authenticates its entries.
  std::string key = "--cache-key-file=" + testing::write_cache_key_file(scratch("redis-key") + "/cache.key");
  Uopd a = Uopd::start({"--cache-dir=" + scratch("redis-a"), flag, key, "--workers=1"});
  Uopd b = Uopd::start({"--cache-dir=" + scratch("redis-b"), flag, key, "--workers=1"});
  ASSERT_TRUE(a.client && b.client);
  Model m(9);
  auto first = a.client->compile(m.root, m.names);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = b.client->compile(m.root, m.names);
  ASSERT_TRUE(second.ok()) << second.status();
  for (const auto& k : second->kernels) {
    EXPECT_EQ(k.status, client::CacheStatus::Hit) << k.name;
    EXPECT_EQ(k.tier, "redis") << k.name;
  }
  EXPECT_EQ(b.stats().compiles, 0u);
  // A Redis that goes away is a miss plus an error, never a failed request.
  redis.stop();
  Model other(11, 32);
  auto without = b.client->compile(other.root, other.names);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_GT(b.stats().cache_errors, 0u);
}

// A unary call with raw bytes as the request, bypassing the client library's encoding.
absl::Status raw_call(const std::string& address, const std::string& method, const std::string& bytes) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) { done.set_value(s); });
  grpc::Status s = done.get_future().get();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

TEST(Uopd, BadInputGetsClearErrorsAndTheServerKeepsServing) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("bad"), "--session-bytes=1048576", "--workers=1"});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok());

  // Garbage bytes where a request should be.
  absl::Status garbage = raw_call(u.proc->address(), "/uopd.v1.Uopd/Compile", std::string("\xff\xfe garbage \x01\x02", 14));
  EXPECT_FALSE(garbage.ok());
  // A request that parses but holds a graph that breaks the wire rules.
  ::uopd::v1::CompileRequest bad_graph;
  auto* node = bad_graph.mutable_graph()->add_nodes();
  node->set_op(::uop::v1::ADD);
  node->add_src(0);
  node->add_src(5);
  bad_graph.mutable_graph()->set_format_version(::uop::v1::FORMAT_VERSION_1);
  absl::Status forward = raw_call(u.proc->address(), "/uopd.v1.Uopd/Compile", bad_graph.SerializeAsString());
  EXPECT_EQ(forward.code(), absl::StatusCode::kInvalidArgument) << forward;
  EXPECT_NE(forward.message().find("codec.topological"), std::string::npos) << forward;

  // A graph that decodes but does not verify: int32 + float32.
  {
    Graph g;
    TensorBuilder tb(g);
    const UOp* a = tb.input(Scalar::Int32, {4});
    const UOp* f = tb.input(Scalar::Float32, {4});
    const UOp* bad = g.make(Op::ADD, dtypes::int32, {a, f});
    auto r = u.client->compile(g.make(Op::SINK, dtypes::void_, {bad}), {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("alu.dtype"), std::string::npos) << r.status();
  }
  // Unknown buffer ids, and a session that does not exist.
  auto dl = session->download("0123456789abcdef0123456789abcdef");
  EXPECT_EQ(dl.status().code(), absl::StatusCode::kNotFound) << dl.status();
  // The session quota, and an upload past a buffer's end.
  auto huge = session->create_buffer(Scalar::Float32, 1 << 20);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find("quota"), std::string::npos) << huge.status();
  auto small = session->create_buffer(Scalar::Float32, 16);
  ASSERT_TRUE(small.ok()) << small.status();
  absl::Status past = session->upload(*small, std::string(128, 'x'));
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;

  // A client that goes away mid-upload.
  {
    auto channel = grpc::CreateChannel(u.proc->address(), grpc::InsecureChannelCredentials());
    auto stub = ::uopd::v1::Uopd::NewStub(channel);
    grpc::ClientContext ctx;
    ::uopd::v1::UploadResponse resp;
    auto writer = stub->Upload(&ctx, &resp);
    ::uopd::v1::UploadChunk c;
    c.set_session_id(session->id());
    c.set_buffer_id(*small);
    c.set_data(std::string(16, 'y'));
    writer->Write(c);
    ctx.TryCancel();
    (void)writer->Finish();
  }

  // Everyone else is still served, and right.
  Model m(13);
  auto ok = session->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(ok.ok()) << ok.status();
  expect_matches(m.expected(), *ok);
  ASSERT_TRUE(session->close().ok());
  client::Stats s = u.stats();
  EXPECT_EQ(s.buffers, 0u) << "no buffer outlives its session";
  EXPECT_EQ(s.sessions, 0u);
}

TEST(Uopd, SigtermDrainsAndLeavesNoWorkers) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("term"), "--workers=2"});
  ASSERT_TRUE(u.client);
  std::vector<int64_t> pids;
  for (const auto& w : u.stats().workers) pids.push_back(w.pid);
  ASSERT_EQ(pids.size(), 2u);
  // A run in flight when SIGTERM arrives finishes, and its caller gets the result.
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok());
  SlowGraph slow(35);
  HostTensor one = HostTensor::of(Scalar::Float32, {1}, {1.0});
  const int64_t idle = testing::cpu_ticks({pids[0], pids[1]});
  auto running = std::async(std::launch::async, [&] { return session->run(slow.root, {}, {{slow.x, one}}); });
  ASSERT_TRUE(testing::burned({pids[0], pids[1]}, idle)) << "no worker ran the kernel";  // the run is in flight
  ::kill(u.proc->pid(), SIGTERM);
  auto r = running.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->outputs[0].tensor.get(0).as_float(), 0);  // (float32 sums of ones saturate: the value is not the point)
  ASSERT_TRUE(u.proc->stop().ok()) << u.proc->log_tail();
  for (int64_t pid : pids) EXPECT_NE(::kill(static_cast<pid_t>(pid), 0), 0) << "worker " << pid << " outlived uopd";
}

}  // namespace
}  // namespace uop
