// What an operator handler sees while the importer walks a model: the node, its inputs as
// tensor-level nodes or as values known at import time, its attributes, and where its
// outputs go. Handlers build with the TensorBuilder (shapes are static: an ONNX model is
// imported for one set of input shapes) and return UNIMPLEMENTED, naming the operator and
// what is missing, for anything they do not handle exactly. Internal to compiler/onnx.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"

// Early returns for Status / StatusOr inside the importer.
#define ONNX_TRY(expr)                              \
  do {                                              \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)
#define ONNX_CONCAT_INNER(a, b) a##b
#define ONNX_CONCAT(a, b) ONNX_CONCAT_INNER(a, b)
#define ONNX_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                     \
  if (!tmp.ok()) return tmp.status();    \
  lhs = std::move(*tmp)
#define ONNX_ASSIGN(lhs, expr) ONNX_ASSIGN_IMPL(ONNX_CONCAT(onnx_tmp_, __LINE__), lhs, expr)

namespace uop::onnx_import {

using Dims = std::vector<int64_t>;

// One ONNX value during import. At least one of `node` and `constant` is set: a node is
// made for a constant only when something consumes it as a tensor.
struct Value {
  Scalar dtype = Scalar::Float32;
  Dims shape;
  const UOp* node = nullptr;
  std::optional<HostTensor> constant;
  const UOp* repacked = nullptr;  // a convolution's weights stored in another order (ops_matmul_conv.cc)
};

// The state of one import, shared by every node's context.
class ImportState {
 public:
  ImportState(Graph& g, uint64_t max_data_bytes) : tb_(g), max_data_bytes_(max_data_bytes) {}

  TensorBuilder& tb() { return tb_; }
  Graph& graph() { return tb_.graph(); }

  Value* find(const std::string& name);
  void set(const std::string& name, Value v) { values_[name] = std::move(v); }

  // The tensor-level node of a value, made on first use: a scalar constant becomes a CONST
  // broadcast to its shape, any other constant a BUFFER bound to its data.
  const UOp* node_of(Value& v);
  // A BUFFER holding `data`, viewed with data's shape; bound when the model runs. Not
  // `known`: `data` is a placeholder (an input bound at each run of a held model), so
  // evaluate() refuses what reads it.
  const UOp* buffer_for(const HostTensor& data, const std::string& name = "", bool known = true);
  // The value at import time: its constant, or the interpreter's result on the subgraph
  // below its node when every BUFFER there has known data (initializers, Constants, graph
  // inputs). `what` names it in the message when that is not possible.
  absl::StatusOr<HostTensor> evaluate(Value& v, const std::string& what);
  // Counts `bytes` of data the import is about to make against ImportOptions::
  // max_data_bytes; RESOURCE_EXHAUSTED naming `what` past it (nothing is counted then).
  absl::Status spend(uint64_t bytes, const std::string& what);
  // A refusal found where a handler cannot return it (a helper that returns a node): the
  // first one is kept, and the import stops with it once the node's handler returns.
  void fail(absl::Status s) {
    if (failure_.ok()) failure_ = std::move(s);
  }
  const absl::Status& failure() const { return failure_; }

  // Every BUFFER made so far with its data (graph inputs included), and their names.
  const absl::flat_hash_map<const UOp*, HostTensor>& known() const { return known_; }
  const absl::flat_hash_map<const UOp*, std::string>& buffer_names() const { return buffer_names_; }

 private:
  TensorBuilder tb_;
  absl::node_hash_map<std::string, Value> values_;  // node_hash_map: Value* stay valid
  absl::flat_hash_map<const UOp*, HostTensor> known_;
  absl::flat_hash_map<const UOp*, std::string> buffer_names_;
  absl::flat_hash_set<const UOp*> placeholders_;  // BUFFERs made not `known`
  uint64_t max_data_bytes_;                        // 0: no bound
  uint64_t data_bytes_ = 0;                        // spent so far
  absl::Status failure_;                           // fail()'s first
};

class NodeContext {
 public:
  NodeContext(ImportState& st, const onnx::NodeProto& node, int opset) : st_(st), node_(node), opset_(opset) {}

  const onnx::NodeProto& node() const { return node_; }
  const std::string& op() const { return node_.op_type(); }
  int opset() const { return opset_; }
  TensorBuilder& tb() { return st_.tb(); }
  Graph& g() { return st_.graph(); }
  ImportState& state() { return st_; }

  // --- inputs. An input named "" is an omitted optional input.
  int num_inputs() const { return node_.input_size(); }
  bool has(int i) const { return i < node_.input_size() && !node_.input(i).empty(); }
  absl::StatusOr<Value*> value(int i);
  absl::StatusOr<const UOp*> in(int i);      // as a tensor
  absl::StatusOr<Scalar> dtype(int i);
  absl::StatusOr<Dims> shape(int i);
  // An input that decides the graph's structure (a shape, axes, pads): its value is
  // needed now. Graph inputs given with the model count as known.
  absl::StatusOr<HostTensor> constant(int i);
  absl::StatusOr<std::vector<int64_t>> ints(int i);  // an integer tensor, flattened
  absl::StatusOr<double> scalar(int i);              // a one-element tensor's value

  // --- attributes
  const onnx::AttributeProto* attr(const std::string& name) const;
  bool has_attr(const std::string& name) const { return attr(name) != nullptr; }
  int64_t attr_int(const std::string& name, int64_t def) const;
  float attr_float(const std::string& name, float def) const;
  std::string attr_string(const std::string& name, const std::string& def) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;
  std::vector<float> attr_floats(const std::string& name) const;
  absl::StatusOr<HostTensor> attr_tensor(const std::string& name) const;

  // --- outputs. An output named "" is not wanted.
  int num_outputs() const { return node_.output_size(); }
  bool wants(int i) const { return i < node_.output_size() && !node_.output(i).empty(); }
  void out(int i, const UOp* node);
  void out_constant(int i, HostTensor t);
  // A zero tensor for the handler to fill in: data the import makes, counted (ImportState::
  // spend) before it is allocated. INVALID_ARGUMENT for a shape whose size overflows.
  absl::StatusOr<HostTensor> zeros(Scalar dtype, const Dims& shape);

  // --- messages: "Op: why" (UNIMPLEMENTED: a gap of the importer) and invalid models.
  absl::Status unsupported(const std::string& why) const;
  absl::Status invalid(const std::string& why) const;

  // --- checked building blocks for operands that come from the model
  const Dims& shape_of(const UOp* x) { return tb().shape(x); }
  Scalar dtype_of(const UOp* x) const { return x->dtype().scalar; }
  // NumPy broadcasting of model operands; INVALID_ARGUMENT when the shapes do not broadcast.
  absl::StatusOr<Dims> broadcast(const std::vector<Dims>& shapes) const;
  absl::StatusOr<const UOp*> alu(Op op, std::vector<const UOp*> src);
  // An axis attribute or input in [-rank, rank) -> [0, rank).
  absl::StatusOr<int64_t> axis(int64_t a, int64_t rank) const;
  absl::StatusOr<std::vector<int64_t>> axes(std::vector<int64_t> a, int64_t rank) const;

 private:
  std::string who() const;  // "Op" or "Op 'name'", for messages
  ImportState& st_;
  const onnx::NodeProto& node_;
  int opset_;
};

// An operator handler. It sets every output the node wants, or fails.
using Handler = std::function<absl::Status(NodeContext&)>;

struct OpDef {
  Handler fn;
  // The attributes it understands; a node carrying any other is refused by name rather than
  // imported with that attribute ignored.
  std::vector<std::string> attrs;
};

// "Op" for the default domain, "domain:Op" otherwise.
using Registry = absl::flat_hash_map<std::string, OpDef>;
const Registry& registry();

// One registration function per op family (ops_*.cc).
void register_elementwise(Registry& r);
void register_activations(Registry& r);
void register_shape_ops(Registry& r);
void register_reductions(Registry& r);
void register_matmul_conv(Registry& r);
void register_normalization(Registry& r);
void register_resize(Registry& r);
void register_quantized(Registry& r);
void register_indexing(Registry& r);
void register_losses(Registry& r);

}  // namespace uop::onnx_import
