// The execute lane (transport/exec_lane.h) between real processes: uopd's end in the test
// process (create, set_peer, claim, call), the worker's end in a forked child that
// attaches to the inherited descriptor and serves it. What the tests guard: replies match
// their requests at every size up to a slot, also with many callers on few slots; the
// handler's failures come back as sent; a dead worker fails its calls with UNAVAILABLE at
// once; a deadline leaves the slot to the worker, which frees it when done; neither end
// trusts the other's lengths or codes; attach() refuses what is no lane; stop() returns.
//
// Every fork happens before the test process starts any thread of its own. A child uses
// only the lane, reports through a MAP_SHARED page (Board) or its exit code, and leaves
// with _exit(). No test asserts how fast anything is: every wait is bounded generously (so
// a hang fails the test instead of the ctest timeout) and only ends on a condition.
//
// A few tests write the segment directly, as a lying peer would: they mirror the layout
// of exec_lane.cc (MirrorHeader, MirrorSlot), and LayoutMirrorMatchesCreate checks that
// mirror against a lane create() made, so a layout change fails there first.
#include "transport/exec_lane.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "transport/shm_sync.h"

namespace uop {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr seconds kBound{30};  // how long any wait may take before the test calls it a hang

// Polls `done` every millisecond until it holds (true) or `limit` passed (false).
bool wait_until(const std::function<bool()>& done, std::chrono::steady_clock::duration limit = kBound) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

absl::Time far_deadline() { return absl::Now() + absl::Seconds(60); }

// What the test process and its worker child both see: a MAP_SHARED anonymous page mapped
// before the fork. The fields are flags and counters; each test uses the ones it needs.
struct Board {
  std::atomic<int> attached{0};          // the worker's attach() returned its end
  std::atomic<int> handled{0};           // handler calls, counted by the worker
  std::atomic<int> started{0};           // a handler that blocks has begun
  std::atomic<int> saw_abandoned{0};     // 1: abandoned() turned true; 2: it never did
  std::atomic<int> release{0};           // set by the test: a blocked handler may return
  std::atomic<int> go{0};                // set by the test: the worker may serve
  std::atomic<int> stop_now{0};          // set by the test: the worker calls stop()
  std::atomic<int> stopped{0};           // stop() returned in the worker
  std::atomic<int> quit{0};              // set by the test: the worker exits
  std::atomic<int> in_flight_before{-1};  // the worker's in_flight() just before stop()
  std::atomic<int> in_flight_after{-1};   // and just after
};
static_assert(std::atomic<int>::is_always_lock_free);

class SharedBoard {
 public:
  SharedBoard() {
    void* p = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    board_ = p == MAP_FAILED ? nullptr : new (p) Board;
  }
  ~SharedBoard() {
    if (board_) munmap(board_, sizeof(Board));
  }
  SharedBoard(const SharedBoard&) = delete;
  SharedBoard& operator=(const SharedBoard&) = delete;
  Board* operator->() const { return board_; }
  Board* get() const { return board_; }

 private:
  Board* board_ = nullptr;
};

// Waits for the child `pid` to exit; its exit code, or -1 when it hung (then it is killed)
// or died of a signal.
int join_child(pid_t pid, std::chrono::steady_clock::duration limit = kBound) {
  int status = 0;
  const bool exited = wait_until([&] { return waitpid(pid, &status, WNOHANG) == pid; }, limit);
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  return exited && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Exit codes of the worker child that are not the body's own.
constexpr int kAttachFailed = 90;
constexpr int kServeFailed = 91;
constexpr int kOrphaned = 92;
constexpr int kGateNeverOpened = 93;
constexpr int kNeverQuit = 94;

// The worker's end in a forked child: it attaches to a duplicate of the lane's descriptor,
// optionally waits for `gate`, serves with `handler`, then runs `body` (default: wait for
// board->quit) and stops the lane; the body's result is the exit code. Killed with the
// test, and by the destructor if still there.
class Worker {
 public:
  Worker(const ExecLane& lane, ExecLane::Handler handler, Board* board,
         std::function<int(ExecLane&)> body = {}, std::atomic<int>* gate = nullptr) {
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ != 0) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(kOrphaned);
    auto attached = ExecLane::attach(dup(lane.fd()));
    if (!attached.ok()) _exit(kAttachFailed);
    ExecLane& mine = **attached;
    board->attached = 1;
    if (gate && !wait_until([&] { return gate->load() != 0; }, std::chrono::minutes(2))) _exit(kGateNeverOpened);
    if (!mine.serve(std::move(handler)).ok()) _exit(kServeFailed);
    int rc = body ? body(mine) : (wait_until([&] { return board->quit.load() != 0; }, std::chrono::minutes(2))
                                      ? 0
                                      : kNeverQuit);
    mine.stop();
    _exit(rc);
  }
  ~Worker() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  pid_t pid() const { return pid_; }

  // Waits for the child to exit: see join_child().
  int join(std::chrono::steady_clock::duration limit = kBound) { return join_child(std::exchange(pid_, -1), limit); }

 private:
  pid_t pid_ = -1;
};

std::shared_ptr<ExecLane> make_lane(uint32_t slots, uint64_t slot_bytes) {
  auto lane = ExecLane::create({.slots = slots, .slot_bytes = slot_bytes});
  EXPECT_TRUE(lane.ok()) << lane.status();
  return lane.ok() ? *lane : nullptr;
}

// A free slot within the bound (callers spin on claim() while others hold every slot).
std::optional<ExecLane::Call> claim_within(ExecLane& lane, int* misses = nullptr) {
  const auto give_up = std::chrono::steady_clock::now() + kBound;
  for (;;) {
    if (auto c = lane.claim()) return c;
    if (misses) ++*misses;
    if (std::chrono::steady_clock::now() > give_up) return std::nullopt;
    std::this_thread::yield();
  }
}

// Claims every slot it can, then frees them all again: how many were free.
uint32_t count_claimable(ExecLane& lane) {
  std::vector<std::optional<ExecLane::Call>> held;
  while (auto c = lane.claim()) held.push_back(std::move(c));
  return static_cast<uint32_t>(held.size());
}

// One call from claim to reply, the reply copied out (the Call goes with this function).
absl::StatusOr<std::string> call_once(ExecLane& lane, std::string_view request, absl::Time deadline) {
  auto c = claim_within(lane);
  if (!c) return absl::ResourceExhaustedError("no slot came free within the bound");
  if (request.size() > c->request().size()) return absl::InternalError("test bug: request over capacity");
  std::memcpy(c->request().data(), request.data(), request.size());
  auto r = c->call(request.size(), deadline);
  if (!r.ok()) return r.status();
  return std::string(*r);
}

// The test process's end sees its worker serve, within the bound.
::testing::AssertionResult wait_served(ExecLane& lane) {
  if (wait_until([&] { return lane.served(); })) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the worker never announced that it serves the lane";
}

// Deterministic bytes, zeros included, different for every (seed, index).
char byte_at(uint64_t seed, uint64_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<char>(x * 0x94d049bb133111ebull >> 56);
}

// ---- exec_lane.cc's layout, mirrored for the tests that write the segment as a lying peer would

constexpr uint64_t kPage = 4096;
constexpr uint64_t kMagic = 0x656e616c646f7075ULL;  // "uopdlane"
struct MirrorHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint64_t slot_bytes;
  uint64_t stride;
  std::atomic<int32_t> server_pid;
};
struct alignas(64) MirrorSlot {
  std::atomic<uint32_t> state;
  int32_t code;
  uint64_t request_bytes;
  uint64_t reply_bytes;
  int64_t deadline_ns;
};
static_assert(sizeof(MirrorSlot) == 64);
enum : uint32_t { kFree = 0, kClaimed = 1, kReady = 2, kRunning = 3, kDone = 4, kAbandoned = 5 };

uint64_t stride_for(uint64_t slot_bytes) { return (sizeof(MirrorSlot) + slot_bytes + kPage - 1) / kPage * kPage; }

// A second MAP_SHARED mapping of a descriptor, whole.
class Mapping {
 public:
  explicit Mapping(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0) return;
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return;
    base_ = static_cast<char*>(p);
    size_ = static_cast<size_t>(st.st_size);
  }
  ~Mapping() {
    if (base_) munmap(base_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  bool ok() const { return base_ != nullptr; }
  size_t size() const { return size_; }
  MirrorHeader& header() const { return *reinterpret_cast<MirrorHeader*>(base_); }
  MirrorSlot& slot(uint32_t i) const {
    return *reinterpret_cast<MirrorSlot*>(base_ + kPage + i * header().stride);
  }
  char* data(uint32_t i) const { return reinterpret_cast<char*>(&slot(i)) + sizeof(MirrorSlot); }

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
};

// ---- the fixture: a board, a lane, and (for the tests that start one) its worker

// Every test has a board (the page is mapped before any fork) and may keep its lane in
// `lane`. start() or serve() forks the worker in the test body, before the test starts any
// thread of its own. A test that still has its worker at the end, without a fatal failure,
// ends it the usual way: board->quit, and the worker exits 0. A test that ends its worker
// otherwise (killed, stopped, a body that returns by itself) joins it itself, and the
// teardown leaves it be; after a fatal failure the Worker's destructor kills it.
class ExecLaneTest : public ::testing::Test {
 protected:
  // Makes the lane and forks its worker (see Worker), without telling the lane its peer.
  ::testing::AssertionResult start(uint32_t slots, uint64_t slot_bytes, ExecLane::Handler handler,
                                   std::function<int(ExecLane&)> body = {}, std::atomic<int>* gate = nullptr) {
    if (!b) return ::testing::AssertionFailure() << "the board could not be mapped";
    lane = make_lane(slots, slot_bytes);
    if (!lane) return ::testing::AssertionFailure() << "no lane of " << slots << " slots of " << slot_bytes;
    worker.emplace(*lane, std::move(handler), b, std::move(body), gate);
    return ::testing::AssertionSuccess();
  }
  // start(), then the worker is the lane's peer and serves it.
  ::testing::AssertionResult serve(uint32_t slots, uint64_t slot_bytes, ExecLane::Handler handler,
                                   std::function<int(ExecLane&)> body = {}) {
    if (auto started = start(slots, slot_bytes, std::move(handler), std::move(body)); !started) return started;
    lane->set_peer(worker->pid());
    return wait_served(*lane);
  }
  // A handler that counts its calls and replies with the request.
  ExecLane::Handler counting_echo() const {
    return [b = b](std::string_view request, std::span<char> reply, const std::function<bool()>&, absl::Time) -> absl::StatusOr<size_t> {
      b->handled.fetch_add(1);
      const std::string copy(request);
      std::memcpy(reply.data(), copy.data(), copy.size());
      return copy.size();
    };
  }

  void TearDown() override {
    if (worker && worker->pid() > 0 && !HasFatalFailure()) {
      b->quit = 1;
      EXPECT_EQ(worker->join(), 0) << "the worker failed a check or hung";
    }
  }

  SharedBoard board;
  Board* const b = board.get();
  std::shared_ptr<ExecLane> lane;
  std::optional<Worker> worker;  // after lane: goes (killed if still there) before it
};

// ---- creating, claiming, attaching: no worker needed

// create() takes 1 to 1024 slots of 1 byte to 1 GiB and refuses the rest; the defaults are
// 16 slots of 1 MiB; the descriptor is close-on-exec (a worker gets it on purpose, with
// --lane-fd, never by accident through another exec); a new lane is not served.
TEST_F(ExecLaneTest, CreateChecksTheLayout) {
  for (ExecLaneLayout bad : {ExecLaneLayout{.slots = 0, .slot_bytes = 4096}, ExecLaneLayout{.slots = 1, .slot_bytes = 0},
                             ExecLaneLayout{.slots = 1025, .slot_bytes = 4096},
                             ExecLaneLayout{.slots = 1, .slot_bytes = (1ULL << 30) + 1},
                             ExecLaneLayout{.slots = UINT32_MAX, .slot_bytes = UINT64_MAX}}) {
    auto lane = ExecLane::create(bad);
    EXPECT_EQ(lane.status().code(), absl::StatusCode::kInvalidArgument)
        << bad.slots << " slots of " << bad.slot_bytes << ": " << lane.status();
  }

  auto defaults = ExecLane::create();
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ((*defaults)->slots(), 16u);
  EXPECT_EQ((*defaults)->capacity(), (1u << 20) + 4096);  // a 1 MiB chunk and its header
  const int flags = fcntl((*defaults)->fd(), F_GETFD);
  ASSERT_GE(flags, 0);
  EXPECT_TRUE(flags & FD_CLOEXEC);
  EXPECT_FALSE((*defaults)->served());

  // The largest of each: every one of 1024 slots can be claimed, then none.
  auto many = ExecLane::create({.slots = 1024, .slot_bytes = 1});
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ((*many)->slots(), 1024u);
  EXPECT_EQ((*many)->capacity(), 1u);
  EXPECT_EQ(count_claimable(**many), 1024u);
  auto big = ExecLane::create({.slots = 1, .slot_bytes = 1ULL << 30});
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ((*big)->capacity(), 1ULL << 30);
  auto c = (*big)->claim();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->request().size(), 1ULL << 30);
}

// claim() hands each slot to one call at a time: with every slot held it returns nullopt,
// and a slot comes back when its Call goes (claimed and never posted).
TEST_F(ExecLaneTest, ClaimHandsOutEachSlotOnce) {
  lane = make_lane(4, 1000);
  ASSERT_TRUE(lane);
  std::vector<std::optional<ExecLane::Call>> held;
  std::vector<char*> buffers;
  for (int i = 0; i < 4; ++i) {
    held.push_back(lane->claim());
    ASSERT_TRUE(held.back().has_value()) << "slot " << i;
    EXPECT_EQ(held.back()->request().size(), 1000u);
    buffers.push_back(held.back()->request().data());
  }
  // Four different slots: four different buffers, none overlapping.
  std::sort(buffers.begin(), buffers.end());
  for (int i = 1; i < 4; ++i) EXPECT_GE(buffers[i] - buffers[i - 1], 1000);
  EXPECT_FALSE(lane->claim().has_value());
  EXPECT_FALSE(lane->claim().has_value());
  char* const second = held[1]->request().data();
  held[1].reset();
  auto again = lane->claim();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->request().data(), second);
  EXPECT_FALSE(lane->claim().has_value());
  held.clear();
  again.reset();
  EXPECT_EQ(count_claimable(*lane), 4u);
}

// The mirror of exec_lane.cc's layout that later tests write through matches a lane that
// create() made: header fields, where each slot's control block and data lie, the state a
// claim leaves. If this fails, fix the mirror before believing the tests that use it.
TEST_F(ExecLaneTest, LayoutMirrorMatchesCreate) {
  lane = make_lane(3, 10000);
  ASSERT_TRUE(lane);
  Mapping m(lane->fd());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m.size(), kPage + 3 * stride_for(10000));
  EXPECT_EQ(m.header().magic, kMagic);
  EXPECT_EQ(m.header().version, 2u);
  EXPECT_EQ(m.header().slots, 3u);
  EXPECT_EQ(m.header().slot_bytes, 10000u);
  EXPECT_EQ(m.header().stride, stride_for(10000));
  EXPECT_EQ(m.header().server_pid.load(), 0);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(m.slot(i).state.load(), kFree) << "slot " << i;

  auto c = lane->claim();
  ASSERT_TRUE(c.has_value());
  int claimed = -1;
  for (uint32_t i = 0; i < 3; ++i)
    if (m.slot(i).state.load() == kClaimed) {
      EXPECT_EQ(claimed, -1) << "two slots claimed by one claim()";
      claimed = static_cast<int>(i);
    }
  ASSERT_GE(claimed, 0);
  std::memcpy(c->request().data(), "mirror", 6);
  EXPECT_EQ(std::string(m.data(claimed), 6), "mirror");
  c.reset();
  EXPECT_EQ(m.slot(claimed).state.load(), kFree);
}

// attach() maps a real lane (whose layout it reports) and refuses, with INVALID_ARGUMENT,
// anything else: a bad or non-mappable descriptor, a file too small, a header of another
// magic or version, a layout that is impossible or larger than the file. The lane owns the
// descriptor either way: closed with the lane, or at once when refused.
TEST_F(ExecLaneTest, AttachRefusesWhatIsNoLane) {
  lane = make_lane(2, 4096);
  ASSERT_TRUE(lane);
  auto expect_refused = [](int fd, const std::string& what) {
    auto a = ExecLane::attach(fd);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << what << ": " << a.status();
    if (fd >= 0) {
      EXPECT_EQ(fcntl(fd, F_GETFD), -1) << what << ": the refused descriptor stays open";
    }
  };
  auto expect_attaches = [&](const std::string& what) {
    const int fd = dup(lane->fd());
    auto a = ExecLane::attach(fd);
    ASSERT_TRUE(a.ok()) << what << ": " << a.status();
    EXPECT_EQ((*a)->slots(), 2u);
    EXPECT_EQ((*a)->capacity(), 4096u);
    EXPECT_EQ((*a)->fd(), fd);
    a->reset();
    EXPECT_EQ(fcntl(fd, F_GETFD), -1) << what << ": the lane did not close its descriptor";
  };
  expect_attaches("the lane as created");

  // Its header corrupted one field at a time, through a second mapping, then restored.
  Mapping m(lane->fd());
  ASSERT_TRUE(m.ok());
  MirrorHeader& h = m.header();
  const MirrorHeader saved{h.magic, h.version, h.slots, h.slot_bytes, h.stride, {}};
  auto restore = [&] {
    h.magic = saved.magic;
    h.version = saved.version;
    h.slots = saved.slots;
    h.slot_bytes = saved.slot_bytes;
    h.stride = saved.stride;
  };
  struct Corruption {
    const char* what;
    std::function<void()> apply;
  };
  const Corruption corruptions[] = {
      {"wrong magic", [&] { h.magic ^= 1; }},
      {"zeroed header", [&] { h.magic = 0; h.version = 0; h.slots = 0; h.slot_bytes = 0; h.stride = 0; }},
      {"version 1", [&] { h.version = 1; }},
      {"version 3", [&] { h.version = 3; }},
      {"0 slots", [&] { h.slots = 0; }},
      {"3 slots in a file of 2", [&] { h.slots = 3; }},
      {"1025 slots", [&] { h.slots = 1025; }},
      {"slots beyond any file", [&] { h.slots = UINT32_MAX; }},
      {"0-byte slots", [&] { h.slot_bytes = 0; }},
      {"a slot size its stride does not match", [&] { h.slot_bytes = 1; }},
      {"2 GiB slots", [&] { h.slot_bytes = 1ULL << 31; h.stride = stride_for(1ULL << 31); }},
      {"a stride that overlaps slots", [&] { h.stride = 4096; }},
      {"a stride of zero", [&] { h.stride = 0; }},
      {"slots that overflow the file", [&] { h.slot_bytes = 8192; h.stride = stride_for(8192); }},
  };
  for (const Corruption& c : corruptions) {
    c.apply();
    expect_refused(dup(lane->fd()), c.what);
    restore();
  }
  expect_attaches("the lane restored");

  // Files that are too small: empty, less than the header page, one slot's worth while the
  // header says two.
  for (off_t size : {off_t{0}, off_t{100}, off_t{kPage - 1}, off_t(kPage + stride_for(4096))}) {
    const int fd = memfd_create("not-a-lane", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, size), 0);
    if (size >= static_cast<off_t>(sizeof(MirrorHeader))) {
      ASSERT_EQ(pwrite(fd, &h, sizeof(MirrorHeader), 0), ssize_t(sizeof(MirrorHeader)));
    }
    expect_refused(fd, "a file of " + std::to_string(size) + " bytes");
  }

  // A page of garbage of the right size.
  {
    const int fd = memfd_create("garbage", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    std::string junk(m.size(), '\0');
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = byte_at(7, i);
    ASSERT_EQ(pwrite(fd, junk.data(), junk.size(), 0), ssize_t(junk.size()));
    expect_refused(fd, "garbage");
  }

  // Descriptors that are no lane at all: none, a pipe, the lane read-only (no shared
  // writable mapping).
  expect_refused(-1, "descriptor -1");
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  close(pipe_fds[1]);
  expect_refused(pipe_fds[0], "a pipe");
  const int read_only = open(("/proc/self/fd/" + std::to_string(lane->fd())).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(read_only, 0);
  expect_refused(read_only, "the lane opened read-only");

  expect_attaches("the lane after all that");
}

// ---- with a worker process

// served() is true only once the peer uopd was given announced that it serves the lane:
// not before (attach() alone announces nothing), and not for another pid.
TEST_F(ExecLaneTest, ServedOnlyByThePeerThatServes) {
  ASSERT_TRUE(start(
      1, 64, [](std::string_view, std::span<char>, const std::function<bool()>&, absl::Time) -> absl::StatusOr<size_t> { return 0; },
      {}, &board->go));
  EXPECT_FALSE(lane->served()) << "served before set_peer";
  lane->set_peer(worker->pid());
  EXPECT_FALSE(lane->served()) << "served before the worker called serve()";
  // The worker has attached and waits at the gate, so the lane is mapped on both ends and
  // only serve() is missing.
  ASSERT_TRUE(wait_until([&] { return b->attached.load() != 0; })) << "the worker never attached";
  EXPECT_FALSE(lane->served()) << "served after attach() alone";
  board->go = 1;
  ASSERT_TRUE(wait_served(*lane));
  lane->set_peer(getpid());
  EXPECT_FALSE(lane->served()) << "served by a pid that is not the one serving";
  lane->set_peer(worker->pid());
  EXPECT_TRUE(lane->served());
}

// Requests of every size from 0 bytes to exactly capacity() (a capacity that is no whole
// number of pages, sizes around the page boundaries of the data) reach the handler intact
// and its replies come back intact: the handler sends the request reversed and scrambled,
// so a reply that is the request left in place, or a stale one, does not pass. Three rounds
// reuse every slot. A caller that waits sees abandoned() false.
TEST_F(ExecLaneTest, RoundTripsRequestsOfEverySize) {
  constexpr uint64_t kCap = 10000;
  ASSERT_TRUE(serve(
      2, kCap,
      [b = b](std::string_view request, std::span<char> reply, const std::function<bool()>& abandoned, absl::Time deadline) -> absl::StatusOr<size_t> {
        b->handled.fetch_add(1);
        if (request == "abandoned?") {
          const std::string r = abandoned() ? "abandoned=1" : "abandoned=0";
          std::memcpy(reply.data(), r.data(), r.size());
          return r.size();
        }
        if (request == "deadline?") {  // what the worker end was told, in Unix nanoseconds
          const std::string r = std::to_string(absl::ToUnixNanos(deadline));
          std::memcpy(reply.data(), r.data(), r.size());
          return r.size();
        }
        if (reply.size() != kCap) return absl::InternalError("the reply span is not the slot");
        const std::string copy(request);  // the reply may share the request's bytes
        for (size_t i = 0; i < copy.size(); ++i) reply[i] = static_cast<char>(copy[copy.size() - 1 - i] ^ 0x5a);
        return copy.size();
      }));
  ASSERT_EQ(lane->capacity(), kCap);

  const size_t sizes[] = {0, 1, 2, 3, 17, 4031, 4032, 4033, 4095, 4096, 4097, 8127, 8128, 8129, kCap - 1, kCap};
  int calls = 0;
  for (int round = 0; round < 3; ++round)
    for (size_t n : sizes) {
      std::string request(n, '\0');
      for (size_t i = 0; i < n; ++i) request[i] = byte_at(round * 100000 + n, i);
      std::string want(n, '\0');
      for (size_t i = 0; i < n; ++i) want[i] = static_cast<char>(request[n - 1 - i] ^ 0x5a);
      auto got = call_once(*lane, request, far_deadline());
      ++calls;
      ASSERT_TRUE(got.ok()) << n << " bytes, round " << round << ": " << got.status();
      ASSERT_EQ(got->size(), n) << "round " << round;
      EXPECT_TRUE(*got == want) << n << " bytes, round " << round << ": the reply differs";
    }
  auto probe = call_once(*lane, "abandoned?", far_deadline());
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(*probe, "abandoned=0");
  // The request's deadline reaches the handler as uopd posted it.
  const absl::Time when = absl::FromUnixNanos(absl::ToUnixNanos(far_deadline()));
  auto told = call_once(*lane, "deadline?", when);
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_EQ(*told, std::to_string(absl::ToUnixNanos(when)));
  EXPECT_EQ(b->handled.load(), calls + 2);
  EXPECT_EQ(count_claimable(*lane), 2u);
}

// A handler's failure comes back with its code and message, every code from 1 to 16
// (UNAUTHENTICATED, the largest) included; an empty message stays empty; a message longer
// than the slot comes back cut to it; the slot then carries a good call.
TEST_F(ExecLaneTest, HandlerFailureComesBackAsSent) {
  constexpr uint64_t kCap = 32;
  const std::string long_message = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ";  // 46 > 32
  ASSERT_TRUE(serve(
      1, kCap,
      [&long_message](std::string_view request, std::span<char> reply, const std::function<bool()>&, absl::Time) -> absl::StatusOr<size_t> {
        if (request == "nf") return absl::NotFoundError("no buffer 7");
        if (request == "empty") return absl::PermissionDeniedError("");
        if (request == "long") return absl::AbortedError(long_message);
        if (request.size() == 1) {  // code by number
          const int code = static_cast<unsigned char>(request[0]);
          return absl::Status(static_cast<absl::StatusCode>(code), "code " + std::to_string(code));
        }
        std::memcpy(reply.data(), "fine", 4);
        return 4;
      }));

  auto nf = call_once(*lane, "nf", far_deadline());
  EXPECT_EQ(nf.status().code(), absl::StatusCode::kNotFound) << nf.status();
  EXPECT_EQ(nf.status().message(), "no buffer 7");

  auto empty = call_once(*lane, "empty", far_deadline());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kPermissionDenied) << empty.status();
  EXPECT_EQ(empty.status().message(), "");

  auto cut = call_once(*lane, "long", far_deadline());
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kAborted) << cut.status();
  EXPECT_EQ(cut.status().message(), long_message.substr(0, kCap));

  for (int code = 1; code <= 16; ++code) {
    auto r = call_once(*lane, std::string(1, static_cast<char>(code)), far_deadline());
    EXPECT_EQ(static_cast<int>(r.status().code()), code) << r.status();
    EXPECT_EQ(r.status().message(), "code " + std::to_string(code));
  }

  auto fine = call_once(*lane, "ok", far_deadline());
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(*fine, "fine");
}

// 8 threads x 200 calls on 4 slots: threads spin on claim() while the slots are busy, and
// every reply answers its own request (the thread, call number and a payload of its own
// length are in it), never another's; the worker handled each call exactly once; every
// slot is free afterwards.
TEST_F(ExecLaneTest, ManyThreadsFewSlotsNoCrossTalk) {
  ASSERT_TRUE(serve(
      4, 512,
      [b = b](std::string_view request, std::span<char> reply, const std::function<bool()>&, absl::Time) -> absl::StatusOr<size_t> {
        b->handled.fetch_add(1);
        const std::string copy(request);
        for (size_t i = 0; i < copy.size(); ++i) reply[i] = copy[copy.size() - 1 - i];
        reply[copy.size()] = '#';
        return copy.size() + 1;
      }));  // forked before any thread of this test

  constexpr int kThreads = 8, kCalls = 200;
  std::atomic<int> failures{0}, misses{0};
  std::mutex first_mutex;
  std::string first_failure;
  auto fail = [&](const std::string& what) {
    if (failures.fetch_add(1) == 0) {
      std::lock_guard<std::mutex> lock(first_mutex);
      first_failure = what;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      int my_misses = 0;
      for (int i = 0; i < kCalls; ++i) {
        std::string request = "t" + std::to_string(t) + ":" + std::to_string(i) + ":";
        const size_t payload = (t * 131 + i * 7) % 400;
        for (size_t k = 0; k < payload; ++k) request.push_back(byte_at(t * 1000 + i, k));
        std::string want(request.rbegin(), request.rend());
        want.push_back('#');
        auto c = claim_within(*lane, &my_misses);
        if (!c) {
          fail("no slot came free within the bound");
          return;
        }
        std::memcpy(c->request().data(), request.data(), request.size());
        auto got = c->call(request.size(), far_deadline());
        if (!got.ok()) {
          fail("thread " + std::to_string(t) + " call " + std::to_string(i) + ": " + std::string(got.status().message()));
        } else if (*got != want) {
          fail("thread " + std::to_string(t) + " call " + std::to_string(i) + " got another reply: " +
               std::string(got->substr(0, 16)));
        }
      }
      misses += my_misses;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << "first: " << first_failure;
  EXPECT_EQ(b->handled.load(), kThreads * kCalls);
  EXPECT_EQ(count_claimable(*lane), 4u);
  RecordProperty("claim_misses", misses.load());  // how often every slot was busy: not asserted (it depends on scheduling)
}

// The worker is killed with SIGKILL while its handler runs (it would never return): the
// call fails with UNAVAILABLE naming the worker's pid, long before its 60 s deadline (a
// DEADLINE_EXCEEDED would mean nobody noticed the exit). A call posted after the worker
// is gone fails the same way.
TEST_F(ExecLaneTest, WorkerKilledMidCallFailsUnavailable) {
  ASSERT_TRUE(serve(2, 256, [b = b](std::string_view, std::span<char>, const std::function<bool()>&, absl::Time) -> absl::StatusOr<size_t> {
    b->started = 1;
    for (;;) pause();  // until killed (or the test dies)
  }));
  const pid_t pid = worker->pid();
  std::thread killer([b = b, pid] {
    if (wait_until([b] { return b->started.load() != 0; })) kill(pid, SIGKILL);
  });
  auto r = call_once(*lane, "block", far_deadline());
  const bool started = b->started.load() != 0;
  if (!started) kill(pid, SIGKILL);  // the handler never ran and the killer gave up: end the worker here
  killer.join();
  ASSERT_TRUE(started) << "the handler never ran";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find(std::to_string(pid)), std::string_view::npos) << r.status();

  auto after = call_once(*lane, "anyone?", far_deadline());
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
  EXPECT_EQ(worker->join(), -1);  // died of the signal
}

// A deadline that passes while the handler runs fails the call with DEADLINE_EXCEEDED;
// abandoned() then turns true in the handler; the slot stays the worker's while its
// handler runs (uopd cannot claim it and write over the reply) and is free again once the
// handler returns; a new call then succeeds. The handler holds until abandoned() is true,
// so the deadline, not the handler, ends the call; the deadline grows until the worker
// has taken the request before it (on a loaded host it may not, within 50 ms: then the
// worker frees the abandoned request without running it, which is checked too).
TEST_F(ExecLaneTest, DeadlineLeavesTheSlotToTheWorker) {
  constexpr uint32_t kSlots = 3;
  ASSERT_TRUE(serve(
      kSlots, 256,
      [b = b, echo = counting_echo()](std::string_view request, std::span<char> reply,
                                      const std::function<bool()>& abandoned, absl::Time deadline) -> absl::StatusOr<size_t> {
        if (request != "hold") return echo(request, reply, abandoned, deadline);
        b->handled.fetch_add(1);
        b->started = 1;
        b->saw_abandoned = wait_until(abandoned) ? 1 : 2;
        wait_until([b] { return b->release.load() != 0; });
        std::memcpy(reply.data(), "late", 4);
        return 4;
      }));

  bool taken = false;
  for (absl::Duration d : {absl::Milliseconds(50), absl::Milliseconds(250), absl::Seconds(1), absl::Seconds(5)}) {
    {
      auto c = claim_within(*lane);
      ASSERT_TRUE(c.has_value());
      std::memcpy(c->request().data(), "hold", 4);
      auto r = c->call(4, absl::Now() + d);
      ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
    }  // the Call goes: that must not free the slot
    // Either the handler runs (and holds the slot until released), or the worker found the
    // request abandoned before it took it and freed the slot unrun.
    ASSERT_TRUE(wait_until([&] { return b->started.load() != 0 || count_claimable(*lane) == kSlots; }));
    if (b->started.load() != 0) {
      taken = true;
      break;
    }
    EXPECT_EQ(b->handled.load(), 0) << "an abandoned request was handled anyway";
  }
  ASSERT_TRUE(taken) << "the worker never took a request within a 5 s deadline";
  ASSERT_TRUE(wait_until([&] { return b->saw_abandoned.load() != 0; }));
  EXPECT_EQ(b->saw_abandoned.load(), 1) << "abandoned() never turned true in the handler";
  EXPECT_EQ(count_claimable(*lane), kSlots - 1) << "the abandoned slot was handed out while its handler ran";
  b->release = 1;
  EXPECT_TRUE(wait_until([&] { return count_claimable(*lane) == kSlots; })) << "the worker never freed the slot";
  auto next = call_once(*lane, "next", far_deadline());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, "next");

  // A deadline already past when the call is posted: DEADLINE_EXCEEDED, or the reply when
  // the worker was quicker than the check; either way every slot comes back.
  auto past = call_once(*lane, "past", absl::InfinitePast());
  if (past.ok()) {
    EXPECT_EQ(*past, "past");
  } else {
    EXPECT_EQ(past.status().code(), absl::StatusCode::kDeadlineExceeded) << past.status();
  }
  EXPECT_TRUE(wait_until([&] { return count_claimable(*lane) == kSlots; })) << "a past deadline lost a slot";
}

// A call cancelled by another thread while the worker holds it (what the executor does to
// the other members of a collective when one fails) comes back CANCELLED, the handler
// sees abandoned() turn true, and the slot stays the worker's until its handler returns.
// A flag that stays clear changes nothing.
TEST_F(ExecLaneTest, CancelLeavesTheSlotToTheWorker) {
  constexpr uint32_t kSlots = 2;
  ASSERT_TRUE(serve(
      kSlots, 256,
      [b = b, echo = counting_echo()](std::string_view request, std::span<char> reply,
                                      const std::function<bool()>& abandoned, absl::Time deadline) -> absl::StatusOr<size_t> {
        if (request != "hold") return echo(request, reply, abandoned, deadline);
        b->started = 1;
        b->saw_abandoned = wait_until(abandoned) ? 1 : 2;
        wait_until([b] { return b->release.load() != 0; });
        return 0;
      }));
  std::atomic<bool> cancel{false};
  {
    auto c = claim_within(*lane);
    ASSERT_TRUE(c.has_value());
    std::memcpy(c->request().data(), "echo", 4);
    auto r = c->call(4, far_deadline(), &cancel);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, "echo");
  }
  auto c = claim_within(*lane);
  ASSERT_TRUE(c.has_value());
  std::memcpy(c->request().data(), "hold", 4);
  std::thread canceller([&] {
    wait_until([&] { return b->started.load() != 0; });
    cancel.store(true);
  });
  auto r = c->call(4, far_deadline(), &cancel);
  canceller.join();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  c.reset();  // the Call goes: that must not free the slot
  ASSERT_TRUE(wait_until([&] { return b->saw_abandoned.load() != 0; }));
  EXPECT_EQ(b->saw_abandoned.load(), 1) << "abandoned() never turned true in the handler";
  EXPECT_EQ(count_claimable(*lane), kSlots - 1) << "the cancelled slot was handed out while its handler ran";
  b->release = 1;
  EXPECT_TRUE(wait_until([&] { return count_claimable(*lane) == kSlots; })) << "the worker never freed the slot";
  auto next = call_once(*lane, "next", far_deadline());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, "next");
}

// A request over capacity() is refused with INVALID_ARGUMENT and never posted: the one
// slot comes back when the Call goes and the worker never saw the request. A Call posts
// once: a second call() is FAILED_PRECONDITION.
TEST_F(ExecLaneTest, OversizedRequestIsRefusedUnposted) {
  ASSERT_TRUE(serve(1, 100, counting_echo()));
  for (size_t n : {size_t{101}, size_t{4096}, SIZE_MAX}) {
    auto c = lane->claim();
    ASSERT_TRUE(c.has_value()) << "the slot did not come back after a refused request";
    auto r = c->call(n, far_deadline());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << n << ": " << r.status();
    EXPECT_FALSE(lane->claim().has_value()) << "the Call still holds its slot";
  }
  auto c = lane->claim();
  ASSERT_TRUE(c.has_value());
  std::memcpy(c->request().data(), "x", 1);
  auto ok = c->call(1, far_deadline());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "x");
  auto twice = c->call(1, far_deadline());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition) << twice.status();
  c.reset();
  EXPECT_EQ(b->handled.load(), 1) << "a refused request reached the worker";
  EXPECT_EQ(count_claimable(*lane), 1u);
}

// A handler that returns more bytes than the slot holds: the worker's end sends INTERNAL
// instead of that length, uopd gets INTERNAL, and the slot carries the next call (a reply
// of exactly capacity()).
TEST_F(ExecLaneTest, OversizedReplyBecomesInternal) {
  ASSERT_TRUE(serve(1, 64, [](std::string_view request, std::span<char> reply, const std::function<bool()>&, absl::Time) -> absl::StatusOr<size_t> {
    if (request == "lie") return reply.size() + 1;
    if (request == "huge") return SIZE_MAX;
    std::memset(reply.data(), 'm', reply.size());
    return reply.size();
  }));
  for (const char* lie : {"lie", "huge"}) {
    auto r = call_once(*lane, lie, far_deadline());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << lie << ": " << r.status();
    EXPECT_NE(r.status().message().find("does not fit"), std::string_view::npos) << r.status();
  }
  auto full = call_once(*lane, "max", far_deadline());
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(*full, std::string(64, 'm'));
}

// uopd does not trust what the worker writes: a fake worker (no serve(), the layout
// mirror) answers with a reply length over the slot, or a status code absl does not have,
// and uopd reports INTERNAL instead of reading past the slot or inventing a code. The same
// fake's honest answers (a failure, a full slot) come through, so the fake speaks the
// protocol and the refusals are the checks at work.
TEST_F(ExecLaneTest, UopdChecksWhatTheWorkerWrites) {
  constexpr uint64_t kCap = 128;
  lane = make_lane(1, kCap);
  ASSERT_TRUE(lane);
  struct Answer {
    int32_t code;
    uint64_t reply_bytes;
  };
  const Answer answers[] = {
      {0, kCap + 1}, {0, UINT64_MAX}, {17, 3}, {99, 3}, {-1, 3}, {5, 3}, {0, kCap}, {3, kCap + 1},
  };
  const int n_answers = sizeof(answers) / sizeof(answers[0]);
  const pid_t parent = getpid();
  const pid_t fake = fork();
  if (fake == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(kOrphaned);
    Mapping m(lane->fd());
    if (!m.ok()) _exit(kAttachFailed);
    MirrorSlot& s = m.slot(0);
    for (int i = 0; i < n_answers; ++i) {
      const bool posted = wait_until([&] {
        uint32_t st = s.state.load();
        if (st == kReady) return true;
        shm::futex_wait(&s.state, st, milliseconds(10));
        return false;
      });
      if (!posted) _exit(10 + i);
      uint32_t ready = kReady;
      if (!s.state.compare_exchange_strong(ready, kRunning)) _exit(40 + i);
      std::memset(m.data(0), 'a' + i, kCap);
      s.code = answers[i].code;
      s.reply_bytes = answers[i].reply_bytes;
      s.state.store(kDone);
      shm::futex_wake_all(&s.state);
    }
    _exit(0);
  }
  ASSERT_GT(fake, 0);
  lane->set_peer(fake);
  std::vector<absl::StatusOr<std::string>> got;
  for (int i = 0; i < n_answers; ++i) got.push_back(call_once(*lane, "q", far_deadline()));
  const int fake_rc = join_child(fake);
  ASSERT_NE(fake_rc, -1) << "the fake worker hung or crashed";
  EXPECT_EQ(fake_rc, 0);

  for (int i : {0, 1, 7}) {  // a reply, or a failure's message, longer than the slot
    EXPECT_EQ(got[i].status().code(), absl::StatusCode::kInternal) << i << ": " << got[i].status();
    EXPECT_NE(got[i].status().message().find("claims"), std::string_view::npos) << got[i].status();
  }
  for (int i : {2, 3, 4}) {  // codes 17, 99, -1
    EXPECT_EQ(got[i].status().code(), absl::StatusCode::kInternal) << i << ": " << got[i].status();
    EXPECT_NE(got[i].status().message().find("status code " + std::to_string(answers[i].code)), std::string_view::npos)
        << got[i].status();
  }
  EXPECT_EQ(got[5].status().code(), absl::StatusCode::kNotFound) << got[5].status();
  EXPECT_EQ(got[5].status().message(), "fff");
  ASSERT_TRUE(got[6].ok()) << got[6].status();
  EXPECT_EQ(*got[6], std::string(kCap, 'g'));
  EXPECT_EQ(count_claimable(*lane), 1u);
}

// The worker does not trust uopd's request length: a request posted (through the layout
// mirror, as a lying uopd would) with more bytes than the slot is answered INVALID_ARGUMENT
// without the handler seeing it; the slot then serves a good call.
TEST_F(ExecLaneTest, WorkerChecksTheRequestLength) {
  constexpr uint64_t kCap = 128;
  ASSERT_TRUE(serve(1, kCap, counting_echo()));
  Mapping m(lane->fd());
  ASSERT_TRUE(m.ok());
  MirrorSlot& s = m.slot(0);
  for (uint64_t lie : {kCap + 1, UINT64_MAX}) {
    uint32_t free_state = kFree;
    ASSERT_TRUE(s.state.compare_exchange_strong(free_state, kClaimed)) << "slot 0 is not free";
    s.request_bytes = lie;
    s.state.store(kReady);
    shm::futex_wake_all(&s.state);
    ASSERT_TRUE(wait_until([&] { return s.state.load() == kDone; })) << "no answer to a request of " << lie;
    EXPECT_EQ(s.code, static_cast<int32_t>(absl::StatusCode::kInvalidArgument)) << lie;
    ASSERT_LE(s.reply_bytes, kCap);
    const std::string message(m.data(0), s.reply_bytes);
    EXPECT_NE(message.find("does not fit"), std::string::npos) << message;
    s.state.store(kFree);
  }
  EXPECT_EQ(b->handled.load(), 0) << "the handler saw an oversized request";
  auto good = call_once(*lane, "good", far_deadline());
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, "good");
  EXPECT_EQ(b->handled.load(), 1);
}

// stop() on an idle worker returns (its slot threads join), twice as well; serve() a
// second time is refused; a stopped worker handles nothing more (a call posted then is
// not answered), and once it has exited, calls fail with UNAVAILABLE.
TEST_F(ExecLaneTest, StopReturnsWhenIdle) {
  ASSERT_TRUE(serve(3, 64, counting_echo(), [b = b, echo = counting_echo()](ExecLane& mine) {
    if (mine.serve(echo).code() != absl::StatusCode::kFailedPrecondition) return 11;
    if (!wait_until([b] { return b->stop_now.load() != 0; }, std::chrono::minutes(2))) return 12;
    b->in_flight_before = mine.in_flight();
    mine.stop();
    mine.stop();
    b->stopped = 1;
    if (!wait_until([b] { return b->quit.load() != 0; }, std::chrono::minutes(2))) return 13;
    return 0;
  }));
  auto first = call_once(*lane, "a", far_deadline());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "a");

  b->stop_now = 1;
  ASSERT_TRUE(wait_until([&] { return b->stopped.load() != 0; })) << "stop() did not return on an idle lane";
  EXPECT_EQ(b->in_flight_before.load(), 0);
  auto unanswered = call_once(*lane, "b", absl::Now() + absl::Milliseconds(300));
  EXPECT_FALSE(unanswered.ok()) << "a stopped worker answered";
  EXPECT_EQ(b->handled.load(), 1) << "a stopped worker ran its handler";

  b->quit = 1;
  EXPECT_EQ(worker->join(), 0) << "the worker failed a check (11: serve twice accepted) or hung";
  auto gone = call_once(*lane, "c", far_deadline());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable) << gone.status();
}

// stop() while a call runs waits for that call: it does not return while the handler
// holds, the caller gets the reply, and in_flight() counts the call while it runs (1) and
// not after (0).
TEST_F(ExecLaneTest, StopWaitsForTheCallInFlight) {
  ASSERT_TRUE(serve(
      2, 64,
      [b = b](std::string_view, std::span<char> reply, const std::function<bool()>&, absl::Time) -> absl::StatusOr<size_t> {
        b->started = 1;
        if (!wait_until([b] { return b->release.load() != 0; }, std::chrono::minutes(2)))
          return absl::DeadlineExceededError("never released");
        std::memcpy(reply.data(), "held", 4);
        return 4;
      },
      [b = b](ExecLane& mine) {
        if (!wait_until([b] { return b->stop_now.load() != 0; }, std::chrono::minutes(2))) return 12;
        b->in_flight_before = mine.in_flight();
        mine.stop();
        b->in_flight_after = mine.in_flight();
        b->stopped = 1;
        return 0;
      }));

  absl::StatusOr<std::string> reply = absl::UnknownError("not yet");
  std::thread caller([&] { reply = call_once(*lane, "hold", far_deadline()); });
  const bool started = wait_until([&] { return b->started.load() != 0; });
  b->stop_now = 1;
  const bool stopping = started && wait_until([&] { return b->in_flight_before.load() != -1; });
  if (stopping) std::this_thread::sleep_for(milliseconds(100));  // time for a wrong stop() to return
  const int stopped_early = b->stopped.load();
  b->release = 1;
  caller.join();
  ASSERT_TRUE(started) << "the handler never ran";
  ASSERT_TRUE(stopping) << "the worker never reached stop()";
  EXPECT_EQ(stopped_early, 0) << "stop() returned while its handler was still running";
  EXPECT_EQ(b->in_flight_before.load(), 1);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(*reply, "held");
  EXPECT_EQ(worker->join(), 0);
  EXPECT_EQ(b->stopped.load(), 1);
  EXPECT_EQ(b->in_flight_after.load(), 0);
}

}  // namespace
}  // namespace uop
