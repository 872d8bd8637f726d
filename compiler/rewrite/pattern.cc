// The matcher behind pattern.h. A rule's pattern is compiled once into a flat array with
// capture names resolved to slots; matching walks pattern and node together, and
// backtracks through the operand orders of commutative ops by continuation passing: each
// step calls "the rest of the match" and undoes its own capture when that fails. Patterns
// are a few levels deep, so the recursion here is bounded by the rule, not by the graph.
#include "compiler/rewrite/pattern.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/functional/function_ref.h"
#include "compiler/support/strings.h"

namespace uop::rw {

namespace detail {
struct PatNode {
  OpSet ops = OpSet::all();
  std::string name;  // capture name, empty if none
  std::vector<Pat> src;
  enum class Src : uint8_t { Any, Exact, Prefix } src_mode = Src::Any;
  bool ordered = false;
  std::vector<std::function<bool(const UOp*)>> preds;
  std::string label;  // what str() prints for a leaf with a value check ("0", "one", ...)
};

struct CNode {
  const PatNode* p;
  int slot;          // capture slot, -1 if none
  bool commutative;  // also try the swapped operand order
  std::vector<int> kids;
};

struct CompiledPat {
  std::vector<CNode> nodes;  // nodes[0] is the root
  std::vector<std::string> names;
};
}  // namespace detail

namespace {

using detail::CNode;
using detail::CompiledPat;
using detail::PatNode;

// At most this many distinct captures per rule: slots live on the stack while matching.
constexpr size_t kMaxSlots = 16;

// A rule that reads a capture it does not bind is our bug, not the user's: stop loudly,
// in release builds too.
[[noreturn]] void fail_loudly(const std::string& msg) {
  std::fprintf(stderr, "uop::rw: %s\n", msg.c_str());
  std::abort();
}

std::shared_ptr<PatNode> leaf() { return std::make_shared<PatNode>(); }

bool all_commutative(const OpSet& ops) {
  if (ops.is_all()) return false;
  bool any = false;
  for (int i = 0; i < kNumOps; ++i) {
    Op op = static_cast<Op>(i);
    if (!ops.has(op)) continue;
    if (!is_commutative(op)) return false;
    any = true;
  }
  return any;
}

int compile(const PatNode& p, CompiledPat& out) {
  int idx = static_cast<int>(out.nodes.size());
  out.nodes.push_back({&p, -1, false, {}});
  if (!p.name.empty()) {
    int slot = -1;
    for (size_t i = 0; i < out.names.size(); ++i)
      if (out.names[i] == p.name) slot = static_cast<int>(i);
    if (slot < 0) {
      slot = static_cast<int>(out.names.size());
      out.names.push_back(p.name);
    }
    out.nodes[idx].slot = slot;
  }
  out.nodes[idx].commutative = p.src_mode == PatNode::Src::Exact && p.src.size() == 2 &&
                               !p.ordered && all_commutative(p.ops);
  std::vector<int> kids;
  for (const Pat& s : p.src) kids.push_back(compile(s.node(), out));
  out.nodes[idx].kids = std::move(kids);
  return idx;
}

class Matcher {
 public:
  using Cont = absl::FunctionRef<bool()>;
  Matcher(const CompiledPat& cp, const UOp** slots) : cp_(cp), slots_(slots) {}

  // Matches pattern node `pi` against `u`, then runs `k` (the rest of the match); true
  // once some binding makes `k` succeed.
  bool node(int pi, const UOp* u, Cont k) {
    const CNode& c = cp_.nodes[pi];
    const PatNode& p = *c.p;
    if (!p.ops.has(u->op())) return false;
    size_t n = p.src.size();
    if (p.src_mode == PatNode::Src::Exact && u->num_src() != n) return false;
    if (p.src_mode == PatNode::Src::Prefix && u->num_src() < n) return false;
    bool bound_here = false;
    if (c.slot >= 0) {
      const UOp*& s = slots_[c.slot];
      if (s && s != u) return false;
      if (!s) { s = u; bound_here = true; }
    }
    bool ok = true;
    for (const auto& pred : p.preds)
      if (!pred(u)) { ok = false; break; }
    if (ok) {
      ok = srcs(c, u, 0, false, k);
      // x + x reads the same both ways: the swap would only repeat the first attempt.
      if (!ok && c.commutative && u->src(0) != u->src(1)) ok = srcs(c, u, 0, true, k);
    }
    if (!ok && bound_here) slots_[c.slot] = nullptr;
    return ok;
  }

 private:
  bool srcs(const CNode& c, const UOp* u, size_t i, bool swapped, Cont k) {
    if (i == c.kids.size()) return k();
    const UOp* s = u->src(swapped ? 1 - i : i);
    return node(c.kids[i], s, [&] { return srcs(c, u, i + 1, swapped, k); });
  }

  const CompiledPat& cp_;
  const UOp** slots_;
};

Pat binary(Op op, const Pat& a, const Pat& b) { return rw::op(op, {a, b}); }
Pat unary(Op op, const Pat& a) { return rw::op(op, {a}); }

bool const_equals(const ConstValue& c, int64_t v) {
  switch (c.kind()) {
    case ConstValue::Kind::Bool: return (v == 0 || v == 1) && c.as_bool() == (v == 1);
    case ConstValue::Kind::Int: return c.as_int() == v;
    case ConstValue::Kind::UInt: return v >= 0 && c.as_uint() == static_cast<uint64_t>(v);
    case ConstValue::Kind::Float: {
      double d = static_cast<double>(v);
      return static_cast<int64_t>(d) == v && c.as_float() == d;  // v exact as a double
    }
  }
  return false;
}

Pat const_leaf(std::string label, std::function<bool(const ConstValue&)> pred) {
  auto n = leaf();
  n->ops = OpSet(Op::CONST);
  n->label = std::move(label);
  n->preds.push_back([pred = std::move(pred)](const UOp* u) { return pred(*u->const_value()); });
  return Pat(n);
}

}  // namespace

OpSet OpSet::of(std::initializer_list<OpCategory> cats) {
  OpSet s;
  for (int i = 0; i < kNumOps; ++i)
    for (OpCategory c : cats)
      if (op_info(static_cast<Op>(i)).category == c) s.bits_.set(i);
  return s;
}

OpSet alu_ops() { return OpSet::of({OpCategory::Unary, OpCategory::Binary, OpCategory::Ternary}); }

// --- Pat ---------------------------------------------------------------------------------

Pat Pat::with(const std::function<void(PatNode&)>& edit) const {
  auto n = std::make_shared<PatNode>(*n_);
  edit(*n);
  return Pat(std::move(n));
}

Pat Pat::named(std::string name) const {
  return with([&](PatNode& n) { n.name = std::move(name); });
}
Pat Pat::dtype(std::function<bool(const DType&)> pred) const {
  return where([pred = std::move(pred)](const UOp* u) { return pred(u->dtype()); });
}
Pat Pat::dtype_is(DType d) const { return dtype([d](const DType& t) { return t == d; }); }
Pat Pat::is_int() const { return dtype([](const DType& t) { return t.is_int(); }); }
Pat Pat::is_signed() const { return dtype([](const DType& t) { return t.is_signed(); }); }
Pat Pat::is_float() const { return dtype([](const DType& t) { return t.is_float(); }); }
Pat Pat::is_bool() const { return dtype([](const DType& t) { return t.is_bool(); }); }
Pat Pat::is_index() const { return dtype([](const DType& t) { return t.is_index(); }); }
Pat Pat::is_scalar() const { return dtype([](const DType& t) { return t.count == 1 && !t.ptr; }); }
Pat Pat::arg(std::function<bool(const Arg&)> pred) const {
  return where([pred = std::move(pred)](const UOp* u) { return pred(u->arg()); });
}
Pat Pat::arg_is(Arg a) const {
  return arg([a = std::move(a)](const Arg& b) { return a == b; });
}
Pat Pat::where(std::function<bool(const UOp*)> pred) const {
  return with([&](PatNode& n) { n.preds.push_back(std::move(pred)); });
}
Pat Pat::ordered() const {
  return with([](PatNode& n) { n.ordered = true; });
}

std::string Pat::str() const {
  const PatNode& n = *n_;
  std::string out;
  if (!n.label.empty()) {
    out = n.label;
  } else if (n.ops.is_all()) {
    out = n.name.empty() ? "any" : "";
  } else {
    std::vector<std::string_view> names;
    for (int i = 0; i < kNumOps; ++i)
      if (n.ops.has(static_cast<Op>(i))) names.push_back(op_name(static_cast<Op>(i)));
    out = names.size() == 1 ? std::string(names[0]) : cat("{", join(names, "|"), "}");
  }
  if (!n.name.empty()) out += out.empty() ? n.name : cat(":", n.name);
  if (n.src_mode != PatNode::Src::Any) {
    std::vector<std::string> parts;
    for (const Pat& s : n.src) parts.push_back(s.str());
    if (n.src_mode == PatNode::Src::Prefix) parts.push_back("...");
    out += cat("(", join(parts, ", "), ")");
  }
  return out;
}

Pat any() { return Pat(leaf()); }
Pat var(std::string name) { return any().named(std::move(name)); }
Pat cvar(std::string name) {
  auto n = leaf();
  n->ops = OpSet(Op::CONST);
  n->name = std::move(name);
  return Pat(n);
}
Pat cnst(int64_t v) {
  return const_leaf(cat(v), [v](const ConstValue& c) { return const_equals(c, v); });
}
Pat cnst(int v) { return cnst(static_cast<int64_t>(v)); }
Pat cnst(double v) {
  return const_leaf(cat(v), [v](const ConstValue& c) {
    if (c.kind() == ConstValue::Kind::Float) return c.as_float() == v;
    if (std::trunc(v) != v || std::fabs(v) >= 9.2e18) return false;  // not an integer value
    return const_equals(c, static_cast<int64_t>(v));
  });
}
Pat cnst(bool v) {
  return const_leaf(v ? "true" : "false", [v](const ConstValue& c) {
    return c.kind() == ConstValue::Kind::Bool && c.as_bool() == v;
  });
}
Pat zero() {
  return const_leaf("zero", [](const ConstValue& c) {
    return c.bits() == 0 || (c.kind() == ConstValue::Kind::Float && c.as_float() == 0.0);
  });
}
Pat one() {
  return const_leaf("one", [](const ConstValue& c) {
    if (c.kind() == ConstValue::Kind::Float) return c.as_float() == 1.0;
    return c.bits() == 1;  // int 1, uint 1, bool true
  });
}

Pat op(OpSet ops, std::vector<Pat> src) {
  auto n = leaf();
  n->ops = ops;
  n->src = std::move(src);
  n->src_mode = PatNode::Src::Exact;
  return Pat(n);
}
Pat op(OpSet ops) {
  auto n = leaf();
  n->ops = ops;
  return Pat(n);
}
Pat op_prefix(OpSet ops, std::vector<Pat> src) {
  auto n = leaf();
  n->ops = ops;
  n->src = std::move(src);
  n->src_mode = PatNode::Src::Prefix;
  return Pat(n);
}

Pat operator+(const Pat& a, const Pat& b) { return binary(Op::ADD, a, b); }
Pat operator-(const Pat& a, const Pat& b) { return binary(Op::SUB, a, b); }
Pat operator*(const Pat& a, const Pat& b) { return binary(Op::MUL, a, b); }
Pat operator/(const Pat& a, const Pat& b) { return binary(Op::FDIV, a, b); }
Pat operator&(const Pat& a, const Pat& b) { return binary(Op::AND, a, b); }
Pat operator|(const Pat& a, const Pat& b) { return binary(Op::OR, a, b); }
Pat operator^(const Pat& a, const Pat& b) { return binary(Op::XOR, a, b); }
Pat operator-(const Pat& a) { return unary(Op::NEG, a); }
Pat neg(const Pat& a) { return unary(Op::NEG, a); }
Pat idiv(const Pat& a, const Pat& b) { return binary(Op::IDIV, a, b); }
Pat mod(const Pat& a, const Pat& b) { return binary(Op::MOD, a, b); }
Pat max_(const Pat& a, const Pat& b) { return binary(Op::MAX, a, b); }
Pat min_(const Pat& a, const Pat& b) { return binary(Op::MIN, a, b); }
Pat lt(const Pat& a, const Pat& b) { return binary(Op::CMPLT, a, b); }
Pat ne(const Pat& a, const Pat& b) { return binary(Op::CMPNE, a, b); }
Pat eq(const Pat& a, const Pat& b) { return binary(Op::CMPEQ, a, b); }
Pat shl(const Pat& a, const Pat& b) { return binary(Op::SHL, a, b); }
Pat shr(const Pat& a, const Pat& b) { return binary(Op::SHR, a, b); }
Pat where_(const Pat& c, const Pat& t, const Pat& f) { return op(Op::WHERE, {c, t, f}); }
Pat cast(const Pat& x) { return unary(Op::CAST, x); }
Pat bitcast(const Pat& x) { return unary(Op::BITCAST, x); }

// --- Match, Rule, RuleSet ----------------------------------------------------------------

const UOp* Match::operator[](std::string_view name) const {
  int slot = rule_.slot_of(name);
  if (slot < 0) fail_loudly(cat("rule '", rule_.name(), "' reads capture '", name, "', which its pattern does not bind"));
  return slots_[slot];
}

Rule::Rule(Pat pattern, RewriteFn fn, std::string name)
    : pattern_(std::move(pattern)), fn_(std::move(fn)), name_(std::move(name)) {
  auto cp = std::make_shared<CompiledPat>();
  compile(pattern_.node(), *cp);
  if (cp->names.size() > kMaxSlots) fail_loudly(cat("rule '", name_, "' has more than ", kMaxSlots, " captures"));
  compiled_ = std::move(cp);
}

int Rule::slot_of(std::string_view name) const {
  const auto& names = compiled_->names;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  return -1;
}

const UOp* Rule::apply(Graph& g, const UOp* u, void* ctx) const {
  std::array<const UOp*, kMaxSlots> slots{};
  Matcher matcher(*compiled_, slots.data());
  const UOp* result = nullptr;
  matcher.node(0, u, [&] {
    const UOp* r = fn_(Match(g, u, *this, slots.data(), ctx));
    if (!r || r == u) return false;  // declined: try the next binding
    result = r;
    return true;
  });
  return result;
}

RuleSet& RuleSet::add(const Pat& pattern, RewriteFn fn, std::string name) {
  rules_.emplace_back(pattern, std::move(fn), std::move(name));
  auto idx = static_cast<uint32_t>(rules_.size() - 1);
  const OpSet& ops = pattern.node().ops;
  for (int i = 0; i < kNumOps; ++i)
    if (ops.has(static_cast<Op>(i))) by_op_[i].push_back(idx);
  return *this;
}

RuleSet& RuleSet::extend(const RuleSet& other) {
  std::vector<Rule> incoming = other.rules_;  // a copy: `other` may be this set
  for (Rule& r : incoming) {
    rules_.push_back(std::move(r));
    auto idx = static_cast<uint32_t>(rules_.size() - 1);
    const OpSet& ops = rules_.back().pattern().node().ops;
    for (int i = 0; i < kNumOps; ++i)
      if (ops.has(static_cast<Op>(i))) by_op_[i].push_back(idx);
  }
  return *this;
}

RuleSet::Applied RuleSet::apply(Graph& g, const UOp* u, void* ctx) const {
  for (uint32_t i : by_op_[static_cast<size_t>(u->op())])
    if (const UOp* r = rules_[i].apply(g, u, ctx)) return {r, &rules_[i]};
  return {};
}

}  // namespace uop::rw
