// The executor's buffer traffic to an embedded uop-worker (a real process) when its
// execute lane has no free slot: the pieces that find none go over gRPC, the others
// through the lane, and the buffer ends up holding every byte where it belongs. The
// slots are made busy by holding claims on them, as concurrent calls would. And the
// frees nobody waits for (a Run's retired buffers): sent by the executor's own thread,
// through the lane or over gRPC, they free exactly what they name.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "proto/worker.grpc.pb.h"
#include "server/executor.h"
#include "server/workers.h"

namespace uop {
namespace {

using server::Executor;

// Every free slot of the lane, held until the vector goes.
std::vector<ExecLane::Call> hold_every_slot(ExecLane& lane) {
  std::vector<ExecLane::Call> held;
  while (std::optional<ExecLane::Call> c = lane.claim()) held.push_back(std::move(*c));
  return held;
}

std::string pattern(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(((i + seed) * 2654435761u) >> 15);
  return s;
}

// One embedded worker (a real uop-worker process), its lane, and an executor over it.
class ExecutorLane : public ::testing::Test {
 protected:
  void SetUp() override {
    WorkerOptions o;
    o.worker_binary = UOP_WORKER_BINARY;
    o.embedded_cpu_workers = 1;
    o.threads_per_worker = 1;
    ASSERT_TRUE(pool.start_embedded(o).ok());
    auto found = pool.worker_for("CPU:0");
    ASSERT_TRUE(found.ok()) << found.status();
    w = *found;
    lane = w->lane();
    ASSERT_TRUE(lane) << "an embedded worker serves an execute lane";
    ex = std::make_unique<Executor>(&pool);
  }
  void TearDown() override {
    ex.reset();
    pool.shutdown();
  }
  WorkerPool pool;
  Executor::Worker w;
  std::shared_ptr<ExecLane> lane;
  std::unique_ptr<Executor> ex;
};

TEST_F(ExecutorLane, BufferTrafficTakesGrpcWhereNoSlotIsFree) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  constexpr uint64_t kPiece = 1 << 20;
  const uint64_t id = Executor::new_buffer_id(w);
  ASSERT_TRUE(ex->alloc(w, id, 3 * kPiece + 100, deadline).ok());

  // Piece 0 with the lane free, piece 1 with every slot taken (gRPC), piece 2 free again:
  // one writer, both ways.
  const std::vector<std::string> pieces = {pattern(kPiece, 1), pattern(kPiece, 2), pattern(kPiece + 100, 3)};
  {
    std::unique_ptr<Executor::BufferWriter> writer = ex->open_writer(w, id, deadline);
    std::string p0 = pieces[0], p1 = pieces[1], p2 = pieces[2];
    ASSERT_TRUE(writer->write(0, p0).ok());
    {
      std::vector<ExecLane::Call> held = hold_every_slot(*lane);
      ASSERT_EQ(held.size(), lane->slots());
      ASSERT_TRUE(writer->write(kPiece, p1).ok());
    }
    ASSERT_TRUE(writer->write(2 * kPiece, p2).ok());
    absl::Status s = writer->finish();
    ASSERT_TRUE(s.ok()) << s;
  }
  const std::string want = pieces[0] + pieces[1] + pieces[2];

  // Read back over gRPC (every slot held), then through the lane: the same bytes.
  {
    std::vector<ExecLane::Call> held = hold_every_slot(*lane);
    auto via_grpc = ex->read(w, id, 0, want.size(), deadline);
    ASSERT_TRUE(via_grpc.ok()) << via_grpc.status();
    EXPECT_TRUE(*via_grpc == want) << "read over gRPC differs";
  }
  auto via_lane = ex->read(w, id, 0, want.size(), deadline);
  ASSERT_TRUE(via_lane.ok()) << via_lane.status();
  EXPECT_TRUE(*via_lane == want) << "read through the lane differs";
  // A read at an offset, across the pieces' boundary.
  auto middle = ex->read(w, id, kPiece - 10, 20, deadline);
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_EQ(*middle, want.substr(kPiece - 10, 20));

  // A write past the end is refused by the worker, whichever way it goes, and names it.
  for (bool busy : {false, true}) {
    std::vector<ExecLane::Call> held;
    if (busy) held = hold_every_slot(*lane);
    absl::Status s = ex->write(w, id, 3 * kPiece, pattern(200, 4), deadline);
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << (busy ? "gRPC: " : "lane: ") << s;
  }
}

// Buffers the worker reports (its Info, over gRPC).
uint64_t worker_buffers(const Executor::Worker& w) {
  auto stub = Executor::stub(w);
  if (!stub.ok()) return UINT64_MAX;
  grpc::ClientContext ctx;
  ::uopd::worker::v1::InfoResponse info;
  if (!(*stub)->Info(&ctx, ::uopd::worker::v1::InfoRequest(), &info).ok()) return UINT64_MAX;
  return info.buffers();
}

TEST_F(ExecutorLane, FreesNobodyWaitsForGoThroughTheLaneOrGrpcAndFreeWhatTheyName) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(Executor::new_buffer_id(w));
    ASSERT_TRUE(ex->alloc(w, ids.back(), 4096, deadline).ok());
  }
  ASSERT_EQ(worker_buffers(w), 6u);
  const uint64_t generation = w->generation();
  // Two through the lane, then two with every slot held (gRPC), then one for a process
  // generation that is not the worker's: nothing is sent for it.
  ex->free_later(w, generation, {ids[0], ids[1]});
  ex->wait_for_frees();
  EXPECT_EQ(worker_buffers(w), 4u);
  {
    std::vector<ExecLane::Call> held = hold_every_slot(*lane);
    ex->free_later(w, generation, {ids[2], ids[3]});
    ex->wait_for_frees();
  }
  EXPECT_EQ(worker_buffers(w), 2u);
  ex->free_later(w, generation + 1, {ids[4]});
  ex->wait_for_frees();
  EXPECT_EQ(worker_buffers(w), 2u);
  // The buffers left are the two never named, whole.
  for (uint64_t id : {ids[4], ids[5]}) {
    auto back = ex->read(w, id, 0, 4096, deadline);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, std::string(4096, '\0'));
  }
}

}  // namespace
}  // namespace uop
