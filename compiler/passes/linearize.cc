#include "compiler/passes/linearize.h"

#include <algorithm>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "compiler/passes/lower_reduce.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

absl::Status bad(const UOp* u, std::string_view what) {
  return absl::InvalidArgumentError(cat("linearize: ", op_name(u->op()), " node: ", what, " [linearize.loops]"));
}

class Linearizer {
 public:
  explicit Linearizer(const UOp* kernel) : order_(toposort(kernel)) {
    for (size_t i = 0; i < order_.size(); ++i) pos_[order_[i]] = i;
  }

  absl::StatusOr<std::vector<const UOp*>> run() {
    // One END per range; the loop's parent is the innermost range its END depends on.
    std::vector<const UOp*> loops;
    for (const UOp* u : order_) {
      if (u->op() == Op::END) {
        const UOp* r = u->src(1);
        if (r->op() != Op::RANGE) return bad(u, "END must close a RANGE");
        if (!end_of_.emplace(r, u).second) return bad(r, "a range closed by two ENDs");
      } else if (u->op() == Op::RANGE) {
        loops.push_back(u);
      }
    }
    for (const UOp* r : loops)
      if (!end_of_.contains(r)) return bad(r, "a range that is never closed");
    // Parents: a loop sits inside the innermost of the loops its END depends on, so it is
    // placed once all of those are. Not in the order of how many it depends on: a
    // reduction loop that varies with an inner loop only (out[a][b][c] = sum_k x[k][c])
    // depends on fewer loops than that inner loop does.
    chain_[nullptr] = {};
    for (std::vector<const UOp*> todo = loops; !todo.empty();) {
      std::vector<const UOp*> later;
      for (const UOp* r : todo) {
        const auto& deps = sets_.of(end_of_[r]);
        if (!std::all_of(deps.begin(), deps.end(), [&](const UOp* d) { return chain_.contains(d); })) {
          later.push_back(r);
          continue;
        }
        auto parent = innermost(deps);
        if (!parent.ok()) return bad(r, "its loop would sit inside sibling loops");
        std::vector<const UOp*> c = chain_.at(*parent);
        c.push_back(r);
        chain_[r] = std::move(c);
        parent_[r] = *parent;
      }
      if (later.size() == todo.size()) return bad(later.front(), "its loop would sit inside sibling loops");
      todo = std::move(later);
    }
    for (const UOp* u : order_) {
      if (u == order_.back() && u->op() == Op::SINK) continue;
      if (u->op() == Op::RANGE || u->op() == Op::END) continue;
      auto b = innermost(sets_.of(u));
      if (!b.ok()) return bad(u, "it depends on ranges of sibling loops");
      block_[u] = *b;
    }
    std::vector<const UOp*> out;
    emit(nullptr, out);
    return out;
  }

 private:
  // The loop, among `ranges`, that the others enclose; nullptr for none. An error when
  // they are not one chain of nested loops.
  absl::StatusOr<const UOp*> innermost(const std::vector<const UOp*>& ranges) {
    const UOp* best = nullptr;
    for (const UOp* r : ranges) {
      auto it = chain_.find(r);
      if (it == chain_.end()) return absl::InternalError("loop order");
      if (!best || it->second.size() > chain_.at(best).size()) best = r;
    }
    if (!best) return best;
    const auto& c = chain_.at(best);
    for (const UOp* r : ranges)
      if (std::find(c.begin(), c.end(), r) == c.end()) return absl::InternalError("sibling loops");
    return best;
  }

  // The item that stands for node `u` among the children of block `b`: u itself, the
  // child loop that contains it, or nullptr when u is not inside b.
  const UOp* item_at(const UOp* u, const UOp* b) const {
    const UOp* home;
    if (u->op() == Op::RANGE) home = u;
    else if (u->op() == Op::END) home = u->src(1);
    else {
      auto it = block_.find(u);
      if (it == block_.end()) return nullptr;
      home = it->second;
    }
    const auto& bc = chain_.at(b);
    const auto& hc = chain_.at(home);
    if (hc.size() < bc.size() || !std::equal(bc.begin(), bc.end(), hc.begin())) return nullptr;
    if (hc.size() == bc.size()) return (u->op() == Op::RANGE || u->op() == Op::END) ? nullptr : u;
    return hc[bc.size()];  // a loop directly inside b
  }

  void emit(const UOp* b, std::vector<const UOp*>& out) {
    // The items of this block and the dependencies among them.
    std::vector<const UOp*> items;
    absl::flat_hash_map<const UOp*, std::vector<const UOp*>> users;
    absl::flat_hash_map<const UOp*, int> waiting;
    absl::flat_hash_map<const UOp*, size_t> first;  // earliest toposort position inside an item
    for (const UOp* u : order_) {
      const UOp* it = item_at(u, b);
      if (!it) continue;
      if (!first.contains(it)) {
        first[it] = pos_.at(u);
        items.push_back(it);
        waiting[it] = 0;
      }
    }
    absl::flat_hash_set<std::pair<const UOp*, const UOp*>> edges;
    for (const UOp* u : order_) {
      const UOp* to = item_at(u, b);
      if (!to) continue;
      for (const UOp* s : u->src()) {
        const UOp* from = item_at(s, b);
        if (!from || from == to || !edges.insert({from, to}).second) continue;
        users[from].push_back(to);
        waiting[to]++;
      }
    }
    auto later = [&](const UOp* x, const UOp* y) { return first.at(x) > first.at(y); };
    std::priority_queue<const UOp*, std::vector<const UOp*>, decltype(later)> ready(later);
    for (const UOp* it : items)
      if (waiting[it] == 0) ready.push(it);
    while (!ready.empty()) {
      const UOp* it = ready.top();
      ready.pop();
      if (it->op() == Op::RANGE) {  // a loop directly inside this block
        out.push_back(it);
        emit(it, out);
        out.push_back(end_of_.at(it));
      } else {
        out.push_back(it);
      }
      for (const UOp* v : users[it])
        if (--waiting[v] == 0) ready.push(v);
    }
  }

  std::vector<const UOp*> order_;
  absl::flat_hash_map<const UOp*, size_t> pos_;
  RangeSets sets_;
  absl::flat_hash_map<const UOp*, const UOp*> end_of_;
  absl::flat_hash_map<const UOp*, const UOp*> parent_;
  absl::flat_hash_map<const UOp*, std::vector<const UOp*>> chain_;  // loop -> enclosing loops + itself
  absl::flat_hash_map<const UOp*, const UOp*> block_;               // op -> innermost loop (nullptr: none)
};

}  // namespace

absl::StatusOr<const UOp*> linearize(Graph& g, const UOp* lowered_kernel) {
  Linearizer lin(lowered_kernel);
  auto ops = lin.run();
  if (!ops.ok()) return ops.status();
  return g.make(Op::LINEAR, dtypes::void_, *ops);
}

}  // namespace uop
