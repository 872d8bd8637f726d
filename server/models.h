// Models held by the server (LoadModel / RunModel, proto/uopd.proto): an ONNX model's
// bytes, from the network, imported here (compiler/onnx) for the shapes its inputs
// declare or the loader names, into a graph whose weights are BUFFERs bound to buffers of
// the loading session and whose inputs are bound at each run. The import is untrusted
// input like a graph: the graph it makes is encoded and decoded again under the server's
// decode limits, so a model can hold no more than a graph could.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/ir/codec.h"

namespace uop::server {

struct ModelTensorInfo {
  std::string name;
  Scalar dtype = Scalar::Float32;
  std::vector<int64_t> shape;
};

// What LoadModel imports, before its weights are on a worker.
struct ImportedModelGraph {
  std::shared_ptr<const DecodedGraph> graph;
  // The weights: the graph's name of each (Binding.name) and its data.
  std::vector<std::pair<std::string, HostTensor>> weights;
  std::vector<ModelTensorInfo> inputs, outputs;
  uint64_t graph_bytes = 0;  // what the decoded graph holds in the scheduler, about
};

// UNIMPLEMENTED where uopd is built without libonnx-dev. INVALID_ARGUMENT for bytes that
// are not a model, an input with neither a numeric declared shape nor one in `shapes`, a
// shape for an input the model does not have; the importer's own statuses otherwise.
absl::StatusOr<ImportedModelGraph> import_model_graph(std::string_view bytes,
                                                      const std::map<std::string, std::vector<int64_t>>& shapes,
                                                      const DecodeLimits& limits);

// A model held by a session (SessionManager::add_model).
struct HeldModel {
  std::shared_ptr<const DecodedGraph> graph;
  std::vector<std::pair<std::string, std::string>> weights;  // graph name -> session buffer id
  std::vector<ModelTensorInfo> inputs, outputs;
};

}  // namespace uop::server
