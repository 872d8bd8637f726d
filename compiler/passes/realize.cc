#include "compiler/passes/realize.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/dim.h"

namespace uop {
namespace {

// How many times EXPAND `e` repeats what is below it, counted up to `cap` (>= 2): the
// product of the dims it broadcasts (1 -> n != 1), a dim that is not a number counting as
// `cap`. 1: it broadcasts nothing, so what is below it is read once per element above.
absl::StatusOr<int64_t> broadcast_factor(const UOp* e, ShapeInference& shapes, int64_t cap) {
  auto in = shapes.shape(e->src(0));
  if (!in.ok()) return in.status();
  auto out = shapes.shape(e);
  if (!out.ok()) return out.status();
  int64_t factor = 1;
  for (size_t i = 0; i < (*in)->size(); ++i) {
    auto a = const_dim((**in)[i]), b = const_dim((**out)[i]);
    if (a == 1 && b != 1) factor = std::min(cap, factor * (b ? std::min(cap, *b) : cap));
  }
  return factor;
}

// Whether `u`'s value is computed from a PAD through elementwise ops alone (not past a
// movement op, a reduction, a buffer or what is realized): the pad's gate then reaches
// every read of `u`. Memoized in `memo`.
bool gated_by_pad(const UOp* u, const absl::flat_hash_set<const UOp*>& realize, ShapeInference& shapes,
                  absl::flat_hash_map<const UOp*, bool>& memo) {
  if (u->op() == Op::PAD) return true;
  if (!shapes.has_shape(u) || realize.contains(u) || is_movement(u->op()) || u->op() == Op::BUFFER ||
      u->op() == Op::REDUCE_AXIS || u->op() == Op::MSELECT || u->op() == Op::COPY)
    return false;
  if (auto it = memo.find(u); it != memo.end()) return it->second;
  memo[u] = false;
  bool gated = false;
  for (const UOp* s : u->src()) gated = gated || gated_by_pad(s, realize, shapes, memo);
  return memo[u] = gated;
}

// The ALU ops that computing `u` once takes inside a kernel: its elementwise chain down
// to buffers, realized values, reductions and constants (movement ops are free), each
// node once (`counted`). Stops counting past `cap`.
int chain_ops(const UOp* u, const absl::flat_hash_set<const UOp*>& realize, ShapeInference& shapes, int cap,
              absl::flat_hash_set<const UOp*>& counted) {
  if (!shapes.has_shape(u) || realize.contains(u) || u->op() == Op::BUFFER || u->op() == Op::REDUCE_AXIS ||
      u->op() == Op::MSELECT || u->op() == Op::COPY || u->op() == Op::CONST || !counted.insert(u).second)
    return 0;
  int n = is_alu(u->op()) || u->op() == Op::CAST ? 1 : 0;
  for (const UOp* s : u->src()) {
    if (n > cap) break;
    n += chain_ops(s, realize, shapes, cap - n, counted);
  }
  return n;
}

// A reduction's operand that a broadcast repeats at least this many times (a matmul's
// A along the output columns, a 1x1 convolution's input along the output channels) and
// whose elementwise chain takes more than kRecomputedOps ALU ops (a LayerNorm feeding
// the next projection, a normalization and activation feeding a convolution) is
// realized: fused, the chain is recomputed for every tile of the broadcast axis (64
// times for a 4 x 16 tile over 1024 columns: a transformer's feed-forward kernel spent
// most of its time so), alone it is one pass over its elements.
constexpr int64_t kRecomputeFactor = 8;
constexpr int kRecomputedOps = 4;

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
    absl::flat_hash_set<const UOp*> broadcast, padded_operands;
    absl::flat_hash_map<const UOp*, bool> gated;
    for (const UOp* root : realize) {
      // `expanded`: reached through a broadcast or a PAD; `reduced`: read by a REDUCE_AXIS
      // of this kernel; `moved`: through a movement op since that REDUCE_AXIS, so that the
      // value is one of its operands, not the product it folds.
      // `repeat`: how many times the broadcasts since that REDUCE_AXIS repeat the value
      // (up to kRecomputeFactor).
      struct Item { const UOp* u; bool expanded, reduced, moved; int64_t repeat; };
      std::vector<Item> stack;
      absl::flat_hash_set<std::tuple<const UOp*, bool, bool, bool, int64_t>> seen;
      // A realized pad's kernel runs over the padded shape, under its gate, as a pad read
      // by a kernel does; a realized reduction's kernel folds what its sources compute.
      for (const UOp* s : root->src()) stack.push_back({s, root->op() == Op::PAD, root->op() == Op::REDUCE_AXIS, false, 1});
      while (!stack.empty()) {
        Item it = stack.back();
        stack.pop_back();
        if (!shapes.has_shape(it.u) || realize.contains(it.u) || it.u->op() == Op::BUFFER ||
            it.u->op() == Op::MSELECT || it.u->op() == Op::COPY)
          continue;  // buffers, and what collectives and copies fill: read, not computed
        if (!seen.insert({it.u, it.expanded, it.reduced, it.moved, it.repeat}).second) continue;
        bool expanded = it.expanded, reduced = it.reduced, moved = it.moved;
        int64_t repeat = it.repeat;
        // An operand of a reduction that a pad gates (a convolution's or a pool's padded
        // input, a concatenation a convolution reads): fused, each of the reduction's
        // loads is gated (is the position inside the input?), a scalar load per vector
        // lane, the padded loops split only by divisors, and the operand's elementwise
        // chain is recomputed for every window position that reads it. Realized, it is
        // one pass over the padded shape, far less than the reduction reads of it.
        if (reduced && (it.u->op() == Op::PAD || (moved && !is_movement(it.u->op()))) &&
            gated_by_pad(it.u, realize, shapes, gated)) {
          padded_operands.insert(it.u);
          continue;  // a kernel of its own: the next round walks it
        }
        if (reduced && repeat >= kRecomputeFactor && !is_movement(it.u->op()) && it.u->op() != Op::REDUCE_AXIS) {
          absl::flat_hash_set<const UOp*> counted;
          if (chain_ops(it.u, realize, shapes, kRecomputedOps, counted) > kRecomputedOps) {
            padded_operands.insert(it.u);
            continue;
          }
        }
        // A reduction folded by another one of this kernel (a convolution's output pooled
        // to a vector, a sum of a sum): fused, it runs inside the outer loop with neither
        // loop tiled for it (SqueezeNet's last 1x1 convolution and its global average
        // pool, one kernel, was a third of the model's time at 27 GFLOPS). Realized, it
        // is a kernel the optimizer tiles, and the outer reduction reads its buffer.
        if (it.u->op() == Op::REDUCE_AXIS && reduced) {
          padded_operands.insert(it.u);
          continue;
        }
        if (it.u->op() == Op::REDUCE_AXIS) {
          reached_by[it.u].insert(root);
          if (expanded) broadcast.insert(it.u);
          reduced = true;
          moved = false;
          repeat = 1;
        } else if (it.u->op() == Op::EXPAND) {
          // Counted up to kRecomputeFactor only, which is all the test above asks, so that
          // the walk's states per node stay few whatever the broadcasts multiply to.
          auto f = broadcast_factor(it.u, shapes, kRecomputeFactor);
          if (!f.ok()) return f.status();
          expanded = expanded || *f != 1;
          if (reduced) repeat = std::min(kRecomputeFactor, repeat * *f);
        } else if (it.u->op() == Op::PAD) {
          // Fused under a pad, a reduction runs over the padded shape's loops with every
          // element behind the pad's gate: its loops split only by divisors, its loads are
          // gated scalars (a convolution's output read by the next one's padded input ran
          // a hundred times slower fused than alone).
          expanded = true;
        }
        moved = moved || (reduced && is_movement(it.u->op()));
        for (const UOp* s : it.u->src()) stack.push_back({s, expanded, reduced, moved, repeat});
      }
    }
    size_t before = realize.size();
    for (const UOp* r : broadcast) realize.insert(r);
    for (const UOp* p : padded_operands) realize.insert(p);
    for (auto& [r, roots] : reached_by)
      if (roots.size() > 1) realize.insert(r);
    if (realize.size() == before) return realize;
  }
}

}  // namespace uop
