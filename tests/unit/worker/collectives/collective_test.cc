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

}  // namespace
}  // namespace uop
