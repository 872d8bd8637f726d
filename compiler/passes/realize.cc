#include "compiler/passes/realize.h"

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/dim.h"

namespace uop {
namespace {

// Whether EXPAND `e` broadcasts some dim (1 -> n != 1), so that what is below it is read
// several times per element above.
absl::StatusOr<bool> broadcasts(const UOp* e, ShapeInference& shapes) {
  auto in = shapes.shape(e->src(0));
  if (!in.ok()) return in.status();
  auto out = shapes.shape(e);
  if (!out.ok()) return out.status();
  for (size_t i = 0; i < (*in)->size(); ++i) {
    auto a = const_dim((**in)[i]), b = const_dim((**out)[i]);
    if (a == 1 && b != 1) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<absl::flat_hash_set<const UOp*>> plan_realize(const UOp* tensor_sink, ShapeInference& shapes) {
  absl::flat_hash_set<const UOp*> realize;
  for (const UOp* out : tensor_sink->src()) realize.insert(out);
  for (const UOp* u : toposort(tensor_sink)) {
    if (u->op() == Op::CONTIGUOUS) realize.insert(u);
    // A collective and a copy between devices read whole buffers.
    if (u->op() == Op::ALLREDUCE && u->src(0)->op() == Op::MULTI)
      for (const UOp* p : u->src(0)->src()) realize.insert(p);
    if (u->op() == Op::COPY) realize.insert(u->src(0));
  }

  // Walk each kernel (a realized root) down to the realized values and buffers it reads,
  // noting for every REDUCE_AXIS which kernels reach it and whether through a broadcast.
  // Realizing a reduction makes it a kernel of its own, so repeat until nothing changes.
  while (true) {
    absl::flat_hash_map<const UOp*, absl::flat_hash_set<const UOp*>> reached_by;
    absl::flat_hash_set<const UOp*> broadcast;
    for (const UOp* root : realize) {
      struct Item { const UOp* u; bool expanded; };
      std::vector<Item> stack;
      absl::flat_hash_set<std::pair<const UOp*, bool>> seen;
      for (const UOp* s : root->src()) stack.push_back({s, false});
      while (!stack.empty()) {
        Item it = stack.back();
        stack.pop_back();
        if (!shapes.has_shape(it.u) || realize.contains(it.u) || it.u->op() == Op::BUFFER ||
            it.u->op() == Op::MSELECT || it.u->op() == Op::COPY)
          continue;  // buffers, and what collectives and copies fill: read, not computed
        if (!seen.insert({it.u, it.expanded}).second) continue;
        bool expanded = it.expanded;
        if (it.u->op() == Op::REDUCE_AXIS) {
          reached_by[it.u].insert(root);
          if (expanded) broadcast.insert(it.u);
        } else if (it.u->op() == Op::EXPAND) {
          auto b = broadcasts(it.u, shapes);
          if (!b.ok()) return b.status();
          expanded = expanded || *b;
        } else if (it.u->op() == Op::PAD) {
          // Fused under a pad, the reduction runs over the padded shape's loops with every
          // element behind the pad's gate: its loops split only by divisors, its loads are
          // gated scalars (a convolution's output read by the next one's padded input ran
          // a hundred times slower fused than alone).
          expanded = true;
        }
        for (const UOp* s : it.u->src()) stack.push_back({s, expanded});
      }
    }
    size_t before = realize.size();
    for (const UOp* r : broadcast) realize.insert(r);
    for (auto& [r, roots] : reached_by)
      if (roots.size() > 1) realize.insert(r);
    if (realize.size() == before) return realize;
  }
}

}  // namespace uop
