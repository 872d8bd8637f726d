// The segment: a header page (layout, the serving pid), then the slots, each a 64-byte
// control block and its data, on a page boundary of their own. A request and its reply
// share the data: the worker has read the request before it writes the reply.
#include "transport/exec_lane.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "compiler/support/strings.h"
#include "transport/shm_sync.h"

namespace uop {
namespace {

constexpr uint64_t kMagic = 0x656e616c646f7075ULL;  // "uopdlane", little-endian
constexpr uint32_t kVersion = 2;  // 2: a request carries its deadline
constexpr uint64_t kPage = 4096;
constexpr uint32_t kMaxSlots = 1024;
constexpr uint64_t kMaxSlotBytes = 1ULL << 30;

// How long a sleeper sleeps before it looks around: uopd for its worker's exit and its
// deadline, the worker for stop().
constexpr std::chrono::milliseconds kUopdSlice{10};
constexpr std::chrono::milliseconds kWorkerSlice{250};

enum SlotState : uint32_t { kFree = 0, kClaimed = 1, kReady = 2, kRunning = 3, kDone = 4, kAbandoned = 5 };

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

std::string errno_text(const char* call) { return cat(call, ": ", std::strerror(errno)); }

}  // namespace

struct ExecLane::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint64_t slot_bytes;
  uint64_t stride;                 // bytes from one slot to the next (control block + data)
  std::atomic<int32_t> server_pid; // set by serve(): the worker that answers
};

struct alignas(64) ExecLane::Slot {
  std::atomic<uint32_t> state;  // SlotState; the futex word
  int32_t code;                 // the reply's absl::StatusCode
  uint64_t request_bytes;
  uint64_t reply_bytes;         // the reply, or the failure's message
  int64_t deadline_ns;          // the request's, Unix nanoseconds (INT64_MAX: none)
};
static_assert(sizeof(ExecLane::Slot) == 64);
static_assert(sizeof(ExecLane::Header) <= kPage);

ExecLane::Slot& ExecLane::slot(uint32_t i) const {
  return *reinterpret_cast<Slot*>(static_cast<char*>(base_) + kPage + uint64_t(i) * stride_);
}

char* ExecLane::data(uint32_t i) const { return reinterpret_cast<char*>(&slot(i)) + sizeof(Slot); }

absl::StatusOr<std::shared_ptr<ExecLane>> ExecLane::create(const ExecLaneLayout& layout) {
  if (layout.slots == 0 || layout.slots > kMaxSlots || layout.slot_bytes == 0 || layout.slot_bytes > kMaxSlotBytes)
    return absl::InvalidArgumentError(cat("an execute lane has 1 to ", kMaxSlots, " slots of at most ", kMaxSlotBytes,
                                          " bytes; asked for ", layout.slots, " of ", layout.slot_bytes));
  std::shared_ptr<ExecLane> lane(new ExecLane);
  lane->fd_ = memfd_create("uopd-exec-lane", MFD_CLOEXEC);
  if (lane->fd_ < 0) return absl::InternalError(errno_text("memfd_create"));
  lane->slots_ = layout.slots;
  lane->slot_bytes_ = layout.slot_bytes;
  lane->stride_ = round_up(sizeof(Slot) + layout.slot_bytes, kPage);
  lane->mapped_ = kPage + uint64_t(layout.slots) * lane->stride_;
  // Pages are the kernel's zeroes until touched: an idle lane costs its control blocks.
  if (ftruncate(lane->fd_, static_cast<off_t>(lane->mapped_)) != 0) return absl::InternalError(errno_text("ftruncate"));
  lane->base_ = mmap(nullptr, lane->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, lane->fd_, 0);
  if (lane->base_ == MAP_FAILED) {
    lane->base_ = nullptr;
    return absl::InternalError(errno_text("mmap"));
  }
  lane->header_ = static_cast<Header*>(lane->base_);
  lane->header_->magic = kMagic;
  lane->header_->version = kVersion;
  lane->header_->slots = layout.slots;
  lane->header_->slot_bytes = layout.slot_bytes;
  lane->header_->stride = lane->stride_;
  lane->header_->server_pid.store(0, std::memory_order_release);
  return lane;
}

absl::StatusOr<std::shared_ptr<ExecLane>> ExecLane::attach(int fd) {
  std::shared_ptr<ExecLane> lane(new ExecLane);
  lane->fd_ = fd;
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::InvalidArgumentError(cat("lane descriptor ", fd, ": ", errno_text("fstat")));
  if (st.st_size < static_cast<off_t>(kPage))
    return absl::InvalidArgumentError(cat("lane descriptor ", fd, " is ", st.st_size, " bytes, too small for a lane"));
  lane->mapped_ = static_cast<size_t>(st.st_size);
  lane->base_ = mmap(nullptr, lane->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (lane->base_ == MAP_FAILED) {
    lane->base_ = nullptr;
    return absl::InvalidArgumentError(cat("lane descriptor ", fd, ": ", errno_text("mmap")));
  }
  const Header& h = *static_cast<Header*>(lane->base_);
  if (h.magic != kMagic || h.version != kVersion)
    return absl::InvalidArgumentError(cat("lane descriptor ", fd, " is not an execute lane of version ", kVersion));
  if (h.slots == 0 || h.slots > kMaxSlots || h.slot_bytes == 0 || h.slot_bytes > kMaxSlotBytes ||
      h.stride != round_up(sizeof(Slot) + h.slot_bytes, kPage) || kPage + uint64_t(h.slots) * h.stride > lane->mapped_)
    return absl::InvalidArgumentError(cat("lane descriptor ", fd, ": its layout (", h.slots, " slots of ", h.slot_bytes,
                                          " bytes) does not fit its ", lane->mapped_, " bytes"));
  lane->header_ = static_cast<Header*>(lane->base_);
  lane->slots_ = h.slots;
  lane->slot_bytes_ = h.slot_bytes;
  lane->stride_ = h.stride;
  return lane;
}

ExecLane::~ExecLane() {
  stop();
  if (base_) munmap(base_, mapped_);
  if (fd_ >= 0) close(fd_);
  if (peer_fd_ >= 0) close(peer_fd_);
}

// ---- uopd's end ----

void ExecLane::set_peer(pid_t pid) {
  if (peer_fd_ >= 0) close(peer_fd_);
  peer_ = pid;
  peer_fd_ = shm::pidfd_open(pid);
}

bool ExecLane::served() const {
  int32_t pid = header_->server_pid.load(std::memory_order_acquire);
  return pid != 0 && pid == peer_;
}

std::optional<ExecLane::Call> ExecLane::claim() {
  // The lowest free slot: with few calls at once the same few slots, their pages and
  // their worker threads, stay warm (and the rest of the segment untouched).
  for (uint32_t i = 0; i < slots_; ++i) {
    uint32_t expected = kFree;
    if (slot(i).state.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire))
      return Call(this, i);
  }
  return std::nullopt;
}

std::span<char> ExecLane::Call::request() { return {lane_->data(slot_), lane_->slot_bytes_}; }

absl::StatusOr<std::string_view> ExecLane::Call::call(size_t bytes, absl::Time deadline,
                                                      const std::atomic<bool>* cancel) {
  if (phase_ != Phase::Claimed) return absl::FailedPreconditionError("an execute lane call is posted once");
  if (bytes > lane_->slot_bytes_)
    return absl::InvalidArgumentError(cat("a request of ", bytes, " bytes does not fit the lane's ", lane_->slot_bytes_));
  Slot& s = lane_->slot(slot_);
  s.request_bytes = bytes;
  s.deadline_ns = deadline == absl::InfiniteFuture() ? INT64_MAX : absl::ToUnixNanos(deadline);
  s.state.store(kReady, std::memory_order_release);
  shm::futex_wake_all(&s.state);
  bool slept = false;
  for (;;) {
    uint32_t st = s.state.load(std::memory_order_acquire);
    if (st == kDone) break;
    const absl::Time now = absl::Now();
    const bool cancelled = cancel && cancel->load(std::memory_order_acquire);
    if (now >= deadline || cancelled) {
      // READY or RUNNING: the worker frees it. A CAS that fails found the reply posted.
      if (s.state.compare_exchange_strong(st, kAbandoned, std::memory_order_acq_rel)) {
        phase_ = Phase::LeftToWorker;
        if (cancelled) return absl::CancelledError("cancelled by the caller before the worker answered");
        return absl::DeadlineExceededError("the request's deadline passed before the worker answered");
      }
      continue;
    }
    // Asked after a sleep, not before the first: the common call sleeps once.
    if (slept && shm::process_exited(lane_->peer_fd_, lane_->peer_)) {
      // Its reply may have come just before it went.
      if (s.state.load(std::memory_order_acquire) == kDone) break;
      phase_ = Phase::LeftToWorker;  // the segment dies with the worker's generation
      return absl::UnavailableError(cat("worker process ", lane_->peer_, " exited while running the request"));
    }
    shm::futex_wait(&s.state, st, std::min<std::chrono::nanoseconds>(kUopdSlice, absl::ToChronoNanoseconds(deadline - now)));
    slept = true;
  }
  phase_ = Phase::Done;
  const uint64_t n = s.reply_bytes;
  if (n > lane_->slot_bytes_)
    return absl::InternalError(cat("the worker's reply claims ", n, " bytes; the lane's slot holds ", lane_->slot_bytes_));
  std::string_view reply(lane_->data(slot_), n);
  if (s.code != 0) {
    if (s.code < 0 || s.code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated))
      return absl::InternalError(cat("the worker's reply has status code ", s.code));
    return absl::Status(static_cast<absl::StatusCode>(s.code), absl::string_view(reply.data(), reply.size()));
  }
  return reply;
}

ExecLane::Call::~Call() {
  if (!lane_ || phase_ == Phase::LeftToWorker) return;
  lane_->slot(slot_).state.store(kFree, std::memory_order_release);  // claimed and never posted, or answered
}

ExecLane::Call& ExecLane::Call::operator=(Call&& o) noexcept {
  if (this == &o) return *this;
  this->~Call();
  lane_ = std::exchange(o.lane_, nullptr);
  slot_ = o.slot_;
  phase_ = o.phase_;
  return *this;
}

// ---- the worker's end ----

absl::Status ExecLane::serve(Handler handler) {
  if (!threads_.empty() || stopping_.load()) return absl::FailedPreconditionError("the execute lane is served already");
  handler_ = std::move(handler);
  for (uint32_t i = 0; i < slots_; ++i) threads_.emplace_back([this, i] { serve_slot(i); });
  header_->server_pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
  return absl::OkStatus();
}

void ExecLane::serve_slot(uint32_t i) {
  Slot& s = slot(i);
  char* buf = data(i);
  while (!stopping_.load(std::memory_order_acquire)) {
    uint32_t st = s.state.load(std::memory_order_acquire);
    if (st == kAbandoned) {  // given up on before we took it
      s.state.compare_exchange_strong(st, kFree, std::memory_order_acq_rel);
      continue;
    }
    if (st != kReady) {
      shm::futex_wait(&s.state, st, kWorkerSlice);
      continue;
    }
    if (!s.state.compare_exchange_strong(st, kRunning, std::memory_order_acq_rel)) continue;
    const uint64_t n = s.request_bytes;
    const absl::Time deadline = s.deadline_ns == INT64_MAX ? absl::InfiniteFuture() : absl::FromUnixNanos(s.deadline_ns);
    absl::StatusOr<size_t> r =
        n > slot_bytes_
            ? absl::StatusOr<size_t>(absl::InvalidArgumentError(
                  cat("a request of ", n, " bytes does not fit the lane's slot of ", slot_bytes_)))
            : handler_(std::string_view(buf, n), std::span<char>(buf, slot_bytes_),
                       [&s] { return s.state.load(std::memory_order_acquire) == kAbandoned; }, deadline);
    if (r.ok() && *r > slot_bytes_)
      r = absl::InternalError(cat("a reply of ", *r, " bytes does not fit the lane's slot of ", slot_bytes_));
    if (r.ok()) {
      s.code = 0;
      s.reply_bytes = *r;
    } else {
      absl::string_view msg = r.status().message();
      const size_t len = std::min<size_t>(msg.size(), slot_bytes_);
      std::memcpy(buf, msg.data(), len);
      s.code = static_cast<int32_t>(r.status().code());
      s.reply_bytes = len;
    }
    uint32_t running = kRunning;
    if (!s.state.compare_exchange_strong(running, kDone, std::memory_order_acq_rel))
      s.state.store(kFree, std::memory_order_release);  // abandoned meanwhile: nobody reads the reply
    else
      shm::futex_wake_all(&s.state);
  }
}

int ExecLane::in_flight() const {
  int n = 0;
  for (uint32_t i = 0; i < slots_; ++i) {
    const uint32_t st = slot(i).state.load(std::memory_order_acquire);
    n += st == kReady || st == kRunning;
  }
  return n;
}

void ExecLane::stop() {
  if (threads_.empty()) return;
  stopping_.store(true, std::memory_order_release);
  for (uint32_t i = 0; i < slots_; ++i) shm::futex_wake_all(&slot(i).state);
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace uop
