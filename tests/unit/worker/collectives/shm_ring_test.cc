// The shared-memory ring with members as real processes (fork): every op on several
// dtypes, sizes 0, 1, odd and 64 MiB, 2 and 3 members, bit for bit against eval_alu in
// the ring's order; small slots so that parts span many messages and slots are reused;
// many calls on one group; and the failures: a member killed mid-allreduce, one that
// never comes, one that stalls, members that disagree. Every failure is bounded by the
// timeout, names the group and the peer, and leaves no segment behind.
#include "worker/collectives/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "tests/unit/worker/collectives/collective_testing.h"
#include "worker/collectives/reduce.h"

namespace uop {
namespace {

using namespace uop::testing;
using std::chrono::milliseconds;

std::string unique_group(const std::string& what) {
  static int counter = 0;
  return cat("test-", getpid(), "-", ++counter, "-", what);
}

bool segment_exists(const std::string& group) {
  int fd = shm_open(shm_ring_segment_name(group).c_str(), O_RDONLY, 0);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

struct Case {
  int size;
  Scalar dtype;
  ReduceOp op;
  uint64_t elements;
  uint64_t slot_bytes = 256 << 10;
  int slots = 4;
};

std::string name_of(const Case& c) {
  return cat(c.size, " members, ", reduce_op_wire_name(c.op), " on ", c.elements, " ", scalar_name(c.dtype));
}

// Runs one allreduce in c.size processes and checks every member's result.
void run_case(const Case& c) {
  SCOPED_TRACE(name_of(c));
  const uint64_t bytes = c.elements * scalar_bytes(c.dtype);
  SharedMemory results(bytes * c.size);
  ASSERT_TRUE(results.data());
  const std::string group = unique_group("case");
  auto reports = run_members(c.size, [&](int rank) {
    uint8_t* mine = results.data() + rank * bytes;
    fill_input(c.dtype, c.op, rank, c.elements, mine);
    ShmRingOptions o;
    o.group = group;
    o.rank = rank;
    o.size = c.size;
    o.timeout = milliseconds(60000);
    o.slot_bytes = c.slot_bytes;
    o.slots = c.slots;
    return shm_allreduce(o, mine, c.elements, c.op, c.dtype);
  });
  for (int r = 0; r < c.size; ++r) ASSERT_TRUE(reports[r].status().ok()) << "rank " << r << ": " << reports[r].status();
  const std::vector<uint8_t> want = ring_reference(c.dtype, c.op, c.size, c.elements);
  for (int r = 0; r < c.size; ++r) {
    int64_t bad = first_mismatch(c.dtype, c.op, c.size, results.data() + r * bytes, want, c.elements, false);
    ASSERT_EQ(bad, -1) << "rank " << r << " element " << bad << ": got "
                       << bits_to_value(load_bits(results.data() + r * bytes, c.dtype, bad), c.dtype).str() << ", want "
                       << bits_to_value(load_bits(want.data(), c.dtype, bad), c.dtype).str();
  }
  EXPECT_FALSE(segment_exists(group));
}

// Every op x several dtypes x sizes 0, 1, 2 and odd, on 2 and 3 members, one group per
// member count running every case in turn. Slots of 1 KiB (two of them): the odd size
// crosses dozens of messages per part and reuses every slot.
TEST(ShmRingTest, EveryOpAndDtypeSmallSlots) {
  const auto cases = sweep_cases({Scalar::Float32, Scalar::Float16, Scalar::BFloat16, Scalar::Float64, Scalar::Int32,
                                  Scalar::Int64, Scalar::UInt8, Scalar::Bool},
                                 {0, 1, 2, 10007});
  for (int size : {2, 3}) {
    const std::string group = unique_group("sweep");
    auto reports = run_members(size, [&](int rank) -> absl::Status {
      ShmRingOptions o;
      o.group = group;
      o.rank = rank;
      o.size = size;
      o.slot_bytes = 1024;
      o.slots = 2;
      auto ring = ShmRing::join(o);
      if (!ring.ok()) return ring.status();
      return run_sweep(rank, size, cases, /*tolerant=*/false, [&](void* p, uint64_t n, ReduceOp op, Scalar t) {
        return (*ring)->allreduce(p, n, op, t);
      });
    });
    for (int r = 0; r < size; ++r) EXPECT_TRUE(reports[r].status().ok()) << size << " members, rank " << r << ": " << reports[r].status();
    EXPECT_FALSE(segment_exists(group));
  }
}

// The default slots on an odd size of a million floats, every op.
TEST(ShmRingTest, OddMillionFloats) {
  const auto cases = sweep_cases({Scalar::Float32}, {1000003});
  for (int size : {2, 3}) {
    const std::string group = unique_group("million");
    auto reports = run_members(size, [&](int rank) -> absl::Status {
      ShmRingOptions o;
      o.group = group;
      o.rank = rank;
      o.size = size;
      auto ring = ShmRing::join(o);
      if (!ring.ok()) return ring.status();
      return run_sweep(rank, size, cases, /*tolerant=*/false, [&](void* p, uint64_t n, ReduceOp op, Scalar t) {
        return (*ring)->allreduce(p, n, op, t);
      });
    });
    for (int r = 0; r < size; ++r) EXPECT_TRUE(reports[r].status().ok()) << size << " members, rank " << r << ": " << reports[r].status();
  }
}

TEST(ShmRingTest, SixtyFourMiB) {
  run_case({2, Scalar::Float32, ReduceOp::Add, (64 << 20) / 4});
  if (HasFatalFailure()) return;
  run_case({3, Scalar::BFloat16, ReduceOp::Max, (64 << 20) / 2});
}

TEST(ShmRingTest, OneMemberIsANoOp) { run_case({1, Scalar::Float32, ReduceOp::Add, 1001}); }

// One group, many calls of different sizes and types: the counters carry on.
TEST(ShmRingTest, ManyCallsOnOneGroup) {
  const std::string group = unique_group("many");
  const uint64_t sizes[] = {5, 0, 70001, 1, 3000};
  SharedMemory ok(sizeof(int) * 3);
  auto reports = run_members(3, [&](int rank) -> absl::Status {
    ShmRingOptions o;
    o.group = group;
    o.rank = rank;
    o.size = 3;
    o.slot_bytes = 4096;
    o.slots = 3;
    auto ring = ShmRing::join(o);
    if (!ring.ok()) return ring.status();
    for (int round = 0; round < 3; ++round) {
      for (uint64_t n : sizes) {
        Scalar t = round == 1 ? Scalar::Int16 : Scalar::Float32;
        ReduceOp op = round == 2 ? ReduceOp::Min : ReduceOp::Add;
        std::vector<uint8_t> buf(n * scalar_bytes(t));
        fill_input(t, op, rank, n, buf.data());
        if (absl::Status st = (*ring)->allreduce(buf.data(), n, op, t); !st.ok()) return st;
        if (first_mismatch(t, op, 3, buf.data(), ring_reference(t, op, 3, n), n, false) != -1)
          return absl::InternalError(cat("wrong result in round ", round, " for ", n, " elements"));
      }
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(reports[r].status().ok()) << "rank " << r << ": " << reports[r].status();
  EXPECT_FALSE(segment_exists(group));
}

// A new group per call, as the Collective RPC makes them, many in a row: the members
// arrive at the same moment each time, so their joins race (a lost bump of the join
// count once left a whole group waiting for nobody until its timeout).
TEST(ShmRingTest, ManyGroupsInARow) {
  const std::string prefix = unique_group("row");
  auto reports = run_members(3, [&](int rank) -> absl::Status {
    for (int i = 0; i < 300; ++i) {
      ShmRingOptions o;
      o.group = cat(prefix, "/", i);
      o.rank = rank;
      o.size = 3;
      o.timeout = milliseconds(10000);
      int32_t x = rank + i;
      if (absl::Status st = shm_allreduce(o, &x, 1, ReduceOp::Add, Scalar::Int32); !st.ok()) return st;
      if (x != 3 * i + 3) return absl::InternalError(cat("group ", i, " gave ", x));
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(reports[r].status().ok()) << "rank " << r << ": " << reports[r].status();
}

// Members loop on 64 MiB allreduces until one fails; rank 1 is killed with SIGKILL while
// they run. The others fail with UNAVAILABLE naming the group and rank 1 and its death
// (the 30 s timeout would be DEADLINE_EXCEEDED), and a new group of the survivors plus a
// newcomer then succeeds.
TEST(ShmRingTest, MemberKilledMidAllreduce) {
  const std::string group = unique_group("kill");
  const uint64_t n = (64 << 20) / 4;
  SharedMemory started(sizeof(int));
  auto reports = run_members(
      3,
      [&](int rank) -> absl::Status {
        ShmRingOptions o;
        o.group = group;
        o.rank = rank;
        o.size = 3;
        o.timeout = milliseconds(30000);
        auto ring = ShmRing::join(o);
        if (!ring.ok()) return ring.status();
        std::vector<float> buf(n, 1.0f);
        for (int i = 0; i < 100000; ++i) {
          if (absl::Status st = (*ring)->allreduce(buf.data(), n, ReduceOp::Add, Scalar::Float32); !st.ok()) return st;
          // In the loop of allreduces, the next one under way.
          if (i == 0) reinterpret_cast<std::atomic<int>*>(started.data())->fetch_add(1);
        }
        return absl::InternalError("never failed");
      },
      [&](const std::vector<pid_t>& pids) {
        auto* looping = reinterpret_cast<std::atomic<int>*>(started.data());
        for (int i = 0; i < 60000 && looping->load() < 3; ++i) std::this_thread::sleep_for(milliseconds(1));
        kill(pids[1], SIGKILL);
      });
  EXPECT_EQ(reports[1].code, -1);  // killed
  for (int r : {0, 2}) {
    absl::Status st = reports[r].status();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find(group), std::string::npos) << st;
    EXPECT_NE(st.message().find("rank 1 (pid "), std::string::npos) << st;
    EXPECT_NE(st.message().find("died"), std::string::npos) << st;
  }
  EXPECT_FALSE(segment_exists(group));
  run_case({3, Scalar::Float32, ReduceOp::Add, 100003});  // the next step works
}

// Rank 2 never comes: the others give up after the timeout, naming it, and take the
// segment's name away with them.
TEST(ShmRingTest, MissingMemberTimesOut) {
  const std::string group = unique_group("missing");
  auto reports = run_members(2, [&](int rank) {
    ShmRingOptions o;
    o.group = group;
    o.rank = rank;
    o.size = 3;
    o.timeout = milliseconds(400);
    float x = 1;
    return shm_allreduce(o, &x, 1, ReduceOp::Add, Scalar::Float32);
  });
  for (int r : {0, 1}) {
    absl::Status st = reports[r].status();
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_NE(st.message().find(group), std::string::npos) << st;
    EXPECT_NE(st.message().find("rank 2 to join"), std::string::npos) << st;
  }
  EXPECT_FALSE(segment_exists(group));
}

// Rank 2 joins and then stalls until both others have given up on it: they can only end
// by their timeout (DEADLINE_EXCEEDED), naming it.
TEST(ShmRingTest, StalledMemberTimesOut) {
  const std::string group = unique_group("stall");
  SharedMemory gave_up_mem(sizeof(std::atomic<int>));
  auto* gave_up = new (gave_up_mem.data()) std::atomic<int>(0);
  auto reports = run_members(3, [&](int rank) -> absl::Status {
    ShmRingOptions o;
    o.group = group;
    o.rank = rank;
    o.size = 3;
    o.timeout = milliseconds(500);
    auto ring = ShmRing::join(o);
    if (!ring.ok()) return ring.status();
    if (rank == 2) {
      for (int i = 0; i < 60000 && gave_up->load() < 2; ++i) std::this_thread::sleep_for(milliseconds(1));
      return gave_up->load() == 2 ? absl::OkStatus() : absl::DeadlineExceededError("the others never gave up");
    }
    std::vector<float> buf(1000, 1.0f);
    absl::Status st = (*ring)->allreduce(buf.data(), buf.size(), ReduceOp::Add, Scalar::Float32);
    gave_up->fetch_add(1);
    return st;
  });
  EXPECT_TRUE(reports[2].status().ok()) << reports[2].status();
  for (int r : {0, 1}) {
    absl::Status st = reports[r].status();
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_NE(st.message().find("rank 2 (pid "), std::string::npos) << st;
  }
}

// Members that disagree on the element count all fail with INVALID_ARGUMENT naming both.
TEST(ShmRingTest, DisagreeingMembersAllFail) {
  const std::string group = unique_group("disagree");
  auto reports = run_members(3, [&](int rank) {
    ShmRingOptions o;
    o.group = group;
    o.rank = rank;
    o.size = 3;
    o.timeout = milliseconds(10000);
    std::vector<float> buf(100, 1.0f);
    return shm_allreduce(o, buf.data(), rank == 1 ? 99 : 100, ReduceOp::Add, Scalar::Float32);
  });
  for (int r = 0; r < 3; ++r) {
    absl::Status st = reports[r].status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("disagree"), std::string::npos) << st;
  }
}

TEST(ShmRingTest, BadArgumentsAndDuplicateRank) {
  ShmRingOptions o;
  o.group = unique_group("bad");
  o.rank = 3;
  o.size = 3;
  EXPECT_EQ(ShmRing::join(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.group = "";
  EXPECT_EQ(ShmRing::join(o).status().code(), absl::StatusCode::kInvalidArgument);

  const std::string group = unique_group("dup");
  auto reports = run_members(2, [&](int) {
    ShmRingOptions d;
    d.group = group;
    d.rank = 0;
    d.size = 2;
    d.timeout = milliseconds(2000);
    return ShmRing::join(d).status();
  });
  // One of them claims rank 0; the other is refused and aborts the group for both.
  int refused = 0;
  for (int r = 0; r < 2; ++r) {
    absl::Status st = reports[r].status();
    EXPECT_FALSE(st.ok());
    refused += st.code() == absl::StatusCode::kInvalidArgument && st.message().find("taken twice") != std::string::npos;
  }
  EXPECT_GE(refused, 1);
  EXPECT_FALSE(segment_exists(group));
}

TEST(ShmRingTest, RingPartsCoverTheBuffer) {
  for (uint64_t n : {0, 1, 2, 5, 1000003})
    for (int parts : {1, 2, 3, 7}) {
      uint64_t next = 0;
      for (int i = 0; i < parts; ++i) {
        RingPart p = ring_part(n, parts, i);
        EXPECT_EQ(p.offset, next);
        EXPECT_LE(p.count, ring_part(n, parts, 0).count);
        next += p.count;
      }
      EXPECT_EQ(next, n);
    }
}

}  // namespace
}  // namespace uop
