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
  onnx_import::ImportOptions opts;
  // Twice the decode limit: the import's graph also holds the nodes that shape arithmetic
  // and hash consing leave unreachable from the outputs.
  opts.max_graph_nodes = 2 * static_cast<size_t>(limits.max_nodes);
  // A model makes at import no more data than it could have sent as its bytes.
  opts.max_data_bytes = limits.max_bytes;
  std::vector<std::pair<std::string, HostTensor>> placeholders;
  ASSIGN_OR_RETURN(onnx_import::ImportedModel m, onnx_import::import_for_shapes(bytes, shapes, opts, &placeholders));
  std::set<std::string> names;
  for (const auto& [name, p] : placeholders) names.insert(name);

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
  for (const auto& [name, p] : placeholders) out.inputs.push_back({name, p.dtype, p.shape});
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
