// The client library on a real gRPC connection, against FakeUopd (fake_uopd.h) in this
// process: sessions close on destruction, buffers stream in several chunks and come back
// intact, inputs bind by name, index and node, statuses pass through unchanged, and the
// embedded-server launcher starts, reports and stops processes without leaving any.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/ir/codec.h"
#include "compiler/support/strings.h"
#include "tests/unit/client/fake_uopd.h"

namespace uop::client {
namespace {

using ::uop::testing::FakeServer;

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_ = FakeServer::start();
    ASSERT_NE(fake_, nullptr);
    ClientOptions o;
    o.address = fake_->address;
    o.chunk_bytes = 1000;  // small, so modest data takes several chunks
    o.bearer_token = "t0ken";
    auto c = Client::connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    auto g = read_graph_file(UOPD_EXAMPLES "/elementwise.json");
    ASSERT_TRUE(g.ok()) << g.status();
    graph_ = std::move(*g);
  }
  void TearDown() override {
    client_.reset();
    if (fake_) fake_->server->Shutdown();
  }
  std::unique_ptr<FakeServer> fake_;
  std::unique_ptr<Client> client_;
  DecodedGraph graph_;
};

TEST(Connect, UnreachableIsUnavailableNamingTheAddress) {
  ClientOptions o;
  o.address = "127.0.0.1:1";
  o.connect_timeout = absl::Milliseconds(300);
  auto c = Client::connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("127.0.0.1:1"), absl::string_view::npos) << c.status();
}

TEST_F(ClientTest, SessionClosesOnDestruction) {
  std::string id;
  {
    auto s = client_->create_session();
    ASSERT_TRUE(s.ok()) << s.status();
    id = s->id();
    EXPECT_EQ(s->devices(), std::vector<std::string>{"CPU:0"});
    std::lock_guard<std::mutex> lock(fake_->service.mu());
    EXPECT_TRUE(fake_->service.open_sessions.count(id));
  }
  std::lock_guard<std::mutex> lock(fake_->service.mu());
  EXPECT_FALSE(fake_->service.open_sessions.count(id));
  EXPECT_EQ(fake_->service.sessions_closed, 1u);
  EXPECT_EQ(fake_->service.last_authorization, "Bearer t0ken");
}

TEST_F(ClientTest, ExplicitCloseThenMoveClosesOnce) {
  auto s = client_->create_session({"CPU:0"});
  ASSERT_TRUE(s.ok());
  Session moved = std::move(*s);
  EXPECT_TRUE(moved.close().ok());
  EXPECT_TRUE(moved.close().ok());  // a second close is a no-op
  std::lock_guard<std::mutex> lock(fake_->service.mu());
  EXPECT_EQ(fake_->service.sessions_closed, 1u);
}

TEST_F(ClientTest, UploadAndDownloadInChunks) {
  auto s = client_->create_session();
  ASSERT_TRUE(s.ok());
  auto id = s->create_buffer(Scalar::UInt8, 10'000);
  ASSERT_TRUE(id.ok()) << id.status();
  std::string data(10'000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  ASSERT_TRUE(s->upload(*id, data).ok());
  {
    std::lock_guard<std::mutex> lock(fake_->service.mu());
    EXPECT_EQ(fake_->service.upload_chunks, 10u);
    EXPECT_EQ(fake_->service.max_upload_chunk, 1000u);
  }
  auto back = s->download(*id);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, data);
  auto part = s->download(*id, 2500, 3001);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(*part, data.substr(2500, 3001));
  // At an offset, and past the end (the server's OUT_OF_RANGE comes back unchanged).
  ASSERT_TRUE(s->upload(*id, "abc", 9997).ok());
  EXPECT_EQ(s->download(*id, 9997, 3).value(), "abc");
  absl::Status over = s->upload(*id, "abcd", 9997);
  EXPECT_EQ(over.code(), absl::StatusCode::kOutOfRange) << over;
  EXPECT_NE(over.message().find("overruns"), absl::string_view::npos) << over;
  EXPECT_TRUE(s->free_buffer(*id).ok());
  EXPECT_EQ(s->free_buffer(*id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->download(*id).status().code(), absl::StatusCode::kNotFound);
}

// free_buffers frees them all (side by side); one that is gone already makes it fail
// NOT_FOUND, and the others are freed all the same.
TEST_F(ClientTest, FreeBuffersFreesThemAll) {
  auto s = client_->create_session();
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = s->create_buffer(Scalar::Float32, 4);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  ASSERT_TRUE(s->free_buffers({ids[0], ids[1]}).ok());
  absl::Status again = s->free_buffers({ids[1], ids[2], ids[3]});
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s->download(ids[i]).status().code(), absl::StatusCode::kNotFound) << i;
  EXPECT_TRUE(s->download(ids[4]).ok());
}

TEST_F(ClientTest, UnknownSessionIsNotFound) {
  auto s = client_->create_session();
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->close().ok());
  auto id = s->create_buffer(Scalar::Float32, 4);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(id.status().message().find(s->id()), absl::string_view::npos);
}

TEST_F(ClientTest, RunInlineByName) {
  auto s = client_->create_session();
  ASSERT_TRUE(s.ok());
  HostTensor a = HostTensor::random(Scalar::Float32, {12}, 1);
  HostTensor b = HostTensor::random(Scalar::Float32, {12}, 2);
  auto r = s->run(graph_.root, graph_.names, {{"a", a}, {"b", b}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 1u);
  EXPECT_EQ(r->outputs[0].name, "out");
  EXPECT_FALSE(r->outputs[0].kept());
  EXPECT_EQ(r->outputs[0].tensor, a);  // the fake echoes the first input
  ASSERT_EQ(r->kernels.size(), 1u);
  EXPECT_EQ(describe_cache(r->kernels[0]), "hit (disk)");
  EXPECT_EQ(r->device, "CPU:0");
  // The graph arrived whole and with its names.
  std::lock_guard<std::mutex> lock(fake_->service.mu());
  EXPECT_EQ(fake_->service.last_run.graph().names_size(), 3);
  EXPECT_EQ(fake_->service.last_run.inputs(0).name(), "a");
}

TEST_F(ClientTest, RunWithBuffersAndKeptOutputs) {
  auto s = client_->create_session();
  ASSERT_TRUE(s.ok());
  HostTensor a = HostTensor::random(Scalar::Float32, {12}, 5);
  auto id = s->upload_tensor(a);
  ASSERT_TRUE(id.ok()) << id.status();
  const UOp* b_node = nullptr;
  for (auto& [n, u] : graph_.names)
    if (n == "b") b_node = u;
  ASSERT_NE(b_node, nullptr);
  auto r = s->run(graph_.root, graph_.names, {{"a", *id}, {b_node, HostTensor::zeros(Scalar::Float32, {12})}},
                  /*keep_outputs=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->outputs.size(), 1u);
  ASSERT_TRUE(r->outputs[0].kept());
  EXPECT_TRUE(r->outputs[0].tensor.data.empty());
  auto t = s->download_tensor(r->outputs[0]);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, a);
  // The node was sent as its wire index: the one the graph names "b".
  std::lock_guard<std::mutex> lock(fake_->service.mu());
  const auto& req = fake_->service.last_run;
  ASSERT_TRUE(req.inputs(1).has_index());
  bool named_b = false;
  for (const auto& nm : req.graph().names()) named_b |= nm.name() == "b" && nm.node() == req.inputs(1).index();
  EXPECT_TRUE(named_b);
}

TEST_F(ClientTest, RunErrorsPassThrough) {
  auto s = client_->create_session();
  ASSERT_TRUE(s.ok());
  auto r = s->run(graph_.root, graph_.names, {{"nope", HostTensor::zeros(Scalar::Float32, {12})}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "the graph has no input named 'nope'");
  // Checked here, before anything is sent.
  HostTensor bad = HostTensor::zeros(Scalar::Float32, {12});
  bad.data.pop_back();
  EXPECT_EQ(s->run(graph_.root, graph_.names, {{"a", bad}}).status().code(), absl::StatusCode::kInvalidArgument);
  Graph other;
  const UOp* stranger = other.cnst(DType(Scalar::Float32), 1.0);
  EXPECT_EQ(s->run(graph_.root, graph_.names, {{stranger, bad}}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, CompileExplainStats) {
  auto c1 = client_->compile(graph_.root, graph_.names, Target{"cuda", "sm_90"}, true, true);
  ASSERT_TRUE(c1.ok()) << c1.status();
  ASSERT_EQ(c1->kernels.size(), 1u);
  EXPECT_EQ(c1->kernels[0].status, CacheStatus::Miss);
  EXPECT_EQ(c1->kernels[0].binary, "binary for cuda");
  EXPECT_EQ(c1->kernels[0].source, "; source");
  EXPECT_EQ(c1->graph_digest, graph_.root->digest().hex());
  auto c2 = client_->compile(graph_.root, graph_.names);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(describe_cache(c2->kernels[0]), "hit (memory)");
  EXPECT_TRUE(c2->kernels[0].binary.empty());

  auto e = client_->explain(graph_.root, graph_.names);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 1u);
  EXPECT_EQ((*e)[0].name, "decode");
  EXPECT_EQ(client_->explain(graph_.root, graph_.names, "bogus").status().code(), absl::StatusCode::kInvalidArgument);

  auto st = client_->stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->compiles, 1u);
  EXPECT_EQ(st->cache_hits_memory, 7u);
  EXPECT_EQ(st->compiler_build_id, "fake-1");
  ASSERT_EQ(st->workers.size(), 1u);
  EXPECT_EQ(st->workers[0].pid, 42);
}

TEST_F(ClientTest, SessionOutlivesClient) {
  auto s = client_->create_session();
  ASSERT_TRUE(s.ok());
  client_.reset();
  auto id = s->create_buffer(Scalar::Int32, 3);
  EXPECT_TRUE(id.ok()) << id.status();
}

// --- EmbeddedServer, with fake_uopd and small shell scripts as the server.

// A zombie counts as gone: an orphan's reaper (PID 1 in a container) may be slow to reap.
bool alive(pid_t pid) {
  std::ifstream stat(cat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z' && line[paren + 2] != 'X';
}

std::string script(const std::string& name, const std::string& body) {
  std::string path = cat(::testing::TempDir(), "/", name, "-", getpid(), ".sh");
  std::ofstream(path) << "#!/bin/sh\n" << body;
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

TEST(Embedded, StartsConnectsAndStops) {
  auto srv = EmbeddedServer::start(FAKE_UOPD);
  ASSERT_TRUE(srv.ok()) << srv.status();
  pid_t pid = (*srv)->pid();
  EXPECT_EQ((*srv)->address().rfind("127.0.0.1:", 0), 0u);
  {
    ClientOptions o;
    o.address = (*srv)->address();
    auto c = Client::connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE((*c)->stats().ok());
  }
  EXPECT_NE((*srv)->log_tail().find("fake_uopd: serving"), std::string::npos) << (*srv)->log_tail();
  EXPECT_TRUE((*srv)->stop().ok());
  EXPECT_FALSE(alive(pid));
  EXPECT_TRUE((*srv)->stop().ok());  // idempotent
}

TEST(Embedded, ExitBeforeListeningReportsItsLog) {
  auto srv = EmbeddedServer::start(FAKE_UOPD, {"--exit-before-listening"});
  EXPECT_EQ(srv.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(srv.status().message().find("told to fail"), absl::string_view::npos) << srv.status();
}

TEST(Embedded, NotExecutable) {
  auto srv = EmbeddedServer::start("/nonexistent/uopd");
  EXPECT_EQ(srv.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(srv.status().message().find("cannot execute"), absl::string_view::npos) << srv.status();
}

TEST(Embedded, SilentServerTimesOut) {
  std::string s = script("silent", "exec sleep 30\n");
  auto srv = EmbeddedServer::start(s, {}, absl::Milliseconds(300));
  EXPECT_EQ(srv.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(srv.status().message().find("no LISTENING line"), absl::string_view::npos) << srv.status();
  std::filesystem::remove(s);
}

TEST(Embedded, IgnoringSigtermGetsKilled) {
  auto srv = EmbeddedServer::start(FAKE_UOPD, {"--ignore-sigterm"});
  ASSERT_TRUE(srv.ok()) << srv.status();
  pid_t pid = (*srv)->pid();
  absl::Status st = (*srv)->stop(absl::Milliseconds(200));
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("did not stop"), absl::string_view::npos) << st;
  EXPECT_FALSE(alive(pid));
}

TEST(Embedded, ChildrenOfTheServerDoNotSurviveIt) {
  // A "server" that starts a long-lived child (as uopd starts workers), reports its pid,
  // and exits on SIGTERM without taking the child along.
  std::string pidfile = cat(::testing::TempDir(), "/child-", getpid(), ".pid");
  std::string s = script("parent", cat("sleep 30 &\necho $! > ", pidfile, "\necho LISTENING 127.0.0.1:9\n",
                                       "trap 'exit 0' TERM\nwhile true; do sleep 0.05; done\n"));
  pid_t child = 0;
  {
    auto srv = EmbeddedServer::start(s);
    ASSERT_TRUE(srv.ok()) << srv.status();
    EXPECT_EQ((*srv)->address(), "127.0.0.1:9");
    std::ifstream(pidfile) >> child;
    ASSERT_GT(child, 0);
    EXPECT_TRUE(alive(child));
  }  // the destructor stops it
  for (int i = 0; i < 100 && alive(child); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(alive(child));
  std::filesystem::remove(s);
  std::filesystem::remove(pidfile);
}

}  // namespace
}  // namespace uop::client
