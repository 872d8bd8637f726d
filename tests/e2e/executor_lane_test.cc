// The executor's buffer traffic to an embedded uop-worker (a real process) when its
// execute lane has no free slot: the pieces that find none go over gRPC, the others
// through the lane, and the buffer ends up holding every byte where it belongs. The
// slots are made busy by holding claims on them, as concurrent calls would.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

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

TEST(ExecutorLane, BufferTrafficTakesGrpcWhereNoSlotIsFree) {
  WorkerPool pool;
  WorkerOptions o;
  o.worker_binary = UOP_WORKER_BINARY;
  o.embedded_cpu_workers = 1;
  o.threads_per_worker = 2;
  ASSERT_TRUE(pool.start_embedded(o).ok());
  auto w = pool.worker_for("CPU:0");
  ASSERT_TRUE(w.ok()) << w.status();
  std::shared_ptr<ExecLane> lane = (*w)->lane();
  ASSERT_TRUE(lane) << "an embedded worker serves an execute lane";
  Executor ex(&pool);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  constexpr uint64_t kPiece = 1 << 20;
  const uint64_t id = Executor::new_buffer_id(*w);
  ASSERT_TRUE(ex.alloc(*w, id, 3 * kPiece + 100, deadline).ok());

  // Piece 0 with the lane free, piece 1 with every slot taken (gRPC), piece 2 free again:
  // one writer, both ways.
  const std::vector<std::string> pieces = {pattern(kPiece, 1), pattern(kPiece, 2), pattern(kPiece + 100, 3)};
  {
    std::unique_ptr<Executor::BufferWriter> writer = ex.open_writer(*w, id, deadline);
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
    auto via_grpc = ex.read(*w, id, 0, want.size(), deadline);
    ASSERT_TRUE(via_grpc.ok()) << via_grpc.status();
    EXPECT_TRUE(*via_grpc == want) << "read over gRPC differs";
  }
  auto via_lane = ex.read(*w, id, 0, want.size(), deadline);
  ASSERT_TRUE(via_lane.ok()) << via_lane.status();
  EXPECT_TRUE(*via_lane == want) << "read through the lane differs";
  // A read at an offset, across the pieces' boundary.
  auto middle = ex.read(*w, id, kPiece - 10, 20, deadline);
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_EQ(*middle, want.substr(kPiece - 10, 20));

  // A write past the end is refused by the worker, whichever way it goes, and names it.
  for (bool busy : {false, true}) {
    std::vector<ExecLane::Call> held;
    if (busy) held = hold_every_slot(*lane);
    absl::Status s = ex.write(*w, id, 3 * kPiece, pattern(200, 4), deadline);
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << (busy ? "gRPC: " : "lane: ") << s;
  }
  pool.shutdown();
}

}  // namespace
}  // namespace uop
