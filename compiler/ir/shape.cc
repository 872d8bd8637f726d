// Tensor-level shape inference: the README's rules for each tensor op, dim arithmetic that
// keeps constant shapes constant, and interval bounds / test-point equality for symbolic
// dims. Every walk is iterative: graphs and dim expressions may be arbitrarily deep.
#include "compiler/ir/shape.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr DimBounds kUnknown{kMin, kMax};
// Test-point evaluation walks both expressions at every point: keep that bounded.
constexpr size_t kMaxProbeNodes = 4096;
constexpr size_t kMaxProbeVars = 16;

int64_t saturate(__int128 v) {
  if (v < kMin) return kMin;
  if (v > kMax) return kMax;
  return static_cast<int64_t>(v);
}

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

// Interval rule for one dim node given its sources' bounds.
DimBounds bounds_rule(const UOp* u, const std::vector<DimBounds>& s) {
  switch (u->op()) {
    case Op::CONST: {
      int64_t v = u->const_value()->to_int();
      return {v, v};
    }
    case Op::DEFINE_VAR: {
      const auto& a = u->arg_as<DefineVarArg>();
      return {a.min, a.max};
    }
    case Op::BIND: return s[0];
    case Op::NEG: return {saturate(-__int128{s[0].max}), saturate(-__int128{s[0].min})};
    case Op::ADD: return {saturate(__int128{s[0].min} + s[1].min), saturate(__int128{s[0].max} + s[1].max)};
    case Op::SUB: return {saturate(__int128{s[0].min} - s[1].max), saturate(__int128{s[0].max} - s[1].min)};
    case Op::MUL: {
      __int128 c[4] = {__int128{s[0].min} * s[1].min, __int128{s[0].min} * s[1].max,
                       __int128{s[0].max} * s[1].min, __int128{s[0].max} * s[1].max};
      return {saturate(*std::min_element(c, c + 4)), saturate(*std::max_element(c, c + 4))};
    }
    case Op::IDIV: {
      // Truncating division is monotone in each argument for a divisor of fixed sign.
      if (s[1].min <= 0) return kUnknown;
      int64_t c[4] = {s[0].min / s[1].min, s[0].min / s[1].max, s[0].max / s[1].min, s[0].max / s[1].max};
      return {*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
    }
    case Op::MOD: {
      if (s[1].min <= 0) return kUnknown;
      int64_t m = s[1].max - 1;  // |x % d| < d
      DimBounds r{s[0].min >= 0 ? 0 : -m, s[0].max <= 0 ? 0 : m};
      if (s[0].min >= 0) r.max = std::min(r.max, s[0].max);
      if (s[0].max <= 0) r.min = std::max(r.min, s[0].min);
      return r;
    }
    case Op::MAX: return {std::max(s[0].min, s[1].min), std::max(s[0].max, s[1].max)};
    case Op::MIN: return {std::min(s[0].min, s[1].min), std::min(s[0].max, s[1].max)};
    case Op::WHERE: return {std::min(s[1].min, s[2].min), std::max(s[1].max, s[2].max)};
    default:
      if (u->dtype().scalar == Scalar::Bool) return {0, 1};
      return kUnknown;
  }
}

// Bounds of d, memoized in `memo`; nullopt when d is not an index or bool expression.
std::optional<DimBounds> compute_facts(const UOp* d, absl::flat_hash_map<const UOp*, std::optional<DimBounds>>& memo) {
  if (auto it = memo.find(d); it != memo.end()) return it->second;
  std::vector<const UOp*> stack{d};
  std::vector<DimBounds> srcb;
  while (!stack.empty()) {
    const UOp* v = stack.back();
    if (memo.contains(v)) { stack.pop_back(); continue; }
    if (!is_dim_node(v)) { memo.emplace(v, std::nullopt); stack.pop_back(); continue; }
    bool pending = false;
    for (const UOp* s : v->src())
      if (!memo.contains(s)) { stack.push_back(s); pending = true; }
    if (pending) continue;
    stack.pop_back();
    srcb.clear();
    bool valid = true;
    for (const UOp* s : v->src()) {
      const auto& f = memo.at(s);
      if (!f) { valid = false; break; }
      srcb.push_back(*f);
    }
    if (valid) memo.emplace(v, bounds_rule(v, srcb));
    else memo.emplace(v, std::nullopt);
  }
  return memo.at(d);
}

// The nodes of one or two dim expressions in post-order, and their variables.
struct Probe {
  std::vector<const UOp*> order;
  std::vector<const UOp*> vars;                         // DEFINE_VARs, in order met
  absl::flat_hash_map<const UOp*, int64_t> bound;       // var -> value of a BIND of it
};

std::optional<Probe> make_probe(const UOp* a, const UOp* b) {
  Probe p;
  absl::flat_hash_map<const UOp*, bool> seen;  // node -> finished
  for (const UOp* root : {a, b}) {
    if (seen.contains(root)) continue;
    struct Frame { const UOp* u; size_t next; };
    std::vector<Frame> stack;
    auto enter = [&](const UOp* u) {
      if (!is_dim_node(u) || seen.size() >= kMaxProbeNodes) return false;
      seen.emplace(u, false);
      stack.push_back({u, 0});
      return true;
    };
    if (!enter(root)) return std::nullopt;
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (f.next < f.u->num_src()) {
        const UOp* s = f.u->src(f.next++);
        if (!seen.contains(s) && !enter(s)) return std::nullopt;
        continue;
      }
      const UOp* u = f.u;
      stack.pop_back();
      p.order.push_back(u);
      if (u->is(Op::DEFINE_VAR)) p.vars.push_back(u);
      if (u->is(Op::BIND) && u->src(1)->is(Op::CONST)) p.bound.emplace(u->src(0), u->src(1)->const_value()->to_int());
    }
  }
  return p;
}

// Evaluates every node of the probe with variables set to `vals` (parallel to p.vars).
std::optional<absl::flat_hash_map<const UOp*, ConstValue>> evaluate(const Probe& p, const std::vector<int64_t>& vals) {
  absl::flat_hash_map<const UOp*, ConstValue> v;
  std::vector<ConstValue> args;
  for (const UOp* u : p.order) {
    switch (u->op()) {
      case Op::CONST: v[u] = *u->const_value(); break;
      case Op::DEFINE_VAR: {
        size_t i = std::find(p.vars.begin(), p.vars.end(), u) - p.vars.begin();
        v[u] = ConstValue::Int(vals[i]);
        break;
      }
      case Op::BIND: v[u] = v.at(u->src(0)); break;
      default: {
        args.clear();
        for (const UOp* s : u->src()) args.push_back(v.at(s));
        Scalar t = (u->is(Op::WHERE) ? u->src(1) : u->src(0))->dtype().scalar;
        auto r = eval_alu(u->op(), t, args);
        if (!r) return std::nullopt;
        v[u] = *r;
      }
    }
  }
  return v;
}

// Whether pred(value of a, value of b) holds at every test point (see dims_equal).
template <typename Pred>
bool holds_at_test_points(const UOp* a, const UOp* b, Pred pred) {
  auto p = make_probe(a, b);
  if (!p) return false;
  std::vector<int64_t> lo, hi, mid, bound;
  for (const UOp* var : p->vars) {
    const auto& r = var->arg_as<DefineVarArg>();
    lo.push_back(r.min);
    hi.push_back(r.max);
    mid.push_back(saturate((__int128{r.min} + r.max) / 2));
    auto it = p->bound.find(var);
    bound.push_back(it != p->bound.end() ? it->second : r.min);
  }
  std::vector<std::vector<int64_t>> points = {lo, hi, mid, bound};
  for (size_t i = 0; i < p->vars.size() && i < kMaxProbeVars; ++i) {
    auto x = lo; x[i] = hi[i]; points.push_back(x);
    auto y = hi; y[i] = lo[i]; points.push_back(y);
  }
  for (const auto& pt : points) {
    auto v = evaluate(*p, pt);
    if (!v || !pred(v->at(a).to_int(), v->at(b).to_int())) return false;
  }
  return true;
}

std::string dim_str(const UOp* d) {
  if (auto c = const_dim(d)) return std::to_string(*c);
  if (d->is(Op::BIND) && d->num_src() > 0) d = d->src(0);
  if (const auto* v = d->arg_if<DefineVarArg>()) return v->name;
  int64_t m = dim_max(d);
  return m == kMax ? "<expr>" : cat("<expr <= ", m, ">");
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += cat(i ? ", " : "", dim_str(s[i]));
  return out + (s.size() == 1 ? ",)" : ")");
}

}  // namespace

std::optional<int64_t> const_dim(const UOp* d) {
  if (!d->is(Op::CONST) || d->dtype() != dtypes::index) return std::nullopt;
  const ConstValue* c = d->arg_if<ConstValue>();  // unverified graphs may carry any arg
  if (!c || c->kind() != ConstValue::Kind::Int) return std::nullopt;
  return c->as_int();
}

std::optional<std::vector<int64_t>> const_shape(const Shape& s) {
  std::vector<int64_t> out;
  out.reserve(s.size());
  for (const UOp* d : s) {
    auto c = const_dim(d);
    if (!c) return std::nullopt;
    out.push_back(*c);
  }
  return out;
}

absl::StatusOr<Shape> shape_operand_dims(Graph& g, const UOp* s) {
  const DType& dt = s->dtype();
  if (dt.ptr || dt.scalar != Scalar::Index)
    return absl::InvalidArgumentError(cat("a shape operand has dtype index, not ", dt.str(), " [shape.operand]"));
  if (s->is(Op::VCONST)) {
    const auto* vc = s->arg_if<VConstArg>();
    if (!vc || vc->values.size() != dt.count)
      return absl::InvalidArgumentError(cat("VCONST shape of width ", dt.count, " does not hold ", dt.count,
                                            " values [shape.operand]"));
    Shape out;
    for (const ConstValue& v : vc->values) {
      if (v.kind() != ConstValue::Kind::Int)
        return absl::InvalidArgumentError("a VCONST shape holds index values [shape.operand]");
      out.push_back(g.idx(v.as_int()));
    }
    return out;
  }
  if (s->is(Op::VECTORIZE)) {
    if (s->num_src() != dt.count)
      return absl::InvalidArgumentError(cat("VECTORIZE shape of width ", dt.count, " has ", s->num_src(),
                                            " elements [shape.operand]"));
    return Shape(s->src().begin(), s->src().end());
  }
  if (dt.count == 1) return Shape{s};
  return absl::InvalidArgumentError(
      cat("a shape operand is a VCONST, a VECTORIZE or (rank 1) an index scalar, not ", op_name(s->op()),
          " [shape.operand]"));
}

const UOp* make_shape_operand(Graph& g, const Shape& s) {
  if (auto c = const_shape(s)) {
    VConstArg arg;
    for (int64_t v : *c) arg.values.push_back(ConstValue::Int(v));
    return g.make(Op::VCONST, DType(Scalar::Index, static_cast<uint32_t>(s.size())), {}, std::move(arg));
  }
  return g.make(Op::VECTORIZE, DType(Scalar::Index, static_cast<uint32_t>(s.size())), s);
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

const UOp* shape_numel(Graph& g, const Shape& s) {
  const UOp* n = g.idx(1);
  for (const UOp* d : s) n = dim_mul(g, n, d);
  return n;
}

DimBounds dim_bounds(const UOp* d) {
  absl::flat_hash_map<const UOp*, std::optional<DimBounds>> memo;
  return compute_facts(d, memo).value_or(kUnknown);
}

bool dims_equal(const UOp* a, const UOp* b) {
  if (a == b) return true;
  auto ca = const_dim(a), cb = const_dim(b);
  if (ca && cb) return *ca == *cb;
  return holds_at_test_points(a, b, [](int64_t x, int64_t y) { return x == y; });
}

bool dims_le(const UOp* a, const UOp* b) {
  if (a == b) return true;
  auto ca = const_dim(a), cb = const_dim(b);
  if (ca && cb) return *ca <= *cb;
  if (dim_bounds(a).max <= dim_bounds(b).min) return true;
  return holds_at_test_points(a, b, [](int64_t x, int64_t y) { return x <= y; });
}

// ---------------------------------------------------------------------------------------

ShapeInference::ShapeInference(Graph& g, ShapeLimits limits, const NodeIndex* index)
    : g_(g), limits_(limits), index_(index) {}

bool ShapeInference::has_shape(const UOp* u) const {
  while (u->is(Op::AFTER) && u->num_src() > 0) u = u->src(0);
  if (is_alu(u->op()) || is_movement(u->op())) return true;
  switch (u->op()) {
    case Op::BUFFER: case Op::BUFFER_VIEW: case Op::CONST: case Op::DEFINE_VAR: case Op::BIND:
    case Op::REDUCE_AXIS: case Op::CAST: case Op::BITCAST: case Op::CONTIGUOUS:
    case Op::CONTIGUOUS_BACKWARD: case Op::DETACH: case Op::COPY: case Op::PRECAST: case Op::ALLREDUCE:
    case Op::MULTI: case Op::MSELECT:
      return true;
    default:
      return false;
  }
}

std::optional<DimBounds> ShapeInference::facts(const UOp* d) { return compute_facts(d, facts_); }

absl::Status ShapeInference::fail(const UOp* u, std::string detail) {
  return absl::InvalidArgumentError(std::move(detail));
}

absl::Status ShapeInference::check_limits(const UOp* u, const Shape& s) {
  if (static_cast<int64_t>(s.size()) > limits_.max_rank)
    return fail(u, cat("rank ", s.size(), " is over the limit of ", limits_.max_rank, " [shape.rank]"));
  int64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < s.size(); ++i) {
    auto f = facts(s[i]);
    if (!f || s[i]->dtype() != dtypes::index)
      return fail(u, cat("dim ", i, " is not an index expression (", op_name(s[i]->op()), " : ",
                         s[i]->dtype().str(), ") [shape.dim]"));
    if (f->min < 0) return fail(u, cat("dim ", i, " of ", shape_str(s), " may be negative [shape.negative]"));
    if (f->max > limits_.max_elements)
      return fail(u, cat("dim ", i, " of ", shape_str(s), " may exceed ", limits_.max_elements,
                         " [shape.too_large]"));
    overflow = overflow || __builtin_mul_overflow(numel, f->max, &numel);
  }
  // A zero dim makes the product zero whatever the other dims are.
  bool has_zero = std::any_of(s.begin(), s.end(), [&](const UOp* d) { return facts(d)->max == 0; });
  if (!has_zero && (overflow || numel > limits_.max_elements))
    return fail(u, cat(shape_str(s), " has more than ", limits_.max_elements, " elements [shape.too_large]"));
  return absl::OkStatus();
}

absl::StatusOr<Shape> ShapeInference::operand(const UOp* u, size_t i, size_t rank, const char* tag) {
  const UOp* s = u->src(i);
  if (s->dtype().count > static_cast<uint32_t>(limits_.max_rank))
    return fail(u, cat("source ", i, " has rank ", s->dtype().count, ", over the limit of ", limits_.max_rank,
                       " [shape.rank]"));
  auto dims = shape_operand_dims(g_, s);
  if (!dims.ok()) return fail(u, cat("source ", i, ": ", dims.status().message()));
  if (rank != SIZE_MAX && dims->size() != rank)
    return fail(u, cat("source ", i, " has ", dims->size(), " dims for an input of rank ", rank, " [", tag, "]"));
  for (size_t k = 0; k < dims->size(); ++k) {
    const UOp* d = (*dims)[k];
    auto f = facts(d);
    if (!f || d->dtype() != dtypes::index)
      return fail(u, cat("source ", i, " dim ", k, " is not an index expression (", op_name(d->op()), " : ",
                         d->dtype().str(), ") [shape.dim]"));
    // Pads and shrink bounds have their own rules; a negative dim is a shape error.
    if (f->min < 0)
      return fail(u, cat("source ", i, " dim ", k, " (", dim_str(d), ") may be negative [",
                         u->is(Op::PAD) || u->is(Op::SHRINK) ? tag : "shape.negative", "]"));
  }
  return dims;
}

absl::StatusOr<Shape> ShapeInference::infer(const UOp* u) {
  const OpInfo& info = op_info(u->op());
  const int n = static_cast<int>(u->num_src());
  // Shape inference may run on graphs nobody verified: never index past the sources.
  if (n < info.min_src || (info.max_src >= 0 && n > info.max_src))
    return fail(u, cat("has ", n, " sources [src.count]"));
  if (arg_kind(u->arg()) != info.arg) return fail(u, "arg of the wrong kind [arg.kind]");
  const DType& dt = u->dtype();
  if (dt.ptr || dt.count != 1 || dt.scalar == Scalar::Void)
    return fail(u, cat("a tensor has a scalar element dtype, not ", dt.str(), " [shape.dtype]"));

  auto src_shape = [&](int i) -> const Shape& { return *shapes_.at(u->src(i)); };
  Shape out;
  const bool elementwise_src0 = u->is(Op::CAST) || u->is(Op::BITCAST) || u->is(Op::CONTIGUOUS) ||
                                u->is(Op::CONTIGUOUS_BACKWARD) || u->is(Op::DETACH) || u->is(Op::COPY) ||
                                u->is(Op::PRECAST) || u->is(Op::AFTER);
  if (is_alu(u->op())) {
    for (int i = 1; i < n; ++i) {
      const Shape &a = src_shape(0), &b = src_shape(i);
      bool same = a.size() == b.size();
      for (size_t k = 0; same && k < a.size(); ++k) same = dims_equal(a[k], b[k]);
      if (!same)
        return fail(u, cat("source ", i, " has shape ", shape_str(b), " but source 0 has ", shape_str(a),
                           " [shape.alu]"));
    }
    out = src_shape(0);
  } else if (elementwise_src0) {
    out = src_shape(0);
  } else {
    switch (u->op()) {
      case Op::BUFFER: {
        int64_t size = u->arg_as<BufferArg>().size;
        if (size < 0) return fail(u, cat("size ", size, " is negative [shape.buffer]"));
        out = {g_.idx(size)};
        break;
      }
      case Op::BUFFER_VIEW: {
        const UOp* base = u->src(0);
        int64_t base_size;
        if (const auto* b = base->arg_if<BufferArg>(); b && base->is(Op::BUFFER)) base_size = b->size;
        else if (const auto* v = base->arg_if<BufferViewArg>(); v && base->is(Op::BUFFER_VIEW)) base_size = v->size;
        else return fail(u, cat("views a ", op_name(base->op()), ", not a BUFFER [shape.buffer_view]"));
        const auto& a = u->arg_as<BufferViewArg>();
        int64_t end;
        if (a.size < 0 || a.offset < 0 || __builtin_add_overflow(a.size, a.offset, &end) || end > base_size)
          return fail(u, cat("view [", a.offset, ", +", a.size, ") is outside its buffer of ", base_size,
                             " [shape.buffer_view]"));
        out = {g_.idx(a.size)};
        break;
      }
      case Op::CONST: case Op::DEFINE_VAR: case Op::BIND:
        break;  // scalars: shape ()
      case Op::MULTI: {
        // Shards agree on every dim but the shard axis, whose sizes add up; replicated
        // shards (axis -1) agree on every dim.
        int64_t axis = u->arg_as<IntArg>().value;
        const Shape& first = src_shape(0);
        if (axis < -1 || axis >= static_cast<int64_t>(first.size()))
          return fail(u, cat("shard axis ", axis, " is not an axis of shape ", shape_str(first), " [shape.multi]"));
        out = first;
        for (int i = 1; i < n; ++i) {
          const Shape& si = src_shape(i);
          bool same = si.size() == first.size();
          for (size_t k = 0; same && k < first.size(); ++k)
            same = static_cast<int64_t>(k) == axis || dims_equal(si[k], first[k]);
          if (!same)
            return fail(u, cat("shard ", i, " has shape ", shape_str(si), " but shard 0 has ", shape_str(first), " [shape.multi]"));
          if (axis >= 0) out[axis] = dim_add(g_, out[axis], si[axis]);
        }
        break;
      }
      case Op::MSELECT: {
        // One device's part: a MULTI's shard, or the value every device of a replicated
        // collective holds.
        const UOp* m = u->src(0);
        int64_t i = u->arg_as<IntArg>().value;
        if (m->is(Op::MULTI)) {
          if (i < 0 || i >= static_cast<int64_t>(m->num_src()))
            return fail(u, cat("shard ", i, " of a MULTI of ", m->num_src(), " [shape.mselect]"));
          out = *shapes_.at(m->src(i));
        } else {
          out = src_shape(0);
        }
        break;
      }
      case Op::ALLREDUCE: {
        // Every device ends with the reduction of all shards: a shard's shape.
        const UOp* m = u->src(0);
        out = m->is(Op::MULTI) ? *shapes_.at(m->src(0)) : src_shape(0);
        break;
      }
      case Op::RESHAPE: {
        const Shape& x = src_shape(0);
        auto ns = operand(u, 1, SIZE_MAX, "shape.reshape");
        if (!ns.ok()) return ns.status();
        if (auto st = check_limits(u, *ns); !st.ok()) return st;
        auto cx = const_shape(x), cn = const_shape(*ns);
        bool same;
        if (cx && cn) {
          // Both products are within the element limit (checked), so they cannot overflow.
          int64_t px = 1, pn = 1;
          for (int64_t d : *cx) px *= d;
          for (int64_t d : *cn) pn *= d;
          same = px == pn;
        } else {
          same = dims_equal(shape_numel(g_, x), shape_numel(g_, *ns));
        }
        if (!same)
          return fail(u, cat("cannot reshape ", shape_str(x), " to ", shape_str(*ns),
                             ": the element counts differ [shape.reshape]"));
        out = std::move(*ns);
        break;
      }
      case Op::EXPAND: {
        const Shape& x = src_shape(0);
        auto ns = operand(u, 1, x.size(), "shape.expand");
        if (!ns.ok()) return ns.status();
        for (size_t k = 0; k < x.size(); ++k)
          if (!dims_equal(x[k], (*ns)[k]) && const_dim(x[k]) != 1)
            return fail(u, cat("axis ", k, ": cannot expand ", shape_str(x), " to ", shape_str(*ns),
                               " (only dims of 1 broadcast) [shape.expand]"));
        out = std::move(*ns);
        break;
      }
      case Op::PERMUTE: {
        const Shape& x = src_shape(0);
        const auto& perm = u->arg_as<IntsArg>().values;
        std::vector<bool> used(x.size(), false);
        bool ok = perm.size() == x.size();
        for (size_t k = 0; ok && k < perm.size(); ++k) {
          ok = perm[k] >= 0 && perm[k] < static_cast<int64_t>(x.size()) && !used[perm[k]];
          if (ok) used[perm[k]] = true;
        }
        if (!ok)
          return fail(u, cat("[", join(perm, ", "), "] is not a permutation of ", x.size(), " axes [shape.permute]"));
        for (int64_t p : perm) out.push_back(x[p]);
        break;
      }
      case Op::PAD: case Op::SHRINK: {
        const bool pad = u->is(Op::PAD);
        const char* tag = pad ? "shape.pad" : "shape.shrink";
        const Shape& x = src_shape(0);
        auto b = operand(u, 1, x.size(), tag);
        if (!b.ok()) return b.status();
        auto e = operand(u, 2, x.size(), tag);
        if (!e.ok()) return e.status();
        for (size_t k = 0; k < x.size(); ++k) {
          const UOp *bk = (*b)[k], *ek = (*e)[k];
          if (pad) {
            out.push_back(dim_add(g_, dim_add(g_, bk, x[k]), ek));
          } else {
            if (!dims_le(bk, ek) || !dims_le(ek, x[k]))
              return fail(u, cat("axis ", k, ": [", dim_str(bk), ", ", dim_str(ek), ") is not inside 0..",
                                 dim_str(x[k]), " [shape.shrink]"));
            out.push_back(dim_sub(g_, ek, bk));
          }
        }
        break;
      }
      case Op::FLIP: {
        const Shape& x = src_shape(0);
        size_t k = u->arg_as<BoolsArg>().values.size();
        if (k != x.size()) return fail(u, cat(k, " flags for ", x.size(), " axes [shape.flip]"));
        out = x;
        break;
      }
      case Op::REDUCE_AXIS: {
        out = src_shape(0);
        std::vector<bool> seen(out.size(), false);
        for (int64_t a : u->arg_as<ReduceAxisArg>().axes) {
          if (a < 0 || a >= static_cast<int64_t>(out.size()) || seen[a])
            return fail(u, cat("axis ", a, " is out of range or repeated for rank ", out.size(),
                               " [shape.reduce_axis]"));
          seen[a] = true;
          out[a] = g_.idx(1);  // keepdim
        }
        break;
      }
      default:
        return fail(u, cat(op_name(u->op()), " is not a tensor-level op [shape.operand]"));
    }
  }
  if (auto st = check_limits(u, out); !st.ok()) return st;
  return out;
}

absl::StatusOr<const Shape*> ShapeInference::shape(const UOp* root) {
  auto error = [&](size_t fi) {
    last_ = fi;
    const Failure& f = failed_[fi];
    std::string where;
    if (index_) {
      auto it = index_->find(f.node);
      where = it != index_->end() ? std::to_string(it->second) : "?";
    } else {
      where = std::to_string(index_by_toposort(root).at(f.node));
    }
    return absl::InvalidArgumentError(cat("node ", where, " (", op_name(f.node->op()), "): ", f.detail));
  };
  if (auto it = shapes_.find(root); it != shapes_.end()) return it->second;
  if (auto it = failures_.find(root); it != failures_.end()) return error(it->second);
  if (!has_shape(root)) {
    failed_.push_back({root, cat(op_name(root->op()), " is not a tensor-level value [shape.operand]")});
    return error(failed_.size() - 1);
  }
  // Which sources a node's rule reads the shapes of.
  auto needed = [](const UOp* u, size_t i) {
    switch (u->op()) {
      case Op::BUFFER: case Op::BUFFER_VIEW: case Op::CONST: case Op::DEFINE_VAR: case Op::BIND: return false;
      // A MULTI's rule reads every shard's shape (once only shard 0's was computed, so
      // an uncached shard threw out_of_range from shapes_.at).
      default: return is_alu(u->op()) || u->is(Op::MULTI) || i == 0;
    }
  };
  // A failure is memoized at the node where it happened and at each node that found a
  // failed source; the next query through them stops there.
  std::vector<const UOp*> stack{root};
  auto fail_at = [&](const UOp* v, size_t fi) {
    failures_.emplace(v, fi);
    return error(fi);
  };
  while (!stack.empty()) {
    const UOp* v = stack.back();
    if (shapes_.contains(v)) { stack.pop_back(); continue; }
    bool pending = false;
    for (size_t i = 0; i < v->num_src(); ++i) {
      const UOp* s = v->src(i);
      if (!needed(v, i) || shapes_.contains(s)) continue;
      if (auto it = failures_.find(s); it != failures_.end()) return fail_at(v, it->second);
      if (!has_shape(s)) {
        failed_.push_back({v, cat("source ", i, " (", op_name(s->op()), ") is not a tensor [shape.operand]")});
        return fail_at(v, failed_.size() - 1);
      }
      stack.push_back(s);
      pending = true;
    }
    if (pending) continue;
    auto r = infer(v);
    if (!r.ok()) {
      failed_.push_back({v, std::string(r.status().message())});
      return fail_at(v, failed_.size() - 1);
    }
    const Shape* stored = &store_.emplace_back(std::move(*r));
    shapes_.emplace(v, stored);
    stack.pop_back();
  }
  return shapes_.at(root);
}

}  // namespace uop
