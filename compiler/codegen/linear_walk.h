// The walk both renderers share (the LLVM CPU backend's llvm_cpu_render.cc, the CUDA
// backend's cuda_render.cc): the LINEAR is verified once (verify_for_rendering below, before
// anything else reads it), then emitted op by op in its own order. The walk keeps what each emitted op stands for (a
// backend's `Emitted`), the open RANGE / IF blocks, and which block computed each value;
// a backend says only how it emits one op.
//
// What the verifier guarantees (every source listed before its use and inside an open
// block, blocks properly nested, operand dtypes, addresses only under LOAD / STORE) is
// asserted here, not checked again: a broken assertion is an INTERNAL error naming the
// node, a bug in a pass or a backend, never bad input. What a backend cannot render
// although the LINEAR is valid (an op it lacks, a size over its limits) it refuses with
// refuse(): INVALID_ARGUMENT naming the node by its toposort index, its op and the rule.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop {

// What an emitted op stands for: nothing (an effect), a value, a buffer (a pointer or an
// array) or an address into one (an INDEX).
enum class EmitKind { None, Value, Buffer, Address };

namespace linear_walk_internal {
// "node 12 (ADD): why", INVALID_ARGUMENT.
absl::Status refuse(const NodeIndex& ix, const UOp* u, std::string_view why);
// INTERNAL: the verified LINEAR broke an assumption of the renderer.
absl::Status broken(const NodeIndex& ix, const UOp* u, std::string_view what);
// The node's toposort index, as messages print it.
std::string number(const NodeIndex& ix, const UOp* u);
}  // namespace linear_walk_internal

// What every renderer runs first: a LINEAR root that passes verify_linear (custom ops
// allowed: whether they are is decided where the graph comes in; the backend then checks
// that it can emit them). `who` names the caller in the message for a root that is not a
// LINEAR.
absl::Status verify_for_rendering(const UOp* linear, std::string_view who);

// `Emitted` must have `EmitKind kind` and `int scope` members (0: valid anywhere);
// `ScopeData` is what the backend keeps per open block (LLVM's loop blocks, say).
template <typename Emitted, typename ScopeData = std::monostate>
class LinearWalk {
 public:
  struct Scope {
    int id = 0;
    const UOp* node = nullptr;  // the RANGE or IF
    ScopeData data{};
  };

  virtual ~LinearWalk() = default;

  // Emits each op of `linear` (verified with verify_for_rendering) in order; the first
  // error stops it.
  absl::Status walk(const UOp* linear) {
    for (const UOp* u : linear->src()) RETURN_IF_ERROR(emit(u));
    if (!scopes_.empty()) return broken(scopes_.back().node, "its block is still open at the end");
    return absl::OkStatus();
  }

 protected:
  explicit LinearWalk(const UOp* linear) : ix_(index_by_toposort(linear)) {}

  // Emits `u`, recording what it stands for with define() / define_anywhere() / done().
  virtual absl::Status emit(const UOp* u) = 0;

  absl::Status refuse(const UOp* u, std::string_view why) const { return linear_walk_internal::refuse(ix_, u, why); }
  absl::Status broken(const UOp* u, std::string_view what) const { return linear_walk_internal::broken(ix_, u, what); }
  std::string number(const UOp* u) const { return linear_walk_internal::number(ix_, u); }

  // The emitted form of source `s` of `u` (listed before it, computed in an open block).
  // The pointer is valid until the next define.
  absl::StatusOr<const Emitted*> get(const UOp* u, const UOp* s) const {
    auto it = done_.find(s);
    if (it == done_.end()) return broken(u, cat("uses node ", number(s), " before it is emitted"));
    if (!in_scope(it->second.scope)) return broken(u, cat("uses node ", number(s), " outside the block that computes it"));
    return &it->second;
  }
  absl::StatusOr<const Emitted*> get(const UOp* u, const UOp* s, EmitKind kind) const {
    ASSIGN_OR_RETURN(const Emitted* e, get(u, s));
    if (e->kind != kind) return broken(u, cat("source node ", number(s), " (", op_name(s->op()), ") is not what it uses"));
    return e;
  }
  absl::StatusOr<const Emitted*> value(const UOp* u, const UOp* s) const { return get(u, s, EmitKind::Value); }

  // The sources a LOAD (address, optional alt) or a STORE (address, value) works on, copied.
  struct Access {
    Emitted address;
    const UOp* data = nullptr;  // LOAD: its alt (or nullptr), STORE: the value stored
    Emitted data_emitted;
  };
  absl::StatusOr<Access> load_operands(const UOp* u) const {
    Access a;
    ASSIGN_OR_RETURN(const Emitted* addr, get(u, u->src(1), EmitKind::Address));
    a.address = *addr;
    if (u->num_src() > 2) {
      a.data = u->src(2);
      ASSIGN_OR_RETURN(const Emitted* alt, value(u, a.data));
      a.data_emitted = *alt;
    }
    return a;
  }
  absl::StatusOr<Access> store_operands(const UOp* u) const {
    // Sources past the value are ranges the STORE closes at kernel level; at linear level
    // END closes them, so they only order here.
    Access a;
    ASSIGN_OR_RETURN(const Emitted* addr, get(u, u->src(0), EmitKind::Address));
    a.address = *addr;
    a.data = u->src(1);
    ASSIGN_OR_RETURN(const Emitted* v, value(u, a.data));
    a.data_emitted = *v;
    return a;
  }

  // `u` stands for `e`, computed here: usable while the current block is open. An op the
  // verifier counts as a definition (is_linear_definition) is usable anywhere.
  void define(const UOp* u, Emitted e) {
    e.scope = current_scope();
    done_[u] = std::move(e);
  }
  void define_anywhere(const UOp* u, Emitted e) {
    e.scope = 0;
    done_[u] = std::move(e);
  }
  // An effect: nothing to use, usable (as an ordering source) anywhere.
  void done(const UOp* u) { done_[u] = Emitted{}; }
  // `u` (AFTER, a BARRIER passing a value) stands for what its source `s` stands for.
  absl::Status same_as(const UOp* u, const UOp* s) {
    ASSIGN_OR_RETURN(const Emitted* e, get(u, s));
    Emitted copy = *e;  // before the insertion below may rehash the map it points into
    done_[u] = std::move(copy);
    return absl::OkStatus();
  }

  // Blocks: RANGE / IF open one, END / ENDIF close the innermost.
  Scope& open_scope(const UOp* node, ScopeData data = {}) {
    scopes_.push_back({next_scope_++, node, std::move(data)});
    return scopes_.back();
  }
  absl::StatusOr<Scope> close_scope(const UOp* u, const UOp* node) {
    if (scopes_.empty() || scopes_.back().node != node) return broken(u, "does not close the innermost open block");
    Scope s = std::move(scopes_.back());
    scopes_.pop_back();
    return s;
  }
  // The RANGEs an END closes, innermost first.
  std::vector<const UOp*> closed_ranges(const UOp* end) const {
    std::vector<const UOp*> out(end->src().begin() + 1, end->src().end());
    return {out.rbegin(), out.rend()};
  }
  size_t depth() const { return scopes_.size(); }
  int current_scope() const { return scopes_.empty() ? 0 : scopes_.back().id; }
  const NodeIndex& index() const { return ix_; }
  const absl::flat_hash_map<const UOp*, Emitted>& emitted() const { return done_; }

 private:
  bool in_scope(int id) const {
    if (id == 0) return true;
    for (const Scope& s : scopes_)
      if (s.id == id) return true;
    return false;
  }

  NodeIndex ix_;
  absl::flat_hash_map<const UOp*, Emitted> done_;
  std::vector<Scope> scopes_;
  int next_scope_ = 1;
};

}  // namespace uop
