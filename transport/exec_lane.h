// The execute lane: how uopd sends requests to a worker process it started itself, on the
// same host, through shared memory instead of gRPC. A cached Run's one round trip to its
// worker is then two futex wake-ups (request posted, reply posted) where gRPC costs a
// socket write, a poller thread's wake-up and a hand-off to a handler thread in each
// direction: on a loaded 2-core host, ~250 µs against ~40 µs. gRPC stays the way to
// remote workers, for what an embedded one does not take here (program loads, Info), and
// for any request or reply larger than a slot.
//
// uopd creates the segment (an anonymous memfd, so a crash leaves nothing behind in
// /dev/shm) before it forks the worker, which inherits the descriptor (--lane-fd=N), maps
// it and serves it with one thread per slot. Each slot carries one call at a time; its
// state word is the futex both ends sleep on:
//
//   FREE --claim (uopd)--> CLAIMED --post--> READY --take (worker)--> RUNNING --reply--> DONE
//   DONE --release (uopd)--> FREE
//   READY or RUNNING --abandon (uopd: its deadline passed)--> ABANDONED --(worker)--> FREE
//
// Only uopd moves a slot out of FREE, only the worker out of READY and RUNNING, so each
// transition is one compare-and-swap. A waiting uopd thread wakes every few milliseconds
// to ask the worker's pidfd whether the process exited: a worker killed mid-call fails
// that call with UNAVAILABLE within moments, never a hang. The lane carries bytes; what
// they mean (worker.proto's ExecuteRequest and ExecuteResponse) is the two ends' business.
// A reply's length is checked against the slot before uopd reads it, and a request's
// before the worker does: neither end trusts the other's numbers.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace uop {

struct ExecLaneLayout {
  uint32_t slots = 16;  // calls in flight at once; more go over gRPC
  // The largest request, and separately the largest reply: a 1 MiB chunk of buffer data
  // and its header fit one.
  uint64_t slot_bytes = (1 << 20) + 4096;
};

class ExecLane {
 public:
  // uopd's end: a new segment, zeroed (every slot FREE), its descriptor close-on-exec.
  static absl::StatusOr<std::shared_ptr<ExecLane>> create(const ExecLaneLayout& layout = {});
  // The worker's end: maps the segment behind an inherited descriptor (the lane owns it
  // from then on). INVALID_ARGUMENT when it is no lane or one of another version.
  static absl::StatusOr<std::shared_ptr<ExecLane>> attach(int fd);
  ~ExecLane();  // stop(), then unmaps and closes
  ExecLane(const ExecLane&) = delete;
  ExecLane& operator=(const ExecLane&) = delete;

  int fd() const { return fd_; }
  uint64_t capacity() const { return slot_bytes_; }
  uint32_t slots() const { return slots_; }

  // ---- uopd's end ----

  // The process that serves the lane: its exit fails waiting calls at once. Set once,
  // before the first call.
  void set_peer(pid_t pid);
  // True once that process announced that it serves the lane (serve() ran in it).
  bool served() const;

  // One call in one slot, from claim() until it goes (then the slot is free again, or
  // left to the worker when the call was abandoned or the worker died).
  class Call {
   public:
    Call(Call&& o) noexcept : lane_(o.lane_), slot_(o.slot_), phase_(o.phase_) { o.lane_ = nullptr; }
    Call& operator=(Call&& o) noexcept;  // lets go of this call's slot first
    ~Call();
    // capacity() bytes to write the request into.
    std::span<char> request();
    // Posts the first `bytes` of request() and waits for the reply. The reply's bytes stay
    // valid while the Call lives. INVALID_ARGUMENT for a request over capacity();
    // DEADLINE_EXCEEDED at the deadline (the worker frees the slot when it is done);
    // UNAVAILABLE when the worker process exited; else the worker's status as it sent it.
    // A Call posts at most once (a refused request was not posted). With `cancel`, set by
    // another thread, the call is abandoned as at its deadline and fails CANCELLED; it is
    // asked every time the wait wakes (at most kUopdSlice, 10 ms, apart).
    absl::StatusOr<std::string_view> call(size_t bytes, absl::Time deadline,
                                          const std::atomic<bool>* cancel = nullptr);

   private:
    friend class ExecLane;
    enum class Phase { Claimed, Done, LeftToWorker };
    Call(ExecLane* lane, uint32_t slot) : lane_(lane), slot_(slot) {}
    ExecLane* lane_;
    uint32_t slot_;
    Phase phase_ = Phase::Claimed;
  };
  // A free slot, or nullopt when every slot is busy.
  std::optional<Call> claim();

  // ---- the worker's end ----

  // Handles one request: writes the reply into `reply` and returns its length, or a failure
  // (its message goes back, cut to the slot). `abandoned` says whether uopd stopped waiting;
  // `deadline` is the one uopd posted the request with (it abandons the request then).
  // `request` and `reply` are the same bytes: read the request before writing the reply.
  using Handler = std::function<absl::StatusOr<size_t>(std::string_view request, std::span<char> reply,
                                                       const std::function<bool()>& abandoned, absl::Time deadline)>;
  // Starts one thread per slot and announces this process as the lane's server. Once per
  // lane (FAILED_PRECONDITION after that, and after stop()).
  absl::Status serve(Handler handler);
  // Calls posted and not yet answered, taken or not (what a drain waits for).
  int in_flight() const;
  // Stops the slot threads once each has finished its call. Idempotent.
  void stop();

  struct Header;
  struct Slot;

 private:
  ExecLane() = default;
  Slot& slot(uint32_t i) const;
  char* data(uint32_t i) const;
  void serve_slot(uint32_t i);

  int fd_ = -1;
  void* base_ = nullptr;
  size_t mapped_ = 0;
  Header* header_ = nullptr;
  uint32_t slots_ = 0;
  uint64_t slot_bytes_ = 0, stride_ = 0;
  // uopd's end.
  pid_t peer_ = 0;
  int peer_fd_ = -1;  // pidfd of peer_, -1 without one
  // The worker's end.
  Handler handler_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
};

}  // namespace uop
