// The tree form of the Op Bestiary, for dumps, `uop explain` and error reports:
//
//   [42] STORE : void
//   ├── [35] INDEX : float32
//   │   ├── [10] PARAM(0, size=16) : ptr<float32, global, 16>
//   │   └── [30] RANGE(R0, Reduce) : index
//   │       └── [5] CONST(4) : index
//   └── [40] REDUCE(Add) : float32
//       └── [30] → (same as above)
//
// A node is drawn once; later occurrences show `→ (same as above)`. Beyond 32 levels the
// outer guides are elided (a line starts with "⋮ "), so the output stays linear in the
// number of nodes however deep the graph is.
#pragma once

#include <string>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/uop.h"

namespace uop {

// Optional labels (e.g. names given by a frontend), printed as `  # name` after a node.
using NodeNames = absl::flat_hash_map<const UOp*, std::string>;

// `index` numbers the nodes (the wire index of a decoded graph); by default
// index_by_toposort(root). A node missing from the index shows as [?].
std::string print_tree(const UOp* root, const NodeIndex* index = nullptr, const NodeNames* names = nullptr);
// One line: `[index] OP(arg) : dtype` (no parentheses when the arg prints empty). Without
// an index, the node's position in its own toposort (the number of nodes below it).
std::string print_node(const UOp* u, const NodeIndex* index = nullptr, const NodeNames* names = nullptr);

}  // namespace uop
