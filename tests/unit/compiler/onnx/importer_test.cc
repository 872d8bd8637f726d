// The ONNX importer on small models built here: values through the reference interpreter
// (the service's compiled path is covered by the conformance tests), unsupported operators
// and attributes reported by name, TensorProto decoding.
#include "compiler/onnx/importer.h"

#include <functional>
#include <limits>
#include <map>
#include <tuple>

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "client/onnx/model_runner.h"
#include "compiler/onnx/tensor_proto.h"
#include "compiler/support/strings.h"

namespace uop::onnx_import {
namespace {

void add_input(onnx::GraphProto* g, const std::string& name, int elem, std::vector<int64_t> dims) {
  auto* vi = g->add_input();
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in,
                          std::vector<std::string> out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  for (auto& s : in) n->add_input(s);
  for (auto& s : out) n->add_output(s);
  return n;
}

std::string serialize(onnx::ModelProto& m, int opset = 13) {
  m.set_ir_version(7);
  m.add_opset_import()->set_version(opset);
  return m.SerializeAsString();
}

HostTensor f32(std::vector<int64_t> shape, std::initializer_list<double> v) { return HostTensor::of(Scalar::Float32, shape, v); }

TEST(OnnxImporter, AddReluThroughTheInterpreter) {
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {2, 3});
  add_input(g, "b", onnx::TensorProto::FLOAT, {3});
  add_node(g, "Add", {"x", "b"}, {"s"});
  add_node(g, "Relu", {"s"}, {"y"});
  g->add_output()->set_name("y");
  auto imported = import_model(serialize(m), {{"x", f32({2, 3}, {1, -2, 3, -4, 5, -6})}, {"b", f32({3}, {0.5, 0.5, 0.5})}});
  ASSERT_TRUE(imported.ok()) << imported.status();
  ASSERT_EQ(imported->outputs.size(), 1u);
  EXPECT_EQ(imported->outputs[0].shape, (std::vector<int64_t>{2, 3}));
  auto got = run_interpreted(*imported);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(compare(f32({2, 3}, {1.5, 0, 3.5, 0, 5.5, 0}), (*got)[0]));
}

TEST(OnnxImporter, ShapeInputsAreReadAtImport) {
  // Reshape's shape comes from an initializer; a 0 copies the input's dim.
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {2, 3});
  auto* shape = g->add_initializer();
  shape->set_name("shape");
  shape->set_data_type(onnx::TensorProto::INT64);
  shape->add_dims(2);
  shape->add_int64_data(3);
  shape->add_int64_data(0);
  add_node(g, "Transpose", {"x"}, {"t"});
  add_node(g, "Reshape", {"t", "shape"}, {"y"});
  g->add_output()->set_name("y");
  auto imported = import_model(serialize(m), {{"x", f32({2, 3}, {1, 2, 3, 4, 5, 6})}});
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->outputs[0].shape, (std::vector<int64_t>{3, 2}));
  auto got = run_interpreted(*imported);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(compare(f32({3, 2}, {1, 4, 2, 5, 3, 6}), (*got)[0]));
}

TEST(OnnxImporter, ConvWithPaddingAndStride) {
  // 1x1x3x3 input, a 2x2 kernel of ones, pads 1, stride 2: each output is a window sum.
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {1, 1, 3, 3});
  add_input(g, "w", onnx::TensorProto::FLOAT, {1, 1, 2, 2});
  auto* n = add_node(g, "Conv", {"x", "w"}, {"y"});
  auto* pads = n->add_attribute();
  pads->set_name("pads");
  for (int i = 0; i < 4; ++i) pads->add_ints(1);
  auto* strides = n->add_attribute();
  strides->set_name("strides");
  strides->add_ints(2);
  strides->add_ints(2);
  g->add_output()->set_name("y");
  auto imported = import_model(serialize(m), {{"x", f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9})},
                                              {"w", f32({1, 1, 2, 2}, {1, 1, 1, 1})}});
  ASSERT_TRUE(imported.ok()) << imported.status();
  auto got = run_interpreted(*imported);
  ASSERT_TRUE(got.ok()) << got.status();
  // Padded 5x5, windows at rows/cols 0 and 2: {1}, {2+3}, {4+7}, {5+6+8+9}.
  EXPECT_TRUE(compare(f32({1, 1, 2, 2}, {1, 5, 11, 28}), (*got)[0]));
}

// Conv's weights from an initializer are stored in blocks of output channels, the block's
// channels innermost (16 where they divide the channels, else 8), and read through a
// permute and a reshape: the values the interpreter computes are a plain convolution's,
// computed here loop by loop.
TEST(OnnxImporter, ConvWeightsStoredInChannelBlocksComputeTheSameConvolution) {
  for (const int64_t M : {24, 32}) {
    SCOPED_TRACE(cat(M, " output channels"));
    const int64_t C = 3, H = 5, W = 4, K = 3, B = M % 16 == 0 ? 16 : 8;
    HostTensor x = HostTensor::random(Scalar::Float32, {1, C, H, W}, 1);
    HostTensor w = HostTensor::random(Scalar::Float32, {M, C, K, K}, 2);
    onnx::ModelProto m;
    auto* g = m.mutable_graph();
    add_input(g, "x", onnx::TensorProto::FLOAT, {1, C, H, W});
    auto* init = g->add_initializer();
    init->set_name("w");
    init->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : w.shape) init->add_dims(d);
    init->set_raw_data(w.data);
    auto* n = add_node(g, "Conv", {"x", "w"}, {"y"});
    auto* pads = n->add_attribute();
    pads->set_name("pads");
    for (int i = 0; i < 4; ++i) pads->add_ints(1);
    g->add_output()->set_name("y");
    auto imported = import_model(serialize(m), {{"x", x}});
    ASSERT_TRUE(imported.ok()) << imported.status();
    // The weights' binding holds them [M / B, C, K, K, B]: element (o / B, c, u, v, o % B)
    // is w[o, c, u, v].
    HostTensor t = HostTensor::zeros(Scalar::Float32, {C * K * K * M});
    for (int64_t o = 0; o < M; ++o)
      for (int64_t r = 0; r < C * K * K; ++r) t.set((o / B * C * K * K + r) * B + o % B, w.get(o * C * K * K + r));
    bool repacked = false;
    for (const auto& [buf, data] : imported->bindings) repacked |= data.data == t.data;
    EXPECT_TRUE(repacked) << "the weights are not bound in blocks of " << B << " output channels";
    auto got = run_interpreted(*imported);
    ASSERT_TRUE(got.ok()) << got.status();
    HostTensor want = HostTensor::zeros(Scalar::Float32, {1, M, H, W});
    for (int64_t o = 0; o < M; ++o)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t xx = 0; xx < W; ++xx) {
          double acc = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t u = 0; u < K; ++u)
              for (int64_t v = 0; v < K; ++v) {
                const int64_t iy = y + u - 1, ix = xx + v - 1;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                acc += x.get((c * H + iy) * W + ix).as_float() * w.get(((o * C + c) * K + u) * K + v).as_float();
              }
          want.set((o * H + y) * W + xx, ConstValue::Float(acc));
        }
    EXPECT_TRUE(compare(want, (*got)[0]));
  }
}

// Weights with no output channels ([0, C, K, K], hostile bytes: zero is a multiple of the
// channel block conv_weights stores, whose repacking divides by the channel count) get an
// answer naming the empty weights (UNIMPLEMENTED), not a repacking divided by zero (before
// the guard, the import went on to an empty output).
TEST(OnnxImporter, ConvWeightsWithNoOutputChannelsAreRefusedByName) {
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {1, 3, 5, 5});
  auto* init = g->add_initializer();
  init->set_name("w");
  init->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {0, 3, 3, 3}) init->add_dims(d);
  init->set_raw_data("");
  add_node(g, "Conv", {"x", "w"}, {"y"});
  g->add_output()->set_name("y");
  auto imported = import_model(serialize(m), {{"x", HostTensor::random(Scalar::Float32, {1, 3, 5, 5}, 1)}});
  ASSERT_FALSE(imported.ok());
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kUnimplemented) << imported.status();
  EXPECT_NE(imported.status().message().find("input 'w' is empty"), std::string::npos) << imported.status();
}

onnx::TensorProto* add_ints_initializer(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(v.size()));
  for (int64_t x : v) t->add_int64_data(x);
  return t;
}

void set_ints(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  for (int64_t x : v) a->add_ints(x);
}

TEST(OnnxImporter, ConvTransposeStridedPlacementsCropped) {
  // out[2i + k] += x[i] * w[k] over 6 positions, pads 1 crop one at each end.
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {1, 1, 3});
  add_input(g, "w", onnx::TensorProto::FLOAT, {1, 1, 2});
  auto* n = add_node(g, "ConvTranspose", {"x", "w"}, {"y"});
  set_ints(n, "strides", {2});
  set_ints(n, "pads", {1, 1});
  g->add_output()->set_name("y");
  auto imported = import_model(serialize(m), {{"x", f32({1, 1, 3}, {1, 2, 3})}, {"w", f32({1, 1, 2}, {1, 10})}});
  ASSERT_TRUE(imported.ok()) << imported.status();
  auto got = run_interpreted(*imported);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(compare(f32({1, 1, 4}, {10, 2, 20, 3}), (*got)[0]));
}

TEST(OnnxImporter, ResizeLinearHalfPixel) {
  // Source coordinates -0.25, 0.25, 0.75, 1.25: the ends clamp to the edge values.
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {2});
  auto* sc = g->add_initializer();
  sc->set_name("scales");
  sc->set_data_type(onnx::TensorProto::FLOAT);
  sc->add_dims(1);
  sc->add_float_data(2.0f);
  auto* n = add_node(g, "Resize", {"x", "", "scales"}, {"y"});
  auto* mode = n->add_attribute();
  mode->set_name("mode");
  mode->set_s("linear");
  g->add_output()->set_name("y");
  auto imported = import_model(serialize(m), {{"x", f32({2}, {1, 3})}});
  ASSERT_TRUE(imported.ok()) << imported.status();
  auto got = run_interpreted(*imported);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(compare(f32({4}, {1, 1.5, 2.5, 3}), (*got)[0]));
}

TEST(OnnxImporter, TopKTiesToTheLowerIndex) {
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {5});
  add_ints_initializer(g, "k", {2});
  auto* n = add_node(g, "TopK", {"x", "k"}, {"v", "i"});
  auto* largest = n->add_attribute();
  largest->set_name("largest");
  largest->set_i(0);
  g->add_output()->set_name("v");
  g->add_output()->set_name("i");
  auto imported = import_model(serialize(m), {{"x", f32({5}, {3, 1, 4, 1, 5})}});
  ASSERT_TRUE(imported.ok()) << imported.status();
  auto got = run_interpreted(*imported);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(compare(f32({2}, {1, 1}), (*got)[0]));
  EXPECT_TRUE(compare(HostTensor::of(Scalar::Int64, {2}, {1, 3}), (*got)[1]));
}

TEST(OnnxImporter, UnsupportedOperatorsAreNamed) {
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {2});
  add_node(g, "FancyOp", {"x"}, {"t"});
  add_node(g, "OtherOp", {"t"}, {"y"});
  g->add_output()->set_name("y");
  std::string bytes = serialize(m);
  auto imported = import_model(bytes, {{"x", f32({2}, {1, 2})}});
  ASSERT_EQ(imported.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(std::string(imported.status().message()), "unsupported operators: FancyOp, OtherOp");
  auto missing = unsupported_operators(bytes);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(*missing, (std::vector<std::string>{"FancyOp", "OtherOp"}));
}

TEST(OnnxImporter, UnknownAttributeIsRefusedNotIgnored) {
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {2});
  auto* n = add_node(g, "Relu", {"x"}, {"y"});
  n->add_attribute()->set_name("mystery");
  g->add_output()->set_name("y");
  auto imported = import_model(serialize(m), {{"x", f32({2}, {1, 2})}});
  ASSERT_EQ(imported.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(imported.status().message()).find("Relu: attribute 'mystery'"), std::string::npos);
}

TEST(OnnxImporter, MissingInputAndWrongDtypeAreInvalid) {
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {2});
  add_node(g, "Neg", {"x"}, {"y"});
  g->add_output()->set_name("y");
  std::string bytes = serialize(m);
  EXPECT_EQ(import_model(bytes, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(import_model(bytes, {{"x", HostTensor::of(Scalar::Int32, {2}, {1, 2})}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(import_model("not a model", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// What fuzz_onnx_import found: attributes and shapes that crashed the import (a division
// by zero, reads past a shape, a sequence unrolled without bound) are refused, naming why.
struct Refusal {
  absl::StatusCode code;
  std::string says;
};
Refusal import_one(const std::string& op, std::vector<std::vector<int64_t>> in_shapes,
                   const std::function<void(onnx::NodeProto*)>& attrs, int outputs = 1, ImportOptions opts = {}) {
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  std::map<std::string, HostTensor> given;
  std::vector<std::string> ins, outs;
  for (size_t i = 0; i < in_shapes.size(); ++i) {
    std::string name = "x" + std::to_string(i);
    add_input(g, name, onnx::TensorProto::FLOAT, in_shapes[i]);
    given[name] = HostTensor::zeros(Scalar::Float32, in_shapes[i]);
    ins.push_back(name);
  }
  for (int i = 0; i < outputs; ++i) outs.push_back("y" + std::to_string(i));
  attrs(add_node(g, op, ins, outs));
  for (auto& o : outs) g->add_output()->set_name(o);
  auto r = import_model(serialize(m, 13), given, opts);
  return {r.status().code(), std::string(r.status().message())};
}
void ints(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
void one_int(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

TEST(OnnxImporter, FuzzFindingsAreRefusedNamingWhy) {
  Refusal r = import_one("MaxPool", {{1, 1, 4, 4}}, [](onnx::NodeProto* n) {
    ints(n, "kernel_shape", {2, 2});
    ints(n, "strides", {0, 1});
  });
  EXPECT_EQ(r.code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.says.find("strides must be at least 1"), std::string::npos) << r.says;

  r = import_one("Conv", {{1, 2, 4, 4}, {2, 1, 3, 3}}, [](onnx::NodeProto* n) { one_int(n, "group", 0); });
  EXPECT_EQ(r.code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.says.find("group must be at least 1"), std::string::npos) << r.says;

  r = import_one("ConvTranspose", {{1, 2, 4, 4}, {2, 1, 2, 2}}, [](onnx::NodeProto* n) { ints(n, "strides", {2}); });
  EXPECT_EQ(r.code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.says.find("one value per spatial axis"), std::string::npos) << r.says;

  r = import_one("ConvTranspose", {{1, 2, 4, 4}, {2, 1, 2, 2}}, [](onnx::NodeProto* n) { ints(n, "dilations", {1, 0}); });
  EXPECT_EQ(r.code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.says.find("dilations must be at least 1"), std::string::npos) << r.says;

  r = import_one("Split", {{}}, [](onnx::NodeProto*) {});
  EXPECT_EQ(r.code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.says.find("scalar"), std::string::npos) << r.says;

  r = import_one("Split", {{4}}, [](onnx::NodeProto* n) { one_int(n, "num_outputs", 0); }, 2);
  EXPECT_NE(r.code, absl::StatusCode::kOk) << r.says;  // num_outputs is not an attribute at opset 13

  r = import_one("Concat", {{}, {}}, [](onnx::NodeProto* n) { one_int(n, "axis", 0); });
  EXPECT_EQ(r.code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.says.find("scalars"), std::string::npos) << r.says;

  r = import_one("LRN", {{1, 4, 2, 2}}, [](onnx::NodeProto* n) { one_int(n, "size", int64_t{1} << 40); });
  EXPECT_EQ(r.code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.says.find("size must be in"), std::string::npos) << r.says;
}

TEST(OnnxImporter, SplitSizesMustBeNonNegative) {
  // [-1, 5] adds up to the axis, 4, but is no split.
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {4});
  auto* sizes = g->add_initializer();
  sizes->set_name("sizes");
  sizes->set_data_type(onnx::TensorProto::INT64);
  sizes->add_dims(2);
  sizes->add_int64_data(-1);
  sizes->add_int64_data(5);
  add_node(g, "Split", {"x", "sizes"}, {"a", "b"});
  g->add_output()->set_name("a");
  g->add_output()->set_name("b");
  auto r = import_model(serialize(m, 13), {{"x", HostTensor::zeros(Scalar::Float32, {4})}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("non-negative"), std::string::npos) << r.status();
}

TEST(OnnxImporter, LongSequencesAndLargeGraphsAreRefusedBeforeTheyAreBuilt) {
  // An LSTM over 2^20 steps (a declared shape is enough) is refused, not unrolled.
  onnx::ModelProto m;
  auto* g = m.mutable_graph();
  add_input(g, "x", onnx::TensorProto::FLOAT, {int64_t{1} << 20, 1, 2});
  add_input(g, "w", onnx::TensorProto::FLOAT, {1, 16, 2});
  add_input(g, "r", onnx::TensorProto::FLOAT, {1, 16, 4});
  auto* n = add_node(g, "LSTM", {"x", "w", "r"}, {"y"});
  one_int(n, "hidden_size", 4);
  g->add_output()->set_name("y");
  HostTensor one_x = HostTensor::zeros(Scalar::Float32, {1, 1, 2});
  one_x.shape = {int64_t{1} << 20, 1, 2};  // a placeholder: the import reads no value of it
  one_x.data.resize(4);
  ImportOptions opts;
  opts.inputs_known = false;
  auto r = import_model(serialize(m, 13),
                        {{"x", one_x}, {"w", HostTensor::zeros(Scalar::Float32, {1, 16, 2})},
                         {"r", HostTensor::zeros(Scalar::Float32, {1, 16, 4})}},
                        opts);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(r.status().message()).find("steps are unrolled"), std::string::npos) << r.status();

  // max_graph_nodes stops the import at the node that passes it.
  Refusal big = import_one("Relu", {{2}}, [](onnx::NodeProto*) {}, 1, ImportOptions{.max_graph_nodes = 1});
  EXPECT_EQ(big.code, absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.says.find("over the limit of 1"), std::string::npos) << big.says;
}

// Data the import makes itself is sized by the model's shapes and values, not by its bytes:
// a few hundred bytes of model could ask for terabytes. Each such request is counted before
// its memory is spent, and refused by name.
onnx::TensorProto* int64_init(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> dims,
                              std::vector<int64_t> values) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  for (int64_t d : dims) t->add_dims(d);
  for (int64_t v : values) t->add_int64_data(v);
  return t;
}

TEST(OnnxImporter, DataTheImportMakesIsBoundedBeforeItIsAllocated) {
  // EyeLike of a declared 65536 x 65536 input: 16 GiB of float32 from a placeholder.
  {
    onnx::ModelProto m;
    auto* g = m.mutable_graph();
    add_input(g, "x", onnx::TensorProto::FLOAT, {65536, 65536});
    add_node(g, "EyeLike", {"x"}, {"y"})->set_name("eye");
    g->add_output()->set_name("y");
    HostTensor placeholder = HostTensor::zeros(Scalar::Float32, {1});
    placeholder.shape = {65536, 65536};  // never read: only its shape decides the graph
    ImportOptions opts;
    opts.inputs_known = false;
    auto r = import_model(serialize(m), {{"x", placeholder}}, opts);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    EXPECT_NE(std::string(r.status().message()).find("EyeLike 'eye' would make 17179869184 bytes"), std::string::npos)
        << r.status();
  }
  // Range(0, 2^40, 1) from initializers: 4 TiB of float32; an infinite one has no length.
  for (auto [limit, code, says] :
       {std::tuple{0x1p40f, absl::StatusCode::kResourceExhausted, "over the limit of 1073741824"},
        std::tuple{std::numeric_limits<float>::infinity(), absl::StatusCode::kInvalidArgument, "make no valid length"}}) {
    onnx::ModelProto m;
    auto* g = m.mutable_graph();
    for (auto [name, value] : {std::pair{"start", 0.0f}, std::pair{"limit", limit}, std::pair{"delta", 1.0f}}) {
      auto* t = g->add_initializer();
      t->set_name(name);
      t->set_data_type(onnx::TensorProto::FLOAT);
      t->add_float_data(value);
    }
    add_node(g, "Range", {"start", "limit", "delta"}, {"y"});
    g->add_output()->set_name("y");
    auto r = import_model(serialize(m, 13), {});
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(std::string(r.status().message()).find(says), std::string::npos) << r.status();
  }
  // OneHot's depth 2^40 builds an iota inside a helper that returns a node: the refusal
  // still stops the import at that node.
  {
    onnx::ModelProto m;
    auto* g = m.mutable_graph();
    add_input(g, "i", onnx::TensorProto::INT64, {3});
    int64_init(g, "depth", {}, {int64_t{1} << 40});
    auto* v = g->add_initializer();
    v->set_name("values");
    v->set_data_type(onnx::TensorProto::FLOAT);
    v->add_dims(2);
    v->add_float_data(0);
    v->add_float_data(1);
    add_node(g, "OneHot", {"i", "depth", "values"}, {"y"});
    g->add_output()->set_name("y");
    auto r = import_model(serialize(m, 13), {{"i", HostTensor::of(Scalar::Int64, {3}, {0, 1, 2})}});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    EXPECT_NE(std::string(r.status().message()).find("OneHot would make"), std::string::npos) << r.status();
  }
  // Shape arithmetic that expands a known value to 2^26 elements is refused as data work,
  // before the interpreter computes it.
  {
    onnx::ModelProto m;
    auto* g = m.mutable_graph();
    add_input(g, "x", onnx::TensorProto::FLOAT, {2});
    int64_init(g, "two", {1}, {2});
    int64_init(g, "big", {1}, {int64_t{1} << 26});
    add_node(g, "Expand", {"two", "big"}, {"e"});
    add_node(g, "Reshape", {"x", "e"}, {"y"});
    g->add_output()->set_name("y");
    auto r = import_model(serialize(m, 13), {{"x", f32({2}, {1, 2})}});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
    EXPECT_NE(std::string(r.status().message()).find("computes more than"), std::string::npos) << r.status();
  }
  // The bound is a total over the import, and a model under it imports and runs.
  {
    Refusal small = import_one("EyeLike", {{4, 4}}, [](onnx::NodeProto*) {}, 1, ImportOptions{.max_data_bytes = 63});
    EXPECT_EQ(small.code, absl::StatusCode::kResourceExhausted) << small.says;
    onnx::ModelProto m;
    auto* g = m.mutable_graph();
    add_input(g, "x", onnx::TensorProto::FLOAT, {2, 2});
    add_node(g, "EyeLike", {"x"}, {"y"});
    g->add_output()->set_name("y");
    auto imported = import_model(serialize(m), {{"x", f32({2, 2}, {5, 6, 7, 8})}}, ImportOptions{.max_data_bytes = 16});
    ASSERT_TRUE(imported.ok()) << imported.status();
    auto got = run_interpreted(*imported);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(compare(f32({2, 2}, {1, 0, 0, 1}), (*got)[0]));
  }
}

TEST(OnnxTensorProto, RawAndTypedData) {
  onnx::TensorProto t;
  t.set_name("a");
  t.set_data_type(onnx::TensorProto::INT32);
  t.add_dims(3);
  for (int v : {7, -1, 2}) t.add_int32_data(v);
  auto r = parse_tensor_proto(t.SerializeAsString());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "a");
  EXPECT_EQ(r->tensor, HostTensor::of(Scalar::Int32, {3}, {7, -1, 2}));

  onnx::TensorProto raw;
  raw.set_data_type(onnx::TensorProto::FLOAT);
  raw.add_dims(2);
  float vals[2] = {1.5f, -2.0f};
  raw.set_raw_data(std::string(reinterpret_cast<const char*>(vals), sizeof vals));
  auto rr = parse_tensor_proto(raw.SerializeAsString());
  ASSERT_TRUE(rr.ok()) << rr.status();
  EXPECT_EQ(rr->tensor, f32({2}, {1.5, -2.0}));

  raw.add_dims(2);  // now [2, 2]: the bytes no longer fit the dims
  EXPECT_EQ(parse_tensor_proto(raw.SerializeAsString()).status().code(), absl::StatusCode::kInvalidArgument);
  onnx::TensorProto str;
  str.set_data_type(onnx::TensorProto::STRING);
  EXPECT_EQ(parse_tensor_proto(str.SerializeAsString()).status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace uop::onnx_import
