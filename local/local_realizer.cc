#include "local/local_realizer.h"

namespace uop::client {

absl::StatusOr<std::vector<LeafStorage>> LocalRealizer::run(Graph&, const CanonicalGraph& graph, const RealizeOptions&) {
  last_.clear();
  // LocalRunner assembles multi-device outputs; Realizer::run gives one result per shard.
  return detail::realize_on_host(graph, [&](Graph& g, const UOp* sink, const absl::flat_hash_map<const UOp*, HostTensor>& inputs) {
    return runner_.run(g, sink, inputs, &last_);
  });
}

}  // namespace uop::client
