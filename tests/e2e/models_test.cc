// Models held by the server (LoadModel / RunModel) against a real uopd and its workers:
// results equal the reference interpreter's on the model as imported in this process;
// the weights go up once however often the model runs; model ids are the session's and
// the tenant's only; malformed, truncated and oversize models are refused by name while
// the server keeps serving.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <latch>
#include <thread>
#include <fstream>
#include <regex>

#include "absl/strings/match.h"
#include "client/client.h"
#include "client/embedded_server.h"
#include "client/onnx/model_runner.h"
#include "compiler/interp/npy.h"
#include "compiler/onnx/importer.h"
#include "proto/uopd.grpc.pb.h"
#include "tests/e2e/scheduler_proc.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using testing::SchedulerProc;

void add_input(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> dims) {
  auto* vi = g->add_input();
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

void add_weight(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> dims, uint64_t seed) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  HostTensor h = HostTensor::random(Scalar::Float32, dims, seed);
  t->set_raw_data(h.data);
}

// y = relu(x @ W1 + b1) @ W2: three weights, an input of `batch` x `in`.
std::string mlp(int64_t batch = 2, int64_t in = 8, int64_t hidden = 16, int64_t out = 4) {
  onnx::ModelProto m;
  m.set_ir_version(7);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  add_input(g, "x", {batch, in});
  add_weight(g, "W1", {in, hidden}, 1);
  add_weight(g, "b1", {hidden}, 2);
  add_weight(g, "W2", {hidden, out}, 3);
  auto node = [&](const std::string& op, std::vector<std::string> ins, const std::string& o) {
    auto* n = g->add_node();
    n->set_op_type(op);
    for (auto& s : ins) n->add_input(s);
    n->add_output(o);
  };
  node("MatMul", {"x", "W1"}, "h");
  node("Add", {"h", "b1"}, "hb");
  node("Relu", {"hb"}, "r");
  node("MatMul", {"r", "W2"}, "y");
  g->add_output()->set_name("y");
  return m.SerializeAsString();
}

// The reference: the model imported here and run by the interpreter.
HostTensor reference(const std::string& model, const HostTensor& x) {
  auto imported = onnx_import::import_model(model, {{"x", x}});
  EXPECT_TRUE(imported.ok()) << imported.status();
  if (!imported.ok()) return {};
  auto got = onnx_import::run_interpreted(*imported);
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok()) return {};
  HostTensor t = (*got)[0];
  t.shape = imported->outputs[0].shape;
  return t;
}

class ModelsE2E : public ::testing::Test {
 protected:
  void SetUp() override { srv_ = SchedulerProc::start(UOPD_BINARY, {"--cache-dir=", "--workers=1"}); }
  Client& c() { return *srv_.client; }
  SchedulerProc srv_;
};

TEST_F(ModelsE2E, RunsMatchTheInterpreterAndTheWeightsGoUpOnce) {
  ASSERT_TRUE(srv_.client);
  auto s = c().create_session();
  ASSERT_TRUE(s.ok()) << s.status();
  auto before = c().stats();
  ASSERT_TRUE(before.ok()) << before.status();
  const std::string model = mlp();
  auto m = s->load_model(model);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->id.size(), 32u);
  ASSERT_EQ(m->inputs.size(), 1u);
  EXPECT_EQ(m->inputs[0].name, "x");
  EXPECT_EQ(m->inputs[0].shape, (std::vector<int64_t>{2, 8}));
  ASSERT_EQ(m->outputs.size(), 1u);
  EXPECT_EQ(m->outputs[0].name, "y");
  EXPECT_EQ(m->outputs[0].shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(m->weight_buffers, 3u);
  EXPECT_EQ(m->weight_bytes, (8 * 16 + 16 + 16 * 4) * 4u);
  auto loaded = c().stats();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model_weight_buffers_written - before->model_weight_buffers_written, 3u);
  EXPECT_EQ(loaded->buffers - before->buffers, 3u);

  constexpr int kRuns = 5;
  for (int i = 0; i < kRuns; ++i) {
    HostTensor x = HostTensor::random(Scalar::Float32, {2, 8}, 100 + i);
    auto r = s->run_model(m->id, {{std::string("x"), x}});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs.size(), 1u);
    HostTensor got = r->outputs[0].tensor;
    got.shape = {2, 4};
    EXPECT_TRUE(compare(reference(model, x), got)) << "run " << i;
  }
  auto after = c().stats();
  ASSERT_TRUE(after.ok()) << after.status();
  // N runs, one upload: no weight written again, no buffer left behind by a run.
  EXPECT_EQ(after->model_weight_buffers_written, loaded->model_weight_buffers_written);
  EXPECT_EQ(after->model_weight_bytes_written, loaded->model_weight_bytes_written);
  EXPECT_EQ(after->buffers, loaded->buffers);
  // The plan is planned once and found again by every later run.
  EXPECT_GE(after->plan_cache_hits - loaded->plan_cache_hits, static_cast<uint64_t>(kRuns - 1));

  // The model dies with its session, and its weights with it.
  ASSERT_TRUE(s->close().ok());
  auto closed = c().stats();
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(closed->buffers, before->buffers);
}

// One held model is one graph in uopd, shared by every RunModel of it: calls of a model
// freshly loaded (its plan not cached yet, its digests not computed by any run), all at
// once, each get the model's answer and the server keeps serving. (Planning adds nodes
// to the graph it plans; two calls planning one model together used to crash uopd.)
TEST_F(ModelsE2E, ConcurrentRunsOfOneFreshModelAllAnswerRight) {
  ASSERT_TRUE(srv_.client);
  auto s = c().create_session();
  ASSERT_TRUE(s.ok()) << s.status();
  constexpr int kRounds = 6, kCalls = 4;
  for (int round = 0; round < kRounds; ++round) {
    // Another hidden width each round: another graph, so another plan to make.
    const std::string model = mlp(2, 8, 16 + round);
    auto m = s->load_model(model);
    ASSERT_TRUE(m.ok()) << m.status();
    std::vector<HostTensor> xs, got(kCalls);
    for (int i = 0; i < kCalls; ++i) xs.push_back(HostTensor::random(Scalar::Float32, {2, 8}, 1000 * round + i));
    std::vector<absl::Status> status(kCalls);
    std::latch start(kCalls);
    std::vector<std::thread> calls;
    for (int i = 0; i < kCalls; ++i)
      calls.emplace_back([&, i] {
        start.arrive_and_wait();  // every call in flight together
        auto r = s->run_model(m->id, {{std::string("x"), xs[i]}});
        status[i] = r.status();
        if (r.ok() && r->outputs.size() == 1) got[i] = r->outputs[0].tensor;
      });
    for (auto& t : calls) t.join();
    for (int i = 0; i < kCalls; ++i) {
      ASSERT_TRUE(status[i].ok()) << "round " << round << " call " << i << ": " << status[i];
      got[i].shape = {2, 4};
      EXPECT_TRUE(compare(reference(model, xs[i]), got[i])) << "round " << round << " call " << i;
    }
  }
  EXPECT_TRUE(c().stats().ok());
}

TEST_F(ModelsE2E, AModelIdOfAnotherSessionIsNotFound) {
  ASSERT_TRUE(srv_.client);
  auto a = c().create_session();
  auto b = c().create_session();
  ASSERT_TRUE(a.ok() && b.ok());
  auto m = a->load_model(mlp());
  ASSERT_TRUE(m.ok()) << m.status();
  HostTensor x = HostTensor::random(Scalar::Float32, {2, 8}, 7);
  auto r = b->run_model(m->id, {{std::string("x"), x}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  auto guessed = a->run_model(std::string(32, '0'), {{std::string("x"), x}});
  EXPECT_EQ(guessed.status().code(), absl::StatusCode::kNotFound) << guessed.status();
  EXPECT_TRUE(a->run_model(m->id, {{std::string("x"), x}}).ok());
  // Bound wrongly: by a name the model does not have, or not at all.
  auto wrong = a->run_model(m->id, {{std::string("W1"), x}});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
  auto unbound = a->run_model(m->id, {});
  EXPECT_EQ(unbound.status().code(), absl::StatusCode::kInvalidArgument) << unbound.status();
}

TEST_F(ModelsE2E, MalformedTruncatedAndGarbageModelsAreInvalidAndTheServerKeepsServing) {
  ASSERT_TRUE(srv_.client);
  auto s = c().create_session();
  ASSERT_TRUE(s.ok());
  auto before = c().stats();
  ASSERT_TRUE(before.ok());
  const std::string model = mlp();
  const std::string garbage(4096, '\xff');
  auto g = s->load_model(garbage);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  EXPECT_TRUE(absl::StrContains(g.status().message(), "not an ONNX model")) << g.status();
  auto t = s->load_model(model.substr(0, model.size() - 100));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_EQ(s->load_model("").status().code(), absl::StatusCode::kInvalidArgument);
  // A node reading a value nothing defines.
  onnx::ModelProto bad;
  ASSERT_TRUE(bad.ParseFromString(model));
  bad.mutable_graph()->mutable_node(1)->set_input(0, "nowhere");
  auto b = s->load_model(bad.SerializeAsString());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), "nowhere")) << b.status();
  // A shape for an input the model does not have.
  auto shaped = s->load_model(model, {{"z", {1}}});
  EXPECT_EQ(shaped.status().code(), absl::StatusCode::kInvalidArgument) << shaped.status();
  EXPECT_TRUE(absl::StrContains(shaped.status().message(), "'z'")) << shaped.status();
  // Nothing of the refused models stays in the session.
  auto mid = c().stats();
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->buffers, before->buffers);
  // And the server serves on.
  auto m = s->load_model(model);
  ASSERT_TRUE(m.ok()) << m.status();
  HostTensor x = HostTensor::random(Scalar::Float32, {2, 8}, 9);
  auto r = s->run_model(m->id, {{std::string("x"), x}});
  ASSERT_TRUE(r.ok()) << r.status();
}

TEST(ModelsLimits, AnOversizeModelIsRefusedBeforeItIsKept) {
  auto srv = SchedulerProc::start(UOPD_BINARY, {"--cache-dir=", "--workers=1", "--max-request-bytes=65536"});
  ASSERT_TRUE(srv.client);
  auto s = srv.client->create_session();
  ASSERT_TRUE(s.ok());
  const std::string big = mlp(2, 128, 256, 4);  // 128 KiB of W1
  ASSERT_GT(big.size(), 65536u);
  auto r = s->load_model(big);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "65536")) << r.status();
  EXPECT_TRUE(s->load_model(mlp()).ok());
}

TEST(ModelsTenants, AModelIdOfAnotherTenantIsNotFound) {
  const std::string dir = testing::scratch_dir("models-tenants");
  std::ofstream(dir + "/tokens") << "alice alice-secret-1\nbob bob-secret-2\ncarol carol-secret-3 bytes=2048\n";
  auto alice = SchedulerProc::start(UOPD_BINARY, {"--cache-dir=", "--workers=1", "--tokens-file=" + dir + "/tokens"},
                                    "alice-secret-1");
  ASSERT_TRUE(alice.client);
  ClientOptions o;
  o.address = alice.proc->address();
  o.bearer_token = "bob-secret-2";
  auto bob = Client::connect(o);
  ASSERT_TRUE(bob.ok());
  auto sa = alice.client->create_session();
  auto sb = (*bob)->create_session();
  ASSERT_TRUE(sa.ok() && sb.ok());
  auto m = sa->load_model(mlp());
  ASSERT_TRUE(m.ok()) << m.status();
  HostTensor x = HostTensor::random(Scalar::Float32, {2, 8}, 11);
  // Bob names Alice's model in his own session: it is not there for him.
  EXPECT_EQ(sb->run_model(m->id, {{std::string("x"), x}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(sa->run_model(m->id, {{std::string("x"), x}}).ok());

  // A model's weights and graph count against its tenant's bytes: 2 KiB hold neither.
  o.bearer_token = "carol-secret-3";
  auto carol = Client::connect(o);
  ASSERT_TRUE(carol.ok());
  auto sc = (*carol)->create_session();
  ASSERT_TRUE(sc.ok());
  auto refused = sc->load_model(mlp());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  auto usage = (*carol)->stats();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->buffers, 0u);
  EXPECT_EQ(usage->buffer_bytes, 0u);
}

// A LoadModel whose client stops sending, after a first chunk or before any, is ended by
// the server's watchdog (the client sees the call cancelled, long before its own 120 s
// deadline), and the server serves on.
TEST(ModelsLimits, ALoadModelLeftOpenIsEndedByTheServer) {
  auto srv = SchedulerProc::start(UOPD_BINARY, {"--cache-dir=", "--workers=1", "--stream-idle-timeout-s=1"});
  ASSERT_TRUE(srv.client);
  auto s = srv.client->create_session();
  ASSERT_TRUE(s.ok());
  auto channel = grpc::CreateChannel(srv.proc->address(), grpc::InsecureChannelCredentials());
  auto stub = ::uopd::v1::Uopd::NewStub(channel);
  const std::string model = mlp();
  for (bool send_one : {true, false}) {
    SCOPED_TRACE(send_one ? "after one chunk" : "before any chunk");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    ::uopd::v1::LoadModelResponse resp;
    auto writer = stub->LoadModel(&ctx, &resp);
    if (send_one) {
      ::uopd::v1::LoadModelChunk c;
      c.set_session_id(s->id());
      c.set_data(model.substr(0, model.size() / 2));
      ASSERT_TRUE(writer->Write(c));
    }
    // No WritesDone: the client just stops. Finish waits for the server's verdict.
    grpc::Status st = writer->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
  }
  auto m = s->load_model(model);
  ASSERT_TRUE(m.ok()) << m.status();
  auto stats = srv.client->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->buffers, 3u);  // the one model's weights: nothing of the abandoned loads
}

// The `uop` command on a model file against a long-lived uopd: `uop run MODEL.onnx` goes
// through LoadModel / RunModel, and `uop bench` loads once for all its runs.
TEST_F(ModelsE2E, UopRunAndBenchOnAModelFile) {
  ASSERT_TRUE(srv_.client);
  const std::string dir = testing::scratch_dir("models-cli");
  const std::string model = mlp();
  std::ofstream(dir + "/mlp.onnx", std::ios::binary) << model;
  HostTensor x = HostTensor::random(Scalar::Float32, {2, 8}, 21);
  ASSERT_TRUE(write_npy(dir + "/x.npy", x).ok());
  const std::string server = cat("--server=", srv_.proc->address());
  auto before = c().stats();
  ASSERT_TRUE(before.ok());

  auto [rc, out] = testing::run_command(UOP_BINARY, cat("run ", server, " ", dir, "/mlp.onnx --in x=", dir, "/x.npy --out y=", dir, "/y.npy"));
  ASSERT_EQ(rc, 0) << out;
  auto y = read_npy(dir + "/y.npy");
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(compare(reference(model, x), *y));
  auto ran = c().stats();
  ASSERT_TRUE(ran.ok());
  EXPECT_EQ(ran->model_weight_buffers_written - before->model_weight_buffers_written, 3u);  // `uop run` loaded it

  // --profile through RunModel: the table, one row per kernel, each launched once.
  auto [prc, pout] = testing::run_command(UOP_BINARY, cat("run ", server, " ", dir, "/mlp.onnx --in x=", dir, "/x.npy --profile"));
  ASSERT_EQ(prc, 0) << pout;
  EXPECT_NE(pout.find("per launch ms"), std::string::npos) << pout;
  EXPECT_TRUE(std::regex_search(pout, std::regex("\\n\\S+ +1 +[0-9.]+ +[0-9.]+ "))) << "no kernel launched once in\n" << pout;
  auto profiled = c().stats();
  ASSERT_TRUE(profiled.ok());
  EXPECT_GT(profiled->launches_timed, ran->launches_timed);
  ran = profiled;

  auto [brc, bout] = testing::run_command(UOP_BINARY, cat("bench ", server, " ", dir, "/mlp.onnx --iterations=7 --warmup=2 --json"));
  ASSERT_EQ(brc, 0) << bout;
  EXPECT_NE(bout.find("\"iterations\": 7"), std::string::npos) << bout;
  for (const char* key : {"min_ms", "p50_ms", "p99_ms", "runs_per_second", "mean_plan_ms", "mean_compile_ms", "mean_run_ms", "mean_client_ms"})
    EXPECT_NE(bout.find(key), std::string::npos) << key << " in " << bout;
  auto benched = c().stats();
  ASSERT_TRUE(benched.ok());
  // Nine runs, one load: the model's three weights written once.
  EXPECT_EQ(benched->model_weight_buffers_written - ran->model_weight_buffers_written, 3u);
  EXPECT_EQ(benched->model_weight_bytes_written - ran->model_weight_bytes_written, (8 * 16 + 16 + 16 * 4) * 4u);

  // The same for a graph file, with random inputs, in the table form.
  auto [grc, gout] = testing::run_command(UOP_BINARY, cat("bench ", server, " " UOPD_EXAMPLES "/elementwise.json --iterations=3"));
  EXPECT_EQ(grc, 0) << gout;
  EXPECT_NE(gout.find("p99"), std::string::npos) << gout;

  // A model that is not one: exit status 1 and the server's message.
  std::ofstream(dir + "/junk.onnx", std::ios::binary) << std::string(64, '\xff');
  auto [jrc, jout] = testing::run_command(UOP_BINARY, cat("bench ", server, " ", dir, "/junk.onnx"));
  EXPECT_EQ(jrc, 1) << jout;
  EXPECT_NE(jout.find("not an ONNX model"), std::string::npos) << jout;
}

// `uop compile` and `uop explain` on a model file import it in the client, as uopd
// imports a model it holds: the graph is the one `uop run` ran (its plan is cached, its
// kernels hit), and nothing is loaded into uopd.
TEST_F(ModelsE2E, UopCompileAndExplainOfAModelFileShowWhatRunRan) {
  ASSERT_TRUE(srv_.client);
  const std::string dir = testing::scratch_dir("models-inspect");
  std::ofstream(dir + "/mlp.onnx", std::ios::binary) << mlp();
  ASSERT_TRUE(write_npy(dir + "/x.npy", HostTensor::random(Scalar::Float32, {2, 8}, 22)).ok());
  const std::string server = cat("--server=", srv_.proc->address()), model = cat(dir, "/mlp.onnx");
  auto [rc, out] = testing::run_command(UOP_BINARY, cat("run ", server, " ", model, " --in x=", dir, "/x.npy"));
  ASSERT_EQ(rc, 0) << out;
  auto ran = c().stats();
  ASSERT_TRUE(ran.ok());

  // The declared shape serves without --in; --in gives the same shape here.
  for (std::string in : {std::string(), cat(" --in x=", dir, "/x.npy")}) {
    auto [crc, cout] = testing::run_command(UOP_BINARY, cat("compile ", server, " ", model, in));
    ASSERT_EQ(crc, 0) << cout;
    EXPECT_NE(cout.find("plan cached"), std::string::npos) << "not the graph `uop run` ran:\n" << cout;
    EXPECT_NE(cout.find("hit (memory)"), std::string::npos) << cout;
    EXPECT_EQ(cout.find("miss"), std::string::npos) << cout;
  }
  auto [erc, eout] = testing::run_command(UOP_BINARY, cat("explain ", server, " ", model, " --stage=normalize"));
  ASSERT_EQ(erc, 0) << eout;
  EXPECT_NE(eout.find("=== normalize [r_"), std::string::npos) << eout;
  EXPECT_NE(eout.find("PARAM("), std::string::npos) << eout;
  auto after = c().stats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->model_weight_buffers_written, ran->model_weight_buffers_written) << "compile or explain loaded the model";

  // A file that is no model: exit status 1, naming it, before any server is asked.
  std::ofstream(dir + "/junk.onnx", std::ios::binary) << std::string(64, '\xff');
  auto [jrc, jout] = testing::run_command(UOP_BINARY, cat("explain ", server, " ", dir, "/junk.onnx"));
  EXPECT_EQ(jrc, 1) << jout;
  EXPECT_NE(jout.find("junk.onnx"), std::string::npos) << jout;
}

}  // namespace
}  // namespace uop
