// The pattern DSL that every pass is written in: a rule is one line, a pattern on the left
// and a callback that builds the replacement on the right (STYLE §3), e.g.
//
//   RuleSet rs("symbolic");
//   Pat x = var("x"), c1 = cvar("c1"), c2 = cvar("c2");
//   rs.add((x + c1) + c2, [](const Match& m) { return ...; }, "add.consts");
//   rs.add(x * one(), [](const Match& m) { return m["x"]; }, "mul.one");
//
// A pattern matches a node by op (one, a set, or any), its sources (exactly, or a prefix),
// dtype, arg and arbitrary node predicates. A name captures the node it stands on, and the
// same name used twice must bind the same node (pointer equality: nodes are hash-consed),
// so `x - x` means "a node minus itself". Binary patterns over commutative ops (op.h's
// is_commutative) also try the swapped operand order, with backtracking, so captures stay
// consistent across both sides; `.ordered()` turns that off.
//
// A RuleSet indexes its rules by the op of their root pattern, so applying it to a node
// only tries the rules that can match that op, in insertion order.
#pragma once

#include <bitset>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/uop.h"

namespace uop::rw {

// A set of ops a pattern node accepts.
class OpSet {
 public:
  OpSet() = default;
  OpSet(Op op) { bits_.set(static_cast<size_t>(op)); }  // NOLINT: implicit on purpose
  OpSet(std::initializer_list<Op> ops) {
    for (Op op : ops) bits_.set(static_cast<size_t>(op));
  }
  static OpSet all() { OpSet s; s.bits_.set(); return s; }
  // Every op of these categories (e.g. the ALU ops: Unary, Binary, Ternary).
  static OpSet of(std::initializer_list<OpCategory> cats);

  bool has(Op op) const { return bits_.test(static_cast<size_t>(op)); }
  bool is_all() const { return bits_.count() >= static_cast<size_t>(kNumOps); }
  OpSet operator|(const OpSet& o) const { OpSet s; s.bits_ = bits_ | o.bits_; return s; }

 private:
  std::bitset<128> bits_;
  static_assert(kNumOps <= 128);
};

// Unary, binary and ternary ALU ops.
OpSet alu_ops();

namespace detail { struct PatNode; }

// A pattern: an immutable tree, cheap to copy and to share between rules. Every refinement
// returns a new Pat and leaves the original as it was.
class Pat {
 public:
  // Captures the matched node under `name`.
  Pat named(std::string name) const;
  // The node's dtype must satisfy `pred`.
  Pat dtype(std::function<bool(const DType&)> pred) const;
  Pat dtype_is(DType d) const;
  Pat is_int() const;     // signed, unsigned or index integer (scalar or vector)
  Pat is_signed() const;  // signed integer or index
  Pat is_float() const;
  Pat is_bool() const;
  Pat is_index() const;
  Pat is_scalar() const;  // vector width 1 and not a pointer
  // The node's arg must satisfy `pred` / equal `a`.
  Pat arg(std::function<bool(const Arg&)> pred) const;
  Pat arg_is(Arg a) const;
  // An arbitrary guard on the node.
  Pat where(std::function<bool(const UOp*)> pred) const;
  // Sources match in the written order only, even for a commutative op.
  Pat ordered() const;

  // A short form for messages: ADD(x, CONST:c1).
  std::string str() const;

  const detail::PatNode& node() const { return *n_; }
  explicit Pat(std::shared_ptr<const detail::PatNode> n) : n_(std::move(n)) {}

 private:
  Pat with(const std::function<void(detail::PatNode&)>& edit) const;
  std::shared_ptr<const detail::PatNode> n_;
};

// Leaves.
Pat any();                    // any node, not captured
Pat var(std::string name);    // any node, captured
Pat cvar(std::string name);   // any CONST, captured
// A CONST whose value equals `v` numerically, in whatever dtype: cnst(2) matches int32 2,
// uint8 2, index 2 and float 2.0; cnst(true) matches bool true only.
Pat cnst(int64_t v);
Pat cnst(int v);
Pat cnst(double v);
Pat cnst(bool v);
// Semantic constants, valid for any dtype: zero() is int 0, bool false, float +0.0 or -0.0
// (numerically zero: a rule that cares about the sign of a float zero must say so), one()
// is int 1, bool true, float 1.0.
Pat zero();
Pat one();

// Interior nodes. `op(o, {a, b})` matches exactly these sources in order (or swapped, for a
// commutative binary op); `op(o)` accepts any sources; `op_prefix` matches the first
// sources and accepts any after them.
Pat op(OpSet ops, std::vector<Pat> src);
Pat op(OpSet ops);
Pat op_prefix(OpSet ops, std::vector<Pat> src);

Pat operator+(const Pat& a, const Pat& b);   // ADD
Pat operator-(const Pat& a, const Pat& b);   // SUB
Pat operator*(const Pat& a, const Pat& b);   // MUL
Pat operator/(const Pat& a, const Pat& b);   // FDIV; integer division is idiv()
Pat operator&(const Pat& a, const Pat& b);   // AND
Pat operator|(const Pat& a, const Pat& b);   // OR
Pat operator^(const Pat& a, const Pat& b);   // XOR
Pat operator-(const Pat& a);                 // NEG
Pat neg(const Pat& a);
Pat idiv(const Pat& a, const Pat& b);
Pat mod(const Pat& a, const Pat& b);
Pat max_(const Pat& a, const Pat& b);
Pat min_(const Pat& a, const Pat& b);
Pat lt(const Pat& a, const Pat& b);
Pat ne(const Pat& a, const Pat& b);
Pat eq(const Pat& a, const Pat& b);
Pat shl(const Pat& a, const Pat& b);
Pat shr(const Pat& a, const Pat& b);
Pat where_(const Pat& c, const Pat& t, const Pat& f);
Pat cast(const Pat& x);     // a CAST to any dtype; refine with .dtype(...)
Pat bitcast(const Pat& x);

class Rule;

// What a rule's callback sees: the graph to build in, the matched root, the captures and
// the user context passed to graph_rewrite.
class Match {
 public:
  Graph& g;
  const UOp* root;

  // The node captured under `name`; the rule's pattern must capture that name.
  const UOp* operator[](std::string_view name) const;
  // The value of a CONST captured under `name`.
  const ConstValue& cv(std::string_view name) const { return *(*this)[name]->const_value(); }
  // The context given to graph_rewrite / RuleSet::apply, or nullptr.
  template <typename T>
  T* ctx() const { return static_cast<T*>(ctx_); }
  const Rule& rule() const { return rule_; }

  Match(Graph& g, const UOp* root, const Rule& rule, const UOp* const* slots, void* ctx)
      : g(g), root(root), rule_(rule), slots_(slots), ctx_(ctx) {}

 private:
  const Rule& rule_;
  const UOp* const* slots_;
  void* ctx_;
};

// Returns the replacement, or nullptr for "no change". Returning the root itself also
// means no change. When a pattern can bind in several ways (commutative operands), a
// callback returning nullptr lets the matcher try the next binding.
using RewriteFn = std::function<const UOp*(const Match&)>;

namespace detail { struct CompiledPat; }

class Rule {
 public:
  Rule(Pat pattern, RewriteFn fn, std::string name);

  const std::string& name() const { return name_; }
  const Pat& pattern() const { return pattern_; }
  // The replacement for `u`, or nullptr when the pattern does not match or the callback
  // declines every binding.
  const UOp* apply(Graph& g, const UOp* u, void* ctx) const;
  // Index of a capture name in this rule's slots, -1 if the pattern does not capture it.
  int slot_of(std::string_view name) const;

 private:
  Pat pattern_;
  RewriteFn fn_;
  std::string name_;
  std::shared_ptr<const detail::CompiledPat> compiled_;
};

class RuleSet {
 public:
  explicit RuleSet(std::string name) : name_(std::move(name)) {}

  RuleSet& add(const Pat& pattern, RewriteFn fn, std::string name);
  // Appends every rule of `other` (after this set's own rules).
  RuleSet& extend(const RuleSet& other);

  struct Applied {
    const UOp* node = nullptr;   // the replacement, nullptr if no rule fired
    const Rule* rule = nullptr;  // the rule that fired
  };
  // The first rule, in insertion order, that rewrites `u` to something else.
  Applied apply(Graph& g, const UOp* u, void* ctx = nullptr) const;

  const std::string& name() const { return name_; }
  size_t size() const { return rules_.size(); }
  const Rule& rule(size_t i) const { return rules_[i]; }
  // How many rules can match a node of this op (what apply() tries).
  size_t rules_for(Op op) const { return by_op_[static_cast<size_t>(op)].size(); }

 private:
  std::string name_;
  std::vector<Rule> rules_;
  std::vector<uint32_t> by_op_[kNumOps];
};

}  // namespace uop::rw
