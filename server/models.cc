#include "server/models.h"

#include <set>

#include "compiler/support/status_macros.h"
#include "proto/uop.pb.h"
#include "server/wire_scan.h"
#include "compiler/support/strings.h"
#if UOPD_ONNX
#include "compiler/onnx/importer.h"
#endif

namespace uop::server {

#if UOPD_ONNX
absl::StatusOr<ImportedModelGraph> import_model_graph(std::string_view bytes,
                                                      const std::map<std::string, std::vector<int64_t>>& shapes,
                                                      const DecodeLimits& limits) {
  ASSIGN_OR_RETURN(std::vector<onnx_import::ModelInput> declared, onnx_import::model_inputs(bytes));
  std::set<std::string> names;
  for (const auto& in : declared) names.insert(in.name);
  for (const auto& [name, shape] : shapes)
    if (!names.contains(name)) return absl::InvalidArgumentError(cat("the model has no input named '", name.substr(0, 64), "'"));
  // Placeholders of each input's shape: their values are never read (inputs_known=false),
  // only their dtype and shape decide the graph.
  std::map<std::string, HostTensor> placeholders;
  for (const auto& in : declared) {
    if (!in.dtype) return absl::UnimplementedError(cat("model input '", in.name, "' has an element type uopd does not support"));
    std::vector<int64_t> shape;
    if (auto it = shapes.find(in.name); it != shapes.end()) shape = it->second;
    else if (in.shape) shape = *in.shape;
    else return absl::InvalidArgumentError(cat("model input '", in.name, "' has symbolic dimensions: give its shape when loading the model"));
    std::optional<int64_t> n = checked_numel(shape);
    if (!n || *n > (int64_t{1} << 40))
      return absl::InvalidArgumentError(cat("model input '", in.name, "': shape ", shape_str(shape), " is not a valid size"));
    HostTensor t;
    t.dtype = *in.dtype;
    t.shape = shape;
    // A placeholder is never read, but the importer copies it into the graph's bindings:
    // one element stands in for any input, so a huge declared input costs nothing here.
    t.data.assign(scalar_bytes(t.dtype) * static_cast<size_t>(*n == 0 ? 0 : 1), '\0');
    placeholders[in.name] = std::move(t);
  }
  onnx_import::ImportOptions opts;
  opts.inputs_known = false;
  // Twice the decode limit: the import's graph also holds the nodes that shape arithmetic
  // and hash consing leave unreachable from the outputs.
  opts.max_graph_nodes = 2 * static_cast<size_t>(limits.max_nodes);
  // A model makes at import no more data than it could have sent as its bytes.
  opts.max_data_bytes = limits.max_bytes;
  ASSIGN_OR_RETURN(onnx_import::ImportedModel m, onnx_import::import_model(bytes, placeholders, opts));

  ImportedModelGraph out;
  Names graph_names = m.names;
  std::set<const UOp*> inputs;
  for (const auto& [name, u] : m.names) inputs.insert(u);
  for (size_t i = 0; i < m.bindings.size(); ++i) {
    const auto& [u, data] = m.bindings[i];
    if (inputs.contains(u)) continue;
    // A name no input of the model has, so that a binding by name finds one node.
    std::string name = cat("weight:", out.weights.size());
    while (names.contains(name)) name.insert(0, "_");
    graph_names.emplace_back(name, u);
    out.weights.emplace_back(name, data);
  }
  // Through the wire format and back, under the limits every graph from the network has.
  uop::v1::Graph wire;
  encode_proto(m.root, graph_names, &wire);
  ASSIGN_OR_RETURN(DecodedGraph g, decode_proto(wire, limits));
  out.graph_bytes = wire.ByteSizeLong() + kDecodedNodeBytes * g.nodes.size();
  out.graph = std::make_shared<const DecodedGraph>(std::move(g));
  for (const auto& in : declared) {
    const HostTensor& p = placeholders[in.name];
    out.inputs.push_back({in.name, p.dtype, p.shape});
  }
  for (const auto& o : m.outputs) out.outputs.push_back({o.name, o.dtype, o.shape});
  return out;
}
#else
absl::StatusOr<ImportedModelGraph> import_model_graph(std::string_view, const std::map<std::string, std::vector<int64_t>>&,
                                                      const DecodeLimits&) {
  return absl::UnimplementedError("this uopd is built without ONNX (libonnx-dev): it cannot load models");
}
#endif

}  // namespace uop::server
