// What a kernel cannot do to its worker, against real uopd and uop-worker processes: run
// on past its deadline (an endless but in-bounds RANGE is stopped cooperatively, the
// worker keeps its pid and stops burning a core), block in code that never looks at its
// stop word (the worker is ended and started again), or make a system call a kernel
// runner has no business making (a CUSTOM op that calls open() dies by SIGSYS in the
// worker's sandbox, and only its worker is affected).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <optional>
#include <fstream>
#include <sstream>
#include <filesystem>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "tests/e2e/proc_status.h"
#include "tests/e2e/softmax_model.h"
#include "tests/e2e/worker_proc.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;
using testing::cpu_ticks;
using testing::wait_until;

std::string scratch(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() /
             ("uopd-runaway-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

struct Uopd {
  std::unique_ptr<EmbeddedServer> proc;
  std::unique_ptr<Client> client;  // 60 s deadlines

  static Uopd start(std::vector<std::string> args) {
    Uopd u;
    auto p = EmbeddedServer::start(UOPD_BINARY, args);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return u;
    u.proc = std::move(*p);
    u.client = connect(u.proc->address(), absl::Seconds(60));
    return u;
  }
  static std::unique_ptr<Client> connect(const std::string& address, absl::Duration deadline) {
    ClientOptions o;
    o.address = address;
    o.deadline = deadline;
    auto c = Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  client::Stats stats() {
    auto s = client->stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : client::Stats{};
  }
  const client::WorkerStatus* worker(const std::string& device) {
    static thread_local client::Stats last;
    last = stats();
    for (const auto& w : last.workers)
      if (w.device == device) return &w;
    return nullptr;
  }
};

// CPU:0's worker as a test starts, and a session of a client whose requests have a 2 s
// deadline.
struct Hurried {
  int64_t pid = 0;
  std::unique_ptr<Client> client;
  std::optional<client::Session> session;
  explicit Hurried(Uopd& u) {
    const client::WorkerStatus* w = u.worker("CPU:0");
    EXPECT_TRUE(w && w->pid > 0);
    if (!w) return;
    pid = w->pid;
    client = Uopd::connect(u.proc->address(), absl::Seconds(2));
    if (!client) return;
    auto s = client->create_session();
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) session.emplace(*std::move(s));
  }
  bool ok() const { return pid > 0 && session.has_value(); }
};

// Kernel-level graphs, built tersely.
struct Kernel {
  Graph g;
  int64_t axes = 0;
  const UOp* param(int64_t slot, Scalar s, int64_t size) {
    return g.make(Op::PARAM, DType(s).ptr_to(AddrSpace::Global, size), {}, ParamArg{slot, size});
  }
  const UOp* range(int64_t end) { return g.make(Op::RANGE, dtypes::index, {g.idx(end)}, RangeArg{axes++, AxisType::Loop}); }
  const UOp* index(const UOp* buf, const UOp* i) { return g.make(Op::INDEX, DType(buf->dtype().scalar), {buf, i}); }
  const UOp* load(const UOp* buf, const UOp* i) { return g.make(Op::LOAD, DType(buf->dtype().scalar), {buf, index(buf, i)}); }
  const UOp* store(const UOp* buf, const UOp* i, const UOp* v, std::vector<const UOp*> ranges = {}) {
    std::vector<const UOp*> src{index(buf, i), v};
    src.insert(src.end(), ranges.begin(), ranges.end());
    return g.make(Op::STORE, dtypes::void_, src);
  }
  const UOp* custom(DType d, std::string text, std::vector<const UOp*> src) {
    return g.make(Op::CUSTOM, d, src, StrArg{std::move(text)});
  }
  const UOp* kernel(std::vector<const UOp*> stores) { return g.make(Op::SINK, dtypes::void_, stores, KernelInfoArg{true, "k"}); }
};

// out[0] = sum of in[0] * r for r < 2^63 - 1: in bounds everywhere, and endless.
struct EndlessKernel : Kernel {
  const UOp* root;
  const UOp* in;
  EndlessKernel() {
    const UOp* out = param(0, Scalar::Float32, 1);
    in = param(1, Scalar::Float32, 1);
    const UOp* r = range(INT64_MAX);
    const UOp* term = g.alu(Op::MUL, {load(in, g.idx(0)), g.make(Op::CAST, dtypes::float32, {r})});
    const UOp* sum = g.make(Op::REDUCE, dtypes::float32, {term, r}, ReduceOpArg{ReduceOp::Add});
    root = kernel({store(out, g.idx(0), sum)});
  }
};

// Waits until the process has used less than a quarter of a core over a whole second: a
// kernel still running would use all of one.
bool stops_burning(int64_t pid) {
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  absl::Time since = absl::Now();
  int64_t ticks = cpu_ticks(pid);
  return wait_until([&] {
    const absl::Time now = absl::Now();
    if (now - since < absl::Seconds(1)) return false;
    const int64_t t = cpu_ticks(pid);
    const bool idle = static_cast<double>(t - ticks) < 0.25 * hz * absl::ToDoubleSeconds(now - since);
    since = now;
    ticks = t;
    return idle;
  }, absl::Seconds(30));
}

void expect_matches(const std::vector<HostTensor>& want, const client::RunResult& got) {
  ASSERT_EQ(want.size(), got.outputs.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CompareResult c = compare(want[i], got.outputs[i].tensor);
    EXPECT_TRUE(c.ok) << got.outputs[i].name << ": " << c.message;
  }
}

// The endless kernel with a 2 s client deadline: DEADLINE_EXCEEDED; then the worker
// (one kernel thread) stops burning its core without being restarted, and a normal Run
// on it matches the interpreter. Through the execute lane and over gRPC.
TEST(RunawayKernels, AnEndlessKernelStopsAtTheClientsDeadline) {
  for (std::string lane : {"shm", "grpc"}) {
    SCOPED_TRACE("--exec-lane=" + lane);
    Uopd u = Uopd::start({"--cache-dir=" + scratch("deadline"), "--workers=1", "--worker-threads=1", "--exec-lane=" + lane});
    ASSERT_TRUE(u.client);
    Hurried h(u);
    ASSERT_TRUE(h.ok());
    const int64_t pid = h.pid;
    EndlessKernel k;
    auto r = h.session->run(k.root, {}, {{k.in, HostTensor::of(Scalar::Float32, {1}, {1.0})}});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
    EXPECT_TRUE(stops_burning(pid)) << "the worker keeps running the kernel past its deadline";

    auto patient = u.client->create_session();
    ASSERT_TRUE(patient.ok()) << patient.status();
    testing::SoftmaxModel m(21);
    auto ok = patient->run(m.root, m.names, m.bindings);
    ASSERT_TRUE(ok.ok()) << ok.status();
    expect_matches(m.expected(), *ok);
    const client::WorkerStatus* after = u.worker("CPU:0");
    ASSERT_TRUE(after);
    EXPECT_EQ(after->pid, pid) << "the worker was restarted instead of stopping the kernel";
    EXPECT_EQ(after->restarts, 0u);
  }
}

// The server's own --request-deadline-s holds the same way for a patient client.
TEST(RunawayKernels, AnEndlessKernelStopsAtTheServersRequestDeadline) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("request-deadline"), "--workers=1", "--worker-threads=1",
                        "--request-deadline-s=2"});
  ASSERT_TRUE(u.client);
  const client::WorkerStatus* before = u.worker("CPU:0");
  ASSERT_TRUE(before && before->pid > 0);
  const int64_t pid = before->pid;
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  EndlessKernel k;
  auto r = session->run(k.root, {}, {{k.in, HostTensor::of(Scalar::Float32, {1}, {1.0})}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(stops_burning(pid));
  testing::SoftmaxModel m(22);
  auto ok = session->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(ok.ok()) << ok.status();
  expect_matches(m.expected(), *ok);
  EXPECT_EQ(u.worker("CPU:0")->pid, pid);
}

// A CUSTOM call that blocks (sleep(1000)) never reads its stop word: past the deadline
// and the grace period the worker exits (status 5), uopd reports it and starts it again,
// and the next Run works on the new worker.
TEST(RunawayKernels, CodeThatIgnoresItsStopWordEndsItsWorker) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("stuck"), "--workers=1", "--allow-custom"});
  ASSERT_TRUE(u.client);
  Hurried h(u);
  ASSERT_TRUE(h.ok());
  const int64_t pid = h.pid;
  Kernel k;
  const UOp* out = k.param(0, Scalar::UInt32, 1);
  const UOp* slept = k.custom(dtypes::uint32, "sleep({0})", {k.g.cnst(dtypes::uint32, ConstValue::UInt(1000))});
  auto r = h.session->run(k.kernel({k.store(out, k.g.idx(0), slept)}), {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  ASSERT_TRUE(wait_until([&] {
    const client::WorkerStatus* w = u.worker("CPU:0");
    return w && w->restarts == 1 && w->state == "up" && w->pid != pid;
  })) << "the worker was not ended and started again";
  EXPECT_NE(u.worker("CPU:0")->last_error.find("exited with status 5"), std::string::npos) << u.worker("CPU:0")->last_error;
  auto patient = u.client->create_session();
  ASSERT_TRUE(patient.ok()) << patient.status();
  testing::SoftmaxModel m(23);
  auto ok = patient->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(ok.ok()) << ok.status();
  expect_matches(m.expected(), *ok);
}

// out[r] = sqrtf(in[r]) through a CUSTOM op: libm works in the sandbox, and the result
// is the C library's, checked against std::sqrt.
TEST(RunawayKernels, ACustomOpCallingLibmWorksInTheSandbox) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("sqrtf"), "--workers=1", "--allow-custom"});
  ASSERT_TRUE(u.client);
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  constexpr int64_t n = 1000;
  Kernel k;
  const UOp* out = k.param(0, Scalar::Float32, n);
  const UOp* in = k.param(1, Scalar::Float32, n);
  const UOp* r = k.range(n);
  const UOp* root = k.kernel({k.store(out, r, k.custom(dtypes::float32, "sqrtf({0})", {k.load(in, r)}), {r})});
  HostTensor x = HostTensor::random(Scalar::Float32, {n}, 5);
  for (int64_t i = 0; i < n; ++i) x.set(i, ConstValue::Float(std::fabs(x.get(i).as_float()) * 100));
  auto got = session->run(root, {}, {{in, x}});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->outputs.size(), 2u);  // every PARAM, by slot
  const HostTensor& y = got->outputs[0].tensor;
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(y.get(i).as_float(), static_cast<double>(std::sqrt(static_cast<float>(x.get(i).as_float())))) << i;
  // Refused forms are refused before anything runs, naming the node.
  auto bad = session->run(k.kernel({k.store(out, r, k.custom(dtypes::float32, "sqrtf({0}); system(0)", {k.load(in, r)}), {r})}),
                          {}, {{in, x}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("llvm_cpu.custom"), std::string::npos) << bad.status();
}

// A CUSTOM op that calls open() makes its worker die by SIGSYS: the client gets
// UNAVAILABLE naming the worker and the signal, the worker is started again, and another
// session's buffer and Runs on the other worker are untouched.
TEST(RunawayKernels, ACustomOpThatOpensAFileDiesBySigsys) {
  Uopd u = Uopd::start({"--cache-dir=" + scratch("sigsys"), "--workers=2", "--allow-custom"});
  ASSERT_TRUE(u.client);
  const client::WorkerStatus* w0 = u.worker("CPU:0");
  const client::WorkerStatus* w1 = u.worker("CPU:1");
  ASSERT_TRUE(w0 && w1);
  const int64_t pid0 = w0->pid, pid1 = w1->pid;
  // The other session, on CPU:1: a buffer it keeps, and a Run before and after.
  auto other = u.client->create_session({"CPU:1"});
  ASSERT_TRUE(other.ok()) << other.status();
  std::string kept(1 << 16, '\0');
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = static_cast<char>(i * 131 + 7);
  auto id = other->create_buffer(Scalar::UInt8, kept.size());
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(other->upload(*id, kept).ok());
  testing::SoftmaxModel m(24);
  auto first = other->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(first.ok()) << first.status();
  expect_matches(m.expected(), *first);

  auto session = u.client->create_session({"CPU:0"});
  ASSERT_TRUE(session.ok()) << session.status();
  Kernel k;
  const UOp* out = k.param(0, Scalar::Int32, 1);
  // open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600): the system call is made, and refused
  // before the path is looked at; NULL stands for a path, which a scalar cannot hold.
  const UOp* fd = k.custom(dtypes::int32, "open({0}, {1}, {2})",
                           {k.g.cnst(dtypes::int64, ConstValue::Int(0)),
                            k.g.cnst(dtypes::int32, ConstValue::Int(O_WRONLY | O_CREAT | O_TRUNC)),
                            k.g.cnst(dtypes::uint32, ConstValue::UInt(0600))});
  auto r = session->run(k.kernel({k.store(out, k.g.idx(0), fd)}), {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("CPU:0"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("SIGSYS"), std::string::npos) << r.status();
  ASSERT_TRUE(wait_until([&] {
    const client::WorkerStatus* w = u.worker("CPU:0");
    return w && w->restarts == 1 && w->state == "up" && w->pid != pid0;
  })) << "CPU:0 was not started again";

  auto back = other->download(*id);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == kept) << "the other session's buffer changed";
  auto second = other->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(second.ok()) << second.status();
  expect_matches(m.expected(), *second);
  const client::WorkerStatus* still = u.worker("CPU:1");
  ASSERT_TRUE(still);
  EXPECT_EQ(still->pid, pid1);
  EXPECT_EQ(still->restarts, 0u);
}

// A remote worker, sandboxed by default, told its scheduler by name: it resolves the name
// before the filter goes on (it could not after), registers, and runs a model right.
TEST(RunawayKernels, ASandboxedRemoteWorkerFindsItsSchedulerByName) {
  const testing::ClusterSecret& secret = testing::test_secret();
  Uopd u = Uopd::start({"--cache-dir=" + scratch("by-name"), "--workers=0", secret.flag()});
  ASSERT_TRUE(u.client);
  const std::string internal = u.proc->internal_address();  // where workers register
  testing::WorkerProc w;
  ASSERT_NO_FATAL_FAILURE(testing::spawn_worker(
      UOP_WORKER_BINARY, {"--device=cpu:0", "--threads=1", "--heartbeat-seconds=1", secret.flag(),
                          "--scheduler=localhost:" + internal.substr(internal.rfind(':') + 1)}, &w));
  ASSERT_TRUE(wait_until([&] {
    const client::WorkerStatus* s = u.worker("CPU:0");
    return s && s->state == "up";
  })) << u.proc->log_tail();
  auto session = u.client->create_session();
  ASSERT_TRUE(session.ok()) << session.status();
  testing::SoftmaxModel m(25);
  auto ok = session->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(ok.ok()) << ok.status();
  expect_matches(m.expected(), *ok);
  EXPECT_TRUE(w.running());
}

}  // namespace
}  // namespace uop
