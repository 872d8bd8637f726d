#include "compiler/passes/rangeify.h"

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/dim.h"
#include "compiler/passes/realize.h"
#include "compiler/rewrite/graph_rewrite.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

using rw::Match;
using rw::Pat;

struct Ctx {
  Graph& g;
  ShapeInference& shapes;
  absl::flat_hash_set<const UOp*> realize;
  absl::flat_hash_map<const UOp*, const UOp*> bufferized;  // realized tensor -> its BUFFERIZE
  absl::flat_hash_map<const UOp*, int64_t> var_values;     // DEFINE_VAR -> bound value
  int64_t next_axis = 0;
  absl::Status error;
  // How many distinct nodes use each node of the tensor graph (the SINK counts), and the
  // partial buffers of each collective (mselect.allreduce).
  absl::flat_hash_map<const UOp*, int64_t> users;
  absl::flat_hash_map<const UOp*, std::vector<const UOp*>> collective_parts;

  const Shape& shape(const UOp* u) {
    static const Shape kEmpty;
    auto s = shapes.shape(u);
    if (!s.ok()) {
      if (error.ok()) error = s.status();
      return kEmpty;
    }
    return **s;
  }
  void fail(const UOp* u, std::string_view what) {
    if (error.ok()) error = absl::InvalidArgumentError(cat("rangeify: ", op_name(u->op()), ": ", what, " [rangeify.unsupported]"));
  }
};

// The parts of INDEX(x, i... [, gate]).
struct Access {
  const UOp* x;
  std::vector<const UOp*> idx;
  const UOp* gate = nullptr;
};

Access parse(const UOp* index) {
  Access a{index->src(0), {}, nullptr};
  size_t n = index->num_src();
  if (n > 1 && index->src(n - 1)->dtype().is_bool()) a.gate = index->src(--n);
  a.idx.assign(index->src().begin() + 1, index->src().begin() + n);
  return a;
}

// A dim as kernel-level index arithmetic: BIND(var, value) becomes var, its value noted.
const UOp* kernel_dim(Ctx& c, const UOp* d) {
  if (d->op() == Op::CONST || d->op() == Op::DEFINE_VAR) return d;
  if (d->op() == Op::BIND) {
    c.var_values[d->src(0)] = d->src(1)->const_value()->to_int();
    return d->src(0);
  }
  std::vector<const UOp*> src;
  for (const UOp* s : d->src()) src.push_back(kernel_dim(c, s));
  return c.g.replace_src(d, src);
}

const UOp* zero_of(Graph& g, DType dt) { return g.cnst(dt, ConstValue::Int(0)); }

// The value of tensor `x` at `idx` (under `gate`): a load for a BUFFER, else an INDEX the
// rules below push further down.
const UOp* read(Ctx& c, const UOp* x, std::span<const UOp* const> idx, const UOp* gate) {
  Graph& g = c.g;
  if (x->op() == Op::BUFFER) {
    std::vector<const UOp*> src{x, idx[0]};
    if (gate) src.push_back(gate);
    const UOp* at = g.make(Op::INDEX, x->dtype(), src);
    if (!gate) return g.make(Op::LOAD, x->dtype(), {x, at});
    return g.make(Op::LOAD, x->dtype(), {x, at, zero_of(g, x->dtype())});
  }
  std::vector<const UOp*> src{x};
  src.insert(src.end(), idx.begin(), idx.end());
  if (gate) src.push_back(gate);
  return g.make(Op::INDEX, x->dtype(), src);
}

const UOp* new_range(Ctx& c, const UOp* end, AxisType type) {
  return c.g.make(Op::RANGE, dtypes::index, {kernel_dim(c, end)}, RangeArg{c.next_axis++, type, false});
}

// A BUFFERIZE of x with fresh ranges: a buffer of its own (not the shared one).
const UOp* fresh_bufferize(Ctx& c, const UOp* x) {
  std::vector<const UOp*> src{nullptr};
  for (const UOp* d : c.shape(x)) src.push_back(new_range(c, d, AxisType::Loop));
  src[0] = read(c, x, std::span<const UOp* const>(src).subspan(1), nullptr);
  return c.g.make(Op::BUFFERIZE, x->dtype(), src, BufferizeArg{});
}

const UOp* bufferize(Ctx& c, const UOp* x) {
  if (auto it = c.bufferized.find(x); it != c.bufferized.end()) return it->second;
  const UOp* b = fresh_bufferize(c, x);
  c.bufferized.emplace(x, b);
  return b;
}

const UOp* and_(Graph& g, const UOp* a, const UOp* b) {
  if (!a) return b;
  if (!b) return a;
  return g.alu(Op::AND, {a, b});
}

// flat = sum(idx[i] * stride[i]) over a row-major shape.
const UOp* flatten(Ctx& c, std::span<const UOp* const> idx, const Shape& shape) {
  Graph& g = c.g;
  const UOp* flat = g.idx(0);
  const UOp* stride = g.idx(1);
  for (size_t i = shape.size(); i-- > 0;) {
    flat = dim_add(g, flat, dim_mul(g, idx[i], stride));
    stride = dim_mul(g, stride, kernel_dim(c, shape[i]));
  }
  return flat;
}

// The row-major indices of `flat` in `shape`.
std::vector<const UOp*> unflatten(Ctx& c, const UOp* flat, const Shape& shape) {
  Graph& g = c.g;
  std::vector<const UOp*> out(shape.size());
  const UOp* stride = g.idx(1);
  for (size_t i = shape.size(); i-- > 0;) {
    const UOp* d = kernel_dim(c, shape[i]);
    const UOp* v = const_dim(stride) == 1 ? flat : g.alu(Op::IDIV, {flat, stride});
    out[i] = i == 0 ? v : g.alu(Op::MOD, {v, d});  // the outermost index needs no wrap
    stride = dim_mul(g, stride, d);
  }
  return out;
}

rw::RuleSet make_rules() {
  using rw::any;
  using rw::op;
  using rw::op_prefix;
  rw::RuleSet rs("rangeify");
  auto on = [](Op o) { return op_prefix(Op::INDEX, {op(o).named("x")}); };

  // A realized value read anywhere but in its own kernel is a read of its buffer.
  rs.add(op_prefix(Op::INDEX, {any().named("x")}), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Access a = parse(m.root);
    // An output that is a BUFFER is a copy; reads of it still read the BUFFER itself.
    if (!c.realize.contains(a.x) || a.x->op() == Op::BUFFER) return nullptr;
    const UOp* b = bufferize(c, a.x);
    if (!a.gate && std::equal(a.idx.begin(), a.idx.end(), b->src().begin() + 1, b->src().end()) &&
        a.idx.size() + 1 == b->num_src())
      return nullptr;  // the value computed by its own BUFFERIZE: push through
    std::vector<const UOp*> src{b};
    src.insert(src.end(), a.idx.begin(), a.idx.end());
    if (a.gate) src.push_back(a.gate);
    return m.g.make(Op::INDEX, a.x->dtype(), src);
  }, "realized.read");

  rs.add(on(Op::RESHAPE), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Access a = parse(m.root);
    const UOp* y = a.x->src(0);
    const UOp* flat = flatten(c, a.idx, c.shape(a.x));
    return read(c, y, unflatten(c, flat, c.shape(y)), a.gate);
  }, "reshape");

  rs.add(on(Op::PERMUTE), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Access a = parse(m.root);
    const auto& perm = a.x->arg_as<IntsArg>().values;
    std::vector<const UOp*> idx(a.idx.size());
    for (size_t i = 0; i < perm.size(); ++i) idx[perm[i]] = a.idx[i];
    return read(c, a.x->src(0), idx, a.gate);
  }, "permute");

  rs.add(on(Op::EXPAND), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Access a = parse(m.root);
    const Shape& in = c.shape(a.x->src(0));
    std::vector<const UOp*> idx = a.idx;
    for (size_t i = 0; i < in.size(); ++i)
      if (const_dim(in[i]) == 1) idx[i] = m.g.idx(0);
    return read(c, a.x->src(0), idx, a.gate);
  }, "expand");

  rs.add(on(Op::PAD), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Graph& g = m.g;
    Access a = parse(m.root);
    const UOp* y = a.x->src(0);
    auto begins = shape_operand_dims(g, a.x->src(1));
    auto ends = shape_operand_dims(g, a.x->src(2));
    if (!begins.ok() || !ends.ok()) { c.fail(a.x, "bad pad operands"); return nullptr; }
    const Shape& in = c.shape(y);
    std::vector<const UOp*> idx(a.idx.size());
    const UOp* valid = nullptr;
    for (size_t i = 0; i < idx.size(); ++i) {
      const UOp* b = kernel_dim(c, (*begins)[i]);
      idx[i] = dim_sub(g, a.idx[i], b);
      if (const_dim(b) != 0)  // idx >= b, i.e. b - 1 < idx
        valid = and_(g, valid, g.alu(Op::CMPLT, {dim_sub(g, b, g.idx(1)), a.idx[i]}));
      if (const_dim((*ends)[i]) != 0)
        valid = and_(g, valid, g.alu(Op::CMPLT, {a.idx[i], dim_add(g, b, kernel_dim(c, in[i]))}));
    }
    if (!valid) return read(c, y, idx, a.gate);
    const UOp* inner = read(c, y, idx, and_(g, a.gate, valid));
    return g.alu(Op::WHERE, {valid, inner, zero_of(g, a.x->dtype())});
  }, "pad");

  rs.add(on(Op::SHRINK), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Access a = parse(m.root);
    auto begins = shape_operand_dims(m.g, a.x->src(1));
    if (!begins.ok()) { c.fail(a.x, "bad shrink operands"); return nullptr; }
    std::vector<const UOp*> idx(a.idx.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = dim_add(m.g, a.idx[i], kernel_dim(c, (*begins)[i]));
    return read(c, a.x->src(0), idx, a.gate);
  }, "shrink");

  rs.add(on(Op::FLIP), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Access a = parse(m.root);
    const auto& flip = a.x->arg_as<BoolsArg>().values;
    const Shape& in = c.shape(a.x->src(0));
    std::vector<const UOp*> idx = a.idx;
    for (size_t i = 0; i < idx.size(); ++i)
      if (flip[i]) idx[i] = dim_sub(m.g, dim_sub(m.g, kernel_dim(c, in[i]), m.g.idx(1)), idx[i]);
    return read(c, a.x->src(0), idx, a.gate);
  }, "flip");

  rs.add(on(Op::REDUCE_AXIS), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Access a = parse(m.root);
    const auto& arg = a.x->arg_as<ReduceAxisArg>();
    const UOp* y = a.x->src(0);
    if (arg.axes.empty()) return read(c, y, a.idx, a.gate);
    const Shape& in = c.shape(y);
    std::vector<const UOp*> idx = a.idx;
    std::vector<const UOp*> src{nullptr};
    for (int64_t ax : arg.axes) {
      idx[ax] = new_range(c, in[ax], AxisType::Reduce);
      src.push_back(idx[ax]);
    }
    src[0] = read(c, y, idx, a.gate);
    return m.g.make(Op::REDUCE, a.x->dtype(), src, ReduceOpArg{arg.op});
  }, "reduce_axis");

  // Element-wise: the operands' values at the same indices.
  rs.add(op_prefix(Op::INDEX, {op(rw::alu_ops() | rw::OpSet{Op::CAST, Op::BITCAST}).named("x")}),
         [](const Match& m) -> const UOp* {
           Ctx& c = *m.ctx<Ctx>();
           Access a = parse(m.root);
           std::vector<const UOp*> src;
           for (const UOp* s : a.x->src()) src.push_back(read(c, s, a.idx, a.gate));
           return m.g.make(a.x->op(), a.x->dtype(), src, a.x->arg());
         }, "elementwise");

  rs.add(on(Op::CONST), [](const Match& m) -> const UOp* {
    const UOp* x = m["x"];
    return m.g.make(Op::CONST, x->dtype(), {}, x->arg());
  }, "const");
  rs.add(on(Op::DEFINE_VAR), [](const Match& m) { return m["x"]; }, "define_var");
  rs.add(on(Op::BIND), [](const Match& m) { return kernel_dim(*m.ctx<Ctx>(), m["x"]); }, "bind");

  // A device's share of a collective: the partials become buffers (the collective reduces
  // them in place) and the read stays a read of this device's one.
  rs.add(on(Op::MSELECT), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Access a = parse(m.root);
    const UOp* all = a.x->src(0);
    if (all->op() != Op::ALLREDUCE || all->src(0)->op() != Op::MULTI) {
      c.fail(a.x, "MSELECT of anything but an ALLREDUCE is left to the multi pass");
      return nullptr;
    }
    const UOp* parts = all->src(0);
    if (parts->src(0)->op() == Op::BUFFERIZE) return nullptr;  // done
    // The collective reduces its partials' buffers in place. It may use a partial's shared
    // buffer only when nothing else reads it: one user of the partial (this MULTI) and one
    // of the MULTI (this ALLREDUCE). Otherwise (another collective over the same partials,
    // a partial that is also an output or read by a kernel) each collective gets buffers
    // of its own, filled from the partials, so no reader sees another's in-place result.
    auto [it, fresh] = c.collective_parts.try_emplace(all);
    if (fresh) {
      const bool exclusive = c.users[parts] == 1;
      for (const UOp* p : parts->src())
        it->second.push_back(exclusive && c.users[p] == 1 ? bufferize(c, p) : fresh_bufferize(c, p));
    }
    const std::vector<const UOp*>& bz = it->second;
    const UOp* done = m.g.make(Op::ALLREDUCE, all->dtype(), {m.g.make(Op::MULTI, parts->dtype(), bz, parts->arg()), all->src(1)}, all->arg());
    std::vector<const UOp*> src{m.g.make(Op::MSELECT, a.x->dtype(), {done}, a.x->arg())};
    src.insert(src.end(), a.idx.begin(), a.idx.end());
    if (a.gate) src.push_back(a.gate);
    return m.g.make(Op::INDEX, a.x->dtype(), src);
  }, "mselect.allreduce");
  // A copy to another device reads the copied buffer there.
  rs.add(on(Op::COPY), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    Access a = parse(m.root);
    if (a.x->src(0)->op() == Op::BUFFERIZE) return nullptr;  // done
    std::vector<const UOp*> src{m.g.make(Op::COPY, a.x->dtype(), {bufferize(c, a.x->src(0)), a.x->src(1)}, a.x->arg())};
    src.insert(src.end(), a.idx.begin(), a.idx.end());
    if (a.gate) src.push_back(a.gate);
    return m.g.make(Op::INDEX, a.x->dtype(), src);
  }, "copy");

  // Values that only mark something for the scheduler or autograd read through.
  rs.add(op_prefix(Op::INDEX, {op({Op::CONTIGUOUS, Op::DETACH, Op::CONTIGUOUS_BACKWARD, Op::PRECAST})
                                   .named("x")}),
         [](const Match& m) -> const UOp* {
           Access a = parse(m.root);
           return read(*m.ctx<Ctx>(), a.x->src(0), a.idx, a.gate);
         }, "passthrough");

  rs.add(on(Op::BUFFER_VIEW), [](const Match& m) -> const UOp* {
    Access a = parse(m.root);
    const auto& v = a.x->arg_as<BufferViewArg>();
    const UOp* i = dim_add(m.g, a.idx[0], m.g.idx(v.offset));
    return read(*m.ctx<Ctx>(), a.x->src(0), std::span<const UOp* const>(&i, 1), a.gate);
  }, "buffer_view");

  // Anything else at tensor level has no lowering yet: say which op, do not guess.
  rs.add(op_prefix(Op::INDEX, {any().named("x")}), [](const Match& m) -> const UOp* {
    Ctx& c = *m.ctx<Ctx>();
    const UOp* x = m["x"];
    if (x->op() == Op::BUFFER || x->op() == Op::BUFFERIZE || x->op() == Op::MSELECT || x->op() == Op::COPY ||
        !c.shapes.has_shape(x))
      return nullptr;
    c.fail(x, "no rangeify rule for this op");
    return nullptr;
  }, "unsupported");
  return rs;
}

}  // namespace

absl::StatusOr<Rangeified> rangeify(Graph& g, const UOp* tensor_sink, ShapeInference& shapes) {
  if (tensor_sink->op() != Op::SINK)
    return absl::InvalidArgumentError("rangeify: the root of a tensor-level graph must be a SINK of its outputs");
  auto realize = plan_realize(tensor_sink, shapes);
  if (!realize.ok()) return realize.status();
  Ctx ctx{g, shapes, std::move(*realize)};
  for (const UOp* u : toposort(tensor_sink)) {
    absl::flat_hash_set<const UOp*> distinct(u->src().begin(), u->src().end());
    for (const UOp* s : distinct) ++ctx.users[s];
  }
  std::vector<const UOp*> outs;
  for (const UOp* o : tensor_sink->src()) outs.push_back(bufferize(ctx, o));
  if (!ctx.error.ok()) return ctx.error;
  const UOp* root = g.make(Op::SINK, dtypes::void_, outs);

  static const rw::RuleSet rules = make_rules();
  auto out = rw::graph_rewrite(g, root, rules, &ctx);
  if (!out.ok()) return out.status();
  if (!ctx.error.ok()) return ctx.error;
  Rangeified r{*out, {}};
  for (auto& [var, value] : ctx.var_values) r.var_values.emplace_back(var, value);
  std::sort(r.var_values.begin(), r.var_values.end(),
            [](const std::pair<const UOp*, int64_t>& a, const std::pair<const UOp*, int64_t>& b) {
              return a.first->arg_as<DefineVarArg>().name < b.first->arg_as<DefineVarArg>().name;
            });
  return r;
}

}  // namespace uop
