#include "local/local_realizer.h"

namespace uop::client {

absl::StatusOr<std::vector<LeafStorage>> LocalRealizer::run(Graph&, const CanonicalGraph& graph, const RealizeOptions&) {
  auto hosts = detail::host_inputs(graph);
  if (!hosts.ok()) return hosts.status();
  Graph g;
  std::vector<const UOp*> buffers;
  const UOp* sink = detail::clone_graph(g, graph, buffers);
  absl::flat_hash_map<const UOp*, HostTensor> inputs;
  for (size_t k = 0; k < buffers.size(); ++k) inputs.emplace(buffers[k], std::move((*hosts)[k]));
  last_.clear();
  auto outs = runner_.run(g, sink, inputs, &last_);
  if (!outs.ok()) return outs.status();
  // LocalRunner assembles multi-device outputs; Realizer::run gives one result per shard.
  return detail::host_results(graph, *std::move(outs));
}

}  // namespace uop::client
