// The scheduler's request limits without a server: the wire scan's node counts and memory
// estimates (an upper bound of what protobuf then takes, for real requests and for
// floods) and the budget for bytes in flight. (A Run's quota reservations and the session
// limits: sessions_test.cc.)
#include <gtest/gtest.h>

#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/uopd.pb.h"
#include "server/inflight.h"
#include "server/wire_scan.h"

namespace uop::server {
namespace {

namespace pb = ::uopd::v1;
namespace gpb = google::protobuf;

absl::StatusOr<WireCost> scan(const std::string& bytes, const gpb::Descriptor& type, WireScanLimits limits = {}) {
  gpb::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()), /*block_size=*/4096);
  return scan_wire(in, type, limits);
}

WireScanLimits nodes_counted() {
  WireScanLimits l;
  l.count = ::uop::v1::Node::descriptor();
  return l;
}

// What protobuf takes for the message once parsed on an arena, as the service parses.
uint64_t parsed_bytes(const std::string& bytes, const gpb::Message& prototype) {
  gpb::Arena arena;
  gpb::Message* m = prototype.New(&arena);
  EXPECT_TRUE(m->ParseFromString(bytes));
  return arena.SpaceUsed();
}

TEST(WireScan, CountsNodesAndBoundsWhatTheParseTakes) {
  for (int64_t n : {1, 10, 1000}) {
    Graph g;
    TensorBuilder tb(g);
    const UOp* x = tb.input(Scalar::Float32, {n});
    const UOp* y = x;
    for (int i = 0; i < 20; ++i) y = tb.alu(Op::ADD, {y, tb.full(Scalar::Float32, double(i), {n})});
    pb::RunRequest req;
    req.set_session_id("s");
    encode_proto(tb.sink({y}), {{"x", tb.buffer_of(x)}}, req.mutable_graph());
    pb::Binding* b = req.add_inputs();
    b->set_name("x");
    b->mutable_tensor()->set_data(std::string(4 * n, 'x'));
    const std::string bytes = req.SerializeAsString();
    auto cost = scan(bytes, *pb::RunRequest::descriptor(), nodes_counted());
    ASSERT_TRUE(cost.ok()) << cost.status();
    EXPECT_EQ(cost->counted, static_cast<uint64_t>(req.graph().nodes_size()));
    EXPECT_FALSE(cost->stopped);
    EXPECT_GE(cost->bytes, parsed_bytes(bytes, pb::RunRequest::default_instance())) << n;
  }
}

TEST(WireScan, AFloodOfTinyMessagesCostsWhatItWouldOnceParsed) {
  // 100k empty nodes, 200 kB on the wire.
  std::string graph = "\x08\x01";
  for (int i = 0; i < 100000; ++i) graph += std::string("\x12\x00", 2);
  auto cost = scan(graph, *::uop::v1::Graph::descriptor(), nodes_counted());
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(cost->counted, 100000u);
  const uint64_t parsed = parsed_bytes(graph, ::uop::v1::Graph::default_instance());
  EXPECT_GE(cost->bytes, parsed);
  EXPECT_GT(parsed, 20 * graph.size()) << "the premise: tiny on the wire, large in memory";
  // It stops at a limit without reading on.
  WireScanLimits l = nodes_counted();
  l.max_counted = 10;
  auto early = scan(graph, *::uop::v1::Graph::descriptor(), l);
  ASSERT_TRUE(early.ok());
  EXPECT_TRUE(early->stopped);
  EXPECT_EQ(early->counted, 11u);
  WireScanLimits b;
  b.max_bytes = 1 << 16;
  auto by_bytes = scan(graph, *::uop::v1::Graph::descriptor(), b);
  ASSERT_TRUE(by_bytes.ok());
  EXPECT_TRUE(by_bytes->stopped);
}

TEST(WireScan, PackedAndUnknownFieldsAreCounted) {
  ::uop::v1::Graph g;
  g.set_format_version(::uop::v1::FORMAT_VERSION_1);
  ::uop::v1::Node* n = g.add_nodes();
  for (int i = 0; i < 5000; ++i) n->add_src(static_cast<uint32_t>(i));  // packed varints
  std::string bytes = g.SerializeAsString();
  bytes += std::string("\xf8\x07\x01", 3);  // field 127 (unknown), varint 1
  auto cost = scan(bytes, *::uop::v1::Graph::descriptor(), nodes_counted());
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(cost->counted, 1u);
  EXPECT_GE(cost->bytes, parsed_bytes(bytes, ::uop::v1::Graph::default_instance()));
  EXPECT_GE(cost->bytes, 5000u * 4);
}

TEST(WireScan, RefusesWhatIsNotAMessage) {
  for (std::string bad : {std::string("\x12\x05\x08", 3),      // a node cut off before its length
                          std::string("\x00\x01", 2),          // field 0
                          std::string("\x12\xff\xff\xff\xff\x0f", 6)}) {  // a length past the input
    auto cost = scan(bad, *::uop::v1::Graph::descriptor());
    EXPECT_EQ(cost.status().code(), absl::StatusCode::kInvalidArgument) << cost.status();
  }
  // Nesting deeper than allowed: Graph > Node > WmmaArg > AxisFactor is three levels.
  ::uop::v1::Graph g;
  g.add_nodes()->mutable_wmma()->add_upcast_a()->set_factor(2);
  WireScanLimits l;
  l.max_depth = 2;
  auto deep = scan(g.SerializeAsString(), *::uop::v1::Graph::descriptor(), l);
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument) << deep.status();
  EXPECT_TRUE(scan(g.SerializeAsString(), *::uop::v1::Graph::descriptor()).ok());
}

TEST(ByteBudget, OneRequestsCapAndEveryonesLimit) {
  ByteBudget budget(1000);
  ByteBudget::Hold a = budget.hold(600);
  EXPECT_TRUE(a.grow(500, "a").ok());
  absl::Status cap = a.grow(200, "more of a");
  EXPECT_EQ(cap.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(cap.message().find("--max-request-memory"), std::string::npos) << cap;
  ByteBudget::Hold b = budget.hold(600);
  absl::Status all = b.grow(600, "b");
  EXPECT_EQ(all.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(all.message().find("--max-inflight-bytes"), std::string::npos) << all;
  EXPECT_TRUE(b.grow(500, "b").ok());
  EXPECT_EQ(budget.in_use(), 1000u);
  a.shrink(400);
  EXPECT_EQ(budget.in_use(), 600u);
  { ByteBudget::Hold gone = std::move(b); }
  EXPECT_EQ(budget.in_use(), 100u);
  EXPECT_EQ(budget.refusals(), 2u);
  EXPECT_FALSE(a.grow(UINT64_MAX, "huge").ok());  // no wrap-around
}

}  // namespace
}  // namespace uop::server
