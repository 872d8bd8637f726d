// Data-parallel training end to end on long-lived collective groups and bucketed
// allreduces: a real uopd with two embedded workers, the spirals trainer
// (client/demo/spirals.h) through it, and the same steps in this process (LocalRunner,
// the same compiler) as the oracle, bit for bit. A separate binary from
// multi_device_e2e_test: LocalRunner links the compiler's CpuBackend, which may not
// share a binary with the worker runtime's class of the same name.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/demo/spirals.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"
#include "local/local_realizer.h"
#include "proto/uopd.pb.h"
#include "tests/e2e/metrics_scrape.h"
#include "tests/e2e/raw_requests.h"
#include "tests/e2e/scheduler_proc.h"

namespace uop {
namespace {

using client::Session;

// uopd with two one-thread CPU workers, no disk cache, its /metrics, and a client.
struct Service {
  testing::SchedulerProc uopd;
  std::string metrics;

  explicit Service(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--workers=2", "--cache-dir=", "--worker-threads=1",
                                     "--collective-timeout-ms=15000", "--metrics-listen=127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    uopd = testing::SchedulerProc::start(UOPD_BINARY, args);
    if (uopd.proc) metrics = testing::metrics_address(*uopd.proc);
  }
  bool ok() const { return uopd.client != nullptr && !metrics.empty(); }
  Session session() {
    auto s = uopd.client->create_session({"CPU:0", "CPU:1"});
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  double metric(const std::string& name) const { return testing::metric(metrics, name); }
};

// The trainer's MLP, small: 32 points, 8 hidden units.
demo::TrainOptions small_mlp() {
  demo::TrainOptions opts;
  opts.points_per_class = 16;
  opts.hidden = 8;
  return opts;
}

// Both trainers' parameters, bit for bit.
void expect_same_parameters(demo::SpiralsTrainer& trainer, demo::SpiralsTrainer& reference) {
  auto got = trainer.parameters();
  auto want = reference.parameters();
  ASSERT_TRUE(got.ok() && want.ok());
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < got->size(); ++i) EXPECT_EQ((*got)[i].data, (*want)[i].data) << "parameter " << i;
}

// One collective group for a whole training run: 200 steps of the spirals MLP on two
// workers, CPU:1 killed (by its pid, between steps) before step 120. Every step before
// it reuses the group the first step formed; step 120 fails UNAVAILABLE naming CPU:1; the
// run goes on from replica 0's parameters once the worker is back, on one new group (the
// old one torn down), and each warm step is one collective (the bucket). Every step's loss and the final parameters are bit for bit those of the same steps run in
// this process (LocalRunner: the same compiler, the collective folded in device order).
TEST(TrainingE2E, OneCollectiveGroupServesEveryStepAndIsReformedAfterAMemberDies) {
  constexpr int kSteps = 200, kKillAt = 120;
  Service svc;
  ASSERT_TRUE(svc.ok());
  Session session = svc.session();
  demo::TrainOptions opts = small_mlp();
  LocalRunner local(1);  // one thread, as each worker
  client::LocalRealizer local_realizer(local);
  demo::SpiralsTrainer reference(local_realizer, opts);
  auto trainer = std::make_unique<demo::SpiralsTrainer>(session, opts);
  const double formed_before = svc.metric("uopd_collective_groups_formed_total");
  double collectives_after_2 = 0;
  for (int step = 1; step <= kSteps; ++step) {
    if (step == kKillAt) {
      auto params = trainer->parameters();  // replica 0's, on CPU:0
      ASSERT_TRUE(params.ok()) << params.status();
      const int64_t pid1 = svc.uopd.worker("CPU:1").pid;
      ASSERT_GT(pid1, 0);
      ASSERT_EQ(::kill(static_cast<pid_t>(pid1), SIGKILL), 0);
      auto failed = trainer->step();
      ASSERT_FALSE(failed.ok());
      EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
      EXPECT_NE(failed.status().message().find("CPU:1"), std::string::npos) << failed.status();
      // CPU:1's replicas died with it: the run goes on from CPU:0's, uploaded again.
      ASSERT_TRUE(testing::wait_until([&] {
        client::WorkerStatus w = svc.uopd.worker("CPU:1");
        return w.state == "up" && w.pid != pid1;
      }, absl::Seconds(60)));
      demo::TrainOptions resumed = opts;
      resumed.initial_params = *params;
      trainer = std::make_unique<demo::SpiralsTrainer>(session, resumed);
    }
    auto got = trainer->step();
    ASSERT_TRUE(got.ok()) << "step " << step << ": " << got.status();
    auto want = reference.step();
    ASSERT_TRUE(want.ok()) << "reference step " << step << ": " << want.status();
    ASSERT_EQ(got->loss, want->loss) << "step " << step;
    if (step == 1 || step == kKillAt - 1 || step == kKillAt || step == kSteps) {
      EXPECT_EQ(svc.metric("uopd_collective_groups_formed_total"), formed_before + (step < kKillAt ? 1 : 2))
          << "after step " << step;
    }
    // The group of the dead process is gone, whether or not the failed step reached its
    // collective: one group alive, the re-formed one.
    if (step == kKillAt || step == kSteps) {
      EXPECT_EQ(svc.metric("uopd_collective_groups"), 1) << "after step " << step;
    }
    // Every warm step is one collective: the gradients and the loss in one bucket.
    if (step == 3) {
      EXPECT_EQ(svc.metric("uopd_collectives_total"), collectives_after_2 + 1);
    }
    if (step == 2) collectives_after_2 = svc.metric("uopd_collectives_total");
  }
  // The group of the killed process went when its replacement's formed.
  EXPECT_EQ(svc.metric("uopd_collective_groups"), 1);
  ASSERT_TRUE(trainer->check_replicas().ok()) << trainer->check_replicas();
  expect_same_parameters(*trainer, reference);
}

// The same steps with every allreduce on its own (--bucket-cap-mb=0) and bucketed: the
// same bits, in one collective per step against one per allreduce.
TEST(TrainingE2E, BucketedAndUnbucketedAllreducesTrainTheSameBits) {
  constexpr int kSteps = 4;
  demo::TrainOptions opts = small_mlp();
  std::vector<std::vector<HostTensor>> params;
  std::vector<double> collectives_per_step;
  for (const char* cap : {"--bucket-cap-mb=25", "--bucket-cap-mb=0"}) {
    Service svc({cap});
    ASSERT_TRUE(svc.ok());
    Session session = svc.session();
    demo::SpiralsTrainer trainer(session, opts);
    double before = 0;
    for (int step = 1; step <= kSteps; ++step) {
      if (step == kSteps) before = svc.metric("uopd_collectives_total");
      auto r = trainer.step();
      ASSERT_TRUE(r.ok()) << cap << ", step " << step << ": " << r.status();
    }
    collectives_per_step.push_back(svc.metric("uopd_collectives_total") - before);
    ASSERT_TRUE(trainer.check_replicas().ok()) << cap << ": " << trainer.check_replicas();
    auto p = trainer.parameters();
    ASSERT_TRUE(p.ok()) << p.status();
    params.push_back(*std::move(p));
  }
  EXPECT_EQ(collectives_per_step[0], 1);
  EXPECT_GE(collectives_per_step[1], 6);  // a gradient per parameter, and the loss
  ASSERT_EQ(params[0].size(), params[1].size());
  for (size_t i = 0; i < params[0].size(); ++i) EXPECT_EQ(params[0][i].data, params[1][i].data) << "parameter " << i;
}

// A warm step is one Run of a held graph whose plan, kernels and collective group are all
// reused, and the client sends it nothing but the step's batch: the parameters stay in
// their session buffers (each step's update written into them), the graph goes by its
// digest, the loss comes back with the Run. Stats across step 3 (a new batch every step):
// bytes uploaded == the batch's, no graph bytes, no buffer made, nothing compiled, the plan
// a cache hit, no group formed, one Execute per worker (the allreduce inside them). The
// losses and the parameters are those of the same steps in this process, bit for bit.
TEST(TrainingE2E, AWarmStepUploadsOnlyItsBatch) {
  constexpr int kSteps = 4;
  Service svc;
  ASSERT_TRUE(svc.ok());
  Session session = svc.session();
  demo::TrainOptions opts = small_mlp();
  opts.fresh_batches = true;
  const uint64_t batch_bytes = 2 * opts.points_per_class * (opts.inputs + opts.classes) * sizeof(float);
  LocalRunner local(1);
  client::LocalRealizer local_realizer(local);
  demo::SpiralsTrainer reference(local_realizer, opts);
  demo::SpiralsTrainer trainer(session, opts);
  client::Client& c = *svc.uopd.client;
  for (int step = 1; step <= kSteps; ++step) {
    auto before = c.stats();
    ASSERT_TRUE(before.ok()) << before.status();
    const double groups_before = svc.metric("uopd_collective_groups_formed_total");
    const double lane_before = svc.metric("uopd_worker_executes_total{transport=\"lane\"}");
    const double grpc_before = svc.metric("uopd_worker_executes_total{transport=\"grpc\"}");
    auto got = trainer.step();
    ASSERT_TRUE(got.ok()) << "step " << step << ": " << got.status();
    auto after = c.stats();
    ASSERT_TRUE(after.ok()) << after.status();
    auto want = reference.step();
    ASSERT_TRUE(want.ok()) << "reference step " << step << ": " << want.status();
    ASSERT_EQ(got->loss, want->loss) << "step " << step;
    if (step == 1) {
      EXPECT_GT(after->run_graph_bytes, before->run_graph_bytes);  // the graph, sent once
      EXPECT_EQ(after->buffers, before->buffers + 12);              // the parameters, one per device
    }
    if (step < 3) continue;
    EXPECT_EQ(after->bytes_uploaded - before->bytes_uploaded, batch_bytes) << "step " << step;
    EXPECT_EQ(after->run_graph_bytes, before->run_graph_bytes) << "step " << step;
    EXPECT_EQ(after->buffers, before->buffers) << "step " << step;
    EXPECT_EQ(after->buffer_bytes, before->buffer_bytes) << "step " << step;
    EXPECT_EQ(after->compiles, before->compiles) << "step " << step;
    EXPECT_EQ(after->plan_cache_hits, before->plan_cache_hits + 1) << "step " << step;
    EXPECT_EQ(svc.metric("uopd_collective_groups_formed_total"), groups_before) << "step " << step;
    // The allreduce runs inside its members' Executes: one Execute per worker per step.
    EXPECT_EQ(svc.metric("uopd_worker_executes_total{transport=\"lane\"}"), lane_before + 2) << "step " << step;
    EXPECT_EQ(svc.metric("uopd_worker_executes_total{transport=\"grpc\"}"), grpc_before) << "step " << step;
  }
  ASSERT_TRUE(trainer.check_replicas().ok()) << trainer.check_replicas();
  expect_same_parameters(trainer, reference);
}

// A step's collectives overlapped with the kernels that do not need them or run inside
// the members' Executes, or every step after the one before (--sequential-steps: each
// collective its own call), bucketed or one collective per allreduce (where there are
// several to overlap): the same bits in all four.
TEST(TrainingE2E, OverlappedAndSequentialStepsTrainTheSameBits) {
  constexpr int kSteps = 3;
  demo::TrainOptions opts = small_mlp();
  std::vector<std::vector<HostTensor>> params;
  for (const char* cap : {"--bucket-cap-mb=25", "--bucket-cap-mb=0"})
    for (bool sequential : {false, true}) {
      std::vector<std::string> flags = {cap};
      if (sequential) flags.push_back("--sequential-steps");
      Service svc(flags);
      ASSERT_TRUE(svc.ok());
      Session session = svc.session();
      demo::SpiralsTrainer trainer(session, opts);
      for (int step = 1; step <= kSteps; ++step) {
        auto r = trainer.step();
        ASSERT_TRUE(r.ok()) << cap << (sequential ? " sequential" : "") << ", step " << step << ": " << r.status();
      }
      auto p = trainer.parameters();
      ASSERT_TRUE(p.ok()) << p.status();
      params.push_back(*std::move(p));
    }
  for (size_t k = 1; k < params.size(); ++k) {
    ASSERT_EQ(params[k].size(), params[0].size());
    for (size_t i = 0; i < params[0].size(); ++i) EXPECT_EQ(params[k][i].data, params[0][i].data) << "run " << k << ", parameter " << i;
  }
}

// A held graph named by digest and outputs assigned into buffers, and what uopd refuses
// of them, by requests no client library sends: an unknown digest (NOT_FOUND), a digest
// with a graph, assigns to an output the graph lacks, to one output or one buffer twice,
// to a buffer of another size or that does not exist. A refused Run changes no buffer,
// and uopd serves the next Run.
TEST(TrainingE2E, HeldGraphsAndAssignsRefuseWhatIsWrong) {
  Service svc;
  ASSERT_TRUE(svc.ok());
  auto opened = svc.uopd.client->create_session({"CPU:0"});
  ASSERT_TRUE(opened.ok()) << opened.status();
  Session& session = *opened;
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {4});
  const UOp* root = tb.sink({tb.alu(Op::ADD, {x, x}), tb.alu(Op::MUL, {x, x})});
  const Names names = {{"x", tb.buffer_of(x)}};
  HostTensor data = HostTensor::zeros(Scalar::Float32, {4});
  for (int i = 0; i < 4; ++i) data.set(i, ConstValue::Float(i + 1));
  auto in = session.upload_tensor(data);
  auto dst = session.create_buffer(Scalar::Float32, 4);
  auto other = session.create_buffer(Scalar::Float32, 8);
  ASSERT_TRUE(in.ok() && dst.ok() && other.ok());
  // x + x into dst, x * x inline; the graph held from the first run on, named by digest after.
  client::RunOptions ro;
  ro.hold_graph = true;
  ro.assign = {{0, *dst}};
  auto before = svc.uopd.client->stats();
  ASSERT_TRUE(before.ok());
  for (int run = 0; run < 2; ++run) {
    auto r = session.run(root, names, {{"x", *in}}, ro);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs.size(), 2u);
    EXPECT_EQ(r->outputs[0].buffer_id, *dst);
    EXPECT_EQ(r->outputs[1].tensor.get(3).to_double(), 16.0);
  }
  auto after = svc.uopd.client->stats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->buffers, before->buffers);  // dst took the output: no buffer made
  EXPECT_EQ(after->plan_cache_hits, before->plan_cache_hits + 1);
  auto doubled = session.download(*dst);
  ASSERT_TRUE(doubled.ok());
  HostTensor want = HostTensor::zeros(Scalar::Float32, {4});
  for (int i = 0; i < 4; ++i) want.set(i, ConstValue::Float(2 * (i + 1)));
  EXPECT_EQ(*doubled, want.data);

  ::uopd::v1::RunRequest base;
  base.set_session_id(session.id());
  auto* b = base.add_inputs();
  b->set_name("x");
  b->set_buffer_id(*in);
  ::uopd::v1::RunRequest with_graph = base;
  encode_proto(root, names, with_graph.mutable_graph());
  auto run_raw = [&](const ::uopd::v1::RunRequest& req) {
    return testing::raw_unary(svc.uopd.proc->address(), "/uopd.v1.Uopd/Run", req.SerializeAsString());
  };
  auto expect_refused = [&](::uopd::v1::RunRequest req, absl::StatusCode code, std::string_view says) {
    absl::Status s = run_raw(req);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(std::string(s.message()).find(says), std::string::npos) << s;
  };
  {
    ::uopd::v1::RunRequest req = base;
    req.set_graph_digest(std::string(64, '0'));
    expect_refused(req, absl::StatusCode::kNotFound, "holds no graph");
    req = with_graph;
    req.set_graph_digest(root->digest().hex());
    expect_refused(req, absl::StatusCode::kInvalidArgument, "not both");
  }
  auto assigning = [&](std::vector<std::pair<uint32_t, std::string>> assign) {
    ::uopd::v1::RunRequest req = with_graph;
    for (auto& [output, id] : assign) {
      auto* a = req.add_assign();
      a->set_output(output);
      a->set_buffer_id(id);
    }
    return req;
  };
  expect_refused(assigning({{5, *dst}}), absl::StatusCode::kInvalidArgument, "output 5 of a graph with 2 outputs");
  expect_refused(assigning({{0, *dst}, {0, *other}}), absl::StatusCode::kInvalidArgument, "assigned twice");
  expect_refused(assigning({{0, *dst}, {1, *dst}}), absl::StatusCode::kInvalidArgument, "assigned twice");
  expect_refused(assigning({{1, *other}}), absl::StatusCode::kInvalidArgument, "holds 8 x float32");
  expect_refused(assigning({{1, std::string(32, 'f')}}), absl::StatusCode::kNotFound, "does not exist");
  // Nothing refused touched dst; the held graph still serves, by digest.
  auto unchanged = session.download(*dst);
  ASSERT_TRUE(unchanged.ok());
  EXPECT_EQ(*unchanged, want.data);
  ::uopd::v1::RunRequest by_digest = base;
  by_digest.set_graph_digest(root->digest().hex());
  EXPECT_TRUE(run_raw(by_digest).ok());

  // A kernel-level graph writes its output in the buffer bound to it: assigning that output
  // would swap the buffer's memory for itself and free it. Refused, and the buffer lives.
  auto kernel = decode_json(R"({"format_version": "FORMAT_VERSION_1", "nodes": [
    {"op": "PARAM", "dtype": {"scalar": "FLOAT32", "ptr": true, "size": "4"}, "param": {"slot": "0", "size": "4"}},
    {"op": "PARAM", "dtype": {"scalar": "FLOAT32", "ptr": true, "size": "4"}, "param": {"slot": "1", "size": "4"}},
    {"op": "CONST", "dtype": {"scalar": "INDEX"}, "const_value": {"i": "4"}},
    {"op": "RANGE", "dtype": {"scalar": "INDEX"}, "src": [2], "range": {"axis_id": "0", "type": "LOOP"}},
    {"op": "INDEX", "dtype": {"scalar": "FLOAT32"}, "src": [1, 3]},
    {"op": "LOAD", "dtype": {"scalar": "FLOAT32"}, "src": [1, 4]},
    {"op": "ADD", "dtype": {"scalar": "FLOAT32"}, "src": [5, 5]},
    {"op": "INDEX", "dtype": {"scalar": "FLOAT32"}, "src": [0, 3]},
    {"op": "STORE", "dtype": {"scalar": "VOID"}, "src": [7, 6, 3]},
    {"op": "SINK", "dtype": {"scalar": "VOID"}, "src": [8], "kernel_info": {"kernel": true, "name": "twice"}}],
    "names": [{"name": "out", "node": 0}, {"name": "in", "node": 1}]})");
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  ::uopd::v1::RunRequest in_place;
  in_place.set_session_id(session.id());
  encode_proto(kernel->root, kernel->names, in_place.mutable_graph());
  for (auto [name, id] : {std::pair{"out", *dst}, std::pair{"in", *in}}) {
    auto* bind = in_place.add_inputs();
    bind->set_name(name);
    bind->set_buffer_id(id);
  }
  ASSERT_TRUE(run_raw(in_place).ok());
  auto* a = in_place.add_assign();
  a->set_output(0);
  a->set_buffer_id(*dst);
  expect_refused(in_place, absl::StatusCode::kInvalidArgument, "a kernel-level graph writes its outputs");
  auto still = session.download(*dst);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(*still, want.data);  // 2 * x, from the kernel's run before the refused one
}

}  // namespace
}  // namespace uop
