// A bounded soak of uopd with faults injected while it runs. Several clients send a fixed
// number of mixed requests (Compile, Run with inline inputs, upload + Run on buffers +
// download) over loopback to a real uopd with two workers, a disk cache and a real Redis
// tier. Meanwhile, as the requests progress: Redis is stopped and started again, a worker
// is killed (three times), the disk cache directory is made unwritable and given back, and
// the scheduler itself is restarted on the same port while the clients retry.
//
// What must hold: every failure a client sees is a clear status (UNAVAILABLE, NOT_FOUND of
// a session lost with the scheduler, DEADLINE_EXCEEDED), with a message; every operation
// succeeds after bounded retries; every result equals the reference interpreter's (nothing
// lost or corrupted); the server's memory stays bounded (VmRSS / VmHWM from /proc); the
// cache's counters add up; service comes back with no help. The figures (requests, errors,
// peak memory, p50 / p99 latency, each fault and its recovery time) are printed. No
// assertion depends on wall-clock time; waits are bounded.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"
#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;
using Clock = std::chrono::steady_clock;

constexpr int kClients = 6;
constexpr int kOpsPerClient = 50;
constexpr int kVariants = 10;
constexpr int kMaxAttempts = 60;  // per operation; backoff 20 ms .. 400 ms

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// VmRSS and VmHWM of a process, in KiB (0 when it is gone).
std::pair<uint64_t, uint64_t> memory_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  uint64_t rss = 0, hwm = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoull(line.substr(6));
    if (line.rfind("VmHWM:", 0) == 0) hwm = std::stoull(line.substr(6));
  }
  return {rss, hwm};
}

// One graph variant (its shapes, hence its kernels, differ from the others'), its inputs
// and the interpreter's outputs.
struct Variant {
  Graph g;
  const UOp* root = nullptr;
  Names names;
  std::vector<std::pair<std::string, HostTensor>> inputs;
  std::vector<HostTensor> expected;

  explicit Variant(int v) {
    const int64_t n = 8 + 4 * v, k = 8 + 2 * v;
    TensorBuilder tb(g);
    const UOp* x = tb.input(Scalar::Float32, {n, k});
    const UOp* w = tb.input(Scalar::Float32, {k, 8});
    const UOp* b = tb.input(Scalar::Float32, {8});
    const UOp* h = tb.alu(Op::ADD, {tb.matmul(x, w), b});
    const UOp* out = tb.alu(Op::FDIV, {h, tb.reduce(h, ReduceOp::Max, {1})});
    root = tb.sink({out});
    names = {{"x", tb.buffer_of(x)}, {"w", tb.buffer_of(w)}, {"b", tb.buffer_of(b)}, {"out", out}};
    absl::flat_hash_map<const UOp*, HostTensor> by_node;
    uint64_t seed = 100 * v + 1;
    for (auto& [name, node] : names) {
      if (node->op() != Op::BUFFER) continue;
      HostTensor t = HostTensor::random(Scalar::Float32, {node->arg_as<BufferArg>().size}, seed++);
      by_node[node] = t;
      inputs.push_back({name, t});
    }
    auto want = interpret(g, root, by_node);
    if (want.ok()) expected = *want;
  }
};

// What the clients saw, for the figures and the checks.
struct Record {
  std::mutex mu;
  std::map<absl::StatusCode, uint64_t> errors;   // failed attempts by code
  std::vector<std::string> unclear;              // failures that are not a clear status
  std::vector<double> latency_ms;                // successful attempts
  absl::flat_hash_set<std::string> kernel_keys;  // every cache key seen
  uint64_t attempts = 0, ops_failed = 0, wrong_results = 0;
  std::vector<Clock::time_point> successes;      // when each successful attempt ended

  void error(const absl::Status& s) {
    std::lock_guard<std::mutex> l(mu);
    ++errors[s.code()];
    bool clear = !s.message().empty() && (s.code() == absl::StatusCode::kUnavailable ||
                                          s.code() == absl::StatusCode::kNotFound ||
                                          s.code() == absl::StatusCode::kDeadlineExceeded);
    if (!clear && unclear.size() < 20) unclear.push_back(std::string(absl::StatusCodeToString(s.code())) + ": " + std::string(s.message()));
  }
  void success(Clock::time_point start, const std::vector<client::Kernel>& kernels) {
    Clock::time_point end = Clock::now();
    std::lock_guard<std::mutex> l(mu);
    latency_ms.push_back(ms(end - start));
    successes.push_back(end);
    for (auto& k : kernels) kernel_keys.insert(k.cache_key);
  }
  // The first success that ended after `t`, as a time since `t`; -1 when none.
  double recovery_ms(Clock::time_point t) {
    std::lock_guard<std::mutex> l(mu);
    double best = -1;
    for (auto s : successes)
      if (s > t && (best < 0 || ms(s - t) < best)) best = ms(s - t);
    return best;
  }
};

bool same(const std::vector<HostTensor>& want, const std::vector<HostTensor>& got) {
  if (want.size() != got.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (!compare(want[i], got[i]).ok) return false;
  return true;
}

// One client: its connection, its session (opened again when the scheduler lost it).
class SoakClient {
 public:
  SoakClient(int id, const std::string& address, std::vector<std::unique_ptr<Variant>>* variants, Record* rec,
         std::atomic<int>* done, std::atomic<bool>* abandon)
      : id_(id), variants_(variants), rec_(rec), done_(done), abandon_(abandon) {
    ClientOptions o;
    o.address = address;
    o.deadline = absl::Seconds(30);
    o.connect_timeout = absl::Seconds(20);
    auto c = Client::connect(o);
    if (c.ok()) client_ = std::move(*c);
  }

  void run() {
    for (int i = 0; i < kOpsPerClient; ++i) {
      // New variants (new kernels) come in as the run goes on, so that compiles and cache
      // lookups below the memory tier happen during every fault, not just at the start.
      int newest = std::min(kVariants - 1, i * kVariants / kOpsPerClient);
      Variant& v = *(*variants_)[std::max(0, newest - (id_ + i) % 3)];
      int kind = (id_ + i) % 3;
      bool ok = false;
      auto backoff = std::chrono::milliseconds(20);
      for (int attempt = 0; attempt < kMaxAttempts && !ok && !abandon_->load(); ++attempt) {
        {
          std::lock_guard<std::mutex> l(rec_->mu);
          ++rec_->attempts;
        }
        absl::Status s = once(v, kind);
        if (s.ok()) {
          ok = true;
          break;
        }
        rec_->error(s);
        // The scheduler restarted: its sessions are gone; open a new one.
        if (s.code() == absl::StatusCode::kNotFound) session_.reset();
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(400));
      }
      if (!ok) {
        std::lock_guard<std::mutex> l(rec_->mu);
        ++rec_->ops_failed;
      }
      ++*done_;
    }
    session_.reset();
  }

 private:
  absl::Status ensure_session() {
    if (session_) return absl::OkStatus();
    auto s = client_->create_session();
    if (!s.ok()) return s.status();
    session_ = std::make_unique<client::Session>(std::move(*s));
    return absl::OkStatus();
  }

  absl::Status check(const Variant& v, std::vector<HostTensor> got) {
    if (same(v.expected, got)) return absl::OkStatus();
    std::lock_guard<std::mutex> l(rec_->mu);
    ++rec_->wrong_results;
    return absl::OkStatus();  // counted; not retried (the test fails on it)
  }

  absl::Status once(const Variant& v, int kind) {
    if (!client_) return absl::UnavailableError("no client");
    auto start = Clock::now();
    if (kind == 0) {
      auto r = client_->compile(v.root, v.names);
      if (!r.ok()) return r.status();
      rec_->success(start, r->kernels);
      return absl::OkStatus();
    }
    if (absl::Status s = ensure_session(); !s.ok()) return s;
    std::vector<client::Input> bindings;
    std::vector<std::string> buffers;
    if (kind == 1) {
      for (auto& [name, t] : v.inputs) bindings.push_back({name, t});
    } else {
      for (auto& [name, t] : v.inputs) {
        auto id = session_->upload_tensor(t);
        if (!id.ok()) return id.status();
        buffers.push_back(*id);
        bindings.push_back({name, *id});
      }
    }
    auto r = session_->run(v.root, v.names, bindings, /*keep_outputs=*/kind == 2);
    if (!r.ok()) return r.status();
    std::vector<HostTensor> got;
    for (auto& o : r->outputs) {
      if (!o.kept()) {
        got.push_back(o.tensor);
        continue;
      }
      auto t = session_->download_tensor(o);
      if (!t.ok()) return t.status();
      got.push_back(*t);
      buffers.push_back(o.buffer_id);
    }
    for (auto& b : buffers) (void)session_->free_buffer(b);  // a lost one is already gone
    rec_->success(start, r->kernels);
    return check(v, std::move(got));
  }

  int id_;
  std::vector<std::unique_ptr<Variant>>* variants_;
  Record* rec_;
  std::atomic<int>* done_;
  std::atomic<bool>* abandon_;  // set when the test gives up: stop retrying
  std::unique_ptr<Client> client_;
  std::unique_ptr<client::Session> session_;
};

// Write permission on a directory tree's directories, taken away or given back.
void set_writable(const std::string& dir, bool writable) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto w = fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write;
  auto how = writable ? fs::perm_options::add : fs::perm_options::remove;
  fs::permissions(dir, writable ? fs::perms::owner_write : w, how, ec);
  for (auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_directory(ec)) fs::permissions(e.path(), writable ? fs::perms::owner_write : w, how, ec);
}

struct Fault {
  std::string what;
  Clock::time_point at;
  double recovery_ms = -1;
};

TEST(Soak, MixedLoadWithFaultsLosesNothing) {
  if (!testing::RedisServer::installed()) GTEST_SKIP() << "redis-server is not installed";
  testing::ScratchDir scratch;
  const std::string cache_dir = scratch.path() + "/cache";
  testing::RedisServer redis;
  ASSERT_TRUE(redis.start());
  const int redis_port = redis.port();
  const int port = testing::free_port();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> args = {"--listen=" + address, "--cache-dir=" + cache_dir, "--workers=2",
                                         "--redis=127.0.0.1:" + std::to_string(redis_port), "--redis-timeout-ms=200",
                                         "--cache-key-file=" + testing::write_cache_key_file(scratch.path() + "/cache.key"),
                                         "--compile-threads=2", "--worker-threads=1"};
  // Started from this thread, which outlives it (the server dies with the thread that
  // started it).
  auto started = EmbeddedServer::start(UOPD_BINARY, args);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<EmbeddedServer> server = std::move(*started);

  std::vector<std::unique_ptr<Variant>> variants;
  for (int v = 0; v < kVariants; ++v) {
    variants.push_back(std::make_unique<Variant>(v));
    ASSERT_FALSE(variants.back()->expected.empty());
  }
  ClientOptions admin_opts;
  admin_opts.address = address;
  admin_opts.deadline = absl::Seconds(20);
  auto admin = Client::connect(admin_opts);
  ASSERT_TRUE(admin.ok()) << admin.status();
  auto stats = [&]() -> absl::StatusOr<client::Stats> {
    for (int i = 0; i < 100; ++i) {  // bounded: the scheduler may be restarting
      auto s = (*admin)->stats();
      if (s.ok()) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return (*admin)->stats();
  };

  Record rec;
  std::atomic<int> done{0};
  std::atomic<bool> abandon{false};
  std::vector<std::unique_ptr<SoakClient>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(std::make_unique<SoakClient>(i, address, &variants, &rec, &done, &abandon));
  Clock::time_point t0 = Clock::now();
  std::vector<std::thread> threads;
  for (auto& c : clients) threads.emplace_back([&c] { c->run(); });

  // The faults, at fixed points of progress, and memory sampled all along.
  const int total = kClients * kOpsPerClient;
  std::vector<Fault> faults;
  uint64_t peak_hwm_kib = 0, rss_early_kib = 0, rss_late_kib = 0;
  uint64_t first_compiles = 0;
  bool first_compiles_checked = false;
  auto sample_memory = [&] {
    auto [rss, hwm] = memory_kib(server->pid());
    peak_hwm_kib = std::max(peak_hwm_kib, hwm);
    return rss;
  };
  auto fault = [&](const std::string& what) {
    faults.push_back({what, Clock::now()});
    std::fprintf(stderr, "soak: %5.0f ms, %d/%d ops: %s\n", ms(Clock::now() - t0), done.load(), total, what.c_str());
  };
  auto wait_for = [&](int percent) {
    while (done.load() * 100 < total * percent && done.load() < total) {
      sample_memory();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done.load() < total;
  };
  auto kill_worker = [&](int n) {
    auto s = stats();
    if (!s.ok() || s->workers.empty()) return;
    const auto& w = s->workers[n % s->workers.size()];
    if (w.pid > 0) ::kill(static_cast<pid_t>(w.pid), SIGKILL);
    fault("worker " + w.device + " (pid " + std::to_string(w.pid) + ") killed");
  };
  const std::string moved = cache_dir + ".moved";
  bool disk_swapped = false;

  if (wait_for(8)) rss_early_kib = sample_memory();
  if (wait_for(10)) { redis.stop(); fault("redis stopped"); }
  if (wait_for(20)) { EXPECT_TRUE(redis.start(redis_port)); fault("redis started again"); }
  if (wait_for(28)) kill_worker(0);
  if (wait_for(36)) kill_worker(1);
  if (wait_for(44)) kill_worker(0);
  if (wait_for(52)) {
    // Read-only for everyone but root; for root (who writes anyway) the directory is
    // swapped for a plain file, which nobody can write entries into.
    std::error_code ec;
    set_writable(cache_dir, false);
    if (::geteuid() == 0) {
      std::filesystem::rename(cache_dir, moved, ec);
      std::ofstream(cache_dir) << "not a directory\n";
      disk_swapped = true;
    }
    fault(disk_swapped ? "disk cache directory made unwritable (swapped for a file: running as root)"
                       : "disk cache directory made read-only");
  }
  if (wait_for(64)) {
    std::error_code ec;
    if (disk_swapped) {
      std::filesystem::remove(cache_dir, ec);
      std::filesystem::rename(moved, cache_dir, ec);
    }
    set_writable(cache_dir, true);
    fault("disk cache directory writable again");
  }
  if (wait_for(72)) {
    rss_late_kib = sample_memory();
    auto s = stats();
    if (s.ok()) {
      first_compiles = s->compiles;
      first_compiles_checked = true;
      EXPECT_GT(s->cache_errors, 0u) << "Redis down and the disk unwritable are visible as cache errors";
    }
    // The scheduler restarts on the same port while the clients keep retrying.
    fault("scheduler stopped (SIGTERM, drain)");
    EXPECT_TRUE(server->stop().ok()) << server->log_tail();
    std::unique_ptr<EmbeddedServer> again;
    for (int i = 0; i < 20 && !again; ++i) {  // the port may take a moment to be free
      auto s2 = EmbeddedServer::start(UOPD_BINARY, args);
      if (s2.ok()) again = std::move(*s2);
      else std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (again) {
      server = std::move(again);
      fault("scheduler started again");
    } else {
      ADD_FAILURE() << "the scheduler did not come back on " << address;
      abandon = true;
    }
  }
  for (auto& t : threads) t.join();
  ASSERT_FALSE(abandon.load());
  Clock::time_point t_end = Clock::now();
  sample_memory();

  // The cache's counters add up, over a quiet phase on the final server: each kernel a
  // client is told about is one lookup, counted once by the server as a hit in a tier, a
  // compile or a coalesced wait; and a second pass compiles nothing.
  auto before = stats();
  ASSERT_TRUE(before.ok()) << before.status();
  uint64_t told = 0;
  std::map<std::string, uint64_t> told_hits;
  uint64_t told_miss = 0, told_coalesced = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (auto& v : variants) {
      auto r = (*admin)->compile(v->root, v->names);
      ASSERT_TRUE(r.ok()) << r.status();
      for (auto& k : r->kernels) {
        ++told;
        if (k.status == client::CacheStatus::Hit) ++told_hits[k.tier];
        if (k.status == client::CacheStatus::Miss) ++told_miss;
        if (k.status == client::CacheStatus::Coalesced) ++told_coalesced;
        if (pass == 1) {
          EXPECT_EQ(k.status, client::CacheStatus::Hit) << "the second pass compiles nothing";
        }
        rec.kernel_keys.insert(k.cache_key);
      }
    }
  auto after = stats();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->cache_hits_memory - before->cache_hits_memory, told_hits["memory"]);
  EXPECT_EQ(after->cache_hits_disk - before->cache_hits_disk, told_hits["disk"]);
  EXPECT_EQ(after->cache_hits_redis - before->cache_hits_redis, told_hits["redis"]);
  EXPECT_EQ(after->compiles - before->compiles, told_miss);
  EXPECT_EQ(after->cache_coalesced - before->cache_coalesced, told_coalesced);
  EXPECT_EQ(told_hits["memory"] + told_hits["disk"] + told_hits["redis"] + told_miss + told_coalesced, told);
  // Singleflight and the tiers: no server compiled a kernel twice.
  EXPECT_LE(after->compiles, rec.kernel_keys.size());
  if (first_compiles_checked) {
    EXPECT_LE(first_compiles, rec.kernel_keys.size());
  }
  // Every worker is up again, and no session or buffer was left behind by the clients.
  for (auto& w : after->workers) EXPECT_EQ(w.state, "up") << w.device << ": " << w.last_error;
  EXPECT_EQ(after->buffers, 0u);

  // Figures.
  for (auto& f : faults) f.recovery_ms = rec.recovery_ms(f.at);
  std::vector<double> lat = rec.latency_ms;
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) { return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, static_cast<size_t>(p * lat.size()))]; };
  uint64_t errors = 0;
  for (auto& [code, n] : rec.errors) errors += n;
  std::fprintf(stderr, "\nsoak figures: %d clients, %d operations, %llu requests (attempts), %llu errors, %llu operations failed\n",
               kClients, total, static_cast<unsigned long long>(rec.attempts), static_cast<unsigned long long>(errors),
               static_cast<unsigned long long>(rec.ops_failed));
  for (auto& [code, n] : rec.errors)
    std::fprintf(stderr, "  errors %-18s %llu\n", absl::StatusCodeToString(code).c_str(), static_cast<unsigned long long>(n));
  std::fprintf(stderr, "  latency of successful requests: p50 %.1f ms, p99 %.1f ms (n=%zu)\n", pct(0.50), pct(0.99), lat.size());
  std::fprintf(stderr, "  server memory: peak VmHWM %.1f MiB; VmRSS %.1f MiB early, %.1f MiB before the restart\n",
               peak_hwm_kib / 1024.0, rss_early_kib / 1024.0, rss_late_kib / 1024.0);
  std::fprintf(stderr, "  distinct kernels %zu; compiles: first server %llu, second %llu; wall %.1f s\n", rec.kernel_keys.size(),
               static_cast<unsigned long long>(first_compiles), static_cast<unsigned long long>(after->compiles),
               ms(t_end - t0) / 1000);
  for (auto& f : faults) std::fprintf(stderr, "  fault: %-75s recovered in %.0f ms\n", f.what.c_str(), f.recovery_ms);

  // What must hold.
  EXPECT_EQ(rec.ops_failed, 0u) << "every operation succeeds within its retries";
  EXPECT_EQ(rec.wrong_results, 0u) << "no result differs from the interpreter's";
  EXPECT_TRUE(rec.unclear.empty()) << "failures that are not a clear status: " << rec.unclear.size() << ", first: "
                                   << (rec.unclear.empty() ? "" : rec.unclear[0]);
  EXPECT_EQ(faults.size(), 9u) << "every fault was injected";
  for (auto& f : faults) EXPECT_GE(f.recovery_ms, 0) << "no success after: " << f.what;
  EXPECT_LT(peak_hwm_kib, uint64_t{1} << 20) << "uopd stays under 1 GiB";
  if (rss_early_kib > 0 && rss_late_kib > 0) {
    EXPECT_LT(rss_late_kib, rss_early_kib + (256u << 10)) << "no steady growth";
  }
  (void)server->stop();
}

}  // namespace
}  // namespace uop
