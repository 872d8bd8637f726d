// Bestiary tree printer. One explicit DFS stack, no recursion: a 200k-deep chain prints.
#include "compiler/ir/printer.h"

#include <vector>

#include "compiler/support/strings.h"

namespace uop {
namespace {

// Guides kept per line; deeper lines drop their outermost guides.
constexpr size_t kMaxGuides = 32;

std::string label(const UOp* u, const NodeIndex& index) {
  auto it = index.find(u);
  return it == index.end() ? "[?]" : cat("[", it->second, "]");
}

std::string line(const UOp* u, const NodeIndex& index, const NodeNames* names) {
  std::string a = arg_str(u->arg());
  std::string out = cat(label(u, index), " ", op_name(u->op()));
  if (!a.empty()) out += cat("(", a, ")");
  out += cat(" : ", u->dtype().str());
  if (names) {
    if (auto it = names->find(u); it != names->end()) out += cat("  # ", it->second);
  }
  return out;
}

}  // namespace

std::string print_node(const UOp* u, const NodeIndex* index, const NodeNames* names) {
  if (index) return line(u, *index, names);
  NodeIndex own = index_by_toposort(u);
  return line(u, own, names);
}

std::string print_tree(const UOp* root, const NodeIndex* index, const NodeNames* names) {
  NodeIndex own;
  if (!index) {
    own = index_by_toposort(root);
    index = &own;
  }
  std::string out = line(root, *index, names) + "\n";
  absl::flat_hash_set<const UOp*> drawn{root};
  // stack[d] is the node at depth d whose sources are being drawn; last[d] says whether it
  // was the last source of its parent (then the guide below it is blank, not "│").
  struct Frame { const UOp* u; size_t next; bool last; };
  std::vector<Frame> stack{{root, 0, true}};
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next == f.u->num_src()) { stack.pop_back(); continue; }
    const UOp* child = f.u->src(f.next++);
    const bool last = f.next == f.u->num_src();
    // Guides for depths 1..size-1 (the root draws none).
    size_t first = 1;
    if (stack.size() - 1 > kMaxGuides) {
      first = stack.size() - kMaxGuides;
      out += "⋮ ";
    }
    for (size_t d = first; d < stack.size(); ++d) out += stack[d].last ? "    " : "│   ";
    out += last ? "└── " : "├── ";
    if (!drawn.insert(child).second) {
      out += cat(label(child, *index), " → (same as above)\n");
      continue;
    }
    out += line(child, *index, names) + "\n";
    stack.push_back({child, 0, last});
  }
  return out;
}

}  // namespace uop
