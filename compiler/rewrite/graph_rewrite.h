// graph_rewrite: the one engine every pass runs on (docs/ARCHITECTURE.md, The pipeline). It applies a RuleSet to a
// graph bottom-up until no rule matches anywhere:
//
//   * a node's sources are rewritten before the node;
//   * at a node, rules are applied until none matches; when a rule returns a new node,
//     that node is itself rewritten bottom-up (its sources may be new and unrewritten);
//   * every node is rewritten once per call (memoized), and a node nothing applies to
//     comes back as itself, so a rewrite that changes nothing returns `root`.
//
// The walk uses an explicit stack: graphs come from the network and may be chains of any
// depth. The number of rule applications is bounded, so a rule set that never settles
// (a + b -> b + a) is an INVALID_ARGUMENT error naming the last rule, not a hang; and on a
// Graph with a node limit (Graph::set_node_limit) a rewrite that grows it past the limit
// is RESOURCE_EXHAUSTED naming the limit, not an exhausted machine.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"
#include "compiler/rewrite/pattern.h"

namespace uop::rw {

struct RewriteOptions {
  // How messages name this rewrite; the rule set's name when empty.
  std::string name;
  // More rule applications than this in one call is an error [rewrite.no_fixed_point].
  size_t max_rewrites = 1'000'000;
  // Called after every rule application, for debug output (`uop explain`) and tests.
  std::function<void(const Rule& rule, const UOp* before, const UOp* after)> trace;
};

absl::StatusOr<const UOp*> graph_rewrite(Graph& g, const UOp* root, const RuleSet& rules,
                                         void* ctx = nullptr, const RewriteOptions& options = {});

}  // namespace uop::rw
