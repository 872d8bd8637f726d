// The ONNX importer: a model (ModelProto bytes) and the data of its inputs -> a tensor-level
// UOp graph (compiler/ir/README.md "Tensor level") whose outputs are the model's outputs,
// plus the data every BUFFER of it must be bound to (initializers, large Constants, the
// inputs themselves).
//
// Shapes are static: a model is imported for one set of input shapes, and the small
// subgraphs that compute shapes, axes or pads are evaluated here with the reference
// interpreter. An operator the importer does not handle exactly is refused with
// UNIMPLEMENTED naming it ("unsupported operator(s): Foo, Bar" or "Op: why"); a malformed
// model gets INVALID_ARGUMENT. Nothing is guessed.
#pragma once

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/uop.h"

namespace uop::onnx_import {

struct ImportedModel {
  std::unique_ptr<Graph> graph;
  const UOp* root = nullptr;  // SINK of the outputs, in the model's order
  Names names;                // the graph inputs' BUFFERs, by their ONNX names
  // Every BUFFER under root with the data it is bound to, in toposort order.
  std::vector<std::pair<const UOp*, HostTensor>> bindings;
  struct Output {
    std::string name;
    Scalar dtype = Scalar::Float32;
    std::vector<int64_t> shape;
  };
  std::vector<Output> outputs;
  std::vector<std::string> op_types;  // the operators the model uses, sorted, once each
};

struct ImportOptions {
  // False for a model a server holds: `inputs` are placeholders of the shapes it is
  // imported for, their data is bound at each run, so no part of the import may read
  // their values (what would need them is UNIMPLEMENTED, naming it).
  bool inputs_known = true;
  // Nodes the import's graph may reach (0: no bound), checked after each ONNX node: past
  // it, RESOURCE_EXHAUSTED naming the node. For a server, whose decode limits would refuse
  // such a graph anyway, so that the refusal comes before the memory is spent.
  size_t max_graph_nodes = 0;
  // Bytes of data the import makes itself (EyeLike, Range, Trilu and attention masks,
  // Resize weights, index tables, the results of shape arithmetic), all of it together;
  // 0: no bound. Their sizes come from the model's shapes, so a small model can ask for
  // any amount: past the bound, RESOURCE_EXHAUSTED naming the node, before the memory is
  // spent.
  uint64_t max_data_bytes = uint64_t{1} << 30;
};

// `inputs` gives every graph input that is not also an initializer (an initializer given
// here overrides its default). INVALID_ARGUMENT for a missing input or a dtype that is not
// the declared one.
absl::StatusOr<ImportedModel> import_model(std::string_view model_bytes,
                                           const std::map<std::string, HostTensor>& inputs,
                                           ImportOptions options = {});

// The model imported for its inputs' shapes alone, as a server holds one (and as `uop
// compile|explain MODEL.onnx` shows it): each graph input a placeholder of its shape in
// `shapes`, else its declared one, whose values the import never reads
// (options.inputs_known is set false). `placeholders`, when given, gets each input's
// placeholder (name, dtype, shape; one element of data) in the model's order.
// INVALID_ARGUMENT for a shape of an input the model does not have, an input with
// neither shape, a shape that is no valid size; UNIMPLEMENTED for an input whose element
// type has no Scalar; the importer's statuses otherwise.
absl::StatusOr<ImportedModel> import_for_shapes(std::string_view model_bytes,
                                                const std::map<std::string, std::vector<int64_t>>& shapes,
                                                ImportOptions options = {},
                                                std::vector<std::pair<std::string, HostTensor>>* placeholders = nullptr);

// The model's graph inputs that are not initializers: name, the declared element type
// when it has a Scalar, and the declared shape when every dimension of it is a number.
// For `uop run`, the test runner's messages and a server's LoadModel.
struct ModelInput {
  std::string name;
  std::optional<Scalar> dtype;
  std::optional<std::vector<int64_t>> shape;
};
absl::StatusOr<std::vector<ModelInput>> model_inputs(std::string_view model_bytes);
// The operator types a model uses, sorted, once each ("domain:Op" outside the default
// domain).
absl::StatusOr<std::vector<std::string>> operator_types(std::string_view model_bytes);
// The operator types a model uses that the importer has no handler for, sorted.
absl::StatusOr<std::vector<std::string>> unsupported_operators(std::string_view model_bytes);

}  // namespace uop::onnx_import
