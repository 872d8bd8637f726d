// WorkerPool and uop-worker as real processes on 127.0.0.1 with ephemeral ports: embedded
// workers run kernels through the gRPC stub; a worker killed with SIGKILL, idle or in the
// middle of an Execute, fails only its own calls (UNAVAILABLE naming it and the signal)
// and comes back as a new generation; shutdown leaves no child behind; SIGTERM drains; an
// embedded worker dies with its parent; a remote worker registers with a real Registry.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "compiler/support/strings.h"
#include "tests/e2e/proc_status.h"
#include "tests/e2e/worker_proc.h"
#include "server/registry_service.h"
#include "server/workers.h"
#include "tests/unit/compiler/codegen/linear_builder.h"

namespace uop {
namespace {

namespace wv1 = uopd::worker::v1;
using Stub = wv1::Worker::Stub;
using testing::LinearBuilder;

constexpr int64_t N = 64;
constexpr const char* kBinary = UOP_WORKER_BINARY;

absl::Status to_absl(const grpc::Status& st) {
  return st.ok() ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
}

// out[i] = in[i] * 3 + i; two int32 buffers of N elements.
const CpuArtifact& scale_kernel() {
  static const CpuArtifact art = [] {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::int32, N);
    const UOp* in = lb.param(1, dtypes::int32, N);
    const UOp* r = lb.range(lb.idx(N), 0, AxisType::Thread);
    const UOp* x = lb.load(in, lb.index(in, r));
    lb.end(lb.store(lb.index(out, r), lb.alu(Op::ADD, {lb.alu(Op::MUL, {x, lb.cnst(dtypes::int32, ConstValue::Int(3))}),
                                                       lb.cast(r, dtypes::int32)})),
           r);
    return *compile_cpu(lb.linear(), CpuTarget::host());
  }();
  return art;
}

// out[0] = 1 + 1 + ... n times in float32, one add after another: runs as long as n says.
const CpuArtifact& count_kernel() {
  static const CpuArtifact art = [] {
    LinearBuilder lb;
    const UOp* out = lb.param(0, dtypes::float32, 1);
    const UOp* n = lb.var("n", 0, int64_t{1} << 40);
    const UOp* acc = lb.reg(dtypes::float32, 1);
    const UOp* row = lb.range(lb.idx(1), 0, AxisType::Thread);
    const UOp* init = lb.store(lb.index(acc, lb.idx(0)), lb.f32(0));
    const UOp* k = lb.range(n, 1, AxisType::Reduce);
    const UOp* acc_in = lb.index(lb.after(acc, {init, k}), lb.idx(0));
    const UOp* done = lb.end(lb.store(acc_in, lb.alu(Op::ADD, {lb.load(acc, acc_in), lb.f32(1)})), k);
    lb.end(lb.store(lb.index(out, row), lb.load(acc, lb.index(lb.after(acc, {done}), lb.idx(0)))), row);
    return *compile_cpu(lb.linear(), CpuTarget::host());
  }();
  return art;
}

std::chrono::system_clock::time_point in(absl::Duration d) { return absl::ToChronoTime(absl::Now() + d); }

grpc::Status alloc(Stub* s, uint64_t id, uint64_t bytes) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(absl::Seconds(10)));
  wv1::AllocBufferRequest req;
  req.set_buffer_id(id);
  req.set_bytes(bytes);
  wv1::AllocBufferResponse resp;
  return s->AllocBuffer(&ctx, req, &resp);
}

grpc::Status write(Stub* s, uint64_t id, const std::string& data) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(absl::Seconds(10)));
  wv1::WriteBufferResponse resp;
  auto w = s->WriteBuffer(&ctx, &resp);
  wv1::WriteChunk c;
  c.set_buffer_id(id);
  c.set_data(data);
  w->Write(c);
  w->WritesDone();
  return w->Finish();
}

grpc::Status read(Stub* s, uint64_t id, std::string* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(absl::Seconds(10)));
  wv1::ReadBufferRequest req;
  req.set_buffer_id(id);
  auto r = s->ReadBuffer(&ctx, req);
  wv1::ReadChunk c;
  while (r->Read(&c)) *out += c.data();
  return r->Finish();
}

std::string read(Stub* s, uint64_t id) {
  std::string out;
  EXPECT_TRUE(read(s, id, &out).ok());
  return out;
}

grpc::Status load(Stub* s, const std::string& key, const CpuArtifact& art) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(absl::Seconds(30)));
  wv1::LoadProgramRequest req;
  req.set_key(key);
  req.set_object(art.object);
  req.set_abi(art.abi.serialize());
  wv1::LoadProgramResponse resp;
  return s->LoadProgram(&ctx, req, &resp);
}

grpc::Status execute(Stub* s, const std::string& key, std::vector<uint64_t> ids, std::vector<int64_t> vars,
                     absl::Duration deadline = absl::Seconds(30)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(deadline));
  wv1::ExecuteRequest req;
  wv1::Launch* l = req.add_launches();
  l->set_key(key);
  for (uint64_t id : ids) l->add_buffer_ids(id);
  for (int64_t v : vars) l->add_vars(v);
  wv1::ExecuteResponse resp;
  return s->Execute(&ctx, req, &resp);
}

grpc::Status info(Stub* s, wv1::InfoResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(in(absl::Seconds(5)));
  return s->Info(&ctx, wv1::InfoRequest(), resp);
}

// Loads the scale kernel, runs it on fresh buffers and checks every element.
void run_scale(Stub* s, uint64_t first_id) {
  ASSERT_TRUE(s);
  ASSERT_TRUE(load(s, "scale", scale_kernel()).ok());
  ASSERT_TRUE(alloc(s, first_id, N * 4).ok());
  ASSERT_TRUE(alloc(s, first_id + 1, N * 4).ok());
  std::vector<int32_t> in(N);
  for (int i = 0; i < N; ++i) in[i] = 7 * i - 100;
  ASSERT_TRUE(write(s, first_id + 1, std::string(reinterpret_cast<const char*>(in.data()), N * 4)).ok());
  grpc::Status st = execute(s, "scale", {first_id, first_id + 1}, {});
  ASSERT_TRUE(st.ok()) << st.error_message();
  std::string out = read(s, first_id);
  ASSERT_EQ(out.size(), size_t{N * 4});
  for (int i = 0; i < N; ++i) {
    int32_t v;
    std::memcpy(&v, out.data() + 4 * i, 4);
    ASSERT_EQ(v, in[i] * 3 + i) << i;
  }
}

// Every child process of this process, from /proc.
std::vector<int64_t> children() {
  std::vector<int64_t> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(task.path() / "children");
    int64_t pid;
    while (f >> pid) out.push_back(pid);
  }
  return out;
}

// Gone, or a zombie nobody reaped yet (init in a container may never reap it).
bool dead(int64_t pid) {
  std::ifstream f(cat("/proc/", pid, "/stat"));
  if (!f) return true;
  std::string line;
  std::getline(f, line);
  auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

using testing::wait_until;

using Proc = testing::WorkerProc;

// The secret of every worker this test starts itself, and of the registries they meet.
const testing::ClusterSecret& secret() { return testing::test_secret(); }

void spawn_worker(std::vector<std::string> flags, Proc* p) {
  flags.push_back(secret().flag());
  testing::spawn_worker(kBinary, flags, p);
}

// The exit status of a child of ours, or -1 if it did not exit in time (then killed).
int wait_exit(Proc& p, absl::Duration limit = absl::Seconds(60)) {
  int status = 0;
  pid_t pid = p.pid;
  p.pid = -1;
  if (!wait_until([&] { return waitpid(pid, &status, WNOHANG) == pid; }, limit)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

WorkerOptions embedded(int n) {
  WorkerOptions o;
  o.worker_binary = kBinary;
  o.embedded_cpu_workers = n;
  o.threads_per_worker = 2;
  return o;
}

TEST(WorkerPool, EmbeddedWorkersRunKernelsAndStopWithoutOrphans) {
  WorkerPool pool;
  ASSERT_TRUE(pool.start_embedded(embedded(2)).ok());
  std::vector<int64_t> pids;
  for (const char* device : {"CPU:0", "CPU:1"}) {
    auto w = pool.worker_for(device);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->device(), device);
    EXPECT_EQ((*w)->state(), "up");
    EXPECT_TRUE((*w)->embedded());
    wv1::InfoResponse i;
    ASSERT_TRUE(info((*w)->stub().get(), &i).ok());
    EXPECT_EQ(i.device(), device);
    EXPECT_EQ(i.pid(), (*w)->pid());
    EXPECT_EQ(i.threads(), 2);
    EXPECT_EQ(i.target(), CpuTarget::host().id());
    run_scale((*w)->stub().get(), 1);
    pids.push_back((*w)->pid());
  }
  EXPECT_NE(pids[0], pids[1]);
  auto none = pool.worker_for("CPU:7", absl::Milliseconds(50));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("CPU:7"), std::string::npos) << none.status();
  auto snap = pool.snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].state, "up");
  EXPECT_EQ(snap[0].restarts, 0u);

  pool.shutdown();
  EXPECT_TRUE(children().empty());
  for (int64_t pid : pids) EXPECT_EQ(kill(static_cast<pid_t>(pid), 0), -1) << pid << " is still there";
  for (const auto& s : pool.snapshot()) EXPECT_EQ(s.state, "down");
  EXPECT_EQ(pool.worker_for("CPU:0", absl::Milliseconds(10)).status().code(), absl::StatusCode::kUnavailable);
}

TEST(WorkerPool, RestartsAWorkerKilledWhileIdle) {
  WorkerPool pool;
  ASSERT_TRUE(pool.start_embedded(embedded(2)).ok());
  auto w = *pool.worker_for("CPU:0");
  int64_t pid = w->pid(), other_pid = (*pool.worker_for("CPU:1"))->pid();
  uint64_t gen = w->generation();
  std::shared_ptr<Stub> old_stub = w->stub();
  ASSERT_TRUE(load(old_stub.get(), "scale", scale_kernel()).ok());
  w->note_program("scale", gen);
  EXPECT_TRUE(w->has_program("scale"));

  ASSERT_EQ(kill(static_cast<pid_t>(pid), SIGKILL), 0);
  wv1::InfoResponse i;
  grpc::Status st = info(old_stub.get(), &i);
  ASSERT_FALSE(st.ok());
  absl::Status told = pool.on_failure(w, to_absl(st));
  EXPECT_EQ(told.code(), absl::StatusCode::kUnavailable) << told;
  EXPECT_NE(told.message().find("CPU:0"), std::string::npos) << told;
  EXPECT_NE(told.message().find("signal 9"), std::string::npos) << told;
  EXPECT_NE(told.message().find(cat("pid ", pid)), std::string::npos) << told;

  auto again = pool.worker_for("CPU:0", absl::Seconds(20));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), w.get());  // the same slot, a new process
  EXPECT_NE(w->pid(), pid);
  EXPECT_GT(w->generation(), gen);
  EXPECT_EQ(w->restarts(), 1u);
  EXPECT_FALSE(w->has_program("scale"));  // the new process has nothing loaded
  EXPECT_NE(w->last_error().find("signal 9"), std::string::npos) << w->last_error();
  w->note_program("scale", gen);  // a record for the old process is ignored
  EXPECT_FALSE(w->has_program("scale"));
  run_scale(w->stub().get(), 1);
  EXPECT_EQ((*pool.worker_for("CPU:1"))->pid(), other_pid);  // the other worker never noticed

  // Nobody calls CPU:1 after this kill: the supervisor still notices and restarts it.
  auto w1 = *pool.worker_for("CPU:1");
  ASSERT_EQ(kill(static_cast<pid_t>(other_pid), SIGKILL), 0);
  ASSERT_TRUE(wait_until([&] { return w1->state() == "up" && w1->pid() != other_pid; }));
  EXPECT_EQ(w1->restarts(), 1u);
  run_scale(w1->stub().get(), 1);
  pool.shutdown();
  EXPECT_TRUE(children().empty());
}

TEST(WorkerPool, FailsTheExecuteInFlightWhenItsWorkerIsKilled) {
  WorkerPool pool;
  ASSERT_TRUE(pool.start_embedded(embedded(2)).ok());
  auto w = *pool.worker_for("CPU:1");
  int64_t pid = w->pid(), other_pid = (*pool.worker_for("CPU:0"))->pid();
  uint64_t gen = w->generation();
  std::shared_ptr<Stub> stub = w->stub();
  ASSERT_TRUE(load(stub.get(), "count", count_kernel()).ok());
  ASSERT_TRUE(alloc(stub.get(), 1, 4).ok());

  // About 10^12 dependent float adds: minutes of work, far more than the test waits.
  std::atomic<bool> finished{false};
  grpc::Status st;
  const int64_t idle = testing::cpu_ticks(pid);
  std::thread call([&] {
    st = execute(stub.get(), "count", {1}, {int64_t{1000} * 1000 * 1000 * 1000}, absl::Seconds(300));
    finished = true;
  });
  EXPECT_TRUE(testing::burned({pid}, idle)) << "the worker never ran the kernel";
  EXPECT_FALSE(finished.load());
  ASSERT_EQ(kill(static_cast<pid_t>(pid), SIGKILL), 0);
  call.join();
  ASSERT_FALSE(st.ok());
  absl::Status told = pool.on_failure(w, to_absl(st), gen);
  EXPECT_EQ(told.code(), absl::StatusCode::kUnavailable) << told;
  EXPECT_NE(told.message().find("worker CPU:1"), std::string::npos) << told;
  EXPECT_NE(told.message().find("signal 9"), std::string::npos) << told;

  auto again = pool.worker_for("CPU:1", absl::Seconds(20));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(w->pid(), pid);
  EXPECT_GT(w->generation(), gen);
  run_scale(w->stub().get(), 1);
  EXPECT_EQ((*pool.worker_for("CPU:0"))->pid(), other_pid);

  // A failure that is the worker's own answer comes back unchanged, worker untouched.
  absl::Status bad = absl::InvalidArgumentError("launch 0: bad");
  EXPECT_EQ(pool.on_failure(w, bad), bad);
  // A deadline on a live worker keeps its code and names the worker.
  grpc::Status late = execute(w->stub().get(), "scale", {1, 2}, {}, absl::Milliseconds(-1));
  ASSERT_FALSE(late.ok());
  absl::Status told_late = pool.on_failure(w, to_absl(late));
  EXPECT_EQ(told_late.code(), absl::StatusCode::kDeadlineExceeded) << told_late;
  EXPECT_NE(told_late.message().find("CPU:1"), std::string::npos) << told_late;
  EXPECT_EQ(w->state(), "up");
  pool.shutdown();
  EXPECT_TRUE(children().empty());
}

// Embedded workers listen on loopback and answer the pool only: a caller without their
// secret, or with the cluster's (which is not theirs), is refused before any handler,
// every method alike, and what the pool put in a buffer stays as it was. Buffer ids are
// random and never handed out twice while in use.
TEST(WorkerPool, EmbeddedWorkersAnswerOnlyThePool) {
  WorkerPool pool(secret().dialer());
  ASSERT_TRUE(pool.start_embedded(embedded(1)).ok());
  auto w = *pool.worker_for("CPU:0");
  EXPECT_EQ(w->address().rfind("127.0.0.1:", 0), 0u) << w->address();
  std::shared_ptr<Stub> mine = w->stub();
  const uint64_t id = w->new_buffer_id();
  ASSERT_TRUE(alloc(mine.get(), id, N * 4).ok());
  const std::string data(N * 4, '\x5a');
  ASSERT_TRUE(write(mine.get(), id, data).ok());
  ASSERT_TRUE(load(mine.get(), "scale", scale_kernel()).ok());
  for (const cluster_auth::Dialer& dial : {cluster_auth::Dialer{}, secret().dialer()}) {
    std::shared_ptr<Stub> stranger = worker_stub(w->address(), dial);
    const auto refused = grpc::StatusCode::UNAUTHENTICATED;
    wv1::InfoResponse i;
    EXPECT_EQ(info(stranger.get(), &i).error_code(), refused);
    EXPECT_EQ(alloc(stranger.get(), id + 1, 4).error_code(), refused);
    EXPECT_EQ(write(stranger.get(), id, std::string(N * 4, 'X')).error_code(), refused);
    EXPECT_EQ(load(stranger.get(), "theirs", count_kernel()).error_code(), refused);
    EXPECT_EQ(execute(stranger.get(), "scale", {id, id}, {}).error_code(), refused);
    std::string got;
    EXPECT_EQ(read(stranger.get(), id, &got).error_code(), refused);
    EXPECT_TRUE(got.empty()) << "a stranger read " << got.size() << " bytes";
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(in(absl::Seconds(10)));
      wv1::FreeBuffersRequest req;
      req.add_buffer_ids(id);
      wv1::FreeBuffersResponse resp;
      EXPECT_EQ(stranger->FreeBuffers(&ctx, req, &resp).error_code(), refused);
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(in(absl::Seconds(10)));
      wv1::CollectiveRequest req;
      req.set_group("g");
      req.set_size(1);
      req.set_buffer_id(id);
      wv1::CollectiveResponse resp;
      EXPECT_EQ(stranger->Collective(&ctx, req, &resp).error_code(), refused);
    }
  }
  EXPECT_EQ(read(mine.get(), id), data) << "a stranger changed the buffer";
  wv1::InfoResponse i;
  ASSERT_TRUE(info(mine.get(), &i).ok());
  EXPECT_EQ(i.programs(), 1u) << "a stranger loaded a program";

  absl::flat_hash_set<uint64_t> ids = {id};
  bool top_bit = false;
  for (int k = 0; k < 1000; ++k) {
    uint64_t x = w->new_buffer_id();
    EXPECT_NE(x, 0u);
    EXPECT_TRUE(ids.insert(x).second) << x << " handed out twice";
    top_bit |= (x >> 63) != 0;
  }
  EXPECT_TRUE(top_bit) << "the ids do not use all 64 bits";
  pool.shutdown();
}

TEST(WorkerPool, ReportsAWorkerBinaryThatCannotRun) {
  WorkerPool pool;
  WorkerOptions o = embedded(1);
  o.worker_binary = "/nonexistent/uop-worker";
  absl::Status st = pool.start_embedded(o);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("/nonexistent/uop-worker"), std::string::npos) << st;
  EXPECT_TRUE(children().empty());
}

TEST(WorkerProcess, SigtermDrainsTheExecuteInFlight) {
  Proc p;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--threads=1"}, &p));
  std::shared_ptr<Stub> stub = worker_stub(p.address, secret().dialer());
  ASSERT_TRUE(load(stub.get(), "count", count_kernel()).ok());
  ASSERT_TRUE(alloc(stub.get(), 1, 4).ok());
  grpc::Status st;
  const int64_t idle = testing::cpu_ticks(p.pid);
  std::thread call([&] { st = execute(stub.get(), "count", {1}, {int64_t{2} * 1000 * 1000 * 1000}, absl::Seconds(120)); });
  EXPECT_TRUE(testing::burned({p.pid}, idle)) << "the worker never ran the kernel";  // the Execute is in flight
  ASSERT_EQ(kill(p.pid, SIGTERM), 0);
  call.join();
  EXPECT_TRUE(st.ok()) << st.error_message();  // finished, not cut off
  EXPECT_EQ(wait_exit(p), 0);
  wv1::InfoResponse i;
  EXPECT_FALSE(info(stub.get(), &i).ok());  // and nothing listens there any more
}

// `--embedded=PID` names the parent: a worker whose parent is that process serves, one
// whose parent is another (it was orphaned and reparented before it looked) exits at once.
// Pid 1 is no special case: uopd is pid 1 in a container without an init, and its
// workers' parent is then pid 1 legitimately.
TEST(WorkerProcess, EmbeddedWorkerKnowsItsParentByPid) {
  Proc ours;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--threads=1", cat("--embedded=", getpid())}, &ours));
  EXPECT_TRUE(ours.running());
  wv1::InfoResponse i;
  EXPECT_TRUE(info(worker_stub(ours.address, secret().dialer()).get(), &i).ok());

  // Its exit status, stdout and stderr dropped.
  auto exit_status = [](const char* flag) {
    Proc p;
    p.pid = fork();
    if (p.pid == 0) {
      int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, STDOUT_FILENO);
      dup2(devnull, STDERR_FILENO);
      execl(kBinary, kBinary, "--threads=1", flag, static_cast<char*>(nullptr));
      _exit(127);
    }
    return p.pid < 0 ? -2 : wait_exit(p, absl::Seconds(20));
  };
  EXPECT_EQ(exit_status("--embedded=1"), 0) << "a worker told another parent kept running";
  EXPECT_EQ(exit_status("--embedded=x"), 2);  // a usage error
}

TEST(WorkerProcess, EmbeddedWorkerDiesWithItsParent) {
  // The shell is the worker's parent; when it exits, PR_SET_PDEATHSIG stops the worker.
  // As a subreaper this process inherits the orphan, so it can see how it ended (and
  // reap it: init in a container may never do that).
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  // The shell exits once the worker serves (it has printed LISTENING, so it runs and has
  // asked for the signal), 0 if it saw that within a bound, else 1.
  const std::string out = std::filesystem::temp_directory_path() / cat("uopd-pdeathsig-", static_cast<int64_t>(getpid()));
  std::filesystem::remove(out);
  std::string cmd = cat("'", kBinary, "' --embedded --listen=127.0.0.1:0 ", secret().flag(), " >'", out,
                        "' 2>/dev/null & echo $!; for i in $(seq 600); do grep -q LISTENING '", out,
                        "' && exit 0; sleep 0.05; done; exit 1");
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_TRUE(f);
  Proc worker;
  long pid = 0;
  ASSERT_EQ(fscanf(f, "%ld", &pid), 1);
  worker.pid = static_cast<pid_t>(pid);
  const int shell = pclose(f);  // the shell exits
  std::filesystem::remove(out);
  EXPECT_TRUE(WIFEXITED(shell) && WEXITSTATUS(shell) == 0) << "the worker never served";
  EXPECT_EQ(wait_exit(worker, absl::Seconds(20)), 0) << "the worker did not drain and exit with its parent";
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST(WorkerPool, RemoteWorkerRegistersWithTheRegistry) {
  WorkerPool pool(secret().dialer());
  RegistryService registry(&pool);
  int port = 0;
  grpc::ServerBuilder builder;
  cluster_auth::Gate gate;
  gate.secret = secret().value();
  builder.AddListeningPort("127.0.0.1:0", gate.credentials(), &port);
  builder.RegisterService(&registry);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_TRUE(server && port != 0);

  Proc p;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device=cpu:3", "--threads=2", cat("--scheduler=127.0.0.1:", port)}, &p));
  const pid_t p_pid = p.pid;
  // The device exists once the worker has registered (worker_for does not wait for
  // devices nobody has announced).
  ASSERT_TRUE(wait_until([&] { return pool.worker_for("CPU:3", absl::Milliseconds(10)).ok(); }, absl::Seconds(30)));
  auto w = pool.worker_for("CPU:3");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE((*w)->embedded());
  EXPECT_EQ((*w)->address(), p.address);
  EXPECT_EQ((*w)->pid(), p_pid);
  uint64_t gen = (*w)->generation();
  run_scale((*w)->stub().get(), 10);

  // Registering again is a no-op; wrong devices and unreachable addresses are refused.
  auto id = pool.register_remote(p.address, "CPU:3");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, (*w)->id());
  EXPECT_EQ((*w)->generation(), gen);
  EXPECT_EQ(pool.register_remote(p.address, "CPU:4").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.register_remote("127.0.0.1:1", "CPU:5").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pool.register_remote("nonsense", "CPU:5").status().code(), absl::StatusCode::kInvalidArgument);

  // The remote worker goes away: its calls fail, and the pool says which worker and why.
  ASSERT_EQ(kill(p.pid, SIGTERM), 0);
  EXPECT_EQ(wait_exit(p), 0);
  wv1::InfoResponse i;
  grpc::Status st = info((*w)->stub().get(), &i);
  ASSERT_FALSE(st.ok());
  absl::Status told = pool.on_failure(*w, to_absl(st));
  EXPECT_EQ(told.code(), absl::StatusCode::kUnavailable) << told;
  EXPECT_NE(told.message().find("CPU:3"), std::string::npos) << told;
  EXPECT_NE(told.message().find("unreachable"), std::string::npos) << told;
  EXPECT_EQ((*w)->state(), "down");
  EXPECT_EQ(pool.worker_for("CPU:3", absl::Milliseconds(10)).status().code(), absl::StatusCode::kUnavailable);

  // A new process for the slot registers: a new generation.
  Proc q;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device=cpu:3", cat("--scheduler=127.0.0.1:", port)}, &q));
  const pid_t q_pid = q.pid;
  auto back = pool.worker_for("CPU:3", absl::Seconds(30));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->pid(), q_pid);
  EXPECT_GT((*back)->generation(), gen);
  run_scale((*back)->stub().get(), 10);
  kill(q.pid, SIGTERM);
  EXPECT_EQ(wait_exit(q), 0);
  server->Shutdown();
  pool.shutdown();
  EXPECT_TRUE(children().empty());
}

// Tenant isolation: each tenant gets processes of its own for an embedded slot, capped, and
// retired once unused; a remote worker serves one tenant at a time.
TEST(WorkerPool, TenantsGetWorkerProcessesOfTheirOwn) {
  WorkerPool pool;
  ASSERT_TRUE(pool.start_embedded(embedded(1)).ok());
  absl::Mutex mu;
  std::set<std::string> with_sessions;  // tenants the test says still have a session on CPU:0
  pool.isolate_tenants({2, absl::ZeroDuration(), [&](const std::string& t, const std::string&) {
                          absl::MutexLock l(&mu);
                          return with_sessions.contains(t);
                        }});
  auto session = [&](const std::string& t, bool open) {
    absl::MutexLock l(&mu);
    if (open) with_sessions.insert(t);
    else with_sessions.erase(t);
  };
  const int64_t shared = (*pool.worker_for("CPU:0"))->pid();
  session("a", true);
  session("b", true);
  auto a = pool.worker_for("CPU:0", absl::Seconds(30), "a");
  auto b = pool.worker_for("CPU:0", absl::Seconds(30), "b");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  EXPECT_EQ((*a)->tenant(), "a");
  EXPECT_NE((*a)->pid(), shared);
  EXPECT_NE((*b)->pid(), shared);
  EXPECT_NE((*a)->pid(), (*b)->pid());
  EXPECT_EQ((*pool.worker_for("CPU:0", absl::Seconds(1), "a"))->pid(), (*a)->pid()) << "one process per tenant and device";
  run_scale((*a)->stub().get(), 1);
  // Both processes are held: a third tenant is refused, naming the limit.
  session("c", true);
  auto c = pool.worker_for("CPU:0", absl::Seconds(1), "c");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted) << c.status();
  EXPECT_NE(c.status().message().find("--max-tenant-workers"), std::string::npos) << c.status();
  // Tenant a is done (no session, no request holding its worker): its process makes room.
  const int64_t a_pid = (*a)->pid();
  a = absl::UnavailableError("let go");
  session("a", false);
  c = pool.worker_for("CPU:0", absl::Seconds(30), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(wait_until([&] { return dead(a_pid); })) << "a's process is stopped once retired";
  // b stays while it holds its worker, and is retired once it lets go and has no session.
  const int64_t b_pid = (*b)->pid();
  session("b", false);
  EXPECT_FALSE(dead(b_pid));
  run_scale((*b)->stub().get(), 2);
  b = absl::UnavailableError("let go");
  EXPECT_TRUE(wait_until([&] { return dead(b_pid); }));
  EXPECT_EQ((*pool.worker_for("CPU:0"))->pid(), shared) << "the shared process is never retired";
  pool.shutdown();
  EXPECT_TRUE(children().empty());
}

TEST(WorkerPool, ARemoteWorkerServesOneTenantAtATime) {
  WorkerPool pool(secret().dialer());
  bool b_has_session = true;
  absl::Mutex mu;
  pool.isolate_tenants({2, absl::ZeroDuration(), [&](const std::string& t, const std::string&) {
                          absl::MutexLock l(&mu);
                          return t == "b" && b_has_session;
                        }});
  Proc p;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device=cpu:3"}, &p));
  ASSERT_TRUE(pool.register_remote(p.address, "CPU:3").ok());
  auto b = pool.worker_for("CPU:3", absl::Seconds(10), "b");
  ASSERT_TRUE(b.ok()) << b.status();
  auto a = pool.worker_for("CPU:3", absl::Seconds(1), "a");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted) << a.status();
  b = absl::UnavailableError("let go");
  {
    absl::MutexLock l(&mu);
    b_has_session = false;
  }
  // Free again once b is done: a gets it (the binding is released within a supervisor round).
  EXPECT_TRUE(wait_until([&] { return pool.worker_for("CPU:3", absl::Seconds(1), "a").ok(); }));
  kill(p.pid, SIGTERM);
  EXPECT_EQ(wait_exit(p), 0);
  pool.shutdown();
}

}  // namespace
}  // namespace uop
