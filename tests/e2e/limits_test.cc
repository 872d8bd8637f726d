// uopd's limits on memory and time, end to end against real uopd and uop-worker
// processes: what a hostile or careless client can send and what it gets back. A flood of
// tiny nodes, or of tiny messages inside one node, is refused before it is parsed, with
// the limit named and uopd's peak memory near the request's size; Runs with 1 GiB outputs
// are answered with the outputs left in the session, four at once, uopd's memory bounded;
// a Run's temporaries count against the session's and the tenant's byte quotas; an Upload
// left open is ended by the server; idle timeouts, sessions and buffers have limits
// without a tokens file; half-open connections to the metrics port leave scrapes served,
// and tenant names stay off it unless the operator asks. Figures (peak RSS) are printed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/uopd.grpc.pb.h"
#include "tests/e2e/hostile_graphs.h"
#include "tests/e2e/metrics_scrape.h"
#include "tests/e2e/proc_status.h"
#include "tests/e2e/raw_requests.h"
#include "tests/e2e/softmax_model.h"
#include "tests/e2e/worker_proc.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;
using testing::BigOutput;
using testing::empty_fields;
using testing::from_grpc;
using testing::memory_kib;
using testing::put_field;
using testing::raw_unary;
using testing::wait_until;
using testing::connect_to;
using testing::gauge;
using testing::metrics_address;
using testing::scrape;
namespace pb = ::uopd::v1;

std::string scratch(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() /
             ("uopd-limits-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

bool contains(std::string_view text, std::string_view what) { return text.find(what) != std::string_view::npos; }
bool contains(const absl::Status& s, std::string_view what) { return contains(std::string_view(s.message().data(), s.message().size()), what); }

double mib(uint64_t kib) { return static_cast<double>(kib) / 1024.0; }

// One uopd and a client of it.
struct Uopd {
  std::unique_ptr<EmbeddedServer> proc;
  std::unique_ptr<Client> client;

  static Uopd start(std::vector<std::string> args, const std::string& token = "") {
    Uopd u;
    args.push_back("--cache-dir=" + scratch("cache"));
    auto p = EmbeddedServer::start(UOPD_BINARY, args);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return u;
    u.proc = std::move(*p);
    u.client = u.connect(token);
    return u;
  }
  std::unique_ptr<Client> connect(const std::string& token = "") const {
    ClientOptions o;
    o.address = proc->address();
    o.deadline = absl::Minutes(5);
    o.bearer_token = token;
    auto c = Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::unique_ptr<pb::Uopd::Stub> stub() const {
    return pb::Uopd::NewStub(grpc::CreateChannel(proc->address(), grpc::InsecureChannelCredentials()));
  }
  bool alive() const { return ::kill(proc->pid(), 0) == 0 && client->stats().ok(); }
  client::Stats stats() const {
    auto s = client->stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : client::Stats{};
  }
  std::pair<uint64_t, uint64_t> memory() const { return memory_kib(proc->pid()); }
};

std::unique_ptr<grpc::ClientContext> context(absl::Duration deadline = absl::Minutes(5)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  return ctx;
}

// A Run with a temporary of n float32 values between two kernels and a scalar output.
struct BigTemporary {
  Graph g;
  const UOp* root;
  const UOp* x;
  const UOp* in;
  explicit BigTemporary(int64_t n) {
    TensorBuilder tb(g);
    in = tb.input(Scalar::Float32, {1});
    x = tb.buffer_of(in);
    const UOp* wide = tb.contiguous(tb.alu(Op::MUL, {tb.expand(in, {n}), tb.full(Scalar::Float32, 0.5, {n})}));
    root = tb.sink({tb.reduce(wide, ReduceOp::Add, {0})});
  }
};

// ---- Decoding bounded before materialization ----

// 100M empty nodes in a 200 MB RunRequest (under the 256 MiB request limit): counted on
// the wire and refused naming max_nodes, before protobuf builds one of them; uopd's peak
// memory stays near the request's size, and it serves the next client.
TEST(Limits, NodeFloodIsRefusedBeforeItIsParsed) {
  Uopd u = Uopd::start({"--workers=1"});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();

  constexpr uint64_t kNodes = 100'000'000;
  std::string graph = "\x08\x01";  // format_version: 1
  graph += empty_fields(2, kNodes);  // nodes
  std::string request;
  put_field(request, 1, session->id());
  put_field(request, 2, graph);
  graph.clear();
  graph.shrink_to_fit();
  ASSERT_LT(request.size(), size_t{256} << 20);

  auto [rss_before, hwm_before] = u.memory();
  absl::Status s = raw_unary(u.proc->address(), "/uopd.v1.Uopd/Run", request);
  auto [rss_after, hwm_after] = u.memory();
  std::fprintf(stderr, "  node flood: %.1f MiB request; uopd VmRSS %.1f MiB before, peak VmHWM %.1f MiB (%.1f before)\n",
               request.size() / 1048576.0, mib(rss_before), mib(hwm_after), mib(hwm_before));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(contains(s, "max_nodes")) << s;
  // The request as received, and little else: parsing it would have taken ~50x.
  EXPECT_LT(hwm_after, rss_before + 2 * request.size() / 1024) << "peak " << mib(hwm_after) << " MiB";

  testing::SoftmaxModel m(5);
  auto ok = session->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(ok.ok()) << ok.status();
  CompareResult c = compare(m.expected()[0], ok->outputs[0].tensor);
  EXPECT_TRUE(c.ok) << c.message;
}

// The same for messages inside one node: 10M empty VCONST values in a 20 MB Compile
// request (~50x that once parsed) are over what one request may hold, refused naming the
// limit before they are parsed.
TEST(Limits, MessageFloodInsideANodeIsRefusedBeforeItIsParsed) {
  Uopd u = Uopd::start({"--workers=1", "--max-request-memory=268435456"});
  ASSERT_TRUE(u.client);
  constexpr uint64_t kValues = 10'000'000;
  std::string vconst = empty_fields(1, kValues);  // VConstArg.values
  std::string node;
  node += "\x08\x1a";  // op: VCONST (26)
  put_field(node, 11, vconst);
  vconst.clear();
  std::string graph = "\x08\x01";
  put_field(graph, 2, node);
  node.clear();
  std::string request;
  put_field(request, 1, graph);  // CompileRequest.graph
  graph.clear();

  auto [rss_before, hwm_before] = u.memory();
  absl::Status s = raw_unary(u.proc->address(), "/uopd.v1.Uopd/Compile", request);
  auto [rss_after, hwm_after] = u.memory();
  std::fprintf(stderr, "  value flood: %.1f MiB request; uopd VmRSS %.1f MiB before, peak VmHWM %.1f MiB\n",
               request.size() / 1048576.0, mib(rss_before), mib(hwm_after));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(contains(s, "--max-request-memory")) << s;
  EXPECT_LT(hwm_after, rss_before + 4 * request.size() / 1024) << "peak " << mib(hwm_after) << " MiB";

  // And in a request's other fields: 10M empty bindings of a Run.
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  std::string run;
  put_field(run, 1, session->id());
  run += empty_fields(3, kValues);  // RunRequest.inputs
  absl::Status bindings = raw_unary(u.proc->address(), "/uopd.v1.Uopd/Run", run);
  auto [rss_end, hwm_end] = u.memory();
  std::fprintf(stderr, "  binding flood: %.1f MiB request; uopd peak VmHWM %.1f MiB\n", run.size() / 1048576.0, mib(hwm_end));
  EXPECT_EQ(bindings.code(), absl::StatusCode::kResourceExhausted) << bindings;
  EXPECT_TRUE(contains(bindings, "--max-request-memory")) << bindings;
  EXPECT_LT(hwm_end, rss_before + 4 * run.size() / 1024) << "peak " << mib(hwm_end) << " MiB";
  EXPECT_TRUE(u.alive());
}

// ---- Response memory ----

// Four Runs at once, each with a 1 GiB output: answered (the outputs stay in the session
// as buffers, past --max-inline-output-bytes), uopd's memory far below one output's size,
// the outputs' bytes right when downloaded.
TEST(Limits, GiantOutputsStayInTheSessionFourAtOnce) {
  Uopd u = Uopd::start({"--workers=1"});
  ASSERT_TRUE(u.client);
  BigOutput big(28);  // 2^28 float32: 1 GiB
  HostTensor x = HostTensor::of(Scalar::Float32, {1}, {1.5});
  // One session each: a session's own quota (4 GiB at most) is not what is probed here.
  std::vector<client::Session> sessions;
  std::vector<pb::RunRequest> reqs(4);
  for (pb::RunRequest& req : reqs) {
    auto s = u.client->create_session();
    ASSERT_TRUE(s.ok()) << s.status();
    req.set_session_id(s->id());
    sessions.push_back(std::move(*s));
    encode_proto(big.root, {{"x", big.x}}, req.mutable_graph());
    pb::Binding* b = req.add_inputs();
    b->set_name("x");
    b->mutable_tensor()->set_dtype(::uop::v1::DType::FLOAT32);
    b->mutable_tensor()->add_shape(1);
    b->mutable_tensor()->set_data(x.data);
  }

  auto [rss_before, hwm_before] = u.memory();
  std::vector<std::future<std::pair<absl::Status, pb::RunResponse>>> runs;
  for (const pb::RunRequest& req : reqs)
    runs.push_back(std::async(std::launch::async, [&u, &req] {
      auto stub = u.stub();
      auto ctx = context();
      pb::RunResponse resp;
      absl::Status s = from_grpc(stub->Run(ctx.get(), req, &resp));
      return std::make_pair(s, resp);
    }));
  int answered = 0;
  std::vector<std::pair<size_t, std::string>> kept;  // session, buffer
  for (size_t i = 0; i < runs.size(); ++i) {
    auto [s, resp] = runs[i].get();
    std::fprintf(stderr, "  1 GiB output, run %zu: %s\n", i, s.ok() ? "OK, output kept in the session" : s.ToString().c_str());
    // A worker without the memory for all four says so; nothing else may go wrong.
    if (s.code() == absl::StatusCode::kResourceExhausted) continue;
    ASSERT_TRUE(s.ok()) << s;
    ++answered;
    ASSERT_EQ(resp.outputs_size(), 1);
    EXPECT_EQ(resp.outputs(0).value_case(), pb::Output::kBufferId) << "a 1 GiB output came back inline";
    kept.emplace_back(i, resp.outputs(0).buffer_id());
  }
  auto [rss_after, hwm_after] = u.memory();
  std::fprintf(stderr, "  1 GiB outputs x4: %d answered; uopd VmRSS %.1f MiB before, peak VmHWM %.1f MiB\n", answered,
               mib(rss_before), mib(hwm_after));
  EXPECT_GE(answered, 1);
  EXPECT_LT(hwm_after, rss_before + (256u << 10)) << "peak " << mib(hwm_after) << " MiB";
  ASSERT_TRUE(u.alive());
  // The last 1 MiB of one of them, downloaded: x + x everywhere.
  ASSERT_FALSE(kept.empty());
  auto tail = sessions[kept[0].first].download(kept[0].second, (uint64_t{1} << 30) - (1 << 20), 1 << 20);
  ASSERT_TRUE(tail.ok()) << tail.status();
  ASSERT_EQ(tail->size(), size_t{1} << 20);
  std::vector<float> want((1 << 20) / 4, 3.0f);
  EXPECT_EQ(std::memcmp(tail->data(), want.data(), tail->size()), 0);
  for (auto& [i, id] : kept) EXPECT_TRUE(sessions[i].free_buffer(id).ok());
  EXPECT_EQ(u.stats().buffer_bytes, 0u);
}

// The client library downloads and frees an output the server left in the session, so
// Session::run gives data whatever its size; outputs fit inline in order while they fit
// --max-inline-output-bytes together.
TEST(Limits, OutputsPastTheInlineLimitAreDownloadedByTheClient) {
  Uopd u = Uopd::start({"--workers=1", "--max-inline-output-bytes=1048576"});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  testing::SoftmaxModel m(3, /*n=*/50000, /*k=*/24, /*m=*/24);  // probs: 4.8 MB
  auto got = session->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_FALSE(got->outputs[0].kept());
  CompareResult c = compare(m.expected()[0], got->outputs[0].tensor);
  EXPECT_TRUE(c.ok) << c.message;
  EXPECT_EQ(u.stats().buffers, 0u) << "the downloaded output was freed";

  // Two outputs of 600 KB: the first inline, the second (past 1 MiB together) kept.
  Graph g;
  TensorBuilder tb(g);
  const UOp* in = tb.input(Scalar::Float32, {150000});
  const UOp* twice = tb.alu(Op::ADD, {in, in});
  const UOp* square = tb.alu(Op::MUL, {in, in});
  const UOp* root = tb.sink({twice, square});
  HostTensor x = HostTensor::random(Scalar::Float32, {150000}, 9);
  auto want = interpret(g, root, {{tb.buffer_of(in), x}});
  ASSERT_TRUE(want.ok()) << want.status();
  pb::RunRequest req;
  req.set_session_id(session->id());
  encode_proto(root, {{"x", tb.buffer_of(in)}}, req.mutable_graph());
  pb::Binding* b = req.add_inputs();
  b->set_name("x");
  b->mutable_tensor()->set_dtype(::uop::v1::DType::FLOAT32);
  b->mutable_tensor()->add_shape(150000);
  b->mutable_tensor()->set_data(x.data);
  pb::RunResponse resp;
  auto ctx = context();
  ASSERT_TRUE(u.stub()->Run(ctx.get(), req, &resp).ok());
  ASSERT_EQ(resp.outputs_size(), 2);
  EXPECT_EQ(resp.outputs(0).value_case(), pb::Output::kData);
  EXPECT_EQ(resp.outputs(0).data(), (*want)[0].data);
  ASSERT_EQ(resp.outputs(1).value_case(), pb::Output::kBufferId);
  auto second = session->download(resp.outputs(1).buffer_id());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, (*want)[1].data);
}


// Requests share one budget for bytes in flight: while a slow Run holds its 32 MiB of
// inline outputs, another that needs as much again is refused naming the limit; once the
// first has answered, it fits.
TEST(Limits, RequestsShareTheBudgetForBytesInFlight) {
  Uopd u = Uopd::start({"--workers=1", "--metrics-listen=127.0.0.1:0", "--max-inflight-bytes=50331648"});  // 48 MiB
  ASSERT_TRUE(u.client);
  const std::string metrics = metrics_address(*u.proc);
  ASSERT_FALSE(metrics.empty()) << u.proc->log_tail();
  Graph g;
  TensorBuilder tb(g);
  const UOp* in = tb.input(Scalar::Float32, {1});
  const UOp* grid = tb.expand(tb.reshape(in, {1, 1}), {int64_t{1} << 20, int64_t{1} << 16});
  const UOp* slow = tb.reduce(grid, ReduceOp::Add, {0, 1});  // 2^36 additions: seconds
  const UOp* wide = tb.expand(in, {int64_t{1} << 23});      // 32 MiB
  const UOp* root = tb.sink({slow, tb.alu(Op::ADD, {wide, wide})});
  HostTensor x = HostTensor::of(Scalar::Float32, {1}, {1.0});
  auto first_session = u.client->create_session();
  auto second_session = u.client->create_session();
  ASSERT_TRUE(first_session.ok() && second_session.ok());
  auto first = std::async(std::launch::async, [&] { return first_session->run(root, {}, {{tb.buffer_of(in), x}}); });
  ASSERT_TRUE(wait_until([&] { return gauge(scrape(metrics), "uopd_inflight_bytes") >= double(32 << 20); }, absl::Seconds(60)))
      << "the slow run never held its outputs' bytes";
  BigOutput other(23);  // 32 MiB
  auto refused = second_session->run(other.root, {}, {{other.x, x}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(contains(refused.status(), "--max-inflight-bytes")) << refused.status();
  auto done = first.get();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_GT(done->outputs[0].tensor.get(0).as_float(), 0);
  std::vector<float> twos(size_t{1} << 23, 2.0f);
  EXPECT_EQ(std::memcmp(done->outputs[1].tensor.data.data(), twos.data(), twos.size() * 4), 0);
  auto fits = second_session->run(other.root, {}, {{other.x, x}});
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(gauge(scrape(metrics), "uopd_inflight_bytes"), 0);
}

// ---- Quotas count a Run's temporaries ----

TEST(Limits, ARunsTemporariesCountAgainstTheByteQuotas) {
  const std::string dir = scratch("quota");
  std::ofstream(dir + "/tokens") << "tiny tiny-secret bytes=1048576\nroomy roomy-secret\n";
  Uopd u = Uopd::start({"--workers=1", "--tokens-file=" + dir + "/tokens"}, "tiny-secret");
  ASSERT_TRUE(u.client);
  BigTemporary t(int64_t{1} << 22);  // a 16 MiB temporary, a scalar output
  HostTensor x = HostTensor::of(Scalar::Float32, {1}, {3.0});
  auto want = interpret(t.g, t.root, {{t.x, x}});
  ASSERT_TRUE(want.ok()) << want.status();

  auto tiny = u.client->create_session();
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  auto refused = tiny->run(t.root, {}, {{t.x, x}});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(contains(refused.status(), "tenant 'tiny' byte quota")) << refused.status();
  EXPECT_TRUE(contains(refused.status(), "limit 1048576")) << refused.status();
  // Small temporaries fit, and the quota is whole again after each run.
  BigTemporary small(1024);
  for (int i = 0; i < 3; ++i) {
    auto ok = tiny->run(small.root, {}, {{small.x, x}});
    ASSERT_TRUE(ok.ok()) << ok.status();
  }
  auto roomy_client = u.connect("roomy-secret");
  auto roomy = roomy_client->create_session();
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  auto ok = roomy->run(t.root, {}, {{t.x, x}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  CompareResult c = compare((*want)[0], ok->outputs[0].tensor);
  EXPECT_TRUE(c.ok) << c.message;

  // Without tenants, the session's quota: kept outputs stay counted, temporaries do not.
  Uopd plain = Uopd::start({"--workers=1", "--session-bytes=8454144"});  // 8 MiB + 64 KiB
  ASSERT_TRUE(plain.client);
  auto s = plain.client->create_session();
  ASSERT_TRUE(s.ok()) << s.status();
  auto over = s->run(t.root, {}, {{t.x, x}});
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_TRUE(contains(over.status(), "--session-bytes")) << over.status();
  BigOutput out(20);  // a 4 MiB output, kept
  for (int i = 0; i < 2; ++i) {
    auto kept = s->run(out.root, {}, {{out.x, x}}, /*keep_outputs=*/true);
    ASSERT_TRUE(kept.ok()) << kept.status();
  }
  EXPECT_EQ(plain.stats().buffer_bytes, uint64_t{8} << 20);
  auto third = s->run(out.root, {}, {{out.x, x}}, /*keep_outputs=*/true);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
}

// ---- Streams, sessions and buffers ----

// An Upload whose client stops sending is ended by the server with a status naming the
// limit: after a first chunk, and with no chunk at all.
TEST(Limits, AnUploadLeftOpenIsEndedByTheServer) {
  Uopd u = Uopd::start({"--workers=1", "--stream-idle-timeout-s=1"});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  auto buffer = session->create_buffer(Scalar::UInt8, 1 << 20);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  for (bool send_one : {true, false}) {
    SCOPED_TRACE(send_one ? "after one chunk" : "before any chunk");
    auto stub = u.stub();
    auto ctx = context(absl::Seconds(120));
    pb::UploadResponse resp;
    auto writer = stub->Upload(ctx.get(), &resp);
    if (send_one) {
      pb::UploadChunk c;
      c.set_session_id(session->id());
      c.set_buffer_id(*buffer);
      c.set_data(std::string(4096, 'u'));
      ASSERT_TRUE(writer->Write(c));
    }
    // No WritesDone: the client just stops. Finish waits for the server's verdict.
    absl::Status s = from_grpc(writer->Finish());
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_TRUE(contains(s, "--stream-idle-timeout-s")) << s;
  }
  // The bytes that came before the stall were written; the server serves on.
  auto back = session->download(*buffer, 0, 4096);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, std::string(4096, 'u'));
  EXPECT_TRUE(session->upload(*buffer, std::string(1 << 20, 'v')).ok());
}

// A Download whose client stops reading: the server's writes block in flow control until
// the watchdog cancels the call, which uopd counts as DEADLINE_EXCEEDED (the client, whose
// gRPC holds the status back until it reads what came before, never sees it), and uopd
// serves on.
TEST(Limits, ADownloadNobodyReadsIsEndedByTheServer) {
  Uopd u = Uopd::start({"--workers=1", "--stream-idle-timeout-s=1", "--metrics-listen=127.0.0.1:0"});
  ASSERT_TRUE(u.client);
  const std::string metrics = metrics_address(*u.proc);
  ASSERT_FALSE(metrics.empty()) << u.proc->log_tail();
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  auto buffer = session->create_buffer(Scalar::UInt8, 64 << 20);  // far more than the flow-control windows
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const std::string ended = "uopd_requests_total{code=\"DEADLINE_EXCEEDED\",method=\"Download\"}";
  {
    auto stub = u.stub();
    auto ctx = context(absl::Seconds(120));
    pb::DownloadRequest req;
    req.set_session_id(session->id());
    req.set_buffer_id(*buffer);
    auto reader = stub->Download(ctx.get(), req);
    // Not one Read.
    EXPECT_TRUE(wait_until([&] { return gauge(scrape(metrics), ended) == 1; }, absl::Seconds(60)))
        << "the server did not end the download\n" << scrape(metrics);
    ctx->TryCancel();
  }
  auto back = session->download(*buffer, 0, 4096);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, std::string(4096, '\0'));
}

// A client-chosen idle timeout of 2^62 ms is clamped to the server's maximum and the
// session is reaped; sessions and buffers have limits, and one session cannot take a
// worker's whole buffer budget, all without a tokens file.
TEST(Limits, SessionsHaveLimitsWithoutATokensFile) {
  {
    Uopd u = Uopd::start({"--workers=1", "--max-session-idle-timeout-s=1"});
    ASSERT_TRUE(u.client);
    auto forever = u.client->create_session({}, absl::Milliseconds(int64_t{1} << 62));
    ASSERT_TRUE(forever.ok()) << forever.status();
    ASSERT_TRUE(forever->create_buffer(Scalar::Float32, 16).ok());
    // (Stats does not touch the session.)
    EXPECT_TRUE(wait_until([&] { return u.stats().sessions == 0; }, absl::Seconds(60)))
        << "a session with a 2^62 ms idle timeout was never reaped";
    EXPECT_EQ(u.stats().buffers, 0u);
    EXPECT_EQ(forever->create_buffer(Scalar::Float32, 16).status().code(), absl::StatusCode::kNotFound);
  }
  Uopd u = Uopd::start({"--workers=1", "--max-sessions=3", "--session-buffers=4", "--worker-max-buffer-bytes=67108864"});
  ASSERT_TRUE(u.client);
  std::vector<client::Session> open;
  for (int i = 0; i < 3; ++i) {
    auto s = u.client->create_session();
    ASSERT_TRUE(s.ok()) << s.status();
    open.push_back(std::move(*s));
  }
  auto fourth = u.client->create_session();
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted) << fourth.status();
  EXPECT_TRUE(contains(fourth.status(), "--max-sessions")) << fourth.status();

  client::Session& a = open[0];
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a.create_buffer(Scalar::UInt8, 16).ok());
  auto fifth = a.create_buffer(Scalar::UInt8, 16);
  EXPECT_EQ(fifth.status().code(), absl::StatusCode::kResourceExhausted) << fifth.status();
  EXPECT_TRUE(contains(fifth.status(), "--session-buffers")) << fifth.status();
  // The worker has 64 MiB for buffers; a session may have a quarter of it by default.
  auto greedy = open[1].create_buffer(Scalar::UInt8, 48 << 20);
  EXPECT_EQ(greedy.status().code(), absl::StatusCode::kResourceExhausted) << greedy.status();
  EXPECT_TRUE(contains(greedy.status(), "--session-bytes")) << greedy.status();
  EXPECT_TRUE(open[2].create_buffer(Scalar::UInt8, 8 << 20).ok()) << "another session still has room";
}

// ---- The metrics port ----


// Connections that send half a request and wait hold nothing the scrapes need: a scrape
// is answered while they are still open (not after the server gave up on them).
TEST(Limits, HalfOpenConnectionsDoNotStopScrapes) {
  Uopd u = Uopd::start({"--workers=1", "--metrics-listen=127.0.0.1:0"});
  ASSERT_TRUE(u.client);
  const std::string metrics = metrics_address(*u.proc);
  ASSERT_FALSE(metrics.empty()) << u.proc->log_tail();
  ASSERT_TRUE(contains(scrape(metrics), "uopd_workers_up"));
  std::vector<int> stalled;
  for (int i = 0; i < 2; ++i) {
    int fd = connect_to(metrics);
    ASSERT_GE(fd, 0);
    std::string half = "GET /metrics HTTP/1.1\r\nHost: uopd\r\n";  // no blank line: never finished
    ASSERT_EQ(write(fd, half.data(), half.size()), static_cast<ssize_t>(half.size()));
    stalled.push_back(fd);
  }
  std::string body = scrape(metrics);
  EXPECT_TRUE(contains(body, "uopd_workers_up")) << body.substr(0, 200);
  for (int fd : stalled) {
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    EXPECT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        << "the half-open connection was answered or closed before the scrape was served";
    close(fd);
  }
}

// Tenant names are on /metrics only with --metrics-tenant-labels: the port takes no
// credential.
TEST(Limits, TenantNamesStayOffTheMetricsPortUnlessAskedFor) {
  const std::string dir = scratch("labels");
  std::ofstream(dir + "/tokens") << "zebra-tenant-7 zebra-secret sessions=1\n";
  for (bool labels : {false, true}) {
    SCOPED_TRACE(labels ? "--metrics-tenant-labels" : "default");
    std::vector<std::string> args = {"--workers=1", "--metrics-listen=127.0.0.1:0", "--tokens-file=" + dir + "/tokens"};
    if (labels) args.push_back("--metrics-tenant-labels");
    Uopd u = Uopd::start(args, "zebra-secret");
    ASSERT_TRUE(u.client);
    auto s = u.client->create_session();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_FALSE(u.client->create_session().ok());  // over its session limit: counted
    const std::string metrics = metrics_address(*u.proc);
    std::string body = scrape(metrics);
    ASSERT_TRUE(contains(body, "uopd_quota_rejections_total{limit=\"sessions\"} 1")) << body;
    EXPECT_EQ(contains(body, "zebra-tenant-7"), labels);
  }
}

}  // namespace
}  // namespace uop
