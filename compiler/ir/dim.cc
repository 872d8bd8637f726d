// The dim algebra of dim.h: folding constructors, bounds through ValueRange, the one
// evaluator of a dim at given variable values, and equality / order decided on canonical
// sums of products.
//
// Why a canonical form decides equality: +, -, * on index values are computed modulo 2^64,
// which is a ring homomorphism from the integers, so two expressions whose normalized
// polynomials agree modulo 2^64 (over the variables and opaque terms, each opaque term a
// function of operands that are themselves equal) compute the same value at every point.
// The converse needs more (a polynomial may vanish at every point of a small box without
// being zero), so "different forms" is a proof of inequality only under the conditions
// dims_equal lists; everything else is kUnknown.
#include "compiler/ir/dim.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "compiler/ir/eval.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
// A dim expression is walked whole: keep that bounded.
constexpr size_t kMaxDimNodes = size_t{1} << 14;
// Corners of the box a multilinear difference is evaluated at: 2^kMaxCornerAtoms.
constexpr size_t kMaxCornerAtoms = 10;
// Variables varied one at a time when looking for a point where two dims differ.
constexpr size_t kMaxWitnessVars = 16;

// Whether u itself may be part of a dim expression (its sources are checked separately).
bool is_dim_node(const UOp* u) {
  const DType& dt = u->dtype();
  if (dt.ptr || dt.count != 1 || (dt.scalar != Scalar::Index && dt.scalar != Scalar::Bool)) return false;
  const OpInfo& info = op_info(u->op());
  if (arg_kind(u->arg()) != info.arg) return false;
  switch (u->op()) {
    case Op::CONST: {
      if (u->num_src() != 0) return false;
      auto k = u->const_value()->kind();
      return dt.scalar == Scalar::Index ? k == ConstValue::Kind::Int : k == ConstValue::Kind::Bool;
    }
    case Op::DEFINE_VAR: return dt.scalar == Scalar::Index;
    case Op::BIND: return dt.scalar == Scalar::Index && u->num_src() == 2 && u->src(0)->is(Op::DEFINE_VAR);
    default:
      return is_alu(u->op()) && static_cast<int>(u->num_src()) == info.min_src;
  }
}

// The nodes of one or two dim expressions in post-order; `bad` is the first node met that
// is not a dim node (or the node past kMaxDimNodes), and then `order` is incomplete.
struct DimNodes {
  std::vector<const UOp*> order;
  const UOp* bad = nullptr;
};

DimNodes dim_nodes(std::initializer_list<const UOp*> roots) {
  DimNodes out;
  absl::flat_hash_map<const UOp*, bool> seen;
  struct Frame { const UOp* u; size_t next; };
  std::vector<Frame> stack;
  auto enter = [&](const UOp* u) {
    if (!is_dim_node(u) || seen.size() >= kMaxDimNodes) {
      out.bad = u;
      return false;
    }
    seen.emplace(u, false);
    stack.push_back({u, 0});
    return true;
  };
  for (const UOp* root : roots) {
    if (seen.contains(root)) continue;
    if (!enter(root)) return out;
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (f.next < f.u->num_src()) {
        const UOp* s = f.u->src(f.next++);
        if (!seen.contains(s) && !enter(s)) return out;
        continue;
      }
      out.order.push_back(f.u);
      stack.pop_back();
    }
  }
  return out;
}

// --- Canonical form. A Poly is a sum of coef * monomial with no zero coefficient; a
// monomial is a product of atoms (variables and opaque terms) with powers, sorted by atom.
// Coefficients are exact integers (128 bits; a form whose coefficients would overflow is
// not built).
using Coef = __int128;
using Monomial = std::vector<std::pair<int, int>>;  // (atom, power)
using Poly = std::map<Monomial, Coef>;

struct Atom {
  const UOp* node;  // the DEFINE_VAR, or the first node met with this opaque term
  bool var;
};

class Normalizer {
 public:
  // Normalizes every node of `order` (a post-order); false when a form grows past
  // kMaxDimTerms or a coefficient past 128 bits.
  bool run(const std::vector<const UOp*>& order) {
    for (const UOp* u : order) {
      form_.emplace(u, normalize(u));
      if (!ok_) return false;
    }
    return true;
  }
  const Poly& form(const UOp* u) const { return form_.at(u); }
  bool ok() const { return ok_; }
  const Atom& atom(int i) const { return atoms_[i]; }

  // p + sign * q.
  Poly add(Poly p, const Poly& q, Coef sign) {
    for (const auto& [m, c] : q)
      if (!accumulate(p, m, c, sign)) return fail();
    if (p.size() > kMaxDimTerms) return fail();
    return p;
  }

 private:
  Poly fail() {
    ok_ = false;
    return {};
  }

  // p[m] += a * b, keeping no zero coefficient; false on overflow.
  static bool accumulate(Poly& p, const Monomial& m, Coef a, Coef b) {
    Coef t, sum;
    if (__builtin_mul_overflow(a, b, &t)) return false;
    auto it = p.find(m);
    if (it == p.end()) {
      if (t != 0) p.emplace(m, t);
      return true;
    }
    if (__builtin_add_overflow(it->second, t, &sum)) return false;
    if (sum == 0) p.erase(it);
    else it->second = sum;
    return true;
  }

  Poly mul(const Poly& p, const Poly& q) {
    if (p.size() * q.size() > kMaxDimTerms * 4) return fail();
    Poly r;
    for (const auto& [mp, cp] : p)
      for (const auto& [mq, cq] : q) {
        Monomial m;
        std::merge(mp.begin(), mp.end(), mq.begin(), mq.end(), std::back_inserter(m));
        // Equal atoms are adjacent after the merge: add their powers.
        Monomial merged;
        for (const auto& [a, k] : m) {
          if (!merged.empty() && merged.back().first == a) merged.back().second += k;
          else merged.emplace_back(a, k);
        }
        if (!accumulate(r, merged, cp, cq)) return fail();
      }
    if (r.size() > kMaxDimTerms) return fail();
    return r;
  }

  static Poly constant(Coef c) { return c == 0 ? Poly{} : Poly{{Monomial{}, c}}; }
  static Poly single(int atom) { return Poly{{Monomial{{atom, 1}}, 1}}; }

  Poly normalize(const UOp* u) {
    auto src = [&](size_t i) -> const Poly& { return form_.at(u->src(i)); };
    switch (u->op()) {
      case Op::CONST: return constant(u->const_value()->to_int());
      case Op::DEFINE_VAR: {
        auto [it, added] = vars_.emplace(u, static_cast<int>(atoms_.size()));
        if (added) atoms_.push_back({u, true});
        return single(it->second);
      }
      case Op::BIND: return src(0);  // a BIND is its variable
      default: break;
    }
    // The ring operations on index values are polynomial; everything else is an opaque
    // term of its normalized operands.
    if (u->dtype().scalar == Scalar::Index) {
      switch (u->op()) {
        case Op::ADD: return add(src(0), src(1), 1);
        case Op::SUB: return add(src(0), src(1), -1);
        case Op::NEG: return add({}, src(0), -1);
        case Op::MUL: return mul(src(0), src(1));
        case Op::MULACC: return add(mul(src(0), src(1)), src(2), 1);
        default: break;
      }
    }
    std::vector<Poly> args;
    for (size_t i = 0; i < u->num_src(); ++i) args.push_back(src(i));
    if (args.size() == 2 && is_commutative(u->op()) && args[1] < args[0]) std::swap(args[0], args[1]);
    // The operands' dtype too: CMPLT on bools and on indices are different functions.
    auto key = std::make_tuple(static_cast<int>(u->op()), static_cast<int>(u->dtype().scalar),
                               static_cast<int>(u->src(0)->dtype().scalar), std::move(args));
    auto [it, added] = opaque_.emplace(std::move(key), static_cast<int>(atoms_.size()));
    if (added) atoms_.push_back({u, false});
    return single(it->second);
  }

  absl::flat_hash_map<const UOp*, Poly> form_;
  absl::flat_hash_map<const UOp*, int> vars_;
  std::map<std::tuple<int, int, int, std::vector<Poly>>, int> opaque_;  // (op, dtype, operand dtype, operands)
  std::vector<Atom> atoms_;
  bool ok_ = true;
};

// The residue of a coefficient modulo 2^64: what index arithmetic can tell apart.
bool zero_mod_2_64(Coef c) { return static_cast<uint64_t>(c) == 0; }

// a and b normalized together, and their difference form(a) - form(b).
struct Difference {
  DimNodes nodes;
  Normalizer norm;
  Poly d;
  ValueRange range;
  bool may_wrap = false;  // some node of either side may wrap around int64
};

// nullopt when either side is not a dim expression or a form is too large.
std::optional<Difference> difference(const UOp* a, const UOp* b) {
  Difference r;
  r.nodes = dim_nodes({a, b});
  if (r.nodes.bad || !r.norm.run(r.nodes.order)) return std::nullopt;
  r.d = r.norm.add(r.norm.form(a), r.norm.form(b), -1);
  if (!r.norm.ok()) return std::nullopt;
  for (const UOp* u : r.nodes.order) r.may_wrap = r.may_wrap || r.range.may_wrap(u);
  return r;
}

// Whether pred(value of a, value of b) fails at one of a few points (every variable at its
// min, max, midpoint and bound value; each alone at its max or min with the others at the
// other end). A point where it fails is a witness: a proof that the claim fails. Points
// where it holds prove nothing.
template <typename Pred>
bool fails_somewhere(const Difference& diff, const UOp* a, const UOp* b, Pred pred) {
  std::vector<const UOp*> vars;
  absl::flat_hash_map<const UOp*, int64_t> bound;
  for (const UOp* u : diff.nodes.order) {
    if (u->is(Op::DEFINE_VAR)) vars.push_back(u);
    if (u->is(Op::BIND) && u->src(1)->is(Op::CONST)) bound.emplace(u->src(0), u->src(1)->const_value()->to_int());
  }
  std::vector<int64_t> lo, hi, mid, at_bound;
  for (const UOp* v : vars) {
    const auto& r = v->arg_as<DefineVarArg>();
    if (r.min > r.max) return false;  // no values at all
    lo.push_back(r.min);
    hi.push_back(r.max);
    mid.push_back(static_cast<int64_t>((__int128{r.min} + r.max) / 2));
    auto it = bound.find(v);
    at_bound.push_back(it != bound.end() && it->second >= r.min && it->second <= r.max ? it->second : r.min);
  }
  std::vector<std::vector<int64_t>> points = {lo, hi, mid, at_bound};
  for (size_t i = 0; i < vars.size() && i < kMaxWitnessVars; ++i) {
    auto x = lo; x[i] = hi[i]; points.push_back(x);
    auto y = hi; y[i] = lo[i]; points.push_back(y);
  }
  std::vector<std::pair<const UOp*, int64_t>> env(vars.size());
  for (const auto& pt : points) {
    for (size_t i = 0; i < vars.size(); ++i) env[i] = {vars[i], pt[i]};
    auto va = eval_dim(a, env), vb = eval_dim(b, env);
    if (va.ok() && vb.ok() && !pred(*va, *vb)) return true;
  }
  return false;
}

// The extremes of a multilinear form over the box of its atoms' bounds (a multilinear
// function is affine in each atom, so its extremes lie at corners); nullopt when the form
// is not multilinear, has too many atoms, or a corner's value overflows.
std::optional<std::pair<Coef, Coef>> corner_extremes(Difference& diff) {
  std::vector<int> atoms;
  for (const auto& [m, c] : diff.d)
    for (const auto& [a, k] : m) {
      if (k != 1) return std::nullopt;
      if (std::find(atoms.begin(), atoms.end(), a) == atoms.end()) atoms.push_back(a);
    }
  if (atoms.size() > kMaxCornerAtoms) return std::nullopt;
  std::vector<ValueRange::Bounds> box;
  for (int a : atoms) {
    box.push_back(diff.range(diff.norm.atom(a).node));
    if (box.back().first > box.back().second) return std::nullopt;
  }
  std::optional<std::pair<Coef, Coef>> ext;
  absl::flat_hash_map<int, Coef> value;
  for (size_t corner = 0; corner < (size_t{1} << atoms.size()); ++corner) {
    for (size_t i = 0; i < atoms.size(); ++i) value[atoms[i]] = (corner >> i) & 1 ? box[i].second : box[i].first;
    Coef sum = 0;
    for (const auto& [m, c] : diff.d) {
      Coef t = c;
      for (const auto& [a, k] : m)
        if (__builtin_mul_overflow(t, value.at(a), &t)) return std::nullopt;
      if (__builtin_add_overflow(sum, t, &sum)) return std::nullopt;
    }
    ext = ext ? std::pair{std::min(ext->first, sum), std::max(ext->second, sum)} : std::pair{sum, sum};
  }
  return ext;
}

}  // namespace

std::optional<int64_t> const_dim(const UOp* d) {
  if (!d->is(Op::CONST) || d->dtype() != dtypes::index) return std::nullopt;
  const ConstValue* c = d->arg_if<ConstValue>();  // unverified graphs may carry any arg
  if (!c || c->kind() != ConstValue::Kind::Int) return std::nullopt;
  return c->as_int();
}

const UOp* dim_add(Graph& g, const UOp* a, const UOp* b) {
  auto ca = const_dim(a), cb = const_dim(b);
  int64_t r;
  if (ca && cb && !__builtin_add_overflow(*ca, *cb, &r)) return g.idx(r);
  if (ca == 0) return b;
  if (cb == 0) return a;
  return g.alu(Op::ADD, {a, b});
}

const UOp* dim_sub(Graph& g, const UOp* a, const UOp* b) {
  auto ca = const_dim(a), cb = const_dim(b);
  int64_t r;
  if (ca && cb && !__builtin_sub_overflow(*ca, *cb, &r)) return g.idx(r);
  if (cb == 0) return a;
  if (a == b) return g.idx(0);
  return g.alu(Op::SUB, {a, b});
}

const UOp* dim_mul(Graph& g, const UOp* a, const UOp* b) {
  auto ca = const_dim(a), cb = const_dim(b);
  int64_t r;
  if (ca && cb && !__builtin_mul_overflow(*ca, *cb, &r)) return g.idx(r);
  if (ca == 0 || cb == 0) return g.idx(0);
  if (ca == 1) return b;
  if (cb == 1) return a;
  return g.alu(Op::MUL, {a, b});
}

bool DimFacts::is_dim(const UOp* d) {
  if (auto it = is_dim_.find(d); it != is_dim_.end()) return it->second;
  std::vector<const UOp*> stack{d};
  while (!stack.empty()) {
    const UOp* v = stack.back();
    if (is_dim_.contains(v)) { stack.pop_back(); continue; }
    if (!is_dim_node(v)) { is_dim_.emplace(v, false); stack.pop_back(); continue; }
    bool pending = false;
    for (const UOp* s : v->src())
      if (!is_dim_.contains(s)) { stack.push_back(s); pending = true; }
    if (pending) continue;
    stack.pop_back();
    bool all = true;
    for (const UOp* s : v->src()) all = all && is_dim_.at(s);
    is_dim_.emplace(v, all);
  }
  return is_dim_.at(d);
}

std::optional<DimBounds> DimFacts::bounds(const UOp* d) {
  if (!is_dim(d)) return std::nullopt;
  auto [lo, hi] = range_(d);
  return DimBounds{lo, hi};
}

DimBounds dim_bounds(const UOp* d) {
  DimFacts f;
  return f.bounds(d).value_or(DimBounds{kMin, kMax});
}

absl::StatusOr<int64_t> eval_dim(const UOp* d, std::span<const std::pair<const UOp*, int64_t>> vars) {
  if (auto c = const_dim(d)) return *c;
  DimNodes nodes = dim_nodes({d});
  if (nodes.bad) return absl::InvalidArgumentError(cat("a dim cannot be computed from ", op_name(nodes.bad->op()), " [dim.op]"));
  auto lookup = [&](const UOp* var) -> std::optional<int64_t> {
    for (const auto& [v, value] : vars)
      if (v == var) return value;
    return std::nullopt;
  };
  // A variable without a value is an error only where something reads it: a BIND of it
  // has the value it binds.
  absl::flat_hash_map<const UOp*, ConstValue> val;
  auto value_of = [&](const UOp* u) -> absl::StatusOr<ConstValue> {
    if (auto it = val.find(u); it != val.end()) return it->second;
    return absl::InvalidArgumentError(cat("variable ", u->arg_as<DefineVarArg>().name, " is not bound [dim.var]"));
  };
  std::vector<ConstValue> args;
  for (const UOp* u : nodes.order) {
    switch (u->op()) {
      case Op::CONST: val.emplace(u, *u->const_value()); break;
      case Op::DEFINE_VAR:
        if (auto v = lookup(u)) val.emplace(u, ConstValue::Int(*v));
        break;
      case Op::BIND: {
        auto v = lookup(u->src(0));
        val.emplace(u, v ? ConstValue::Int(*v) : val.at(u->src(1)));
        break;
      }
      default: {
        args.clear();
        for (const UOp* s : u->src()) {
          ASSIGN_OR_RETURN(ConstValue a, value_of(s));
          args.push_back(a);
        }
        Scalar t = (u->is(Op::WHERE) ? u->src(1) : u->src(0))->dtype().scalar;
        auto r = eval_alu(u->op(), t, args);
        if (!r) return absl::InvalidArgumentError(cat("a dim cannot be computed from ", op_name(u->op()), " [dim.op]"));
        val.emplace(u, *r);
      }
    }
  }
  ASSIGN_OR_RETURN(ConstValue r, value_of(d));
  return r.to_int();
}

DimTruth dims_equal(const UOp* a, const UOp* b) {
  if (a == b) return DimTruth::kTrue;
  auto ca = const_dim(a), cb = const_dim(b);
  if (ca && cb) return *ca == *cb ? DimTruth::kTrue : DimTruth::kFalse;
  auto diff = difference(a, b);
  if (!diff) return DimTruth::kUnknown;
  // What is left of the difference modulo 2^64: nothing, or only a constant.
  bool only_constant = true, all_zero = true;
  for (const auto& [m, c] : diff->d) {
    if (zero_mod_2_64(c)) continue;
    all_zero = false;
    if (!m.empty()) only_constant = false;
  }
  if (all_zero) return DimTruth::kTrue;
  if (only_constant) return DimTruth::kFalse;
  auto ra = diff->range(a), rb = diff->range(b);
  if (ra.second < rb.first || rb.second < ra.first) return DimTruth::kFalse;
  // A nonzero polynomial in the variables alone whose degree in each variable is below the
  // number of values it takes does not vanish on the whole box (the combinatorial
  // Nullstellensatz); without wrapping the values are the integers the forms compute.
  if (!diff->may_wrap) {
    absl::flat_hash_map<int, int> degree;
    bool vars_only = true;
    for (const auto& [m, c] : diff->d)
      for (const auto& [atom, k] : m) {
        vars_only = vars_only && diff->norm.atom(atom).var;
        degree[atom] = std::max(degree[atom], k);
      }
    bool low_degree = vars_only;
    for (const auto& [atom, k] : degree) {
      if (!low_degree) break;
      const auto& r = diff->norm.atom(atom).node->arg_as<DefineVarArg>();
      low_degree = r.min <= r.max && __int128{k} < __int128{r.max} - r.min + 1;
    }
    if (low_degree) return DimTruth::kFalse;
  }
  if (fails_somewhere(*diff, a, b, [](int64_t x, int64_t y) { return x == y; })) return DimTruth::kFalse;
  return DimTruth::kUnknown;
}

DimTruth dims_le(const UOp* a, const UOp* b) {
  if (a == b) return DimTruth::kTrue;
  auto ca = const_dim(a), cb = const_dim(b);
  if (ca && cb) return *ca <= *cb ? DimTruth::kTrue : DimTruth::kFalse;
  auto diff = difference(b, a);
  if (!diff) return DimTruth::kUnknown;
  auto ra = diff->range(a), rb = diff->range(b);
  if (ra.second <= rb.first) return DimTruth::kTrue;
  if (ra.first > rb.second) return DimTruth::kFalse;
  if (std::all_of(diff->d.begin(), diff->d.end(), [](const auto& t) { return zero_mod_2_64(t.second); }))
    return DimTruth::kTrue;  // equal values
  // Without wrapping, b - a is the integer the difference form computes.
  if (!diff->may_wrap)
    if (auto ext = corner_extremes(*diff)) {
      if (ext->first >= 0) return DimTruth::kTrue;
      if (ext->second < 0) return DimTruth::kFalse;
    }
  if (fails_somewhere(*diff, a, b, [](int64_t x, int64_t y) { return x <= y; })) return DimTruth::kFalse;
  return DimTruth::kUnknown;
}

}  // namespace uop
