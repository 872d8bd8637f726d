// Remote workers and the scheduler's Registry, with real uopd and uop-worker processes on
// 127.0.0.1 and ephemeral ports: a worker registers again every heartbeat, so a scheduler
// killed and started again on the same port serves it again without the worker being
// touched (and a worker with the heartbeat off is not learned back); `--name=auto` gives
// workers of one local device distinct cluster names, the same ones again on every
// heartbeat, after a worker restart (same instance) and after a scheduler restart; and
// `uop-worker --health-check` answers for a serving worker and a dead address.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include "tests/e2e/softmax_model.h"

#include "absl/time/clock.h"
#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/support/strings.h"
#include "tests/e2e/scheduler_proc.h"
#include "tests/e2e/worker_proc.h"
#include "server/registry_service.h"
#include "server/workers.h"

namespace uop {
namespace {

namespace wv1 = uopd::worker::v1;
using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;

constexpr const char* kWorker = UOP_WORKER_BINARY;
constexpr const char* kUopd = UOPD_BINARY;

using testing::wait_until;

std::string scratch(const std::string& tag) { return testing::scratch_dir("registration-" + tag); }

using Proc = testing::WorkerProc;

using testing::test_secret;
const testing::ClusterSecret& secret() { return test_secret(); }

void spawn_worker(std::vector<std::string> flags, Proc* p) {
  flags.push_back(secret().flag());
  testing::spawn_worker(kWorker, flags, p);
}

// `uop-worker ARGS...`: its exit status and output.
std::pair<int, std::string> run_worker_command(const std::string& args) { return testing::run_command(kWorker, args); }

struct Scheduler : testing::SchedulerProc {
  static Scheduler start(std::vector<std::string> args) {
    args.push_back(secret().flag());
    return Scheduler{testing::SchedulerProc::start(kUopd, args)};
  }
  // device -> (address, pid) of every worker that is up.
  std::map<std::string, std::pair<std::string, int64_t>> workers_up() {
    std::map<std::string, std::pair<std::string, int64_t>> out;
    auto st = client->stats();
    if (!st.ok()) return out;
    for (const auto& w : st->workers)
      if (w.state == "up") out[w.device] = {w.address, w.pid};
    return out;
  }
};

absl::Status run_on(Client& c, const std::string& device, uint64_t seed) { return testing::run_softmax(c, device, seed); }

// Polls run_on until it succeeds (a device being learned back) or `limit` passes.
absl::Status run_when_served(Client& c, const std::string& device, uint64_t seed,
                             absl::Duration limit = absl::Seconds(60)) {
  absl::Status last;
  wait_until([&] { return (last = run_on(c, device, seed)).ok(); }, limit);
  return last;
}

TEST(Registration, RestartedSchedulerLearnsItsWorkersBack) {
  const std::string cache = scratch("restart");
  Scheduler a = Scheduler::start({"--workers=0", "--cache-dir=" + cache});
  ASSERT_TRUE(a.client);
  const std::string address = a.proc->address();
  const std::string port = address.substr(address.rfind(':') + 1);
  // Workers register at the internal listener, which the new scheduler takes over too.
  const std::string internal = a.proc->internal_address();
  const std::string internal_port = internal.substr(internal.rfind(':') + 1);
  const std::string sched = "--scheduler=" + internal;

  // An explicitly named worker with a fast heartbeat, two that ask for automatic names
  // (the same local device), and one that registers once (the heartbeat off).
  Proc w5, auto1, auto2, once;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device=cpu:5", "--threads=2", sched, "--heartbeat-seconds=1"}, &w5));
  ASSERT_NO_FATAL_FAILURE(
      spawn_worker({"--device=cpu:0", "--threads=1", sched, "--name=auto", "--heartbeat-seconds=1"}, &auto1));
  ASSERT_NO_FATAL_FAILURE(
      spawn_worker({"--device=cpu:0", "--threads=1", sched, "--name=auto", "--heartbeat-seconds=1"}, &auto2));
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device=cpu:6", "--threads=1", sched, "--heartbeat-seconds=0"}, &once));

  ASSERT_TRUE(wait_until([&] { return a.workers_up().size() == 4; })) << "workers never all registered";
  auto before = a.workers_up();
  ASSERT_TRUE(before.count("CPU:5") && before.count("CPU:6")) << "explicit names are kept as given";
  // The automatic names: the two lowest free CPU names, one each.
  ASSERT_TRUE(before.count("CPU:0") && before.count("CPU:1"));
  EXPECT_EQ((std::set<std::string>{before["CPU:0"].first, before["CPU:1"].first}),
            (std::set<std::string>{auto1.address, auto2.address}));
  EXPECT_EQ(before["CPU:5"].first, w5.address);
  EXPECT_EQ(before["CPU:5"].second, w5.pid);
  ASSERT_TRUE(run_on(*a.client, "CPU:5", 1).ok());
  // A device named by the scheduler runs graphs like any other (the worker's own device
  // is CPU:0 whichever name it serves under).
  ASSERT_TRUE(run_on(*a.client, "CPU:1", 2).ok());

  // The scheduler dies without a word and a new one takes its port.
  ASSERT_EQ(kill(a.proc->pid(), SIGKILL), 0);
  (void)a.proc->stop();  // reaps it (a status for the SIGKILL)
  a.client.reset();
  Scheduler b = Scheduler::start(
      {"--workers=0", "--cache-dir=" + cache, "--listen=127.0.0.1:" + port, "--internal-listen=127.0.0.1:" + internal_port});
  ASSERT_TRUE(b.client);
  ASSERT_EQ(b.proc->address(), address);
  ASSERT_EQ(b.proc->internal_address(), internal);

  // Without touching the workers, their devices are served again.
  absl::Status back = run_when_served(*b.client, "CPU:5", 3);
  EXPECT_TRUE(back.ok()) << back;
  EXPECT_TRUE(w5.running());
  auto after = b.workers_up();
  ASSERT_TRUE(after.count("CPU:5"));
  EXPECT_EQ(after["CPU:5"], before["CPU:5"]) << "the same worker process, not a new one";
  // The automatic names come back as they were (each worker asks for its previous one).
  ASSERT_TRUE(wait_until([&] { return b.workers_up().count("CPU:0") && b.workers_up().count("CPU:1"); }));
  after = b.workers_up();
  EXPECT_EQ(after["CPU:0"], before["CPU:0"]);
  EXPECT_EQ(after["CPU:1"], before["CPU:1"]);
  EXPECT_TRUE(run_when_served(*b.client, "CPU:0", 4).ok());
  // The worker that registered once is unknown to the new scheduler, though it runs.
  EXPECT_TRUE(once.running());
  EXPECT_EQ(after.count("CPU:6"), 0u);
  auto none = run_on(*b.client, "CPU:6", 5);
  EXPECT_FALSE(none.ok());
}

// The Registry in-process (a WorkerPool and RegistryService, as uopd serves them) for the
// naming rules, with real workers behind the addresses.
// The Registry in front of a pool, counting the registrations it answers (a worker's
// first one and each heartbeat), so that a test can wait for heartbeats to go by.
class CountingRegistry final : public wv1::Registry::Service {
 public:
  explicit CountingRegistry(WorkerPool* pool) : inner_(pool) {}
  grpc::Status Register(grpc::ServerContext* ctx, const wv1::RegisterRequest* req, wv1::RegisterResponse* resp) override {
    grpc::Status st = inner_.Register(ctx, req, resp);
    ++answered_;
    return st;
  }
  int answered() const { return answered_.load(); }

 private:
  RegistryService inner_;
  std::atomic<int> answered_{0};
};

class PoolWithRegistry {
 public:
  PoolWithRegistry() : pool(secret().dialer()) {
    registry_ = std::make_unique<CountingRegistry>(&pool);
    grpc::ServerBuilder builder;
    cluster_auth::Gate gate;
    gate.secret = secret().value();
    builder.AddListeningPort("127.0.0.1:0", gate.credentials(), &port);
    builder.RegisterService(registry_.get());
    server_ = builder.BuildAndStart();
  }
  ~PoolWithRegistry() {
    if (server_) server_->Shutdown();
    pool.shutdown();
  }
  int registrations() const { return registry_->answered(); }
  WorkerPool pool;
  int port = 0;

 private:
  std::unique_ptr<CountingRegistry> registry_;
  std::unique_ptr<grpc::Server> server_;
};

absl::StatusOr<RemoteRegistered> reg(WorkerPool& pool, const std::string& address, const std::string& device,
                                     const std::string& name, const std::string& instance = "",
                                     const std::string& previous = "") {
  RemoteRegistration r;
  r.address = address;
  r.device = device;
  r.name = name;
  r.instance = instance;
  r.previous_name = previous;
  return pool.register_remote(r);
}

std::string info_device(const std::shared_ptr<WorkerHandle>& w) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  wv1::InfoResponse info;
  auto stub = w->stub();
  if (!stub || !stub->Info(&ctx, wv1::InfoRequest(), &info).ok()) return "";
  return info.device();
}

// device -> (address, generation) of every remote slot that is up.
std::map<std::string, std::pair<std::string, uint64_t>> slots_up(const WorkerPool& pool) {
  std::map<std::string, std::pair<std::string, uint64_t>> out;
  for (const auto& w : pool.snapshot())
    if (w.state == "up") out[w.device] = {w.address, w.generation};
  return out;
}

TEST(Registration, AutomaticNamesAreDistinctAndStable) {
  PoolWithRegistry s;
  ASSERT_NE(s.port, 0);
  // Two workers of the same local device ask for names through the real Registry.
  Proc p, q;
  const std::string sched = cat("--scheduler=127.0.0.1:", s.port);
  ASSERT_NO_FATAL_FAILURE(
      spawn_worker({"--device=cpu:0", "--threads=1", sched, "--name=auto", "--heartbeat-seconds=1"}, &p));
  ASSERT_NO_FATAL_FAILURE(
      spawn_worker({"--device=cpu:0", "--threads=1", sched, "--name=auto", "--heartbeat-seconds=1"}, &q));
  ASSERT_TRUE(wait_until([&] { return slots_up(s.pool).size() == 2; })) << "the workers never registered";
  auto named = slots_up(s.pool);
  ASSERT_TRUE(named.count("CPU:0") && named.count("CPU:1"));
  EXPECT_EQ((std::set<std::string>{named["CPU:0"].first, named["CPU:1"].first}),
            (std::set<std::string>{p.address, q.address}));
  // The scheduler's name and the worker's own device are two things.
  auto w1 = s.pool.worker_for("CPU:1");
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(info_device(*w1), "CPU:0");

  // Heartbeats (two of each worker) change nothing: same names, same generations.
  const int before = s.registrations();
  ASSERT_TRUE(wait_until([&] { return s.registrations() >= before + 4; })) << "the workers stopped their heartbeats";
  EXPECT_EQ(slots_up(s.pool), named);
  const std::string p_name = named["CPU:0"].first == p.address ? "CPU:0" : "CPU:1";
  auto again = reg(s.pool, p.address, "CPU:0", "auto");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->name, p_name);
  EXPECT_EQ(slots_up(s.pool), named);

  // The rules, worker by worker, on pools of our own (no heartbeats in the way).
  Proc r1, r2, r3, r4;
  for (Proc* r : {&r1, &r2, &r3, &r4}) ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device=cpu:0", "--threads=1"}, r));
  {
    WorkerPool pool(secret().dialer());
    auto a = reg(pool, r1.address, "CPU:0", "auto", "node-a");
    auto b = reg(pool, r2.address, "CPU:0", "auto", "node-b");
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_EQ(a->name, "CPU:0");
    EXPECT_EQ(b->name, "CPU:1");
    uint64_t gen = (*pool.worker_for("CPU:0"))->generation();
    auto a2 = reg(pool, r1.address, "CPU:0", "auto", "node-a");
    ASSERT_TRUE(a2.ok()) << a2.status();
    EXPECT_EQ(a2->name, "CPU:0");
    EXPECT_EQ(a2->worker_id, a->worker_id);
    EXPECT_EQ((*pool.worker_for("CPU:0"))->generation(), gen);
    pool.shutdown();
  }
  // A restarted scheduler: whoever comes first, each worker gets its previous name back.
  WorkerPool pool(secret().dialer());
  auto b = reg(pool, r2.address, "CPU:0", "auto", "node-b", "CPU:1");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->name, "CPU:1");
  auto a = reg(pool, r1.address, "CPU:0", "auto", "node-a", "CPU:0");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->name, "CPU:0");
  const uint64_t gen = (*pool.worker_for("CPU:0"))->generation();
  // One instance given to two live workers: the second is refused, the first keeps it.
  auto twice = reg(pool, r3.address, "CPU:0", "auto", "node-a");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kAlreadyExists) << twice.status();
  EXPECT_EQ((*pool.worker_for("CPU:0"))->address(), r1.address);
  // The instance's worker replaced (a pod restarted on its node): the name follows the
  // instance to the new process, as a new generation.
  r1.kill_now();
  auto moved = reg(pool, r3.address, "CPU:0", "auto", "node-a");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->name, "CPU:0");
  EXPECT_EQ((*pool.worker_for("CPU:0"))->address(), r3.address);
  EXPECT_GT((*pool.worker_for("CPU:0"))->generation(), gen);
  // A new instance: the lowest free name.
  auto c = reg(pool, r4.address, "CPU:0", "auto", "node-c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "CPU:2");

  // Explicit names work as before, and a live worker keeps its name from another one.
  Proc r5;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device=cpu:7", "--threads=1"}, &r5));
  auto e = reg(pool, r5.address, "CPU:7", "");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->name, "CPU:7");
  auto taken = reg(pool, r4.address, "CPU:0", "CPU:1");
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists) << taken.status();
  EXPECT_EQ((*pool.worker_for("CPU:1"))->address(), r2.address);
  EXPECT_EQ(reg(pool, r4.address, "CPU:0", "CUDA:1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg(pool, r4.address, "CPU:3", "auto").status().code(), absl::StatusCode::kInvalidArgument);
  // A name other than the worker's device: served under that name, by that worker.
  Proc r6;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device=cpu:7", "--threads=1"}, &r6));
  auto other = reg(pool, r6.address, "CPU:7", "CPU:9");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->name, "CPU:9");
  auto w9 = pool.worker_for("CPU:9");
  ASSERT_TRUE(w9.ok()) << w9.status();
  EXPECT_EQ(info_device(*w9), "CPU:7");
  pool.shutdown();
}

TEST(Registration, HealthCheckModeAnswersForTheWorker) {
  Proc p;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device=cpu:0", "--threads=1"}, &p));
  auto [rc, out] = run_worker_command("--health-check=" + p.address);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
  EXPECT_EQ(out.find("NOT_SERVING"), std::string::npos) << out;
  // The same address once nobody serves it.
  const std::string gone = p.address;
  p.kill_now();
  auto [rc2, out2] = run_worker_command("--health-check=" + gone);
  EXPECT_NE(rc2, 0) << out2;
  EXPECT_EQ(out2.find(": SERVING"), std::string::npos) << out2;
  auto [rc3, out3] = run_worker_command("--health-check=");
  EXPECT_EQ(rc3, 2) << out3;
  // The value may follow a space, as for every flag.
  Proc q;
  ASSERT_NO_FATAL_FAILURE(spawn_worker({"--device", "cpu:0", "--threads", "1"}, &q));
  auto [rc4, out4] = run_worker_command("--health-check " + q.address);
  EXPECT_EQ(rc4, 0) << out4;
  EXPECT_NE(out4.find("SERVING"), std::string::npos) << out4;
}

// Bad usage exits 2 before anything starts, naming the flag.
TEST(Registration, WorkerUsageErrorsNameTheFlag) {
  for (auto [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--bogus", "--bogus is not an option of 'uop-worker'"},
           {"--threads 5000", "--threads takes an integer from 0 to 4096, got '5000'"},
           {"--embedded=x", "--embedded takes an integer from 1 to 2147483647, got 'x'"},
           {"--seccomp=maybe", "--seccomp takes on or off, got 'maybe'"},
           {"--device gpu:0", "--device: 'gpu:0' is not a device"},
           {"--insecure=perhaps", "--insecure takes true or false, got 'perhaps'"}}) {
    auto [rc, out] = run_worker_command(args);
    EXPECT_EQ(rc, 2) << args << ": " << out;
    EXPECT_NE(out.find(says), std::string::npos) << args << ": " << out;
  }
}

}  // namespace
}  // namespace uop
