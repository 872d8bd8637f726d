// run_collective, the entry point of the worker's Collective RPC: the request's mistakes
// are INVALID_ARGUMENT naming the group before any peer is involved, and a good request
// reaches its transport (shm and gloo, members as forked processes) with the answer of
// eval.h's scalar functions.
#include "worker/collectives/collective.h"

#include <grpcpp/grpcpp.h>

#include <gtest/gtest.h>

#include <atomic>

#include "tests/unit/worker/collectives/rendezvous_testing.h"

namespace uop {
namespace {

using namespace uop::testing;

CollectiveSpec spec_for(const std::string& group, int rank, int size, const std::string& transport) {
  CollectiveSpec s;
  s.group = group;
  s.rank = rank;
  s.size = size;
  s.op = "add";
  s.dtype = "float32";
  s.elements = 4;
  s.transport = transport;
  s.timeout_ms = 20000;
  return s;
}

void expect_invalid(const CollectiveSpec& s, uint64_t bytes, const std::string& fragment) {
  std::vector<uint8_t> buf(std::max<uint64_t>(bytes, 1));
  absl::Status st = run_collective(s, buf.data(), bytes);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find(fragment), std::string::npos) << st;
  if (!s.group.empty()) {
    EXPECT_NE(std::string(st.message()).find(s.group), std::string::npos) << st;
  }
}

TEST(RunCollectiveTest, RequestMistakesAreInvalidArgument) {
  CollectiveSpec s = spec_for("req-check", 0, 2, "shm");
  {
    CollectiveSpec b = s;
    b.group = "";
    expect_invalid(b, 16, "group");
  }
  {
    CollectiveSpec b = s;
    b.rank = 2;
    expect_invalid(b, 16, "rank 2 is not in a group of 2");
  }
  {
    CollectiveSpec b = s;
    b.size = 0;
    expect_invalid(b, 16, "group of 0");
  }
  {
    CollectiveSpec b = s;
    b.op = "sum";
    expect_invalid(b, 16, "unknown op 'sum'");
  }
  {
    CollectiveSpec b = s;
    b.dtype = "float128";
    expect_invalid(b, 16, "unknown dtype 'float128'");
  }
  {
    CollectiveSpec b = s;
    b.dtype = "bool";  // eval.h defines no ADD on bool
    expect_invalid(b, 16, "not defined on bool");
  }
  {
    CollectiveSpec b = s;
    b.elements = 5;  // 20 bytes of float32 in a 16-byte buffer
    expect_invalid(b, 16, "need 20 bytes, the buffer has 16");
  }
  {
    CollectiveSpec b = s;
    b.elements = UINT64_MAX / 2;
    expect_invalid(b, 16, "the buffer has 16");
  }
  {
    CollectiveSpec b = s;
    b.transport = "mpi";
    expect_invalid(b, 16, "unknown transport 'mpi'");
  }
  {
    CollectiveSpec b = s;
    b.transport = "gloo";  // and no rendezvous address
    expect_invalid(b, 16, "rendezvous");
  }
}

TEST(RunCollectiveTest, OneMemberIsANoOpOnEveryTransportButNccl) {
  for (const char* transport : {"shm", "gloo"}) {
    CollectiveSpec s = spec_for(cat("solo-", getpid(), "-", transport), 0, 1, transport);
    s.rendezvous = "127.0.0.1:1";  // never contacted by a group of one
    float x[4] = {1, 2, 3, 4};
    EXPECT_TRUE(run_collective(s, x, sizeof x).ok()) << transport;
    EXPECT_EQ(x[3], 4.0f);
  }
}

// The shm transport through run_collective, members as processes, int64 MUL with
// wraparound: the result is the product mod 2^64, as eval.h's int64 multiplication gives.
TEST(RunCollectiveTest, ShmThroughRunCollective) {
  const int n = 3;
  const uint64_t elements = 1001;
  SharedMemory results(elements * 8 * n);
  const std::string group = cat("run-shm-", getpid());
  auto reports = run_members(n, [&](int rank) {
    auto* mine = reinterpret_cast<int64_t*>(results.data()) + rank * elements;
    fill_input(Scalar::Int64, ReduceOp::Mul, rank, elements, mine);
    CollectiveSpec s = spec_for(group, rank, n, "shm");
    s.op = "mul";
    s.dtype = "int64";
    s.elements = elements;
    return run_collective(s, mine, elements * 8 + 5);  // a larger buffer is fine
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(reports[r].status().ok()) << reports[r].status();
  auto want = ring_reference(Scalar::Int64, ReduceOp::Mul, n, elements);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(std::memcmp(results.data() + r * elements * 8, want.data(), want.size()), 0) << "rank " << r;
}

// The gloo transport through run_collective, with the Rendezvous service in a child.
TEST(RunCollectiveTest, GlooThroughRunCollective) {
  RendezvousServer server;
  ASSERT_TRUE(server.ok());
  const std::string address = server.address();

  const int n = 2;
  const uint64_t elements = 777;
  SharedMemory results(elements * 2 * n);
  const std::string group = cat("run-gloo-", getpid());
  auto reports = run_members(n, [&](int rank) {
    uint8_t* mine = results.data() + rank * elements * 2;
    fill_input(Scalar::BFloat16, ReduceOp::Max, rank, elements, mine);
    CollectiveSpec s = spec_for(group, rank, n, "gloo");
    s.op = "max";
    s.dtype = "bfloat16";
    s.elements = elements;
    s.rendezvous = address;
    return run_collective(s, mine, elements * 2);
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(reports[r].status().ok()) << reports[r].status();
  auto want = ring_reference(Scalar::BFloat16, ReduceOp::Max, n, elements);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(first_mismatch(Scalar::BFloat16, ReduceOp::Max, n, results.data() + r * elements * 2, want, elements, false), -1)
        << "rank " << r;
}

// Every dtype the collectives reduce and every op defined on it.
std::vector<SweepCase> every_dtype_and_op() {
  return sweep_cases({Scalar::Float32, Scalar::Float16, Scalar::BFloat16, Scalar::Float64, Scalar::Int8, Scalar::Int16,
                      Scalar::Int32, Scalar::Int64, Scalar::UInt8, Scalar::UInt16, Scalar::UInt32, Scalar::UInt64,
                      Scalar::Bool},
                     {0});
}

// A bucket of buffers of these sizes (the ring's parts of each end at other places than
// the flat bucket's would) through one collective, and each of them through its own on the
// same living group: the same bits, and eval_alu's in the ring's order (ring_reference).
const uint64_t kBucketSizes[] = {5, 1001, 0, 3001, 1};

absl::Status bucket_matches_alone(int rank, int n, const CollectiveSpec& base) {
  const size_t inherited = live_collective_groups();  // the forking test process's
  for (const SweepCase& c : every_dtype_and_op()) {
    const std::string what = cat(reduce_op_wire_name(c.op), " on ", scalar_name(c.dtype));
    const uint64_t esize = scalar_bytes(c.dtype);
    std::vector<std::vector<uint8_t>> bucket, alone;
    for (uint64_t size : kBucketSizes) {
      bucket.emplace_back(size * esize + 3);
      fill_input(c.dtype, c.op, rank, size, bucket.back().data());
      alone.push_back(bucket.back());
    }
    CollectiveSpec s = base;
    s.op = reduce_op_wire_name(c.op);
    s.dtype = scalar_name(c.dtype);
    std::vector<HostBuffer> host;
    for (auto& b : bucket) host.push_back({b.data(), b.size()});
    s.bucket.assign(std::begin(kBucketSizes), std::end(kBucketSizes));
    if (absl::Status st = run_collective(s, host, {}); !st.ok()) return absl::Status(st.code(), cat(what, ", bucketed: ", st.message()));
    s.bucket.clear();
    for (size_t k = 0; k < alone.size(); ++k) {
      s.elements = kBucketSizes[k];
      if (absl::Status st = run_collective(s, alone[k].data(), alone[k].size()); !st.ok())
        return absl::Status(st.code(), cat(what, ", buffer ", k, " alone: ", st.message()));
      if (bucket[k] != alone[k]) return absl::InternalError(cat(what, ": buffer ", k, " bucketed differs from alone"));
      const std::vector<uint8_t> want = ring_reference(c.dtype, c.op, n, kBucketSizes[k]);
      if (int64_t bad = first_mismatch(c.dtype, c.op, n, bucket[k].data(), want, kBucketSizes[k], false); bad >= 0)
        return absl::InternalError(cat(what, ": buffer ", k, " element ", bad, " is not eval_alu's"));
    }
  }
  if (live_collective_groups() != inherited + 1)
    return absl::InternalError(cat(live_collective_groups() - inherited, " living groups after every call on one"));
  return absl::OkStatus();
}

TEST(RunCollectiveTest, ShmBucketGivesEachBufferTheBitsItGetsAloneForEveryDtypeAndOp) {
  const int n = 3;
  const std::string group = cat("bucket-shm-", getpid());
  auto reports = run_members(n, [&](int rank) {
    CollectiveSpec s = spec_for(group, rank, n, "shm");
    s.keep_group = true;
    return bucket_matches_alone(rank, n, s);
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(reports[r].status().ok()) << "rank " << r << ": " << reports[r].status();
}

TEST(RunCollectiveTest, GlooBucketGivesEachBufferTheBitsItGetsAloneForEveryDtypeAndOp) {
  RendezvousServer server;
  ASSERT_TRUE(server.ok());
  for (int n : {2, 3}) {  // two: one flat allreduce; three: buffer by buffer (Gloo's own order)
    const std::string group = cat("bucket-gloo-", getpid(), "-", n);
    auto reports = run_members(n, [&](int rank) -> absl::Status {
      CollectiveSpec s = spec_for(group, rank, n, "gloo");
      s.rendezvous = server.address();
      s.keep_group = true;
      // Gloo between three adds in an order of its own: the bucket must still match the
      // buffers alone bit for bit, but not ring_reference, so only two are checked
      // against it (bucket_matches_alone); three compare with each other only.
      if (n == 2) return bucket_matches_alone(rank, n, s);
      for (const SweepCase& c : every_dtype_and_op()) {
        const uint64_t esize = scalar_bytes(c.dtype);
        std::vector<std::vector<uint8_t>> bucket;
        std::vector<HostBuffer> host;
        for (uint64_t size : kBucketSizes) {
          bucket.emplace_back(size * esize + 1);
          fill_input(c.dtype, c.op, rank, size, bucket.back().data());
        }
        std::vector<std::vector<uint8_t>> alone = bucket;
        for (auto& b : bucket) host.push_back({b.data(), b.size()});
        s.op = reduce_op_wire_name(c.op);
        s.dtype = scalar_name(c.dtype);
        s.bucket.assign(std::begin(kBucketSizes), std::end(kBucketSizes));
        if (absl::Status st = run_collective(s, host, {}); !st.ok()) return st;
        s.bucket.clear();
        for (size_t k = 0; k < alone.size(); ++k) {
          s.elements = kBucketSizes[k];
          if (absl::Status st = run_collective(s, alone[k].data(), alone[k].size()); !st.ok()) return st;
          if (bucket[k] != alone[k])
            return absl::InternalError(cat(reduce_op_wire_name(c.op), " on ", scalar_name(c.dtype), ": buffer ", k, " differs"));
        }
      }
      return absl::OkStatus();
    });
    for (int r = 0; r < n; ++r) EXPECT_TRUE(reports[r].status().ok()) << n << " members, rank " << r << ": " << reports[r].status();
  }
}

TEST(RunCollectiveTest, BucketMistakesAreInvalidArgument) {
  CollectiveSpec s = spec_for(cat("bucket-check-", getpid()), 0, 1, "shm");
  float a[4] = {}, b[2] = {};
  const HostBuffer two[] = {{a, sizeof a}, {b, sizeof b}};
  s.bucket = {4};
  absl::Status st = run_collective(s, two, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("a bucket of 1 buffers, given 2"), std::string::npos) << st;
  s.bucket = {4, 3};  // 12 bytes in a buffer of 8
  st = run_collective(s, two, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("bucket buffer 1: 3 float32 elements need 12 bytes, the buffer has 8"),
            std::string::npos)
      << st;
  s.bucket.assign(kMaxBucketBuffers + 1, 0);
  std::vector<HostBuffer> many(kMaxBucketBuffers + 1, HostBuffer{a, sizeof a});
  st = run_collective(s, many, {});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("at most 4096"), std::string::npos) << st;
}

// A living group is named by the scheduler alone; a call that names it as another member
// than the one it was formed as is refused, and the group stays for its real members.
TEST(RunCollectiveTest, ALivingGroupRefusesACallAsAnotherMember) {
  CollectiveSpec s = spec_for(cat("live-check-", getpid()), 0, 1, "shm");
  s.keep_group = true;
  float x[4] = {1, 2, 3, 4};
  ASSERT_TRUE(run_collective(s, x, sizeof x).ok());
  const size_t alive = live_collective_groups();
  CollectiveSpec other = s;
  other.size = 2;
  other.rank = 1;
  absl::Status st = run_collective(other, x, sizeof x);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("formed as rank 0 of 1 over shm"), std::string::npos) << st;
  EXPECT_EQ(live_collective_groups(), alive);
  EXPECT_TRUE(run_collective(s, x, sizeof x).ok());
}

// One group formed once serves 200 calls; the member killed before call 150 fails that
// call for the others with UNAVAILABLE naming it, their group is dropped, and a new group
// of the survivors (another name, as the scheduler gives) serves the rest.
TEST(RunCollectiveTest, ALivingGroupServesEveryCallUntilAMemberDies) {
  const int n = 3, calls = 200, kill_at = 150;
  const uint64_t elements = 1000;
  const std::string group = cat("live-", getpid());
  auto reports = run_members(n, [&](int rank) -> absl::Status {
    const size_t inherited = live_collective_groups();  // the forking test process's
    std::vector<float> buf(elements);
    bool failed = false;  // call kill_at failed once, and is made again on the new group
    for (int call = 0; call < calls; ++call) {
      if (rank == 2 && call == kill_at) raise(SIGKILL);
      const bool survivors = call > kill_at || (call == kill_at && failed);
      const int members = survivors ? n - 1 : n;
      CollectiveSpec s = spec_for(survivors ? group + "-again" : group, rank, members, "shm");
      s.keep_group = true;
      s.elements = elements;
      fill_input(Scalar::Float32, ReduceOp::Add, rank, elements, buf.data());
      absl::Status st = run_collective(s, buf.data(), elements * 4);
      if (call == kill_at && !failed) {
        if (st.code() != absl::StatusCode::kUnavailable || std::string(st.message()).find("rank 2") == std::string::npos)
          return absl::InternalError(cat("call ", call, " after rank 2 died: ", st.ToString()));
        if (live_collective_groups() != inherited)
          return absl::InternalError(cat("the failed group is kept: ", live_collective_groups() - inherited, " living"));
        failed = true;
        --call;
        continue;
      }
      if (!st.ok()) return absl::Status(st.code(), cat("call ", call, ": ", st.message()));
      if (live_collective_groups() != inherited + 1)
        return absl::InternalError(cat("call ", call, ": ", live_collective_groups() - inherited, " living groups"));
      const std::vector<uint8_t> want = ring_reference(Scalar::Float32, ReduceOp::Add, members, elements);
      if (first_mismatch(Scalar::Float32, ReduceOp::Add, members, buf.data(), want, elements, false) >= 0)
        return absl::InternalError(cat("call ", call, ": not the ring's sum"));
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(reports[r].status().ok()) << "rank " << r << ": " << reports[r].status();
  EXPECT_EQ(reports[2].code, -1) << "rank 2 was to die";
}

}  // namespace
}  // namespace uop
