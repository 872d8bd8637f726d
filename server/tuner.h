// Schedule search (docs/ARCHITECTURE.md, Schedule search): for one kernel and the CPU
// target, a beam search over loop schedules (compiler/passes/loop_schedule.h) from the
// heuristic's, each candidate compiled on the compile pool and timed on a worker with the
// kernel's real shapes on scratch buffers (never a session's), its output checked against
// the heuristic kernel's on the same random inputs. The winner becomes a tuning record,
// kept in the compile cache's tiers (memory, disk, Redis) under a key of its own, and
// every later compile of that kernel for that target and compiler build uses it
// (Planner::set_schedule_source).
//
// Search: the beam starts as the heuristic's schedule; each round every schedule of the
// beam is extended by each step candidate_steps lists (those apply_schedule refuses, and
// those whose scheduled kernel is one already tried, are left out), the new candidates are
// compiled and timed, and the best `width` of them are the next beam. It stops when a
// round's best is not faster than the best so far by 2% (timing noise), when no step is
// left, or when the kernel's budget is spent. A candidate that does not compile, does not
// match (Tolerance below), crashes its worker or runs past its deadline is dropped and
// counted by that reason; a worker that died is restarted by the pool and the search goes
// on.
//
// Timing: one Execute per candidate: the scratch buffers allocated with the inputs, then
// kWarmup launches not counted (page faults, caches, the thread pool waking), then
// `runs` launches each timed by the worker (a monotonic clock around the launch); the
// candidate's time is the minimum of those: on a shared machine noise only ever adds
// time, so the minimum is the best estimate of what the kernel costs. `runs` is chosen
// once per kernel from the heuristic kernel's first timing, so that a candidate's launches
// take about kTimedMs (3 .. 25 launches).
//
// Records: "UOPDTUNE1" | payload length (u32 LE) | payload | SHA-256 of everything before;
// the payload is lines "key=value" (kernel, target, build, schedule, before_ms, after_ms).
// A record that is truncated, fails its checksum, does not parse, or names another
// kernel, target or compiler build is a miss (and removed from its tier), never a
// schedule; in the disk and Redis tiers it is also authenticated like every entry
// (server/cache/README.md). A record whose schedule is "" says the heuristic won.
//
// Once per cluster: with a Redis tier, a search first takes a lease named by the record's
// key (SET NX PX `uopd:tune-lease:v1:<record key>`, its value a random token of this
// Tuner's), so servers sharing that Redis search a kernel once; the others keep the
// heuristic kernel and pick the record up when it appears (a miss is asked again after
// kMissRecheck). The lease is short (SearchOptions::lease, `uopd --search-lease-s`) and a
// thread of the search renews it every third of that while the search runs, so a server
// that dies mid-search holds its kernel for at most one lease: then another server's
// search of it takes the lease over. A renewal that finds the lease another server's (it
// expired and was taken: a renewal came too late, say while Redis was unreachable) stops
// the search at its next candidate without a record, since that server searches it now
// (TunerStats::leases_lost); one that finds it gone and free takes it again. A search that
// ends, with a record or without, removes its lease if it still holds it. The lease is
// extended and removed only while it holds this Tuner's token (RedisTier::extend_if_holds,
// remove_if_holds: one Lua script each), never another server's. A Redis that does not
// answer cannot coordinate: the search goes on (taken or renewed, it is tried again).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/executor.h"
#include "server/planner.h"

namespace uop::server {

enum class SearchMode {
  Off,        // no records used, no search: the heuristic's kernels only
  Heuristic,  // records used where they exist (uop tune, another server), no search here
  Beam,       // and a kernel with none is searched in the background after it first runs
};

struct SearchOptions {
  SearchMode mode = SearchMode::Heuristic;
  int width = 4;                             // schedules kept per round
  absl::Duration budget = absl::Seconds(30);  // per kernel
  // The cluster lease's time to live (with a Redis tier): renewed every third of it while
  // the search runs; how long a server that died mid-search keeps others from its kernel.
  absl::Duration lease = absl::Seconds(10);
  // Tests only: called on every candidate after it compiled and before it is timed (a
  // test rigs one to compute something else). Never set by uopd. The worker keeps what it
  // loaded under the candidate's cache key, so a test must not run a rigged schedule
  // through that worker afterwards.
  std::function<void(const std::string& schedule, CompiledKernel& kernel)> corrupt_candidate;
  // Tests only: the time a timing reports, from the schedule timed ("" the heuristic's),
  // whether it is the winner's confirmation against the heuristic, and the time measured
  // (a test makes a candidate win by luck). Never set by uopd.
  std::function<double(const std::string& schedule, bool confirming, double ms)> rig_time;
};

// "off", "heuristic", "beam" or "beam:WIDTH" (1 .. 64) into `o`; INVALID_ARGUMENT naming
// what is wrong otherwise. search_mode_name prints it back ("beam:4").
absl::Status parse_search_mode(std::string_view text, SearchOptions* o);
std::string search_mode_name(const SearchOptions& o);

// A tuning record: the schedule that won for a kernel on a target and compiler build.
struct TuningRecord {
  std::string kernel;    // digest, hex
  std::string target;    // Backend::target_id
  std::string build;     // Backend::build_id
  std::string schedule;  // "" the heuristic's
  double before_ms = 0, after_ms = 0;
};
// Its cache key (64 hex): the kernel, target, build and namespace, apart from every
// artifact's key.
std::string tuning_record_key(const Digest& kernel, const Backend& backend, std::string_view cache_namespace);
std::string encode_tuning_record(const TuningRecord& r);
// DATA_LOSS naming what is wrong for bytes that are not a record of `kernel` for this
// backend's target and build.
absl::StatusOr<TuningRecord> decode_tuning_record(std::string_view bytes, const Digest& kernel, const Backend& backend);

// What tuning one kernel did.
struct TuneResult {
  std::string name;
  Digest digest;
  std::string heuristic;  // the heuristic's schedule, as text
  std::string schedule;   // the winner's ("" the heuristic kept)
  double before_ms = 0;   // the heuristic kernel's time
  double after_ms = 0;    // the winner's
  bool from_record = false;  // a record existed: nothing was searched
  std::string skipped;    // why the kernel was not searched ("" it was)
  uint64_t candidates_timed = 0;
  uint64_t dropped_compile = 0, dropped_mismatch = 0, dropped_crash = 0, dropped_timeout = 0;
  double seconds = 0;
};

struct TunerStats {
  uint64_t searches = 0, candidates_timed = 0;
  uint64_t dropped_compile = 0, dropped_mismatch = 0, dropped_crash = 0, dropped_timeout = 0;
  uint64_t leases_held_elsewhere = 0;  // searches left to another server
  uint64_t leases_lost = 0;            // searches stopped, no record: another server took their lease
  std::vector<std::pair<std::string, uint64_t>> record_hits;  // per tier, in order
  uint64_t record_misses = 0, record_errors = 0, records_written = 0;
};

class Tuner {
 public:
  // Time spent timing one candidate, and the launches before it not counted.
  static constexpr double kTimedMs = 50;
  static constexpr int kWarmup = 2;
  // The winner is timed again against the heuristic, in turns, this many times each.
  static constexpr int kConfirmRounds = 3;
  // A record missing from every tier is asked for again after this long.
  static constexpr absl::Duration kMissRecheck = absl::Seconds(2);

  Tuner(SearchOptions options, Planner* planner, Executor* executor, CompileCache* cache);
  ~Tuner();  // stops the background search (the one running finishes its candidate)
  Tuner(const Tuner&) = delete;
  Tuner& operator=(const Tuner&) = delete;

  const SearchOptions& options() const { return opts_; }

  // The schedule kernel k's record names for `backend` ("" none, or the heuristic won, or
  // mode off): the planner's schedule source.
  std::string recorded_schedule(const PlannedKernel& k, const Backend& backend, std::string_view cache_namespace);

  // Tunes plan.kernels[kernel] now for the CPU (the heuristic's kernel and a record are
  // what a CUDA kernel keeps: skipped says so), on `device`'s worker for `tenant`: its
  // record if there is one, else a search (width and budget 0: the options'; a budget past the options' is cut to it). The winner's
  // record is written to every tier. FAILED_PRECONDITION with mode off.
  absl::StatusOr<TuneResult> tune(const Plan& plan, size_t kernel, const std::string& device, const std::string& tenant,
                                  std::string_view cache_namespace, const Requester& who, int width = 0,
                                  absl::Duration budget = absl::ZeroDuration());

  // Beam mode: the CPU kernels of a plan that just ran, without a record, are queued for a
  // search in the background (one at a time, each kernel once per process).
  void after_run(std::shared_ptr<const Plan> plan, const std::string& device, const std::string& tenant,
                 std::string_view cache_namespace);

  TunerStats stats() const;

 private:
  struct Candidate;
  class Lease;
  // The record in the first tier that has a good one (copied into the tiers above), or
  // nullopt; counts hits, misses and refused records.
  std::optional<TuningRecord> find_record(const std::string& key, const Digest& kernel, const Backend& backend);
  void put_record(const std::string& key, const TuningRecord& r);
  // Whether this server may search the kernel of `key` now (the cluster lease, when Redis
  // is a tier); `held` the lease taken, renewed until it is destroyed (null: no Redis tier,
  // or one that did not answer).
  bool take_lease(const std::string& key, std::unique_ptr<Lease>* held);
  // `queued`: the background's search of a kernel after_run made pending (any other call
  // first waits for a pending search of its kernel, then finds that search's record).
  absl::StatusOr<TuneResult> search(const Plan& plan, size_t kernel, const std::string& device, const std::string& tenant,
                                    std::string_view cache_namespace, const Requester& who, int width, absl::Duration budget,
                                    bool queued = false);
  void background();

  const SearchOptions opts_;
  Planner* planner_;
  Executor* executor_;
  CompileCache* cache_;
  // The value of every lease this Tuner takes: random, so that no other server's is the
  // same. One value per Tuner is enough: it searches a kernel once at a time (pending_).
  const std::string lease_token_;

  mutable std::mutex mu_;
  // Records seen in this process: key -> schedule; misses -> when to ask again.
  absl::flat_hash_map<std::string, std::string> known_;
  absl::flat_hash_map<std::string, absl::Time> missing_;
  // The kernel digest, target identity digest and namespace -> the record key: recorded_schedule's SHA-256s, remembered.
  using MemoKey = std::tuple<Digest, Digest, std::string>;
  absl::flat_hash_map<MemoKey, std::string> keys_;
  absl::flat_hash_set<std::string> queued_;  // record keys searched or queued in the background
  // Record keys with a search queued or running in this process: one search per kernel at
  // a time, and a Tune of a pending kernel waits for it (searched_ says when one ends).
  absl::flat_hash_set<std::string> pending_;
  std::condition_variable searched_;
  struct Queued {
    std::shared_ptr<const Plan> plan;
    size_t kernel;
    std::string device, tenant, cache_namespace;
  };
  std::deque<Queued> queue_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread worker_;  // the background search, in beam mode

  std::atomic<uint64_t> searches_{0}, timed_{0}, d_compile_{0}, d_mismatch_{0}, d_crash_{0}, d_timeout_{0};
  std::atomic<uint64_t> leases_elsewhere_{0}, leases_lost_{0}, record_misses_{0}, record_errors_{0}, records_written_{0};
  std::vector<std::atomic<uint64_t>> record_hits_;  // per tier
};

}  // namespace uop::server
