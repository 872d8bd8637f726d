// The wire codec: every op, arg kind, dtype and enum value round-trips through binary and
// JSON with its digest intact, and hostile input of every kind comes back as
// INVALID_ARGUMENT naming the node and the rule, never as a crash or a hang.
#include "compiler/ir/codec.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "compiler/ir/digest.h"
#include "compiler/support/strings.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/json_util.h"
#include "proto/uop.pb.h"

namespace uop {
namespace {

std::string_view sv(absl::string_view s) { return {s.data(), s.size()}; }

bool contains(const absl::Status& st, const std::string& part) {
  return sv(st.message()).find(part) != std::string_view::npos;
}

void expect_invalid(const absl::Status& st, std::string_view tag, const std::string& where) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(contains(st, cat("[", tag, "]"))) << "want [" << tag << "] in: " << st;
  EXPECT_TRUE(contains(st, where)) << "want '" << where << "' in: " << st;
}

// Non-default values of every arg kind, so that an arg has to travel to come back equal.
Arg sample_arg(ArgKind k) {
  switch (k) {
    case ArgKind::None: return NoArg{};
    case ArgKind::Const: return ConstValue::Float(2.5);
    case ArgKind::VConst: return VConstArg{{ConstValue::Int(3), ConstValue::Int(-1), ConstValue::Int(7)}};
    case ArgKind::Int: return IntArg{-42};
    case ArgKind::Ints: return IntsArg{{2, 0, 1}};
    case ArgKind::Bools: return BoolsArg{{true, false, true}};
    case ArgKind::Range: return RangeArg{7, AxisType::GroupReduce, true};
    case ArgKind::ReduceAxis: return ReduceAxisArg{ReduceOp::Max, {1, 3}};
    case ArgKind::ReduceOp: return ReduceOpArg{ReduceOp::Min};
    case ArgKind::Buffer: return BufferArg{1024};
    case ArgKind::BufferView: return BufferViewArg{16, 8};
    case ArgKind::Bufferize: return BufferizeArg{"CUDA:1", AddrSpace::Local, false};
    case ArgKind::Param: return ParamArg{3, 256};
    case ArgKind::DefineVar: return DefineVarArg{"batch", 1, 64};
    case ArgKind::DefineReg: return DefineRegArg{4, 2};
    case ArgKind::Str: return StrArg{"line one\nline \"two\" \xc3\xa9"};
    case ArgKind::Bytes: return BytesArg{std::string("\x00\xff\x7f\x80 elf", 8)};
    case ArgKind::AxisFactors: return AxisFactorsArg{{{0, 4}, {2, -2}}};
    case ArgKind::Wmma: {
      WmmaArg w;
      w.name = "WMMA_16_16_16_half_float";
      w.n = 16, w.m = 8, w.k = 4;
      w.dtype_in = Scalar::BFloat16;
      w.dtype_out = Scalar::Float64;
      w.device = "CUDA";
      w.threads = 64;
      w.upcast_a = {{0, 2}};
      w.upcast_b = {{1, 2}, {2, 2}};
      w.upcast_c = {{3, 4}};
      w.reduce_axes = {{4, 16}};
      w.tile_grid_x = 2, w.tile_grid_y = 3;
      return w;
    }
    case ArgKind::CallInfo: return CallInfoArg{"fn", "grad", {"a", "b"}, true, true};
    case ArgKind::KernelInfo: return KernelInfoArg{true, "r_16_4"};
    case ArgKind::Device: return DeviceArg{{"CPU:0", "CUDA:1"}};
    case ArgKind::CustomFunction: return CustomFunctionArg{CustomFunctionKind::Graph, "g"};
  }
  return NoArg{};
}

// A node of `op` with its arg kind and as many simple leaf sources as ops.def allows.
const UOp* sample_node(Graph& g, Op op, bool with_default_arg) {
  const OpInfo& info = op_info(op);
  int nsrc = info.max_src < 0 ? info.min_src + 2 : info.max_src;
  std::vector<const UOp*> src;
  for (int k = 0; k < nsrc; ++k) src.push_back(g.cnst_int(dtypes::int32, 100 + k));
  Arg arg = with_default_arg ? default_arg(info.arg) : sample_arg(info.arg);
  DType dt = dtypes::float32.vec(4);
  if (op == Op::CONST) dt = with_default_arg ? dtypes::int32 : dtypes::float32;  // the value's type
  if (op == Op::VCONST) dt = dtypes::index.vec(with_default_arg ? 0 : 3);
  return g.make(op, dt, src, std::move(arg));
}

// Decodes `root` back from binary and from JSON, and checks the node is the same.
void expect_round_trip(const UOp* root, const Names& names = {}) {
  for (bool json : {false, true}) {
    SCOPED_TRACE(json ? "json" : "binary");
    absl::StatusOr<DecodedGraph> d = json ? decode_json(encode_json(root, names)) : decode_binary(encode_binary(root, names));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->root, d->nodes.back());
    EXPECT_EQ(d->root->op(), root->op());
    EXPECT_EQ(d->root->dtype(), root->dtype());
    EXPECT_TRUE(d->root->arg() == root->arg()) << arg_str(d->root->arg()) << " vs " << arg_str(root->arg());
    EXPECT_EQ(d->root->digest().hex(), root->digest().hex());
    ASSERT_EQ(d->names.size(), names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ(d->names[i].first, names[i].first);
      EXPECT_EQ(d->names[i].second->digest().hex(), names[i].second->digest().hex());
    }
  }
}

// ---------------------------------------------------------------------------------------
// Names: ops.def and the proto enums agree, so mapping by name is total.

TEST(CodecNames, EveryOpIsInTheProtoEnumAndBack) {
  const google::protobuf::EnumDescriptor* d = v1::Op_descriptor();
  for (int i = 0; i < kNumOps; ++i) {
    std::string name(op_name(static_cast<Op>(i)));
    EXPECT_NE(d->FindValueByName(name), nullptr) << name << " is in ops.def but not in uop.v1.Op";
  }
  for (int i = 0; i < d->value_count(); ++i) {
    const std::string& name = d->value(i)->name();
    if (d->value(i)->number() == 0) continue;  // OP_UNSPECIFIED
    EXPECT_TRUE(op_from_name(name).has_value()) << name << " is in uop.v1.Op but not in ops.def";
  }
  EXPECT_EQ(d->value_count(), kNumOps + 1);
}

TEST(CodecNames, ScalarsAndAddrSpacesAreInTheProto) {
  const google::protobuf::EnumDescriptor* scalars = v1::DType_Scalar_descriptor();
  EXPECT_EQ(scalars->value_count(), kNumScalars);
  for (int i = 0; i < kNumScalars; ++i) {
    std::string name(scalar_name(static_cast<Scalar>(i)));
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_NE(scalars->FindValueByName(name), nullptr) << name;
  }
  const google::protobuf::EnumDescriptor* spaces = v1::DType_AddrSpace_descriptor();
  EXPECT_EQ(spaces->value_count(), 3);
  for (const char* name : {"GLOBAL", "LOCAL", "REG"}) EXPECT_NE(spaces->FindValueByName(name), nullptr);
  EXPECT_EQ(v1::RangeArg_AxisType_descriptor()->value_count(), 10);
  EXPECT_EQ(v1::ReduceOpArg_Kind_descriptor()->value_count(), 4);
  EXPECT_EQ(v1::CustomFunctionArg_Kind_descriptor()->value_count(), 2);
}

// Every value of every arg enum survives the trip, which fails if any two are mapped to
// one proto value or a name is spelled differently.
TEST(CodecNames, EveryArgEnumValueRoundTrips) {
  Graph g;
  std::vector<const UOp*> all;
  const UOp* end = g.idx(4);
  for (int t = 0; t <= static_cast<int>(AxisType::Unroll); ++t)
    all.push_back(g.make(Op::RANGE, dtypes::index, {end}, RangeArg{t, static_cast<AxisType>(t), t % 2 == 0}));
  for (int r = 0; r <= static_cast<int>(ReduceOp::Min); ++r) {
    all.push_back(g.make(Op::REDUCE, dtypes::float32, {end}, ReduceOpArg{static_cast<ReduceOp>(r)}));
    all.push_back(g.make(Op::REDUCE_AXIS, dtypes::float32, {end}, ReduceAxisArg{static_cast<ReduceOp>(r), {r}}));
  }
  for (int a = 0; a <= static_cast<int>(AddrSpace::Reg); ++a)
    all.push_back(g.make(Op::BUFFERIZE, dtypes::float32, {end}, BufferizeArg{"", static_cast<AddrSpace>(a), true}));
  for (auto k : {CustomFunctionKind::EncDec, CustomFunctionKind::Graph})
    all.push_back(g.make(Op::CUSTOM_FUNCTION, dtypes::void_, {}, CustomFunctionArg{k, "f"}));
  for (int s = 0; s < kNumScalars; ++s) {
    WmmaArg w;
    w.dtype_in = w.dtype_out = static_cast<Scalar>(s);
    all.push_back(g.make(Op::WMMA, dtypes::float32, {end, end, end}, w));
  }
  const UOp* root = g.make(Op::SINK, dtypes::void_, all);
  expect_round_trip(root);
  auto d = decode_binary(encode_binary(root));
  ASSERT_TRUE(d.ok()) << d.status();
  for (size_t i = 0; i < all.size(); ++i)
    EXPECT_TRUE(d->root->src(i)->arg() == all[i]->arg()) << i << ": " << arg_str(all[i]->arg());
}

// ---------------------------------------------------------------------------------------
// Round trips

TEST(CodecRoundTrip, SampleArgsAreNotDefaults) {
  for (int k = 1; k < kNumArgKinds; ++k)
    EXPECT_FALSE(sample_arg(static_cast<ArgKind>(k)) == default_arg(static_cast<ArgKind>(k)))
        << arg_kind_name(static_cast<ArgKind>(k));
}

TEST(CodecRoundTrip, EveryOp) {
  for (int i = 0; i < kNumOps; ++i) {
    Op op = static_cast<Op>(i);
    SCOPED_TRACE(op_name(op));
    Graph g;
    const UOp* u = sample_node(g, op, /*with_default_arg=*/false);
    expect_round_trip(u);
    // The arg is on the wire, not reconstructed from a default.
    v1::Graph pb;
    encode_proto(u, {}, &pb);
    EXPECT_EQ(pb.nodes(pb.nodes_size() - 1).arg_case() == v1::Node::ARG_NOT_SET, op_info(op).arg == ArgKind::None);
  }
}

// Zero-valued args still state their oneof field (proto3 oneofs keep presence), and the
// plain SINK / CALL / FUNCTION leave theirs out.
TEST(CodecRoundTrip, EveryOpWithDefaultArg) {
  for (int i = 0; i < kNumOps; ++i) {
    Op op = static_cast<Op>(i);
    SCOPED_TRACE(op_name(op));
    Graph g;
    const UOp* u = sample_node(g, op, /*with_default_arg=*/true);
    expect_round_trip(u);
    v1::Graph pb;
    encode_proto(u, {}, &pb);
    ArgKind k = op_info(op).arg;
    bool omitted = k == ArgKind::None || k == ArgKind::CallInfo || k == ArgKind::KernelInfo;
    EXPECT_EQ(pb.nodes(pb.nodes_size() - 1).arg_case() == v1::Node::ARG_NOT_SET, omitted);
  }
}

TEST(CodecRoundTrip, EveryDType) {
  Graph g;
  std::vector<const UOp*> all;
  std::vector<DType> dtypes_;
  for (int s = 0; s < kNumScalars; ++s) {
    DType base(static_cast<Scalar>(s));
    for (uint32_t count : {1u, 4u, 1u << 16}) {
      dtypes_.push_back(base.vec(count));
      for (int a = 0; a <= static_cast<int>(AddrSpace::Reg); ++a)
        for (int64_t size : {int64_t{-1}, int64_t{0}, int64_t{1024}, std::numeric_limits<int64_t>::max()})
          dtypes_.push_back(base.vec(count).ptr_to(static_cast<AddrSpace>(a), size));
    }
  }
  for (size_t i = 0; i < dtypes_.size(); ++i)
    all.push_back(g.make(Op::DEFINE_LOCAL, dtypes_[i], {}, IntArg{static_cast<int64_t>(i)}));
  all.push_back(g.make(Op::VCONST, dtypes::index.vec(0), {}, VConstArg{}));  // the empty shape
  const UOp* root = g.make(Op::SINK, dtypes::void_, all);
  expect_round_trip(root);
  for (bool json : {false, true}) {
    auto d = json ? decode_json(encode_json(root, {}, false)) : decode_binary(encode_binary(root));
    ASSERT_TRUE(d.ok()) << d.status();
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(d->root->src(i)->dtype(), all[i]->dtype()) << all[i]->dtype().str();
  }
}

TEST(CodecRoundTrip, SpecialConstants) {
  using L = std::numeric_limits<double>;
  Graph g;
  std::vector<const UOp*> all;
  auto f = [&](DType dt, double v) { all.push_back(g.make(Op::CONST, dt, {}, ConstValue::Float(v))); };
  for (DType dt : {dtypes::float64, dtypes::float32, dtypes::float16, dtypes::bfloat16}) {
    for (double v : {L::quiet_NaN(), -0.0, 0.0, L::infinity(), -L::infinity(), 1.0, -2.5}) f(dt, v);
  }
  f(dtypes::float64, L::denorm_min());
  f(dtypes::float64, L::max());
  f(dtypes::float64, L::lowest());
  f(dtypes::float64, 0.1);
  f(dtypes::float32, std::ldexp(1.0, -149));                         // float32's smallest subnormal
  f(dtypes::float32, static_cast<double>(std::numeric_limits<float>::max()));
  f(dtypes::float16, std::ldexp(1.0, -24));                          // float16's smallest subnormal
  f(dtypes::float16, std::ldexp(1.0, -14) - std::ldexp(1.0, -24));   // its largest subnormal
  f(dtypes::float16, -std::ldexp(3.0, -24));
  f(dtypes::float16, 65504.0);
  f(dtypes::bfloat16, std::ldexp(1.0, -133));                        // bfloat16's smallest subnormal
  auto c = [&](DType dt, ConstValue v) { all.push_back(g.make(Op::CONST, dt, {}, v)); };
  c(dtypes::int64, ConstValue::Int(std::numeric_limits<int64_t>::min()));
  c(dtypes::int64, ConstValue::Int(std::numeric_limits<int64_t>::max()));
  c(dtypes::index, ConstValue::Int(std::numeric_limits<int64_t>::min()));
  c(dtypes::uint64, ConstValue::UInt(std::numeric_limits<uint64_t>::max()));
  c(dtypes::int8, ConstValue::Int(-128));
  c(dtypes::uint8, ConstValue::UInt(255));
  c(dtypes::bool_, ConstValue::Bool(true));
  c(dtypes::bool_, ConstValue::Bool(false));
  c(dtypes::float32.vec(4), ConstValue::Float(-0.0));  // a vector CONST broadcasts its value
  all.push_back(g.make(Op::VCONST, dtypes::float16.vec(3), {},
                       VConstArg{{ConstValue::Float(-0.0), ConstValue::Float(L::infinity()),
                                  ConstValue::Float(std::ldexp(1.0, -24))}}));
  const UOp* root = g.make(Op::SINK, dtypes::void_, all);
  expect_round_trip(root);
  for (bool json : {false, true}) {
    auto d = json ? decode_json(encode_json(root)) : decode_binary(encode_binary(root));
    ASSERT_TRUE(d.ok()) << d.status();
    for (size_t i = 0; i < all.size(); ++i)  // ConstValue equality is bitwise
      EXPECT_TRUE(d->root->src(i)->arg() == all[i]->arg()) << all[i]->dtype().str() << " " << arg_str(all[i]->arg());
  }
}

// Protobuf prints -0.0 as `-0` and reads that back as +0.0; the encoder rewrites the
// number, and must leave the same characters inside strings alone.
TEST(CodecRoundTrip, JsonKeepsNegativeZeroAndStringsIntact) {
  Graph g;
  const std::string tricky = "-0 \"f\": -0, [-0] \\\" -0";
  const UOp* root = g.make(Op::SINK, dtypes::void_,
                           {g.cnst(dtypes::float64, -0.0), g.make(Op::SOURCE, dtypes::void_, {}, StrArg{tricky}),
                            g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"-0", -1, 0})});
  for (bool pretty : {false, true}) {
    auto d = decode_json(encode_json(root, {{"-0", root}}, pretty));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->root->digest().hex(), root->digest().hex());
    EXPECT_TRUE(std::signbit(d->root->src(0)->const_value()->as_float()));
    EXPECT_EQ(d->root->src(1)->arg_as<StrArg>().value, tricky);
    EXPECT_EQ(d->names[0].first, "-0");
  }
}

// Binary carries a NaN's payload bit for bit. (JSON writes every NaN as "NaN".)
TEST(CodecRoundTrip, NanPayloadInBinary) {
  Graph g;
  const UOp* u = g.make(Op::CONST, dtypes::float64, {}, ConstValue::Float(std::bit_cast<double>(uint64_t{0xfff0000000000123})));
  auto d = decode_binary(encode_binary(u));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->root->const_value()->bits(), u->const_value()->bits());
  EXPECT_EQ(d->root->digest().hex(), u->digest().hex());
}

TEST(CodecRoundTrip, Names) {
  Graph g;
  const UOp* a = g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"a", 0, 9});
  const UOp* b = g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"b", 0, 9});
  const UOp* sum = g.alu(Op::ADD, {a, g.idx(1)});
  const UOp* unreachable = g.alu(Op::MUL, {b, b});
  Names names = {{"out", sum}, {"a", a}, {"side", unreachable}, {"also a", a}, {"", sum}};
  expect_round_trip(sum, names);
  auto d = decode_binary(encode_binary(sum, names));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->names[1].second, d->names[3].second);
  EXPECT_EQ(d->names[0].second, d->root);
  EXPECT_EQ(d->root->op(), Op::ADD);
}

// A named node may use the root; the root then travels twice and decodes to one node.
TEST(CodecRoundTrip, NamedNodeAboveTheRoot) {
  Graph g;
  const UOp* root = g.make(Op::DEFINE_VAR, dtypes::index, {}, DefineVarArg{"n", 1, 8});
  const UOp* above = g.alu(Op::MUL, {root, g.idx(2)});
  Names names = {{"above", above}};
  v1::Graph pb;
  encode_proto(root, names, &pb);
  EXPECT_EQ(pb.nodes_size(), 4);
  expect_round_trip(root, names);
  auto d = decode_proto(pb);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->root, d->nodes[0]);
  EXPECT_EQ(d->index.at(d->root), 0u);
  EXPECT_EQ(d->names[0].second->src(0), d->root);
}

TEST(CodecRoundTrip, JsonIsSnakeCaseWithEnumNames) {
  Graph g;
  const UOp* u = g.alu(Op::ADD, {g.cnst(dtypes::float32, 1.5), g.make(Op::DEFINE_VAR, dtypes::float32, {}, DefineVarArg{"x", 0, 1})});
  std::string pretty = encode_json(u, {{"y", u}});
  for (const char* want : {"\"format_version\": \"FORMAT_VERSION_1\"", "\"op\": \"ADD\"", "\"const_value\"",
                           "\"define_var\"", "\"scalar\": \"FLOAT32\"", "\"names\""})
    EXPECT_NE(pretty.find(want), std::string::npos) << want << " in " << pretty;
  std::string compact = encode_json(u, {}, /*pretty=*/false);
  EXPECT_EQ(compact.find('\n'), std::string::npos);
  EXPECT_NE(compact.find("\"op\":\"ADD\""), std::string::npos) << compact;
}

TEST(CodecDecode, HandWrittenJsonInEitherCase) {
  const char* json = R"({
    "formatVersion": "FORMAT_VERSION_1",
    "nodes": [
      {"op": "CONST", "dtype": {"scalar": "FLOAT32"}, "constValue": {"f": 1.5}},
      {"op": "CONST", "dtype": {"scalar": "FLOAT32"}, "const_value": {"f": "Infinity"}},
      {"op": "ADD", "dtype": {"scalar": "FLOAT32", "count": 1}, "src": [0, 1]},
      {"op": "SINK", "src": [2]}
    ],
    "names": [{"name": "sum", "node": 2}]
  })";
  auto d = decode_json(json);
  ASSERT_TRUE(d.ok()) << d.status();
  Graph g;
  const UOp* want = g.make(Op::SINK, dtypes::void_, {g.alu(Op::ADD, {g.cnst(dtypes::float32, 1.5), g.cnst(dtypes::float32, INFINITY)})});
  EXPECT_EQ(d->root->digest().hex(), want->digest().hex());
  ASSERT_EQ(d->names.size(), 1u);
  EXPECT_EQ(d->names[0].second, d->root->src(0));
}

TEST(CodecDecode, HashConsesDuplicates) {
  v1::Graph pb;
  pb.set_format_version(v1::FORMAT_VERSION_1);
  for (int i = 0; i < 2; ++i) {
    v1::Node* c = pb.add_nodes();
    c->set_op(v1::CONST);
    c->mutable_dtype()->set_scalar(v1::DType::INT32);
    c->mutable_const_value()->set_i(7);
  }
  v1::Node* add = pb.add_nodes();
  add->set_op(v1::ADD);
  add->mutable_dtype()->set_scalar(v1::DType::INT32);
  add->add_src(0);
  add->add_src(1);
  auto d = decode_proto(pb);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->nodes[0], d->nodes[1]);
  EXPECT_EQ(d->index.at(d->nodes[1]), 0u);  // the first wire index names it
  EXPECT_EQ(d->root->src(0), d->root->src(1));
  EXPECT_EQ(d->graph->size(), 2u);
}

TEST(CodecDecode, SinkCallFunctionMayOmitTheirArg) {
  for (v1::Op op : {v1::SINK, v1::CALL, v1::FUNCTION}) {
    v1::Graph pb;
    pb.set_format_version(v1::FORMAT_VERSION_1);
    v1::Node* c = pb.add_nodes();
    c->set_op(v1::CONST);
    c->mutable_dtype()->set_scalar(v1::DType::BOOL);
    c->mutable_const_value()->set_b(true);
    v1::Node* n = pb.add_nodes();
    n->set_op(op);
    n->add_src(0);
    auto d = decode_proto(pb);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->root->arg() == default_arg(op_info(d->root->op()).arg));
  }
}

TEST(CodecDecode, DeepChainHasNoRecursion) {
  constexpr int kDepth = 200'000;
  Graph g;
  const UOp* u = g.cnst(dtypes::float32, 1.0);
  for (int i = 0; i < kDepth; ++i) u = g.make(Op::NEG, dtypes::float32, {u});
  std::string bytes = encode_binary(u);
  auto d = decode_binary(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->nodes.size(), size_t{kDepth} + 1);
  EXPECT_EQ(d->root->digest().hex(), u->digest().hex());
  auto j = decode_json(encode_json(u, {}, /*pretty=*/false));
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->root->digest().hex(), u->digest().hex());
}

// ---------------------------------------------------------------------------------------
// Invalid input: one case per rule.

// 0 CONST f32 1.5 | 1 CONST f32 2 | 2 ADD(0,1) | 3 CONST index 16 | 4 RANGE(3) | 5 SINK(2,4)
// names: "out" -> 5
v1::Graph valid_graph() {
  v1::Graph pb;
  pb.set_format_version(v1::FORMAT_VERSION_1);
  auto node = [&](v1::Op op, v1::DType::Scalar s, std::initializer_list<uint32_t> src) {
    v1::Node* n = pb.add_nodes();
    n->set_op(op);
    if (s != v1::DType::VOID) n->mutable_dtype()->set_scalar(s);
    for (uint32_t i : src) n->add_src(i);
    return n;
  };
  node(v1::CONST, v1::DType::FLOAT32, {})->mutable_const_value()->set_f(1.5);
  node(v1::CONST, v1::DType::FLOAT32, {})->mutable_const_value()->set_f(2.0);
  node(v1::ADD, v1::DType::FLOAT32, {0, 1});
  node(v1::CONST, v1::DType::INDEX, {})->mutable_const_value()->set_i(16);
  node(v1::RANGE, v1::DType::INDEX, {3})->mutable_range()->set_type(v1::RangeArg::LOOP);
  node(v1::SINK, v1::DType::VOID, {2, 4});
  v1::Name* name = pb.add_names();
  name->set_name("out");
  name->set_node(5);
  return pb;
}

TEST(CodecInvalidBase, TheValidGraphDecodes) {
  auto d = decode_proto(valid_graph());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->root->op(), Op::SINK);
}

struct BadCase {
  std::string name;
  std::function<void(v1::Graph&, DecodeLimits&)> mutate;
  std::string_view tag;
  std::string where;  // a part of the message: the node (and op) or what is named
};

// Turns node 5 (the SINK) into another op with other sources.
v1::Node* retarget(v1::Graph& g, v1::Op op, std::initializer_list<uint32_t> src) {
  v1::Node* n = g.mutable_nodes(5);
  n->Clear();
  n->set_op(op);
  for (uint32_t i : src) n->add_src(i);
  return n;
}

std::vector<BadCase> bad_cases() {
  using G = v1::Graph;
  using L = DecodeLimits;
  return {
      {"VersionMissing", [](G& g, L&) { g.clear_format_version(); }, "codec.version", "graph: format_version is 0"},
      {"VersionTwo", [](G& g, L&) { g.set_format_version(static_cast<v1::FormatVersion>(2)); }, "codec.version", "graph:"},
      {"NoNodes", [](G& g, L&) { g.clear_nodes(); g.clear_names(); }, "codec.empty", "graph:"},
      {"TooManyNodes", [](G&, L& l) { l.max_nodes = 5; }, "codec.limits", "max_nodes (5)"},
      {"UnknownOp", [](G& g, L&) { g.mutable_nodes(2)->set_op(static_cast<v1::Op>(999)); }, "codec.op", "node 2: op 999"},
      {"UnspecifiedOp", [](G& g, L&) { g.mutable_nodes(2)->set_op(v1::OP_UNSPECIFIED); }, "codec.op", "node 2: op 0"},
      {"UnknownScalar", [](G& g, L&) { g.mutable_nodes(2)->mutable_dtype()->set_scalar(static_cast<v1::DType::Scalar>(99)); },
       "codec.enum", "node 2 (ADD): dtype scalar 99"},
      {"UnknownAddrSpace",
       [](G& g, L&) {
         g.mutable_nodes(2)->mutable_dtype()->set_ptr(true);
         g.mutable_nodes(2)->mutable_dtype()->set_addrspace(static_cast<v1::DType::AddrSpace>(7));
       },
       "codec.enum", "node 2 (ADD): dtype addrspace 7"},
      {"AddrSpaceOnNonPointer", [](G& g, L&) { g.mutable_nodes(2)->mutable_dtype()->set_addrspace(v1::DType::LOCAL); },
       "codec.dtype", "node 2 (ADD)"},
      {"SizeOnNonPointer", [](G& g, L&) { g.mutable_nodes(2)->mutable_dtype()->set_size(4); }, "codec.dtype", "node 2 (ADD)"},
      {"NegativePointerSize",
       [](G& g, L&) {
         g.mutable_nodes(2)->mutable_dtype()->set_ptr(true);
         g.mutable_nodes(2)->mutable_dtype()->set_size(-1);
       },
       "codec.dtype", "node 2 (ADD): pointer size -1"},
      {"CountZero", [](G& g, L&) { g.mutable_nodes(2)->mutable_dtype()->set_count(0); }, "codec.dtype", "node 2 (ADD): dtype count 0"},
      {"CountOverLimit", [](G& g, L&) { g.mutable_nodes(2)->mutable_dtype()->set_count(1u << 20); }, "codec.limits",
       "node 2 (ADD): dtype count 1048576"},
      {"UnknownAxisType", [](G& g, L&) { g.mutable_nodes(4)->mutable_range()->set_type(static_cast<v1::RangeArg::AxisType>(42)); },
       "codec.enum", "node 4 (RANGE): range type 42"},
      {"UnknownReduceOp",
       [](G& g, L&) { retarget(g, v1::REDUCE, {2, 4})->mutable_reduce_op()->set_op(static_cast<v1::ReduceOpArg::Kind>(9)); },
       "codec.enum", "node 5 (REDUCE): reduce op 9"},
      {"UnknownReduceAxisOp",
       [](G& g, L&) { retarget(g, v1::REDUCE_AXIS, {2})->mutable_reduce_axis()->set_op(static_cast<v1::ReduceOpArg::Kind>(-3)); },
       "codec.enum", "node 5 (REDUCE_AXIS): reduce op -3"},
      {"UnknownBufferizeAddrSpace",
       [](G& g, L&) { retarget(g, v1::BUFFERIZE, {2})->mutable_bufferize()->set_addrspace(static_cast<v1::DType::AddrSpace>(3)); },
       "codec.enum", "node 5 (BUFFERIZE): bufferize addrspace 3"},
      {"UnknownCustomFunctionKind",
       [](G& g, L&) { retarget(g, v1::CUSTOM_FUNCTION, {})->mutable_custom_function()->set_kind(static_cast<v1::CustomFunctionArg::Kind>(5)); },
       "codec.enum", "node 5 (CUSTOM_FUNCTION): custom_function kind 5"},
      {"UnknownWmmaDType",
       [](G& g, L&) { retarget(g, v1::WMMA, {0, 1, 2})->mutable_wmma()->set_dtype_out(static_cast<v1::DType::Scalar>(77)); },
       "codec.enum", "node 5 (WMMA): wmma dtype_out 77"},
      {"SelfSource", [](G& g, L&) { g.mutable_nodes(2)->set_src(1, 2); }, "codec.topological",
       "node 2 (ADD): source 1 refers to node 2, which does not come before it"},
      {"ForwardSource", [](G& g, L&) { g.mutable_nodes(2)->set_src(1, 4); }, "codec.topological",
       "node 2 (ADD): source 1 refers to node 4"},
      {"SourceOutOfRange", [](G& g, L&) { g.mutable_nodes(2)->set_src(0, 4'000'000'000u); }, "codec.topological",
       "node 2 (ADD): source 0 refers to node 4000000000"},
      {"TooFewSources", [](G& g, L&) { g.mutable_nodes(2)->mutable_src()->RemoveLast(); }, "codec.source_count",
       "node 2 (ADD): has 1 source; ADD takes 2"},
      {"TooManySources", [](G& g, L&) { g.mutable_nodes(2)->add_src(0); }, "codec.source_count", "node 2 (ADD): has 3 sources"},
      {"ConstWithTwoSources", [](G& g, L&) { g.mutable_nodes(1)->add_src(0); g.mutable_nodes(1)->add_src(0); },
       "codec.source_count", "node 1 (CONST): has 2 sources; CONST takes 0 to 1"},
      {"RangeWithoutSources", [](G& g, L&) { g.mutable_nodes(4)->clear_src(); }, "codec.source_count",
       "RANGE takes at least 1"},
      {"SourcesOverLimit", [](G&, L& l) { l.max_sources = 1; }, "codec.limits", "node 2 (ADD): has 2 sources, more than max_sources 1"},
      {"ArgMissing", [](G& g, L&) { g.mutable_nodes(4)->clear_range(); }, "codec.arg_kind",
       "node 4 (RANGE): takes a range arg but has none"},
      {"ArgOfAnotherKind", [](G& g, L&) { g.mutable_nodes(4)->set_int_value(3); }, "codec.arg_kind",
       "node 4 (RANGE): takes a range arg but has int_value"},
      {"ArgOnAnOpWithout", [](G& g, L&) { g.mutable_nodes(2)->set_int_value(0); }, "codec.arg_kind",
       "node 2 (ADD): takes no arg but has int_value"},
      {"SinkWithForeignArg", [](G& g, L&) { g.mutable_nodes(5)->mutable_call_info(); }, "codec.arg_kind",
       "node 5 (SINK): takes a kernel_info arg but has call_info"},
      {"ConstWithoutArg", [](G& g, L&) { g.mutable_nodes(0)->clear_const_value(); }, "codec.arg_kind",
       "node 0 (CONST): takes a const_value arg but has none"},
      {"ConstValueUnset", [](G& g, L&) { g.mutable_nodes(0)->mutable_const_value()->Clear(); }, "codec.const",
       "node 0 (CONST): value has no value set"},
      {"ConstWrongField", [](G& g, L&) { g.mutable_nodes(0)->mutable_const_value()->set_i(1); }, "codec.const",
       "node 0 (CONST): value is set in field i but a float32 goes in field f"},
      {"ConstNotAFloat32", [](G& g, L&) { g.mutable_nodes(0)->mutable_const_value()->set_f(0.1); }, "codec.const",
       "node 0 (CONST): value 0.1 is not a float32 value"},
      {"ConstOutOfUInt8",
       [](G& g, L&) {
         g.mutable_nodes(0)->mutable_dtype()->set_scalar(v1::DType::UINT8);
         g.mutable_nodes(0)->mutable_const_value()->set_u(256);
       },
       "codec.const", "node 0 (CONST): value 256 is not a uint8 value"},
      {"ConstOutOfInt8",
       [](G& g, L&) {
         g.mutable_nodes(0)->mutable_dtype()->set_scalar(v1::DType::INT8);
         g.mutable_nodes(0)->mutable_const_value()->set_i(-129);
       },
       "codec.const", "node 0 (CONST): value -129 is not a int8 value"},
      {"BoolConstAsInt",
       [](G& g, L&) {
         g.mutable_nodes(0)->mutable_dtype()->set_scalar(v1::DType::BOOL);
         g.mutable_nodes(0)->mutable_const_value()->set_u(1);
       },
       "codec.const", "node 0 (CONST): value is set in field u but a bool goes in field b"},
      {"VoidConst", [](G& g, L&) { g.mutable_nodes(0)->clear_dtype(); }, "codec.const", "node 0 (CONST): a constant of type void"},
      {"PointerConst", [](G& g, L&) { g.mutable_nodes(0)->mutable_dtype()->set_ptr(true); }, "codec.const", "node 0 (CONST)"},
      {"VConstWidthMismatch",
       [](G& g, L&) {
         v1::Node* n = retarget(g, v1::VCONST, {});
         n->mutable_dtype()->set_scalar(v1::DType::INDEX);
         n->mutable_dtype()->set_count(2);
         for (int i = 0; i < 3; ++i) n->mutable_vconst()->add_values()->set_i(i);
       },
       "codec.const", "node 5 (VCONST): has 3 values for a dtype of width 2"},
      {"VConstValueWrongField",
       [](G& g, L&) {
         v1::Node* n = retarget(g, v1::VCONST, {});
         n->mutable_dtype()->set_scalar(v1::DType::INDEX);
         n->mutable_dtype()->set_count(2);
         n->mutable_vconst()->add_values()->set_i(1);
         n->mutable_vconst()->add_values()->set_f(2);
       },
       "codec.const", "node 5 (VCONST): value 1 is set in field f"},
      {"VConstEmptyShapeWithValue",
       [](G& g, L&) {
         v1::Node* n = retarget(g, v1::VCONST, {});
         n->mutable_dtype()->set_scalar(v1::DType::INDEX);
         n->mutable_dtype()->set_count(0);
         n->mutable_vconst()->add_values()->set_i(1);
       },
       "codec.const", "node 5 (VCONST): has 1 values for a dtype of width 0"},
      {"VConstCountZeroNotIndex",
       [](G& g, L&) {
         v1::Node* n = retarget(g, v1::VCONST, {});
         n->mutable_dtype()->set_scalar(v1::DType::FLOAT32);
         n->mutable_dtype()->set_count(0);
         n->mutable_vconst();
       },
       "codec.dtype", "node 5 (VCONST): dtype count 0"},
      {"StrOverLimit", [](G& g, L& l) { retarget(g, v1::SOURCE, {})->set_str("four"); l.max_arg_bytes = 3; }, "codec.limits",
       "node 5 (SOURCE): str has 4 bytes"},
      {"BytesOverLimit", [](G& g, L& l) { retarget(g, v1::PROGRAM_BINARY, {})->set_bytes_value("four"); l.max_arg_bytes = 3; },
       "codec.limits", "node 5 (PROGRAM_BINARY): bytes_value has 4 bytes"},
      {"DefineVarNameOverLimit",
       [](G& g, L& l) { retarget(g, v1::DEFINE_VAR, {})->mutable_define_var()->set_name("four"); l.max_arg_bytes = 3; },
       "codec.limits", "node 5 (DEFINE_VAR): define_var name has 4 bytes"},
      {"DevicesOverLimit",
       [](G& g, L& l) {
         v1::Node* n = retarget(g, v1::DEVICE, {});
         for (int i = 0; i < 3; ++i) n->mutable_device()->add_devices("CPU");
         l.max_vector_width = 2;
       },
       "codec.limits", "node 5 (DEVICE): devices has 3 entries"},
      {"GepListOverLimit",
       [](G& g, L& l) {
         v1::Node* n = retarget(g, v1::GEP, {2});
         for (int i = 0; i < 3; ++i) n->mutable_ints()->add_values(i);
         l.max_vector_width = 2;
       },
       "codec.limits", "node 5 (GEP): ints has 3 entries"},
      {"FlipListOverLimit",
       [](G& g, L& l) {
         v1::Node* n = retarget(g, v1::FLIP, {2});
         for (int i = 0; i < 3; ++i) n->mutable_bools()->add_values(true);
         l.max_vector_width = 2;
       },
       "codec.limits", "node 5 (FLIP): bools has 3 entries"},
      {"WmmaListOverLimit",
       [](G& g, L& l) {
         v1::Node* n = retarget(g, v1::WMMA, {0, 1, 2});
         for (int i = 0; i < 3; ++i) n->mutable_wmma()->add_upcast_a()->set_axis(i);
         l.max_vector_width = 2;
       },
       "codec.limits", "node 5 (WMMA): wmma upcast_a has 3 entries"},
      {"CallMetadataOverLimit",
       [](G& g, L& l) {
         v1::Node* n = retarget(g, v1::CALL, {2});
         n->mutable_call_info()->add_metadata("x");
         n->mutable_call_info()->add_metadata("y");
         l.max_vector_width = 1;
       },
       "codec.limits", "node 5 (CALL): call_info metadata has 2 entries"},
      {"NameOutOfRange", [](G& g, L&) { g.mutable_names(0)->set_node(6); }, "codec.name",
       "name 0 \"out\": refers to node 6, but the graph has 6 nodes"},
      {"NameOverLimit", [](G&, L& l) { l.max_arg_bytes = 2; }, "codec.limits", "name 0: has 3 bytes"},
  };
}

class CodecInvalid : public testing::TestWithParam<BadCase> {};

TEST_P(CodecInvalid, IsRefusedWithNodeAndRule) {
  const BadCase& c = GetParam();
  v1::Graph pb = valid_graph();
  DecodeLimits limits;
  c.mutate(pb, limits);
  expect_invalid(decode_proto(pb, limits).status(), c.tag, c.where);
  {
    SCOPED_TRACE("binary");
    expect_invalid(decode_binary(pb.SerializeAsString(), limits).status(), c.tag, c.where);
  }
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(pb, &json).ok());
  SCOPED_TRACE("json: " + json);
  expect_invalid(decode_json(json, limits).status(), c.tag, c.where);
}

INSTANTIATE_TEST_SUITE_P(Rules, CodecInvalid, testing::ValuesIn(bad_cases()),
                         [](const testing::TestParamInfo<BadCase>& p) { return p.param.name; });

TEST(CodecInvalidBytes, GarbageIsAParseError) {
  expect_invalid(decode_binary("\xff\xff\xff\xff").status(), "codec.parse", "graph:");
  expect_invalid(decode_binary(std::string_view("\x12\x05\x08", 3)).status(), "codec.parse", "graph:");
}

TEST(CodecInvalidBytes, TruncatedEncodingIsAParseError) {
  std::string bytes = valid_graph().SerializeAsString();
  expect_invalid(decode_binary(std::string_view(bytes).substr(0, bytes.size() - 1)).status(), "codec.parse", "graph:");
}

TEST(CodecInvalidBytes, EmptyInputIsRefused) {
  expect_invalid(decode_binary("").status(), "codec.version", "graph:");
}

TEST(CodecInvalidBytes, OverMaxBytes) {
  DecodeLimits limits;
  limits.max_bytes = 10;
  std::string bytes = valid_graph().SerializeAsString();
  expect_invalid(decode_binary(bytes, limits).status(), "codec.limits", "more than max_bytes 10");
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(valid_graph(), &json).ok());
  expect_invalid(decode_json(json, limits).status(), "codec.limits", "more than max_bytes 10");
}

// Empty nodes cost 2 bytes each on the wire; they are counted before protobuf builds any.
TEST(CodecInvalidBytes, NodeFloodIsRefusedBeforeParsing) {
  std::string bytes = "\x08\x01";  // format_version: 1
  for (int i = 0; i < 100'000; ++i) bytes += std::string("\x12\x00", 2);
  DecodeLimits limits;
  limits.max_nodes = 1000;
  expect_invalid(decode_binary(bytes, limits).status(), "codec.limits", "max_nodes (1000)");
}

TEST(CodecInvalidJson, UnknownFieldsAndBadSyntaxAreParseErrors) {
  expect_invalid(decode_json(R"({"format_version": 1, "nodes": [{"op": "ADD", "colour": 1}]})").status(), "codec.parse", "graph:");
  expect_invalid(decode_json(R"({"format_version": 1, "nodes": [{"op": "NOT_AN_OP"}]})").status(), "codec.parse", "graph:");
  expect_invalid(decode_json(R"({"format_version": 1, "nodes": [)").status(), "codec.parse", "graph:");
  expect_invalid(decode_json("").status(), "codec.parse", "graph:");
  expect_invalid(decode_json("[]").status(), "codec.parse", "graph:");
}

TEST(CodecInvalidJson, UnknownOpNumberIsAnOpError) {
  expect_invalid(decode_json(R"({"format_version": 1, "nodes": [{"op": 999}]})").status(), "codec.op", "node 0: op 999");
}

TEST(CodecInvalidJson, DeepNestingIsRefusedNotRecursed) {
  std::string deep(100'000, '[');
  expect_invalid(decode_json(cat(R"({"format_version": 1, "nodes": )", deep)).status(), "codec.parse", "graph:");
  std::string objects;
  for (int i = 0; i < 50'000; ++i) objects += R"({"a":)";
  expect_invalid(decode_json(objects).status(), "codec.parse", "graph:");
}

// ---------------------------------------------------------------------------------------
// Fuzz-style: nothing crashes, everything returns a status.

// A graph that uses every op, for mutation.
std::string rich_encoding() {
  Graph g;
  std::vector<const UOp*> all;
  for (int i = 0; i < kNumOps; ++i) all.push_back(sample_node(g, static_cast<Op>(i), false));
  return encode_binary(g.make(Op::SINK, dtypes::void_, all), {{"first", all[0]}});
}

void check_result(const absl::StatusOr<DecodedGraph>& d) {
  if (!d.ok()) {
    ASSERT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
    return;
  }
  ASSERT_FALSE(d->nodes.empty());
  ASSERT_EQ(d->root, d->nodes.back());
  d->root->digest();
}

class CodecFuzz : public testing::Test {
 protected:
  // Malformed UTF-8 in a string field makes protobuf log an error per message; quiet here.
  void SetUp() override { old_ = google::protobuf::SetLogHandler(nullptr); }
  void TearDown() override { google::protobuf::SetLogHandler(old_); }
  google::protobuf::LogHandler* old_ = nullptr;
};

TEST_F(CodecFuzz, RandomBytes) {
  std::mt19937 rng(20240611);
  for (int i = 0; i < 3000; ++i) {
    std::string buf(rng() % 300, '\0');
    for (char& c : buf) c = static_cast<char>(rng());
    if (i % 3 == 0 && !buf.empty()) buf[0] = '\x08';  // start like a Graph more often
    check_result(decode_binary(buf));
    if (i % 4 == 0) check_result(decode_json(buf));
  }
}

TEST_F(CodecFuzz, MutatedEncodings) {
  std::mt19937 rng(7);
  const std::string valid = rich_encoding();
  ASSERT_TRUE(decode_binary(valid).ok());
  for (int i = 0; i < 3000; ++i) {
    std::string buf = valid;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % buf.size();
      switch (rng() % 4) {
        case 0: buf[pos] = static_cast<char>(rng()); break;
        case 1: buf[pos] = static_cast<char>(buf[pos] ^ (1 << (rng() % 8))); break;
        case 2: buf.erase(pos, 1 + rng() % 4); break;
        case 3: buf.insert(pos, 1, static_cast<char>(rng())); break;
      }
      if (buf.empty()) buf = "x";
    }
    check_result(decode_binary(buf));
  }
}

TEST_F(CodecFuzz, MutatedJson) {
  std::mt19937 rng(11);
  Graph g;
  const UOp* u = g.alu(Op::ADD, {g.cnst(dtypes::float32, 1.5), g.make(Op::DEFINE_VAR, dtypes::float32, {}, DefineVarArg{"x", 0, 1})});
  const std::string valid = encode_json(g.make(Op::SINK, dtypes::void_, {u}), {{"u", u}}, false);
  const std::string alphabet = "{}[]\":,0123456789-. abcdefxyzNAD_";
  for (int i = 0; i < 2000; ++i) {
    std::string buf = valid;
    size_t pos = rng() % buf.size();
    if (rng() % 2) buf[pos] = alphabet[rng() % alphabet.size()];
    else buf.erase(pos, 1 + rng() % 8);
    check_result(decode_json(buf));
  }
}

// Field-level mutations of a valid message reach the rules behind the parser: random op
// and enum numbers, source indices, dtype fields and arg fields.
TEST_F(CodecFuzz, MutatedMessages) {
  std::mt19937 rng(3);
  v1::Graph valid;
  ASSERT_TRUE(valid.ParseFromString(rich_encoding()));
  auto pick = [&](std::initializer_list<int64_t> v) { return *(v.begin() + rng() % v.size()); };
  std::map<std::string, int> seen;
  for (int i = 0; i < 4000; ++i) {
    v1::Graph pb = valid;
    for (int e = 1 + static_cast<int>(rng() % 3); e > 0; --e) {
      v1::Node* n = pb.mutable_nodes(static_cast<int>(rng() % pb.nodes_size()));
      v1::DType* d = n->mutable_dtype();
      switch (rng() % 12) {
        case 0: n->set_op(static_cast<v1::Op>(rng() % 100)); break;
        case 1: if (n->src_size()) n->set_src(static_cast<int>(rng() % n->src_size()), static_cast<uint32_t>(rng() % (pb.nodes_size() + 2))); break;
        case 2: n->add_src(static_cast<uint32_t>(rng() % pb.nodes_size())); break;
        case 3: n->clear_src(); break;
        case 4: d->set_scalar(static_cast<v1::DType::Scalar>(pick({-1, 0, 1, 5, 10, 14, 15, 99}))); break;
        case 5: d->set_count(static_cast<uint32_t>(pick({0, 1, 3, 70000}))); break;
        case 6: d->set_ptr(!d->ptr()); break;
        case 7: d->set_addrspace(static_cast<v1::DType::AddrSpace>(pick({0, 1, 2, 3, -5}))); break;
        case 8: d->set_size(pick({-1, 0, 16})); break;
        case 9: n->clear_arg(); break;
        case 10: n->set_int_value(pick({0, -1, 7})); break;
        case 11: n->mutable_const_value()->set_f(pick({0, 1, 300})); break;
      }
    }
    auto d = decode_proto(pb);
    check_result(d);
    std::string msg(sv(d.status().message()));
    seen[d.ok() ? "ok" : msg.substr(msg.rfind('['))]++;
  }
  for (const char* tag : {"[codec.op]", "[codec.enum]", "[codec.dtype]", "[codec.topological]", "[codec.source_count]",
                          "[codec.arg_kind]", "[codec.const]", "[codec.limits]", "ok"})
    EXPECT_GT(seen[tag], 0) << tag << " never came up";
}

TEST_F(CodecFuzz, EveryTruncation) {
  const std::string bin = rich_encoding();
  for (size_t n = 0; n < bin.size(); ++n) check_result(decode_binary(std::string_view(bin).substr(0, n)));
  Graph g;
  const UOp* u = g.alu(Op::ADD, {g.cnst(dtypes::float32, 1.5), g.make(Op::DEFINE_VAR, dtypes::float32, {}, DefineVarArg{"x", 0, 1})});
  const std::string json = encode_json(u);
  for (size_t n = 0; n < json.size(); ++n) check_result(decode_json(std::string_view(json).substr(0, n)));
}

// ---------------------------------------------------------------------------------------
// Files

class CodecFiles : public testing::Test {
 protected:
  std::string path(const std::string& name) { return cat(testing::TempDir(), "/codec_test_", getpid(), "_", name); }
  void TearDown() override {
    for (const std::string& p : made_) std::remove(p.c_str());
  }
  std::string made(const std::string& name) { made_.push_back(path(name)); return made_.back(); }
  void write_raw(const std::string& p, std::string_view data) {
    std::FILE* f = std::fopen(p.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(data.data(), 1, data.size(), f);
    std::fclose(f);
  }
  std::vector<std::string> made_;
};

TEST_F(CodecFiles, RoundTripByExtension) {
  Graph g;
  const UOp* x = g.make(Op::DEFINE_VAR, dtypes::int32, {}, DefineVarArg{"x", 0, 9});
  const UOp* root = g.alu(Op::MUL, {x, g.cnst_int(dtypes::int32, 3)});
  Names names = {{"x", x}};
  for (const char* name : {"g.uopb", "g.json", "g.graph"}) {
    SCOPED_TRACE(name);
    std::string p = made(name);
    ASSERT_TRUE(write_graph_file(p, root, names).ok());
    auto d = read_graph_file(p);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->root->digest().hex(), root->digest().hex());
    ASSERT_EQ(d->names.size(), 1u);
  }
  // An unknown extension holding JSON falls back to the JSON parser.
  std::string p = made("g.txt");
  write_raw(p, encode_json(root, names));
  auto d = read_graph_file(p);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->root->digest().hex(), root->digest().hex());
}

TEST_F(CodecFiles, ErrorsNameThePath) {
  std::string missing = path("missing.uopb");
  auto st = read_graph_file(missing).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_TRUE(contains(st, missing)) << st;

  std::string bad_json = made("bad.json");
  write_raw(bad_json, "{\"nodes\": [");
  st = read_graph_file(bad_json).status();
  expect_invalid(st, "codec.parse", bad_json);

  std::string bad_other = made("bad.graph");
  write_raw(bad_other, "  {\"format_version\": 1, \"nodes\": [{\"op\": 999}]}");
  expect_invalid(read_graph_file(bad_other).status(), "codec.op", bad_other + ": node 0: op 999");

  std::string big = made("big.uopb");
  write_raw(big, std::string(100, 'x'));
  DecodeLimits limits;
  limits.max_bytes = 99;
  expect_invalid(read_graph_file(big, limits).status(), "codec.limits", big);

  Graph g;
  std::string nowhere = path("no/such/dir/g.uopb");
  st = write_graph_file(nowhere, g.idx(1));
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(contains(st, nowhere)) << st;
}

}  // namespace
}  // namespace uop
