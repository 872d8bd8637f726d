// `Tune` end to end: a real uopd and its uop-worker. A graph tuned then run computes what
// the interpreter computes, compiled with its record's schedule; a second uopd on the same
// cache directory finds the record on disk and searches nothing; two uopd sharing a real
// Redis, asked to tune one kernel at once, search it once between them; one that dies
// mid-search holds the kernel only until its lease expires, then the other searches it;
// --search=beam
// searches a kernel after its first run, in the background; --search=off refuses Tune
// and never searches; bad Tune requests are refused naming what is wrong, and the server
// keeps serving.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"
#include "tests/e2e/metrics_scrape.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

using client::Client;
using client::EmbeddedServer;

struct Server {
  std::unique_ptr<EmbeddedServer> proc;
  std::unique_ptr<Client> client;
  static Server start(std::vector<std::string> args) {
    Server s;
    // First, so that a test's own args say otherwise (a later flag wins).
    args.insert(args.begin(), {"--workers=1", "--metrics-listen="});
    auto p = EmbeddedServer::start(UOPD_BINARY, args);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return s;
    s.proc = std::move(*p);
    client::ClientOptions o;
    o.address = s.proc->address();
    o.deadline = absl::Minutes(2);
    auto c = Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) s.client = std::move(*c);
    return s;
  }
};

std::string cache_dir(std::string_view name) {
  auto d = std::filesystem::temp_directory_path() / cat("uopd-tune-", name, "-", ::getpid());
  std::filesystem::remove_all(d);
  return d.string();
}

// A real Redis for servers to share and the flags each needs for it: --redis and one
// --cache-key-file (in cache_dir(name)). ok() once it answers.
struct SharedRedis {
  testing::RedisServer redis;
  std::string redis_flag, key_flag;
  explicit SharedRedis(std::string_view name) {
    if (!redis.start()) return;
    const std::string key_dir = cache_dir(name);
    std::filesystem::create_directories(key_dir);
    key_flag = "--cache-key-file=" + testing::write_cache_key_file(key_dir + "/cache.key");
    redis_flag = cat("--redis=127.0.0.1:", redis.port());
  }
  bool ok() const { return !redis_flag.empty(); }
};

// y = relu(x @ w) for x 16 x 48, w 48 x 32: one kernel.
struct Layer {
  Graph g;
  TensorBuilder tb{g};
  const UOp* x = tb.input(Scalar::Float32, {16, 48});
  const UOp* w = tb.input(Scalar::Float32, {48, 32});
  const UOp* root;
  Names names;
  Layer() {
    const UOp* m = tb.matmul(x, w);
    root = tb.sink({tb.alu(Op::MAX, {m, tb.full(Scalar::Float32, 0.0, {16, 32})})});
    names.emplace_back("x", tb.buffer_of(x));
    names.emplace_back("w", tb.buffer_of(w));
  }
};

// The layer run on `c`, against the interpreter; the ABI text of the kernel it ran.
std::string expect_run_matches_interpreter(Client& c, Layer& l) {
  auto session = c.create_session();
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return "";
  HostTensor x = HostTensor::random(Scalar::Float32, {16, 48}, 3), w = HostTensor::random(Scalar::Float32, {48, 32}, 4);
  auto r = session->run(l.root, l.names, {{"x", x}, {"w", w}});
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return "";
  auto want = interpret(l.g, l.root, {{l.tb.buffer_of(l.x), x}, {l.tb.buffer_of(l.w), w}});
  EXPECT_TRUE(want.ok()) << want.status();
  if (!want.ok()) return "";
  CompareResult cmp = compare((*want)[0], r->outputs[0].tensor, Tolerance{1e-4, 1e-4});
  EXPECT_TRUE(cmp.ok) << cmp.message;
  EXPECT_EQ(r->kernels.size(), 1u);
  if (r->kernels.empty()) return "";
  // A Run's answer lists no ABI: the artifact it ran is the one of its cache key, which
  // Compile answers with its ABI.
  auto compiled = c.compile(l.root, l.names);
  EXPECT_TRUE(compiled.ok()) << compiled.status();
  if (!compiled.ok()) return "";
  for (const client::Kernel& k : compiled->kernels)
    if (k.cache_key == r->kernels[0].cache_key) return k.abi;
  ADD_FAILURE() << "Compile answers no kernel of the run's cache key " << r->kernels[0].cache_key;
  return "";
}

TEST(TuneE2e, ATunedGraphRunsLikeTheInterpreterWithItsRecordsSchedule) {
  const std::string dir = cache_dir("record");
  Layer l;
  {
    Server s = Server::start({"--cache-dir=" + dir, "--search-budget-s=20"});
    ASSERT_TRUE(s.client);
    auto t = s.client->tune(l.root, l.names, "", 2);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->skipped.empty()) << t->skipped;
    EXPECT_FALSE(t->from_record);
    EXPECT_GT(t->candidates_timed, 0u);
    EXPECT_EQ(t->dropped_mismatch, 0u);
    EXPECT_LE(t->after_ms, t->before_ms);
    const std::string abi = expect_run_matches_interpreter(*s.client, l);
    const std::string& want = t->schedule.empty() ? t->heuristic_schedule : t->schedule;
    EXPECT_NE(abi.find(cat("schedule ", want.size(), ":", want, "\n")), std::string::npos)
        << "the run's kernel is compiled with the record's schedule " << want << ":\n" << abi;
    auto st = s.client->stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->search, "heuristic");
    EXPECT_EQ(st->searches, 1u);
    EXPECT_EQ(st->candidates_timed, t->candidates_timed);
    EXPECT_EQ(st->tuning_records_written, 1u);
  }
  // Another uopd on the directory: the record from disk, nothing searched.
  Server again = Server::start({"--cache-dir=" + dir});
  ASSERT_TRUE(again.client);
  auto t = again.client->tune(l.root, l.names, "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->from_record);
  auto st = again.client->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->searches, 0u);
  EXPECT_EQ(st->tuning_records_disk, 1u);
  expect_run_matches_interpreter(*again.client, l);
}

TEST(TuneE2e, TwoServersSharingARedisSearchAKernelOnce) {
  if (!testing::RedisServer::installed()) GTEST_SKIP() << "redis-server is not installed";
  SharedRedis shared("redis-key");
  ASSERT_TRUE(shared.ok());
  const std::string &flag = shared.redis_flag, &key = shared.key_flag;
  Server a = Server::start({"--cache-dir=" + cache_dir("redis-a"), flag, key, "--search-budget-s=20"});
  Server b = Server::start({"--cache-dir=" + cache_dir("redis-b"), flag, key, "--search-budget-s=20"});
  ASSERT_TRUE(a.client && b.client);
  Layer l;
  // Both at once: whichever takes the lease searches; the other finds the lease taken
  // (and keeps the heuristic's kernel) or, if it comes later, the record.
  auto on_b = std::async(std::launch::async, [&] { return b.client->tune(l.root, l.names, ""); });
  auto ta = a.client->tune(l.root, l.names, "");
  auto tb = on_b.get();
  ASSERT_TRUE(ta.ok()) << ta.status();
  ASSERT_TRUE(tb.ok()) << tb.status();
  auto sa = a.client->stats();
  auto sb = b.client->stats();
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(sa->searches + sb->searches, 1u) << "one search between the two";
  EXPECT_EQ(sa->tuning_records_written + sb->tuning_records_written, 1u);
  // Afterwards both find the record: the searcher in memory, the other in Redis at the latest.
  Server& other = sa->searches == 1 ? b : a;
  auto later = other.client->tune(l.root, l.names, "");
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_TRUE(later->from_record);
  expect_run_matches_interpreter(*other.client, l);
}

// A searches a kernel and cannot finish (its worker stopped: the heuristic kernel's first
// timing waits); its lease, a second long, lives on while A does (renewed), and B's search
// of the kernel is left to A. A is killed: its lease expires a second later, and B's
// search then takes the kernel over and publishes its record.
TEST(TuneE2e, WhenTheSearchingServerDiesAnotherSearchesTheKernelAfterItsLease) {
  if (!testing::RedisServer::installed()) GTEST_SKIP() << "redis-server is not installed";
  SharedRedis shared("lease-key");
  ASSERT_TRUE(shared.ok());
  const std::string &flag = shared.redis_flag, &key = shared.key_flag;
  testing::RedisServer& redis = shared.redis;
  Server a = Server::start(
      {"--cache-dir=" + cache_dir("lease-a"), flag, key, "--search-budget-s=600", "--search-lease-s=1"});
  Server b = Server::start({"--cache-dir=" + cache_dir("lease-b"), flag, key, "--search-budget-s=20",
                            "--search-lease-s=1", "--metrics-listen=127.0.0.1:0"});
  ASSERT_TRUE(a.client && b.client);
  const std::string b_metrics = testing::metrics_address(*b.proc);
  auto leases = [&](std::string_view outcome) {
    return testing::metric(b_metrics, cat("uopd_schedule_search_leases_total{outcome=\"", outcome, "\"}"));
  };
  EXPECT_EQ(leases("held_elsewhere"), 0);
  EXPECT_EQ(leases("lost"), 0);
  auto sa = a.client->stats();
  ASSERT_TRUE(sa.ok()) << sa.status();
  ASSERT_EQ(sa->workers.size(), 1u);
  const pid_t a_worker = static_cast<pid_t>(sa->workers[0].pid);
  ASSERT_GT(a_worker, 0);
  ASSERT_EQ(::kill(a_worker, SIGSTOP), 0);
  Layer l;
  auto on_a = std::async(std::launch::async, [&] { return a.client->tune(l.root, l.names, ""); });
  std::string lease;
  ASSERT_TRUE(testing::wait_until([&] {
    lease = redis.raw({"KEYS", "uopd:tune-lease:v1:*"});
    return !lease.empty();
  })) << "A took the kernel's lease";
  const std::string token = redis.raw({"GET", lease});
  // Its time to live is the lease's, not the budget's; and it is renewed while A lives: a
  // time to live that grew again four times (a renewal every third of it) outlived one lease.
  int64_t ttl = std::stoll(redis.raw({"PTTL", lease}));
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 1000);
  int renewals = 0;
  ASSERT_TRUE(testing::wait_until([&] {
    const int64_t now = std::stoll(redis.raw({"PTTL", lease}));
    renewals += now > ttl;
    ttl = now;
    return renewals >= 4;
  })) << "A's lease was not renewed";
  EXPECT_EQ(redis.raw({"GET", lease}), token) << "still A's";

  auto held = b.client->tune(l.root, l.names, "");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_NE(held->skipped.find("another server"), std::string::npos) << held->skipped;
  auto sb = b.client->stats();
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->searches, 0u);
  EXPECT_EQ(sb->leases_held_elsewhere, 1u);
  EXPECT_EQ(leases("held_elsewhere"), 1);

  ASSERT_EQ(::kill(a.proc->pid(), SIGKILL), 0);
  ::kill(a_worker, SIGKILL);
  EXPECT_FALSE(on_a.get().ok()) << "A died mid-search";
  ASSERT_TRUE(testing::wait_until([&] { return redis.raw({"EXISTS", lease}) == "0"; }))
      << "the dead server's lease expired";
  auto took = b.client->tune(l.root, l.names, "");
  ASSERT_TRUE(took.ok()) << took.status();
  EXPECT_TRUE(took->skipped.empty()) << took->skipped;
  EXPECT_FALSE(took->from_record);
  EXPECT_GT(took->candidates_timed, 0u);
  sb = b.client->stats();
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->searches, 1u);
  EXPECT_EQ(sb->tuning_records_written, 1u);
  EXPECT_EQ(sb->leases_held_elsewhere, 1u);
  EXPECT_EQ(sb->leases_lost, 0u);
  EXPECT_EQ(leases("lost"), 0);
  EXPECT_EQ(redis.raw({"EXISTS", lease}), "0") << "B removed its lease when it published the record";
  // The record is in Redis: a fresh server finds it there.
  Server c = Server::start({"--cache-dir=" + cache_dir("lease-c"), flag, key});
  ASSERT_TRUE(c.client);
  auto found = c.client->tune(l.root, l.names, "");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(found->from_record);
  EXPECT_EQ(found->schedule, took->schedule);
  expect_run_matches_interpreter(*c.client, l);
}

TEST(TuneE2e, BeamSearchesAKernelAfterItsFirstRunInTheBackground) {
  Server s = Server::start({"--cache-dir=", "--search=beam:2", "--search-budget-s=10"});
  ASSERT_TRUE(s.client);
  Layer l;
  expect_run_matches_interpreter(*s.client, l);
  // The search runs after the Run has answered. A Tune of the kernel waits for that search
  // (one per kernel at a time) and then finds its record: nothing is searched twice.
  auto t = s.client->tune(l.root, l.names, "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->from_record) << "the background search wrote its record";
  auto st = s.client->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->search, "beam:2");
  EXPECT_EQ(st->searches, 1u);
  EXPECT_EQ(st->tuning_records_written, 1u);
  EXPECT_GT(st->candidates_timed, 0u);
  // The record's schedule is what the next run compiles with, and it still matches.
  const std::string abi = expect_run_matches_interpreter(*s.client, l);
  if (!t->schedule.empty()) {
    EXPECT_NE(abi.find(cat(t->schedule.size(), ":", t->schedule)), std::string::npos) << abi;
  }
}

TEST(TuneE2e, SearchOffRefusesTuneAndSearchesNothing) {
  Server s = Server::start({"--cache-dir=", "--search=off"});
  ASSERT_TRUE(s.client);
  Layer l;
  auto t = s.client->tune(l.root, l.names, "");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  expect_run_matches_interpreter(*s.client, l);
  auto st = s.client->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->search, "off");
  EXPECT_EQ(st->searches + st->candidates_timed + st->tuning_record_misses, 0u);
  // A --search uopd does not know stops it at start.
  auto bad = EmbeddedServer::start(UOPD_BINARY, {"--workers=1", "--metrics-listen=", "--search=beam:0"});
  EXPECT_FALSE(bad.ok());
}

TEST(TuneE2e, BadTuneRequestsAreRefusedNamingWhatIsWrong) {
  Server s = Server::start({"--cache-dir="});
  ASSERT_TRUE(s.client);
  Layer l;
  auto wide = s.client->tune(l.root, l.names, "", 65);
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(wide.status().message()).find("width"), std::string::npos) << wide.status();
  auto none = s.client->tune(l.root, l.names, "0123456789abcdef");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(none.status().message()).find("no kernel"), std::string::npos) << none.status();
  auto st = s.client->stats();
  ASSERT_TRUE(st.ok()) << "still serving";
  EXPECT_EQ(st->searches, 0u);
}

}  // namespace
}  // namespace uop
