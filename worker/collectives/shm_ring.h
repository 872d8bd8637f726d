// Allreduce in place among the processes of one host through POSIX shared memory
// (docs/ARCHITECTURE.md, The service: CPU workers on one host). The members of a group map one segment, named
// after the group, created by whoever comes first and unlinked as soon as everyone is
// in (so a crash later cannot leak it). Each member has an outbox of a few slots there;
// the allreduce is a ring: a reduce-scatter then an all-gather, 2 (n - 1) steps, each part
// of the buffer cut into slot-sized messages so that a member copies one message in while
// its successor reduces the previous one (chunked and pipelined). A chunk goes through
// every step before the next one starts, and what a step receives is reduced straight
// into the outbox of the next step, so it is sent on from cache, not read back from the
// buffer.
//
// Synchronization is by atomic counters in the segment (spin, then yield, then futex).
// Every wait is bounded by the timeout and watches the peers' processes (pidfd), so a
// member killed mid-collective fails the others at once (UNAVAILABLE naming its rank and
// pid), a missing or stuck one fails them after the timeout (DEADLINE_EXCEEDED naming it),
// never a hang. The first member to fail aborts the group, so all of them fail together.
//
// Reduction order (what a bit-exact reference must follow): the buffer is cut into
// `size` parts (ring_part); part j is reduced as x[j], then x[j+1] op acc, x[j+2] op acc,
// ... around the ring (ranks mod size), so every member ends with the same bits.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/ir/arg.h"
#include "compiler/ir/dtype.h"

namespace uop {

struct ShmRingOptions {
  std::string group;  // unique per collective instance; names the segment
  int rank = 0;
  int size = 1;
  // Bounds each wait: for the group to assemble, and for any peer's next step.
  std::chrono::milliseconds timeout{30000};
  // Asked while waiting; true makes the call fail with CANCELLED (and the group abort).
  std::function<bool()> cancelled;
  uint64_t slot_bytes = 256 << 10;  // one message; rounded down to a multiple of 64
  int slots = 4;                    // messages a member may be ahead of its successor (>= 2)
};

// Part i of `elements` cut into `parts`: the first elements % parts parts have one more.
struct RingPart {
  uint64_t offset = 0, count = 0;
};
RingPart ring_part(uint64_t elements, int parts, int i);

// The shared-memory name of a group's segment ("/uopd-coll-<hash>-<readable prefix>").
std::string shm_ring_segment_name(const std::string& group);

// The directory segments live in (/dev/shm, where shm_open puts them), opened once per
// process (O_PATH) and kept: segments are opened and unlinked relative to it, which is
// what a sandboxed worker may still do (worker/sandbox.h). -1 if it cannot be opened.
int shm_directory();

class ShmRing {
 public:
  // Maps (or creates) the group's segment and claims `rank`; returns when all members
  // have. INVALID_ARGUMENT for a bad rank / size, a taken rank or members that disagree
  // on the size; DEADLINE_EXCEEDED naming the ranks that never came.
  static absl::StatusOr<std::unique_ptr<ShmRing>> join(const ShmRingOptions& options);
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // Reduces `elements` values of `dtype` at `data` in place. Every member calls it with
  // the same (elements, op, dtype), one call after another; INVALID_ARGUMENT if they
  // disagree or the op is not defined on the dtype. After a failure the group is aborted
  // and every later call returns the same error. `parts`, if given, are the sizes of the
  // `size` ring parts in order (summing to `elements`) instead of ring_part's: what lets
  // a bucket of buffers laid out part by part (collective.cc) reduce each element in the
  // order it would alone. Members must agree on them too.
  absl::Status allreduce(void* data, uint64_t elements, ReduceOp op, Scalar dtype,
                         std::span<const uint64_t> parts = {});

  // A group that lives across calls: the next calls' wait bound and cancellation (the
  // ones given at join bound the join and the calls until this is called).
  void rebind(std::chrono::milliseconds timeout, std::function<bool()> cancelled) {
    opts_.timeout = timeout;
    opts_.cancelled = std::move(cancelled);
  }
  // Whether the group failed (a member died, disagreed, was cancelled): then every call fails.
  bool broken() const { return !failure_.ok(); }

  const ShmRingOptions& options() const { return opts_; }

 // The shared segment's layout (defined in shm_ring.cc; public so that its helpers can name it).
  struct Segment;
  struct Counter;

 private:
  explicit ShmRing(const ShmRingOptions& options);
  absl::Status attach();
  absl::Status await_members();
  absl::Status wait_for(Counter& c, uint32_t target, int peer, const std::string& what);
  absl::Status check_peers();
  absl::Status fail(absl::StatusCode code, const std::string& reason);
  absl::Status failure_from_abort();
  std::string where() const;
  uint8_t* outbox(int member, uint32_t seq) const;

  ShmRingOptions opts_;
  std::string name_;
  Segment* seg_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  bool unlinked_ = false;
  std::vector<int> pidfds_;  // by rank; -1 for self or where pidfd_open is unavailable
  std::vector<int> pids_;
  uint32_t ops_ = 0, sent_ = 0, received_ = 0;
  absl::Status failure_;
};

// join, allreduce, leave: one collective instance (what the Collective RPC does).
absl::Status shm_allreduce(const ShmRingOptions& options, void* data, uint64_t elements, ReduceOp op, Scalar dtype);

}  // namespace uop
