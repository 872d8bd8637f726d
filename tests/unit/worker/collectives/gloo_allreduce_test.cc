// Gloo over TCP on 127.0.0.1 with a real Rendezvous gRPC server, members and server as
// forked processes: every op on several dtypes, sizes 0, 1, odd and 64 MiB, 2 and 3
// members, against eval_alu (exact for integers and MAX / MIN; a few ulps for float
// ADD / MUL, which Gloo's ring adds up in another order); and the failures: a member
// killed mid-allreduce (the survivors fail at once, naming it, and the next group works),
// one that never joins, members that disagree, a rendezvous nobody serves.
#include "worker/collectives/gloo_allreduce.h"

#include <grpcpp/grpcpp.h>

#include <gtest/gtest.h>

#include <atomic>

#include "server/rendezvous_service.h"
#include "tests/unit/worker/collectives/collective_testing.h"
#include "tests/unit/worker/collectives/rendezvous_testing.h"

namespace uop {
namespace {

using namespace uop::testing;
using std::chrono::milliseconds;

RendezvousServer& server() {
  static RendezvousServer* s = new RendezvousServer();  // one for the whole binary
  return *s;
}

std::string unique_group(const std::string& what) {
  static int counter = 0;
  return cat("gloo-test-", getpid(), "-", ++counter, "-", what);
}

GlooOptions options(const std::string& group, int rank, int size, milliseconds timeout = milliseconds(60000)) {
  GlooOptions o;
  o.group = group;
  o.rank = rank;
  o.size = size;
  o.rendezvous = server().address();
  o.timeout = timeout;
  return o;
}

// `exact`: the shm ring's bits (ring_reference's order), no tolerance for float ADD / MUL.
void run_case(int size, Scalar t, ReduceOp op, uint64_t elements, bool exact = false) {
  SCOPED_TRACE(cat(size, " members, ", reduce_op_wire_name(op), " on ", elements, " ", scalar_name(t)));
  ASSERT_TRUE(server().ok());
  const uint64_t bytes = elements * scalar_bytes(t);
  SharedMemory results(bytes * size);
  const std::string group = unique_group("case");
  auto reports = run_members(size, [&](int rank) {
    uint8_t* mine = results.data() + rank * bytes;
    fill_input(t, op, rank, elements, mine);
    return gloo_allreduce(options(group, rank, size), mine, elements, op, t);
  });
  for (int r = 0; r < size; ++r) ASSERT_TRUE(reports[r].status().ok()) << "rank " << r << ": " << reports[r].status();
  const std::vector<uint8_t> want = ring_reference(t, op, size, elements);
  for (int r = 0; r < size; ++r) {
    int64_t bad = first_mismatch(t, op, size, results.data() + r * bytes, want, elements, !exact);
    ASSERT_EQ(bad, -1) << "rank " << r << " element " << bad << ": got "
                       << bits_to_value(load_bits(results.data() + r * bytes, t, bad), t).str() << ", want "
                       << bits_to_value(load_bits(want.data(), t, bad), t).str();
    // Every member holds the same bits (Gloo's all-gather copies one result around).
    EXPECT_EQ(std::memcmp(results.data() + r * bytes, results.data(), bytes), 0) << "rank " << r;
  }
}

// Every op x several dtypes x sizes 0, 1 and odd, on 2 and 3 members, one group per
// member count running every case in turn (exact but for float ADD / MUL: see above).
TEST(GlooAllreduceTest, EveryOpAndDtype) {
  ASSERT_TRUE(server().ok());
  const auto cases = sweep_cases({Scalar::Float32, Scalar::Float16, Scalar::BFloat16, Scalar::Float64, Scalar::Int32,
                                  Scalar::Int64, Scalar::UInt8, Scalar::Bool},
                                 {0, 1, 10007});
  for (int size : {2, 3}) {
    const std::string group = unique_group("sweep");
    auto reports = run_members(size, [&](int rank) -> absl::Status {
      auto g = GlooGroup::connect(options(group, rank, size));
      if (!g.ok()) return g.status();
      return run_sweep(rank, size, cases, /*tolerant=*/true, [&](void* p, uint64_t n, ReduceOp op, Scalar t) {
        return (*g)->allreduce(p, n, op, t);
      });
    });
    for (int r = 0; r < size; ++r) EXPECT_TRUE(reports[r].status().ok()) << size << " members, rank " << r << ": " << reports[r].status();
  }
}

// Up to 16 KiB the inputs go with the members' agreement check and each member reduces
// them itself in the shm ring's order: the shm ring's bits exactly, on three members too
// (where float ADD shows the order), up to the largest such buffer of each element size.
TEST(GlooAllreduceTest, SmallBuffersGetTheShmRingsBits) {
  for (uint64_t elements : {1, 2, 7, 1000, 4096}) run_case(3, Scalar::Float32, ReduceOp::Add, elements, true);
  run_case(3, Scalar::Float16, ReduceOp::Add, 8192, true);
  run_case(3, Scalar::Float64, ReduceOp::Mul, 2048, true);
  run_case(2, Scalar::Float32, ReduceOp::Add, 4096, true);
  run_case(3, Scalar::Float32, ReduceOp::Add, 4097);  // Gloo's ring, within its tolerance
}

TEST(GlooAllreduceTest, OddMillionFloatsAndSixtyFourMiB) {
  run_case(2, Scalar::Float32, ReduceOp::Add, 1000003);
  run_case(3, Scalar::Float32, ReduceOp::Max, 1000003);
  run_case(2, Scalar::Float32, ReduceOp::Add, (64 << 20) / 4);
  run_case(3, Scalar::Int64, ReduceOp::Mul, (64 << 20) / 8);
}

// Members loop on 64 MiB allreduces in one group; rank 1 is killed while they run. The
// survivors fail UNAVAILABLE naming rank 1: the broken connection, not their 20 s timeout
// (which would be DEADLINE_EXCEEDED); then a new group works.
TEST(GlooAllreduceTest, MemberKilledMidAllreduce) {
  ASSERT_TRUE(server().ok());
  const std::string group = unique_group("kill");
  const uint64_t n = (64 << 20) / 4;
  SharedMemory started(sizeof(std::atomic<int>));
  auto* count = new (started.data()) std::atomic<int>(0);
  auto reports = run_members(
      3,
      [&](int rank) -> absl::Status {
        auto g = GlooGroup::connect(options(group, rank, 3, milliseconds(20000)));
        if (!g.ok()) return g.status();
        std::vector<float> buf(n, 1.0f);
        for (int i = 0; i < 100000; ++i) {
          if (absl::Status st = (*g)->allreduce(buf.data(), n, ReduceOp::Add, Scalar::Float32); !st.ok()) return st;
          if (i == 0) count->fetch_add(1);  // in the loop of allreduces, the next one under way
        }
        return absl::InternalError("never failed");
      },
      [&](const std::vector<pid_t>& pids) {
        for (int i = 0; i < 60000 && count->load() < 3; ++i) std::this_thread::sleep_for(milliseconds(1));
        kill(pids[1], SIGKILL);
      });
  EXPECT_EQ(reports[1].code, -1);
  for (int r : {0, 2}) {
    absl::Status st = reports[r].status();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_NE(st.message().find(group), std::string::npos) << st;
    EXPECT_NE(st.message().find("rank 1 (pid "), std::string::npos) << st;
    EXPECT_NE(st.message().find("stopped answering"), std::string::npos) << st;
  }
  run_case(3, Scalar::Float32, ReduceOp::Add, 100003);
}

TEST(GlooAllreduceTest, MissingMemberTimesOut) {
  ASSERT_TRUE(server().ok());
  const std::string group = unique_group("missing");
  auto reports = run_members(2, [&](int rank) {
    float x = 1;
    return gloo_allreduce(options(group, rank, 3, milliseconds(500)), &x, 1, ReduceOp::Add, Scalar::Float32);
  });
  for (int r : {0, 1}) {
    absl::Status st = reports[r].status();
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_NE(st.message().find(group), std::string::npos) << st;
    EXPECT_NE(st.message().find("rank 2 never joined"), std::string::npos) << st;
  }
}

TEST(GlooAllreduceTest, DisagreeingMembersAllFail) {
  ASSERT_TRUE(server().ok());
  const std::string group = unique_group("disagree");
  auto reports = run_members(3, [&](int rank) {
    std::vector<int32_t> buf(100, 1);
    return gloo_allreduce(options(group, rank, 3, milliseconds(10000)), buf.data(), 100,
                          rank == 2 ? ReduceOp::Max : ReduceOp::Add, Scalar::Int32);
  });
  for (int r = 0; r < 3; ++r) {
    absl::Status st = reports[r].status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("rank 2 reduces 100 int32 elements (max)"), std::string::npos) << st;
  }
}

TEST(GlooAllreduceTest, NobodyServesTheRendezvous) {
  auto reports = run_members(1, [&](int) {
    GlooOptions o = options(unique_group("norendezvous"), 0, 2, milliseconds(1000));
    o.rendezvous = "127.0.0.1:1";  // nothing listens on port 1
    float x = 1;
    return gloo_allreduce(o, &x, 1, ReduceOp::Add, Scalar::Float32);
  });
  absl::Status st = reports[0].status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("rendezvous at 127.0.0.1:1"), std::string::npos) << st;
}

TEST(GlooAllreduceTest, LocalAddressTowardTheRendezvous) {
  auto a = local_address_toward("127.0.0.1:5000");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, "127.0.0.1");
  auto b = local_address_toward("[::1]:5000");
  if (b.ok()) {
    EXPECT_EQ(*b, "::1");  // where the host has IPv6 at all
  }
  EXPECT_FALSE(local_address_toward("no-such-host.invalid:1").ok());
}

}  // namespace
}  // namespace uop
