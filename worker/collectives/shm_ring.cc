// The segment: a header (layout, the join count, the abort record), one control block per
// member (its pid, its allreduce descriptors and three counters) and the members' outboxes.
// Counters only grow (mod 2^32), so one segment serves any number of allreduce calls.
//
// A member sends message `seq` into outbox slot seq % slots once its successor has
// consumed message seq - slots, and bumps `produced`; it receives message `seq` from its
// predecessor once that one's `produced` passed seq, and bumps `consumed`. Every part
// is cut into the same number of chunks (some empty), and each chunk passes through the
// 2 (n - 1) ring steps in turn, so the sequence numbers of all members line up without
// any per-step handshake.
#include "worker/collectives/shm_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#include "compiler/support/strings.h"
#include "transport/shm_sync.h"
#include "worker/collectives/reduce.h"

namespace uop {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x676e6972646f7075ull;  // "uopdring"
constexpr uint32_t kVersion = 3;
constexpr size_t kGroupChars = 192;
constexpr size_t kReasonChars = 512;
constexpr int kSpins = 256;                                // pause-loop checks before yielding
constexpr int kYields = 32;                                // then sched_yield rounds before sleeping
constexpr auto kFutexSlice = std::chrono::milliseconds(1);  // a sleeping waiter re-checks this often
constexpr auto kPeerCheckEvery = std::chrono::milliseconds(5);

uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

struct OpDesc {
  uint64_t elements;
  uint32_t op, dtype;
  uint64_t layout;  // a hash of the parts given to allreduce; 0: ring_part's
};

}  // namespace

struct ShmRing::Counter {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> waiters{0};  // sleepers in futex_wait: only then does a bump wake
};

namespace {

using Counter = ShmRing::Counter;
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "counters in shared memory must be lock-free (address-free)");

struct alignas(64) Member {
  std::atomic<int32_t> pid{0};  // 0 until the rank is claimed
  OpDesc desc[2];               // allreduce #k's, at k % 2: a peer is never two calls ahead
  alignas(64) Counter ops;      // allreduce calls started; desc is written before the bump
  alignas(64) Counter produced;
  alignas(64) Counter consumed;
  // allreduce calls finished: bumped after the last message of a call is sent and the
  // last one received, so a member that is done and then exits (its worker stopped, a
  // test's child returned) is no loss to a peer still reading its final message.
  alignas(64) Counter finished;
};

}  // namespace

struct ShmRing::Segment {
  std::atomic<uint64_t> magic{0};  // kMagic once the creator has filled the header in
  uint32_t version = 0, size = 0, slots = 0, pad = 0;
  uint64_t slot_bytes = 0, total_bytes = 0, members_offset = 0, data_offset = 0;
  char group[kGroupChars] = {};
  alignas(64) Counter joined;
  alignas(64) std::atomic<uint32_t> abort_owner{0};  // 1 + the rank that failed first
  std::atomic<uint32_t> abort_ready{0};              // its code and reason are written
  int32_t abort_code = 0;
  char abort_reason[kReasonChars] = {};
};

namespace {

struct Layout {
  uint64_t members_offset, data_offset, total;
};
Layout layout_for(int size, int slots, uint64_t slot_bytes) {
  Layout l;
  l.members_offset = round_up(sizeof(ShmRing::Segment), 64);
  l.data_offset = round_up(l.members_offset + uint64_t(size) * sizeof(Member), 4096);
  l.total = l.data_offset + uint64_t(size) * uint64_t(slots) * slot_bytes;
  return l;
}

Member& member_at(ShmRing::Segment* seg, int i) {
  return reinterpret_cast<Member*>(reinterpret_cast<uint8_t*>(seg) + seg->members_offset)[i];
}

using shm::futex_wait;
using shm::futex_wake_all;

// seq_cst on both sides (here and in wait_for) so that a waiter that registered before
// the bump is always seen: either it sees the new value or we see it waiting.
void publish(Counter& c, uint32_t v) {
  c.value.store(v, std::memory_order_seq_cst);
  if (c.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&c.value);
}

// For a counter that several members bump at once (the join count): publish()'s store of
// a value computed before could overwrite a concurrent bump.
void bump(Counter& c) {
  c.value.fetch_add(1, std::memory_order_seq_cst);
  if (c.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&c.value);
}

bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

std::string errno_text(const char* call) { return cat(call, ": ", std::strerror(errno)); }

std::string describe_op(const OpDesc& d) {
  return cat(d.elements, " ", scalar_name(static_cast<Scalar>(d.dtype)), " elements (",
             reduce_op_wire_name(static_cast<ReduceOp>(d.op)), d.layout ? cat(", parts ", d.layout) : std::string(), ")");
}

}  // namespace

RingPart ring_part(uint64_t elements, int parts, int i) {
  uint64_t base = elements / parts, extra = elements % parts, ui = static_cast<uint64_t>(i);
  return {ui * base + std::min(ui, extra), base + (ui < extra ? 1 : 0)};
}

std::string shm_ring_segment_name(const std::string& group) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: the readable prefix alone may collide
  for (unsigned char c : group) h = (h ^ c) * 1099511628211ull;
  std::string readable;
  for (char c : group.substr(0, 48)) readable += (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.') ? c : '_';
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return cat("/uopd-coll-", hex, "-", readable);
}

int shm_directory() {
  static const int fd = open("/dev/shm", O_PATH | O_DIRECTORY | O_CLOEXEC);
  return fd;
}

namespace {

// shm_open / shm_unlink of a segment name ("/uopd-coll-..."), relative to shm_directory():
// the same file, and a call a sandboxed worker may make.
int open_segment(const std::string& name, int flags, mode_t mode) {
  if (shm_directory() < 0) {
    errno = ENOENT;
    return -1;
  }
  return openat(shm_directory(), name.c_str() + 1, flags | O_NOFOLLOW | O_CLOEXEC, mode);
}
void unlink_segment(const std::string& name) {
  if (shm_directory() >= 0) unlinkat(shm_directory(), name.c_str() + 1, 0);
}

}  // namespace

ShmRing::ShmRing(const ShmRingOptions& options) : opts_(options) {
  opts_.slot_bytes = std::max<uint64_t>(64, opts_.slot_bytes / 64 * 64);
  // Two at least: a member frees message k of its predecessor only after writing its
  // own message k + 1, so with one slot each the ring would wait on itself.
  opts_.slots = std::max(2, opts_.slots);
  name_ = shm_ring_segment_name(opts_.group);
}

ShmRing::~ShmRing() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  if (seg_) munmap(seg_, mapped_bytes_);
  // Never all there (a failed join): take the name away so that nothing leaks.
  if (!unlinked_) unlink_segment(name_);
}

std::string ShmRing::where() const {
  return cat("shm allreduce in group '", opts_.group, "' (rank ", opts_.rank, " of ", opts_.size, "): ");
}

uint8_t* ShmRing::outbox(int m, uint32_t seq) const {
  uint64_t slot = uint64_t(m) * opts_.slots + seq % static_cast<uint32_t>(opts_.slots);
  return reinterpret_cast<uint8_t*>(seg_) + seg_->data_offset + slot * opts_.slot_bytes;
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::join(const ShmRingOptions& options) {
  std::unique_ptr<ShmRing> ring(new ShmRing(options));
  if (options.group.empty() || options.size < 1 || options.rank < 0 || options.rank >= options.size)
    return absl::InvalidArgumentError(cat(ring->where(), "needs a group name and 0 <= rank < size"));
  if (absl::Status st = ring->attach(); !st.ok()) return st;
  if (absl::Status st = ring->await_members(); !st.ok()) return st;
  return ring;
}

// Creates the segment, or opens the one a faster member created and waits until its
// creator has laid it out.
absl::Status ShmRing::attach() {
  const Layout want = layout_for(opts_.size, opts_.slots, opts_.slot_bytes);
  const Clock::time_point deadline = Clock::now() + opts_.timeout;
  auto past_deadline = [&] { return Clock::now() >= deadline; };
  auto unavailable = [&](const std::string& what) {
    return absl::UnavailableError(cat(where(), "segment ", name_, ": ", what));
  };
  int fd = -1;
  bool creator = false;
  while (fd < 0) {
    fd = open_segment(name_, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      creator = true;
      break;
    }
    if (errno != EEXIST) return unavailable(errno_text("open"));
    fd = open_segment(name_, O_RDWR, 0);
    if (fd < 0 && errno != ENOENT) return unavailable(errno_text("open"));
    if (fd < 0 && past_deadline()) return unavailable("it keeps disappearing");  // unlinked under us: retry
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};

  if (creator) {
    // fallocate, not ftruncate: tmpfs pages are reserved now, so a full /dev/shm is an
    // error here instead of a SIGBUS in the middle of the allreduce.
    if (int err = posix_fallocate(fd, 0, static_cast<off_t>(want.total)); err != 0) {
      unlink_segment(name_);
      unlinked_ = true;
      return absl::ResourceExhaustedError(
          cat(where(), "cannot reserve ", want.total, " bytes of shared memory: ", std::strerror(err)));
    }
  } else {
    struct stat st {};
    for (;;) {  // the creator reserves the memory right after creating the name
      if (fstat(fd, &st) != 0) return unavailable(errno_text("fstat"));
      if (st.st_size > 0) break;
      if (past_deadline()) return absl::DeadlineExceededError(cat(where(), "segment ", name_, " was never laid out"));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (static_cast<uint64_t>(st.st_size) != want.total)
      return absl::InvalidArgumentError(cat(where(), "the members disagree on the group: its segment has ",
                                            st.st_size, " bytes, this member expects ", want.total,
                                            " (another size, slot count or slot size)"));
  }
  void* p = mmap(nullptr, want.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return unavailable(errno_text("mmap"));
  mapped_bytes_ = want.total;
  seg_ = static_cast<Segment*>(p);

  if (creator) {
    Segment* s = new (p) Segment();
    s->version = kVersion;
    s->size = opts_.size;
    s->slots = opts_.slots;
    s->slot_bytes = opts_.slot_bytes;
    s->total_bytes = want.total;
    s->members_offset = want.members_offset;
    s->data_offset = want.data_offset;
    std::strncpy(s->group, opts_.group.c_str(), kGroupChars - 1);
    for (int i = 0; i < opts_.size; ++i) new (&member_at(s, i)) Member();
    s->magic.store(kMagic, std::memory_order_release);
  } else {
    while (seg_->magic.load(std::memory_order_acquire) != kMagic) {
      if (past_deadline()) return absl::DeadlineExceededError(cat(where(), "segment ", name_, " was never initialized"));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (seg_->version != kVersion || seg_->size != uint32_t(opts_.size) || seg_->slots != uint32_t(opts_.slots) ||
        seg_->slot_bytes != opts_.slot_bytes || opts_.group.compare(0, kGroupChars - 1, seg_->group) != 0)
      return fail(absl::StatusCode::kInvalidArgument,
                  cat("the members disagree on the group: rank ", opts_.rank, " joins with size ", opts_.size,
                      ", the segment was made for size ", seg_->size));
  }

  int32_t none = 0;
  Member& me = member_at(seg_, opts_.rank);
  if (!me.pid.compare_exchange_strong(none, static_cast<int32_t>(getpid())))
    return fail(absl::StatusCode::kInvalidArgument, cat("rank ", opts_.rank, " is taken twice (pids ", none, " and ", getpid(), ")"));
  bump(seg_->joined);
  pidfds_.assign(opts_.size, -2);  // -2: not opened yet
  pids_.assign(opts_.size, 0);
  return absl::OkStatus();
}

absl::Status ShmRing::await_members() {
  absl::Status st = wait_for(seg_->joined, static_cast<uint32_t>(opts_.size), -1, "join");
  if (!st.ok()) return st;
  // Everyone has the segment mapped: the name is no longer needed, and without it a
  // crash from here on leaks nothing. Every member unlinks; all but one get ENOENT.
  unlink_segment(name_);
  unlinked_ = true;
  return check_peers();
}

// Dead peers: a pidfd polls readable once its process has exited (even before it is
// reaped); kill(pid, 0) is the fallback where pidfd_open is missing. A peer that died
// after finishing the allreduce in progress owes us nothing more (its outbox is in the
// segment, which outlives it), so only one that had not finished fails the group; its
// absence from the next call is caught there.
absl::Status ShmRing::check_peers() {
  for (int q = 0; q < opts_.size; ++q) {
    if (q == opts_.rank) continue;
    if (pids_[q] == 0) pids_[q] = member_at(seg_, q).pid.load(std::memory_order_acquire);
    if (pids_[q] == 0) continue;  // not joined yet
    if (pidfds_[q] == -2) pidfds_[q] = shm::pidfd_open(pids_[q]);  // -1 (gone already, or no pidfd): kill(pid, 0)
    bool dead = shm::process_exited(pidfds_[q], pids_[q]);
    if (dead && ops_ > 0 && reached(member_at(seg_, q).finished.value.load(std::memory_order_acquire), ops_)) dead = false;
    if (dead) return fail(absl::StatusCode::kUnavailable, cat("rank ", q, " (pid ", pids_[q], ") died"));
  }
  if (opts_.cancelled && opts_.cancelled())
    return fail(absl::StatusCode::kCancelled, cat("rank ", opts_.rank, " was cancelled by its caller"));
  return absl::OkStatus();
}

// Records the first failure in the segment for everyone (a later one only adopts it) and
// wakes every sleeper so that the others fail now, not at their timeout.
absl::Status ShmRing::fail(absl::StatusCode code, const std::string& reason) {
  if (!failure_.ok()) return failure_;
  uint32_t none = 0;
  if (!seg_->abort_owner.compare_exchange_strong(none, opts_.rank + 1)) return failure_from_abort();
  seg_->abort_code = static_cast<int32_t>(code);
  std::strncpy(seg_->abort_reason, reason.c_str(), kReasonChars - 1);
  seg_->abort_ready.store(1, std::memory_order_release);
  futex_wake_all(&seg_->joined.value);
  for (uint32_t i = 0; i < seg_->size; ++i) {
    Member& m = member_at(seg_, i);
    futex_wake_all(&m.ops.value);
    futex_wake_all(&m.produced.value);
    futex_wake_all(&m.consumed.value);
  }
  failure_ = absl::Status(code, cat(where(), reason));
  return failure_;
}

absl::Status ShmRing::failure_from_abort() {
  if (!failure_.ok()) return failure_;
  uint32_t owner = seg_->abort_owner.load(std::memory_order_acquire);
  Clock::time_point until = Clock::now() + std::chrono::milliseconds(100);
  while (!seg_->abort_ready.load(std::memory_order_acquire) && Clock::now() < until) std::this_thread::yield();
  if (!seg_->abort_ready.load(std::memory_order_acquire)) {
    failure_ = absl::UnavailableError(cat(where(), "rank ", owner - 1, " aborted the group"));
    return failure_;
  }
  auto code = static_cast<absl::StatusCode>(seg_->abort_code);
  // A peer's cancellation is, for everyone else, a peer that went away.
  if (code == absl::StatusCode::kCancelled) code = absl::StatusCode::kUnavailable;
  failure_ = absl::Status(code, cat(where(), std::string(seg_->abort_reason, strnlen(seg_->abort_reason, kReasonChars)),
                                    " (seen by rank ", owner - 1, ")"));
  return failure_;
}

// Waits until c >= target (mod 2^32). `peer` is whom we wait for (-1: the join), `what`
// says for what, both for the message if it never comes.
absl::Status ShmRing::wait_for(Counter& c, uint32_t target, int peer, const std::string& what) {
  for (int i = 0; i < kSpins; ++i) {
    if (reached(c.value.load(std::memory_order_acquire), target)) return absl::OkStatus();
    cpu_relax();
  }
  const Clock::time_point start = Clock::now(), deadline = start + opts_.timeout;
  Clock::time_point next_check = start;
  for (int round = 0;; ++round) {
    if (reached(c.value.load(std::memory_order_acquire), target)) return absl::OkStatus();
    if (seg_->abort_owner.load(std::memory_order_acquire) != 0) return failure_from_abort();
    Clock::time_point now = Clock::now();
    if (now >= next_check) {
      if (absl::Status st = check_peers(); !st.ok()) return st;
      next_check = now + kPeerCheckEvery;
    }
    if (now >= deadline) {
      std::string whom;
      if (peer >= 0) {
        whom = cat("rank ", peer, " (pid ", member_at(seg_, peer).pid.load(), ")");
      } else {
        std::vector<int> missing;
        for (int q = 0; q < opts_.size; ++q)
          if (member_at(seg_, q).pid.load() == 0) missing.push_back(q);
        whom = missing.empty() ? std::string("the group")
                               : cat(missing.size() == 1 ? "rank " : "ranks ", uop::join(missing, ", "));
      }
      return fail(absl::StatusCode::kDeadlineExceeded,
                  cat("timed out after ", static_cast<int64_t>(opts_.timeout.count()), " ms waiting for ", whom, " to ", what));
    }
    if (round < kYields) {
      sched_yield();
      continue;
    }
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    uint32_t v = c.value.load(std::memory_order_seq_cst);
    if (!reached(v, target)) futex_wait(&c.value, v, kFutexSlice);
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

absl::Status ShmRing::allreduce(void* data, uint64_t elements, ReduceOp op, Scalar dtype,
                                std::span<const uint64_t> parts) {
  if (!failure_.ok()) return failure_;
  const int n = opts_.size, r = opts_.rank;
  // The ring parts: given, or ring_part's. FNV-1a of the given sizes goes with the call's
  // description, so that members laying out a bucket differently disagree instead of
  // mixing their elements.
  std::vector<RingPart> part(n);
  uint64_t layout = 0;
  if (!parts.empty()) {
    if (parts.size() != static_cast<size_t>(n))
      return fail(absl::StatusCode::kInvalidArgument, cat("rank ", r, ": ", parts.size(), " ring parts for a group of ", n));
    uint64_t at = 0;
    layout = 1469598103934665603ull;
    for (int j = 0; j < n; ++j) {
      if (parts[j] > elements - at)
        return fail(absl::StatusCode::kInvalidArgument, cat("rank ", r, ": ring parts past the ", elements, " elements"));
      part[j] = {at, parts[j]};
      at += parts[j];
      layout = (layout ^ parts[j]) * 1099511628211ull;
    }
    if (at != elements)
      return fail(absl::StatusCode::kInvalidArgument, cat("rank ", r, ": ring parts of ", at, " elements for ", elements));
    layout |= 1;  // never 0, which means ring_part's
  } else {
    for (int j = 0; j < n; ++j) part[j] = ring_part(elements, n, j);
  }
  auto combine = combine_function(op, dtype);
  if (!combine.ok()) return fail(absl::StatusCode::kInvalidArgument, cat("rank ", r, ": ", combine.status().message()));
  const uint64_t esize = static_cast<uint64_t>(scalar_bytes(dtype));
  if (elements > UINT64_MAX / esize)
    return fail(absl::StatusCode::kInvalidArgument, cat("rank ", r, ": ", elements, " elements overflow"));
  if (n == 1) return absl::OkStatus();

  // Every member publishes what it is about to do and checks that the others agree.
  const uint32_t k = ops_++;
  OpDesc mine{};  // zeroed padding: descriptions are compared bytewise
  mine.elements = elements;
  mine.op = static_cast<uint32_t>(op);
  mine.dtype = static_cast<uint32_t>(dtype);
  mine.layout = layout;
  Member& me = member_at(seg_, r);
  me.desc[k % 2] = mine;
  publish(me.ops, k + 1);
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    Member& m = member_at(seg_, q);
    if (absl::Status st = wait_for(m.ops, k + 1, q, cat("start allreduce #", k)); !st.ok()) return st;
    const OpDesc theirs = m.desc[k % 2];
    if (std::memcmp(&theirs, &mine, sizeof mine) != 0)
      return fail(absl::StatusCode::kInvalidArgument, cat("the members disagree: rank ", q, " reduces ",
                                                          describe_op(theirs), ", rank ", r, " ", describe_op(mine)));
  }

  uint8_t* local = static_cast<uint8_t*>(data);
  const int succ = (r + 1) % n, pred = (r + n - 1) % n;
  Member& next = member_at(seg_, succ);
  Member& prev = member_at(seg_, pred);
  const uint64_t chunk = std::max<uint64_t>(1, opts_.slot_bytes / esize);
  uint64_t largest = 0;
  for (const RingPart& p : part) largest = std::max(largest, p.count);
  const uint64_t messages = (largest + chunk - 1) / chunk;
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  auto piece = [&](RingPart p, uint64_t m) -> RingPart {
    uint64_t begin = std::min(p.count, m * chunk);
    return {p.offset + begin, std::min(chunk, p.count - begin)};
  };

  // Chunk m goes through all 2 (n - 1) steps before chunk m + 1 starts, so what arrives
  // at step s is combined (or copied) straight into the outbox slot of step s + 1 while
  // it is in cache: a reduce-scatter step that is not the last never writes the local
  // buffer, and no part is read back from memory to be sent on. Message (step s, chunk m)
  // is sequence number m * steps + s for every member.
  const int steps = 2 * (n - 1);
  auto part_at = [&](int step, bool receiving) {
    const bool scatter = step < n - 1;
    const int t = scatter ? step : step - (n - 1);
    if (scatter) return part[receiving ? mod(r - t - 1) : mod(r - t)];
    return part[receiving ? mod(r - t) : mod(r + 1 - t)];
  };
  auto free_slot = [&](uint32_t seq) {
    return wait_for(next.consumed, seq + 1 - static_cast<uint32_t>(opts_.slots), succ,
                    cat("free an outbox slot (message ", seq, ")"));
  };
  for (uint64_t m = 0; m < messages; ++m) {
    {  // step 0 sends a piece of our own input
      const uint32_t seq = sent_;
      if (absl::Status st = free_slot(seq); !st.ok()) return st;
      RingPart out = piece(part_at(0, false), m);
      if (out.count) std::memcpy(outbox(r, seq), local + out.offset * esize, out.count * esize);
      publish(me.produced, sent_ = seq + 1);
    }
    for (int step = 0; step < steps; ++step) {
      const uint32_t rseq = received_;
      if (absl::Status st = wait_for(prev.produced, rseq + 1, pred, cat("send message ", rseq)); !st.ok()) return st;
      const bool forward = step + 1 < steps;  // what arrives is what step + 1 sends
      const uint32_t seq = sent_;
      if (forward)
        if (absl::Status st = free_slot(seq); !st.ok()) return st;
      const RingPart in = piece(part_at(step, true), m);
      const uint8_t* from = outbox(pred, rseq);
      uint8_t* dst = local + in.offset * esize;
      uint8_t* fwd = forward ? outbox(r, seq) : nullptr;
      if (in.count) {
        const uint64_t bytes = in.count * esize;
        if (step < n - 1) {  // reduce-scatter: our value op the running one (steps < 2 (n - 1), so fwd is set)
          (*combine)(fwd, dst, from, in.count);
          if (step == n - 2) std::memcpy(dst, fwd, bytes);  // the part is final here: keep it
        } else {             // all-gather: a final part, kept and passed on
          std::memcpy(dst, from, bytes);
          if (fwd) std::memcpy(fwd, dst, bytes);
        }
      }
      if (forward) publish(me.produced, sent_ = seq + 1);
      publish(me.consumed, received_ = rseq + 1);
    }
  }
  publish(me.finished, k + 1);
  return absl::OkStatus();
}

absl::Status shm_allreduce(const ShmRingOptions& options, void* data, uint64_t elements, ReduceOp op, Scalar dtype) {
  auto ring = ShmRing::join(options);
  if (!ring.ok()) return ring.status();
  return (*ring)->allreduce(data, elements, op, dtype);
}

}  // namespace uop
