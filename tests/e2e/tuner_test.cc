// Schedule search (server/tuner.h) with the scheduler's own parts in this process and a
// real uop-worker: a searched kernel, compiled as its record says and run on the worker,
// computes what the interpreter computes; a candidate rigged to compute something else
// (the test hook) is dropped as a mismatch and never wins; one whose object the worker
// refuses, or under which the worker dies, is dropped as a crash (the worker replaced)
// and the search goes on; records that are truncated,
// corrupt, foreign or of another build are misses, in the record codec and in the tiers;
// --search=off never searches nor uses a record; servers sharing a real Redis search a
// kernel once (the lease), the other picks the record up; a search whose lease another
// server took over stops without a record.
#include "server/tuner.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"
#include "server/cache/disk_tier.h"
#include "server/cache/memory_tier.h"
#include "server/cache/redis_tier.h"
#include "tests/e2e/worker_proc.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop::server {
namespace {

std::shared_ptr<const DecodedGraph> wire(const UOp* root) {
  auto d = decode_binary(encode_binary(root));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::make_shared<const DecodedGraph>(std::move(*d)) : nullptr;
}

// A @ B (+ 1 with `plus_one`) for A 24 x 40, B 40 x 36: one kernel, a tiled reduction.
struct Matmul {
  Graph g;
  TensorBuilder tb{g};
  const UOp* a = tb.input(Scalar::Float32, {24, 40});
  const UOp* b = tb.input(Scalar::Float32, {40, 36});
  const UOp* root;
  explicit Matmul(bool plus_one = false) {
    const UOp* c = tb.matmul(a, b);
    if (plus_one) c = tb.alu(Op::ADD, {c, tb.full(Scalar::Float32, 1.0, {24, 36})});
    root = tb.sink({c});
  }
};

ClusterKey test_key() { return *ClusterKey::from_bytes(std::string(32, 'k')); }

// One scheduler's parts: a compile cache of memory, disk and (optionally) Redis tiers,
// the planner, one embedded worker, the executor, the tuner.
struct Server {
  std::string dir;
  std::unique_ptr<CompileCache> cache;
  std::unique_ptr<Planner> planner;
  WorkerPool pool;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Tuner> tuner;

  explicit Server(SearchOptions o, int redis_port = 0) {
    dir = (std::filesystem::path(::testing::TempDir()) /
           cat("tuner-", ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-", redis_port, "-",
               reinterpret_cast<uintptr_t>(this)))
              .string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::vector<std::unique_ptr<CacheTier>> tiers;
    tiers.push_back(std::make_unique<MemoryTier>(int64_t{64} << 20));
    tiers.push_back(std::make_unique<DiskTier>(dir, int64_t{256} << 20, test_key()));
    if (redis_port) {
      RedisEndpoint ep;
      ep.host = "127.0.0.1";
      ep.port = redis_port;
      auto t = RedisTier::create(ep, test_key(), RedisTier::Options{});
      EXPECT_TRUE(t.ok()) << t.status();
      if (t.ok()) tiers.push_back(std::move(*t));
    }
    cache = std::make_unique<CompileCache>(std::move(tiers));
    planner = std::make_unique<Planner>(PlannerOptions{}, cache.get(), CpuTarget::host());
    WorkerOptions wo;
    wo.worker_binary = UOP_WORKER_BINARY;
    wo.embedded_cpu_workers = 1;
    wo.threads_per_worker = 2;
    absl::Status s = pool.start_embedded(wo);
    EXPECT_TRUE(s.ok()) << s;
    executor = std::make_unique<Executor>(&pool);
    tuner = std::make_unique<Tuner>(std::move(o), planner.get(), executor.get(), cache.get());
    planner->set_schedule_source([t = tuner.get()](const PlannedKernel& k, const Backend& b, std::string_view ns) {
      return t->recorded_schedule(k, b, ns);
    });
  }
  ~Server() {
    tuner.reset();
    pool.shutdown();
  }

  std::shared_ptr<const Plan> plan(const UOp* root) {
    bool cached = false;
    auto p = planner->plan(wire(root), &cached);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
  absl::StatusOr<TuneResult> tune(const Plan& p, absl::Duration budget = absl::Seconds(20)) {
    Requester who;
    who.deadline = absl::Now() + absl::Minutes(2);
    return tuner->tune(p, 0, "CPU:0", "", "", who, 2, budget);
  }
};

SearchOptions beam() {
  SearchOptions o;
  o.mode = SearchMode::Heuristic;  // tune() searches; nothing in the background
  o.width = 2;
  return o;
}

// The plan compiled (the planner asks the tuner for records) and run on the worker with
// random inputs, against the interpreter on the same inputs.
void expect_runs_like_the_interpreter(Server& s, Matmul& m, const Plan& p, std::string_view want_schedule) {
  auto kernels = s.planner->compile(p, s.planner->host());
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  ASSERT_EQ(kernels->size(), 1u);
  EXPECT_EQ((*kernels)[0].abi.schedule, want_schedule.empty() ? (*kernels)[0].abi.schedule : std::string(want_schedule))
      << "the compile uses the record's schedule";
  HostTensor a = HostTensor::random(Scalar::Float32, {24, 40}, 1), b = HostTensor::random(Scalar::Float32, {40, 36}, 2);
  absl::flat_hash_map<int, BoundInput> in;
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    if (p.buffers[i].role != PlannedBuffer::Role::Input) continue;
    in[static_cast<int>(i)] = BoundInput{nullptr, p.buffers[i].node == m.tb.buffer_of(m.a)->digest() ? &a : &b};
  }
  auto ran = s.executor->run("CPU:0", "", p, *kernels, in, {false}, absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(ran.ok()) << ran.status();
  auto want = interpret(m.g, m.root, {{m.tb.buffer_of(m.a), a}, {m.tb.buffer_of(m.b), b}});
  ASSERT_TRUE(want.ok()) << want.status();
  HostTensor got = ran->outputs[0];
  got.shape = (*want)[0].shape;
  CompareResult c = compare((*want)[0], got, Tolerance{1e-4, 1e-4});
  EXPECT_TRUE(c.ok) << c.message;
}

TEST(Tuner, ASearchedKernelMatchesTheInterpreterAndItsRecordIsUsed) {
  Server s(beam());
  Matmul m;
  auto p = s.plan(m.root);
  ASSERT_TRUE(p);
  ASSERT_EQ(p->kernels.size(), 1u);
  auto r = s.tune(*p);
  ASSERT_TRUE(r.ok()) << r.status();
  std::cout << "searched " << r->name << ": heuristic \"" << r->heuristic << "\" " << r->before_ms << " ms, winner \""
            << r->schedule << "\" " << r->after_ms << " ms, " << r->candidates_timed << " candidates timed in "
            << r->seconds << " s\n";
  EXPECT_TRUE(r->skipped.empty()) << r->skipped;
  EXPECT_FALSE(r->from_record);
  EXPECT_GT(r->candidates_timed, 0u);
  EXPECT_EQ(r->dropped_mismatch, 0u) << "every real candidate computes what the heuristic's kernel does";
  EXPECT_GT(r->before_ms, 0);
  EXPECT_LE(r->after_ms, r->before_ms);
  EXPECT_FALSE(r->heuristic.empty());
  EXPECT_EQ(s.tuner->recorded_schedule(p->kernels[0], *s.planner->host(), ""), r->schedule);
  expect_runs_like_the_interpreter(s, m, *p, r->schedule);
  // Tuned again: the record answers, nothing is searched.
  auto again = s.tune(*p);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->from_record);
  EXPECT_EQ(again->schedule, r->schedule);
  EXPECT_EQ(s.tuner->stats().searches, 1u);
  EXPECT_EQ(s.tuner->stats().records_written, 1u);
}

TEST(Tuner, ACandidateRiggedToBeWrongNeverWins) {
  // The rig: a kernel of the same buffers that adds 1 to every element, as fast as any.
  Server s(beam());
  Matmul wrong(/*plus_one=*/true);
  auto wp = s.plan(wrong.root);
  ASSERT_TRUE(wp);
  auto rig = s.planner->compile_candidates(wp->kernels[0], s.planner->host(), {""}, "", Requester{});
  ASSERT_TRUE(rig[0].ok()) << rig[0].status();
  std::vector<std::string> rigged;
  std::mutex mu;
  SearchOptions o = beam();
  // Every other candidate, and every candidate of the first round's first half: the
  // fastest schedules are among them as often as not.
  size_t seen = 0;
  o.corrupt_candidate = [&](const std::string& schedule, CompiledKernel& k) {
    std::lock_guard<std::mutex> l(mu);
    if (seen++ % 2) return;
    rigged.push_back(schedule);
    k.object = (*rig[0]).object;
  };
  Server t(o);
  Matmul m;
  auto p = t.plan(m.root);
  ASSERT_TRUE(p);
  auto r = t.tune(*p);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(rigged.empty());
  EXPECT_GE(r->dropped_mismatch, 1u);
  EXPECT_EQ(t.tuner->stats().dropped_mismatch, r->dropped_mismatch);
  for (const std::string& bad : rigged) EXPECT_NE(r->schedule, bad) << "a rigged candidate won";
  expect_runs_like_the_interpreter(t, m, *p, r->schedule);
}

// The winner's curse: a candidate that won the search by luck (its timings rigged 100
// times faster) is timed again against the heuristic, in turns; slower there, it is not
// kept (the record keeps the heuristic, after = before). One that still wins keeps the
// confirmation's times.
TEST(Tuner, AWinnerIsKeptOnlyIfItBeatsTheHeuristicAgain) {
  for (bool holds : {false, true}) {
    SCOPED_TRACE(holds ? "the win holds" : "a lucky win");
    SearchOptions o = beam();
    o.rig_time = [holds](const std::string& schedule, bool confirming, double ms) {
      if (!confirming) return ms / 100;
      if (schedule.empty()) return 2.0;
      return holds ? 1.0 : 200.0;
    };
    Server s(o);
    Matmul m;
    auto p = s.plan(m.root);
    ASSERT_TRUE(p);
    auto r = s.tune(*p);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_GT(r->candidates_timed, 0u);
    if (holds) {
      EXPECT_FALSE(r->schedule.empty());
      EXPECT_EQ(r->before_ms, 2.0);
      EXPECT_EQ(r->after_ms, 1.0);
    } else {
      EXPECT_EQ(r->schedule, "");
      EXPECT_EQ(r->after_ms, r->before_ms);
    }
    EXPECT_EQ(s.tuner->recorded_schedule(p->kernels[0], *s.planner->host(), ""), r->schedule);
    expect_runs_like_the_interpreter(s, m, *p, r->schedule);
  }
}

// A candidate whose object the worker cannot load or run fails on the worker: it is
// dropped as a crash, and the search goes on to a winner that still computes the right
// thing, on a worker that still serves.
TEST(Tuner, ACandidateThatFailsOnTheWorkerIsDroppedAndTheSearchGoesOn) {
  SearchOptions o = beam();
  std::mutex mu;
  size_t seen = 0;
  std::vector<std::string> broken;
  o.corrupt_candidate = [&](const std::string& schedule, CompiledKernel& k) {
    std::lock_guard<std::mutex> l(mu);
    if (seen++ % 3) return;
    broken.push_back(schedule);
    k.object = CompiledKernel::bytes("not an ELF object");
  };
  Server s(o);
  Matmul m;
  auto p = s.plan(m.root);
  ASSERT_TRUE(p);
  auto r = s.tune(*p);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(broken.empty());
  EXPECT_EQ(r->dropped_crash, broken.size());
  EXPECT_EQ(s.tuner->stats().dropped_crash, broken.size());
  for (const std::string& bad : broken) EXPECT_NE(r->schedule, bad);
  expect_runs_like_the_interpreter(s, m, *p, r->schedule);
}

// The worker dies while a candidate is being timed (killed, as a crashing kernel would
// end it): that candidate is dropped, the pool starts another worker, and the search goes
// on on it.
TEST(Tuner, AWorkerThatDiesUnderACandidateIsReplacedAndTheSearchGoesOn) {
  SearchOptions o = beam();
  WorkerPool* pool = nullptr;
  int64_t killed = 0;
  o.corrupt_candidate = [&](const std::string&, CompiledKernel&) {
    if (killed || !pool) return;
    killed = pool->snapshot().at(0).pid;
    ASSERT_GT(killed, 0);
    ::kill(static_cast<pid_t>(killed), SIGKILL);
  };
  Server s(o);
  pool = &s.pool;
  Matmul m;
  auto p = s.plan(m.root);
  ASSERT_TRUE(p);
  auto r = s.tune(*p);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_GT(killed, 0);
  EXPECT_EQ(r->dropped_crash, 1u);
  EXPECT_GT(r->candidates_timed, 0u) << "candidates after the death were timed on the new worker";
  EXPECT_NE(s.pool.snapshot().at(0).pid, killed);
  EXPECT_EQ(s.pool.snapshot().at(0).restarts, 1u);
  expect_runs_like_the_interpreter(s, m, *p, r->schedule);
}

TEST(Tuner, CorruptTruncatedForeignAndOtherBuildRecordsAreMisses) {
  Server s(beam());
  Matmul m;
  auto p = s.plan(m.root);
  ASSERT_TRUE(p);
  const PlannedKernel& k = p->kernels[0];
  const Backend& host = *s.planner->host();
  TuningRecord good{k.digest.hex(), host.target_id(), host.build_id(), "split(1,4,upcast)", 2, 1};
  const std::string bytes = encode_tuning_record(good);
  auto back = decode_tuning_record(bytes, k.digest, host);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->schedule, good.schedule);

  std::vector<std::pair<std::string, std::string>> bad;
  bad.emplace_back("truncated", bytes.substr(0, bytes.size() - 1));
  bad.emplace_back("empty", "");
  std::string flipped = bytes;
  flipped[20] ^= 1;
  bad.emplace_back("a flipped bit", flipped);
  auto with = [&](auto change) {
    TuningRecord r = good;
    change(r);
    return encode_tuning_record(r);
  };
  bad.emplace_back("another build", with([](TuningRecord& r) { r.build += "-other"; }));
  bad.emplace_back("another target", with([](TuningRecord& r) { r.target = "x86_64-other"; }));
  bad.emplace_back("another kernel", with([](TuningRecord& r) { r.kernel = std::string(64, '0'); }));
  bad.emplace_back("a schedule that does not parse", with([](TuningRecord& r) { r.schedule = "split(1,04,upcast)"; }));
  bad.emplace_back("an artifact's magic", "UOPDCACHE2" + bytes.substr(9));
  for (const auto& [what, b] : bad) {
    auto d = decode_tuning_record(b, k.digest, host);
    ASSERT_FALSE(d.ok()) << what;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << what;
  }

  // In the tiers: a corrupt record in memory and in a disk entry is a miss, counted and
  // removed; the compile keeps the heuristic's kernel.
  const std::string key = tuning_record_key(k.digest, host, "");
  ASSERT_TRUE(s.cache->tiers()[0]->put(key, bad[0].second).ok());
  ASSERT_TRUE(s.cache->tiers()[1]->put(key, bad[3].second).ok());
  EXPECT_EQ(s.tuner->recorded_schedule(k, host, ""), "");
  TunerStats st = s.tuner->stats();
  EXPECT_EQ(st.record_errors, 2u);
  EXPECT_EQ(st.record_hits[0].second + st.record_hits[1].second, 0u);
  for (size_t i = 0; i < 2; ++i) {
    auto left = s.cache->tiers()[i]->get(key);
    ASSERT_TRUE(left.ok());
    EXPECT_FALSE(left->has_value()) << "a refused record stays in tier " << s.cache->tiers()[i]->name();
  }
  auto kernels = s.planner->compile(*p, s.planner->host());
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  EXPECT_NE((*kernels)[0].abi.schedule, good.schedule);

  // A good record on disk is found by a server that starts on the directory (copied into
  // its memory tier), and its compile uses the record's schedule.
  ASSERT_TRUE(s.cache->tiers()[1]->put(key, bytes).ok());
  Server fresh(beam());
  {
    std::vector<std::unique_ptr<CacheTier>> tiers;
    tiers.push_back(std::make_unique<MemoryTier>(int64_t{64} << 20));
    tiers.push_back(std::make_unique<DiskTier>(s.dir, int64_t{256} << 20, test_key()));
    CompileCache cache(std::move(tiers));
    Planner planner(PlannerOptions{}, &cache, CpuTarget::host());
    Tuner tuner(beam(), &planner, fresh.executor.get(), &cache);
    EXPECT_EQ(tuner.recorded_schedule(k, host, ""), good.schedule);
    EXPECT_EQ(tuner.stats().record_hits[1].second, 1u) << "from disk";
    planner.set_schedule_source([&](const PlannedKernel& pk, const Backend& b, std::string_view ns) {
      return tuner.recorded_schedule(pk, b, ns);
    });
    auto compiled = planner.compile(*p, planner.host());
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    EXPECT_EQ((*compiled)[0].abi.schedule, good.schedule);
    expect_runs_like_the_interpreter(fresh, m, *p, "");
  }
}

TEST(Tuner, SearchOffNeverSearchesNorUsesRecords) {
  SearchOptions o;
  o.mode = SearchMode::Off;
  Server s(o);
  Matmul m;
  auto p = s.plan(m.root);
  ASSERT_TRUE(p);
  const Backend& host = *s.planner->host();
  const std::string key = tuning_record_key(p->kernels[0].digest, host, "");
  ASSERT_TRUE(s.cache->tiers()[0]
                  ->put(key, encode_tuning_record({p->kernels[0].digest.hex(), host.target_id(), host.build_id(),
                                                   "split(1,4,upcast)", 2, 1}))
                  .ok());
  auto r = s.tune(*p);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  s.tuner->after_run(p, "CPU:0", "", "");
  EXPECT_EQ(s.tuner->recorded_schedule(p->kernels[0], host, ""), "");
  auto kernels = s.planner->compile(*p, s.planner->host());
  ASSERT_TRUE(kernels.ok());
  EXPECT_NE((*kernels)[0].abi.schedule, "split(1,4,upcast)");
  TunerStats st = s.tuner->stats();
  EXPECT_EQ(st.searches, 0u);
  EXPECT_EQ(st.candidates_timed, 0u);
  EXPECT_EQ(st.record_misses + st.record_errors + st.record_hits[0].second, 0u) << "no record was even looked up";

  SearchOptions parsed;
  EXPECT_TRUE(parse_search_mode("beam:8", &parsed).ok());
  EXPECT_EQ(parsed.mode, SearchMode::Beam);
  EXPECT_EQ(parsed.width, 8);
  for (const char* bad : {"beam:0", "beam:65", "beam:", "beam:+3", "Beam", "on", ""})
    EXPECT_FALSE(parse_search_mode(bad, &parsed).ok()) << bad;
}

TEST(Tuner, ServersSharingARedisSearchAKernelOnce) {
  if (!testing::RedisServer::installed()) GTEST_SKIP() << "redis-server is not installed";
  testing::RedisServer redis;
  ASSERT_TRUE(redis.start());
  Server a(beam(), redis.port());
  Server b(beam(), redis.port());
  Matmul m;
  auto pa = a.plan(m.root);
  auto pb = b.plan(m.root);
  ASSERT_TRUE(pa && pb);
  auto ra = a.tune(*pa);
  ASSERT_TRUE(ra.ok()) << ra.status();
  EXPECT_FALSE(ra->from_record);
  auto rb = b.tune(*pb);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_TRUE(rb->from_record) << "b finds a's record in Redis";
  EXPECT_EQ(rb->schedule, ra->schedule);
  EXPECT_EQ(a.tuner->stats().searches + b.tuner->stats().searches, 1u);
  EXPECT_EQ(b.tuner->stats().record_hits[2].second, 1u) << "from redis";

  // While one server holds a kernel's lease (it is searching), another does not search it.
  Matmul other(/*plus_one=*/true);
  auto po = b.plan(other.root);
  ASSERT_TRUE(po);
  auto* redis_tier = dynamic_cast<RedisTier*>(a.cache->tiers()[2].get());
  ASSERT_NE(redis_tier, nullptr);
  auto took = redis_tier->set_if_absent(
      cat("uopd:tune-lease:v1:", tuning_record_key(po->kernels[0].digest, *b.planner->host(), "")), "a", 600000);
  ASSERT_TRUE(took.ok() && *took);
  auto ro = b.tune(*po);
  ASSERT_TRUE(ro.ok()) << ro.status();
  EXPECT_FALSE(ro->skipped.empty());
  EXPECT_EQ(b.tuner->stats().searches, 0u);
  EXPECT_EQ(b.tuner->stats().leases_held_elsewhere, 1u);
}

// The lease expired and another server took it (its token in Redis now): this search's
// next renewal finds it so, and the search stops at its next candidate, timing nothing
// more and publishing no record, and leaves the other server's lease alone.
TEST(Tuner, ASearchWhoseLeaseAnotherServerTookStopsWithoutARecord) {
  if (!testing::RedisServer::installed()) GTEST_SKIP() << "redis-server is not installed";
  testing::RedisServer redis;
  ASSERT_TRUE(redis.start());
  SearchOptions o = beam();
  o.lease = absl::Seconds(1);  // renewed every third of a second
  Tuner* tuner = nullptr;
  std::string lease;
  int candidates = 0;
  bool lost = false;
  // At the first candidate (the search holds its lease): another server's token in it,
  // then the candidate waits for a renewal to find that.
  o.corrupt_candidate = [&](const std::string&, CompiledKernel&) {
    if (candidates++) return;
    ASSERT_EQ(redis.raw({"GET", lease}).size(), 32u) << "the search holds its lease, a random token";
    ASSERT_EQ(redis.raw({"SET", lease, "another server", "PX", "600000"}), "OK");
    lost = testing::wait_until([&] { return tuner->stats().leases_lost == 1; });
  };
  Server s(o, redis.port());
  tuner = s.tuner.get();
  Matmul m;
  auto p = s.plan(m.root);
  ASSERT_TRUE(p);
  const std::string key = tuning_record_key(p->kernels[0].digest, *s.planner->host(), "");
  lease = cat("uopd:tune-lease:v1:", key);
  auto r = s.tune(*p);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(lost) << "a renewal found the lease another server's";
  EXPECT_EQ(candidates, 1) << "no candidate after the lease was lost";
  EXPECT_EQ(r->candidates_timed, 0u);
  EXPECT_NE(r->skipped.find("took its lease over"), std::string::npos) << r->skipped;
  EXPECT_EQ(r->schedule, "");
  TunerStats st = s.tuner->stats();
  EXPECT_EQ(st.searches, 1u);
  EXPECT_EQ(st.leases_lost, 1u);
  EXPECT_EQ(st.leases_held_elsewhere, 0u);
  EXPECT_EQ(st.records_written, 0u);
  for (const auto& t : s.cache->tiers()) {
    auto got = t->get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_FALSE(got->has_value()) << "a record in tier " << t->name();
  }
  EXPECT_EQ(redis.raw({"GET", lease}), "another server") << "the other server's lease is left alone";
}

}  // namespace
}  // namespace uop::server
