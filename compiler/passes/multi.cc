#include "compiler/passes/multi.h"

#include <optional>

#include "absl/container/flat_hash_set.h"
#include "compiler/ir/dim.h"
#include "compiler/rewrite/graph_rewrite.h"
#include "compiler/support/strings.h"

namespace uop {

const UOp* device_of(const UOp* root) {
  std::vector<const UOp*> stack{root};
  absl::flat_hash_set<const UOp*> seen{root};
  while (!stack.empty()) {
    const UOp* u = stack.back();
    stack.pop_back();
    if (u->op() == Op::BUFFER || u->op() == Op::COPY) return u->src(1);
    // One device's share of a collective lives where that device's partial lives.
    if (u->op() == Op::MSELECT && u->src(0)->op() == Op::ALLREDUCE && u->src(0)->src(0)->op() == Op::MULTI) {
      const UOp* part = u->src(0)->src(0)->src(u->arg_as<IntArg>().value);
      if (seen.insert(part).second) stack.push_back(part);
      continue;
    }
    for (const UOp* s : u->src())
      if (seen.insert(s).second) stack.push_back(s);
  }
  return nullptr;
}

namespace {

using rw::Match;

struct Shards {
  std::vector<const UOp*> parts;
  int64_t axis = -1;
};

// A value as shards: a MULTI's, or a collective's result (the same on every device).
std::optional<Shards> as_multi(Graph& g, const UOp* u) {
  if (u->op() == Op::MULTI) return Shards{{u->src().begin(), u->src().end()}, u->arg_as<IntArg>().value};
  if (u->op() == Op::ALLREDUCE && u->src(0)->op() == Op::MULTI) {
    Shards s;
    for (size_t i = 0; i < u->src(0)->num_src(); ++i)
      s.parts.push_back(g.make(Op::MSELECT, u->dtype(), {u}, IntArg{static_cast<int64_t>(i)}));
    return s;
  }
  return std::nullopt;
}

struct Ctx {
  ShapeInference& shapes;
  absl::Status error;

  void fail(const UOp* u, std::string_view what) {
    if (error.ok()) error = absl::InvalidArgumentError(cat("multi: ", op_name(u->op()), ": ", what, " [multi.unsupported]"));
  }
  std::optional<std::vector<int64_t>> shape(const UOp* u) {
    auto s = shapes.shape(u);
    if (!s.ok()) {
      if (error.ok()) error = s.status();
      return std::nullopt;
    }
    auto c = const_shape(**s);
    if (!c) fail(u, "multi-device tensors need constant shapes");
    return c;
  }
};

const UOp* shape_node(Graph& g, const std::vector<int64_t>& dims) {
  Shape s;
  for (int64_t d : dims) s.push_back(g.idx(d));
  return make_shape_operand(g, s);
}

// Offsets of the shards along the shard axis: shard i covers [off[i], off[i+1]).
std::optional<std::vector<int64_t>> offsets(Ctx& c, const Shards& m) {
  std::vector<int64_t> off{0};
  for (const UOp* p : m.parts) {
    auto s = c.shape(p);
    if (!s) return std::nullopt;
    off.push_back(off.back() + (*s)[m.axis]);
  }
  return off;
}

// The part of a whole (replicated or device-free) tensor that shard i holds.
const UOp* slice(Graph& g, Ctx& c, const UOp* x, int64_t axis, int64_t begin, int64_t end) {
  auto s = c.shape(x);
  if (!s) return x;
  std::vector<int64_t> b(s->size(), 0), e = *s;
  b[axis] = begin;
  e[axis] = end;
  return g.make(Op::SHRINK, x->dtype(), {x, shape_node(g, b), shape_node(g, e)});
}

const UOp* multi(Graph& g, const std::vector<const UOp*>& parts, int64_t axis, DType dt) {
  return g.make(Op::MULTI, dt, parts, IntArg{axis});
}

const UOp* elementwise(const Match& m) {
  Graph& g = m.g;
  Ctx& c = *m.ctx<Ctx>();
  const UOp* x = m.root;
  std::vector<std::optional<Shards>> ms;
  const Shards* sharded = nullptr;
  size_t n = 0;
  for (const UOp* s : x->src()) ms.push_back(as_multi(g, s));
  for (auto& s : ms) {
    if (!s) continue;
    if (n && s->parts.size() != n) return c.fail(x, "operands on different numbers of devices"), nullptr;
    n = s->parts.size();
    if (s->axis >= 0) {
      if (sharded && sharded->axis != s->axis) return c.fail(x, "operands sharded on different axes"), nullptr;
      sharded = &*s;
    }
  }
  if (!n) return nullptr;
  int64_t axis = sharded ? sharded->axis : -1;
  std::vector<int64_t> off;
  if (sharded) {
    auto o = offsets(c, *sharded);
    if (!o) return nullptr;
    off = *o;
  }
  std::vector<const UOp*> out;
  for (size_t i = 0; i < n; ++i) {
    std::vector<const UOp*> src;
    for (size_t k = 0; k < x->num_src(); ++k) {
      const UOp* s = x->src(k);
      if (ms[k] && ms[k]->axis == axis) {
        src.push_back(ms[k]->parts[i]);
      } else if (ms[k]) {  // replicated, next to a sharded operand: this shard's part of it
        src.push_back(slice(g, c, ms[k]->parts[i], axis, off[i], off[i + 1]));
      } else {
        if (device_of(s))
          return c.fail(x, "a single-device tensor used with a multi-device one (shard it, or copy it with to())"), nullptr;
        src.push_back(axis >= 0 ? slice(g, c, s, axis, off[i], off[i + 1]) : s);
      }
    }
    out.push_back(g.make(x->op(), x->dtype(), src, x->arg()));
  }
  return multi(g, out, axis, x->dtype());
}

const UOp* movement(const Match& m) {
  Graph& g = m.g;
  Ctx& c = *m.ctx<Ctx>();
  const UOp* x = m.root;
  auto sh = as_multi(g, x->src(0));
  if (!sh) return nullptr;
  const int64_t a = sh->axis;
  std::vector<const UOp*> out;
  int64_t new_axis = a;
  for (size_t i = 0; i < sh->parts.size(); ++i) {
    const UOp* p = sh->parts[i];
    std::vector<const UOp*> src(x->src().begin(), x->src().end());
    src[0] = p;
    if (a >= 0) {
      auto whole = c.shape(x->src(0));
      auto part = c.shape(p);
      if (!whole || !part) return nullptr;
      auto dims = [&](int k) -> std::vector<int64_t> {
        auto d = shape_operand_dims(g, x->src(k));
        std::vector<int64_t> v;
        if (d.ok())
          for (const UOp* e : *d) v.push_back(const_dim(e).value_or(-1));
        return v;
      };
      switch (x->op()) {
        case Op::PERMUTE: {
          const auto& perm = x->arg_as<IntsArg>().values;
          new_axis = std::find(perm.begin(), perm.end(), a) - perm.begin();
          break;
        }
        case Op::RESHAPE: case Op::EXPAND: {
          std::vector<int64_t> to = dims(1);
          // The dims up to and including the shard axis stay: each shard keeps its rows.
          bool keeps = static_cast<int64_t>(to.size()) > a;
          for (int64_t k = 0; keeps && k <= a; ++k) keeps = to[k] == (*whole)[k];
          if (!keeps) return c.fail(x, "a RESHAPE or EXPAND that changes the shard axis or the dims before it"), nullptr;
          to[a] = (*part)[a];
          src[1] = shape_node(g, to);
          break;
        }
        case Op::PAD: {
          if (dims(1)[a] != 0 || dims(2)[a] != 0) return c.fail(x, "padding along the shard axis"), nullptr;
          break;
        }
        case Op::SHRINK: {
          std::vector<int64_t> b = dims(1), e = dims(2);
          if (b[a] != 0 || e[a] != (*whole)[a]) return c.fail(x, "shrinking along the shard axis"), nullptr;
          e[a] = (*part)[a];
          src[2] = shape_node(g, e);
          break;
        }
        case Op::FLIP:
          if (x->arg_as<BoolsArg>().values[a]) return c.fail(x, "flipping the shard axis"), nullptr;
          break;
        default: break;
      }
    }
    out.push_back(g.make(x->op(), x->dtype(), src, x->arg()));
  }
  return multi(g, out, new_axis, x->dtype());
}

const UOp* reduce(const Match& m) {
  Graph& g = m.g;
  Ctx& c = *m.ctx<Ctx>();
  const UOp* x = m.root;
  auto sh = as_multi(g, x->src(0));
  if (!sh) return nullptr;
  const auto& arg = x->arg_as<ReduceAxisArg>();
  std::vector<const UOp*> partials;
  for (const UOp* p : sh->parts) partials.push_back(g.make(Op::REDUCE_AXIS, x->dtype(), {p}, arg));
  bool across = sh->axis >= 0 && std::find(arg.axes.begin(), arg.axes.end(), sh->axis) != arg.axes.end();
  if (!across) return multi(g, partials, sh->axis, x->dtype());
  // Each device reduced its rows; the collective combines the partials everywhere.
  DeviceArg devices;
  for (size_t i = 0; i < sh->parts.size(); ++i) {
    const UOp* d = device_of(sh->parts[i]);
    if (!d) return c.fail(x, cat("shard ", i, " reads no buffer, so it has no device")), nullptr;
    devices.devices.push_back(d->arg_as<DeviceArg>().devices.at(0));
  }
  const UOp* dev = g.make(Op::DEVICE, dtypes::void_, {}, devices);
  const UOp* all = g.make(Op::ALLREDUCE, x->dtype(), {multi(g, partials, -1, x->dtype()), dev}, ReduceOpArg{arg.op});
  auto result = as_multi(g, all);
  return multi(g, result->parts, -1, x->dtype());
}

const rw::RuleSet& rules() {
  static const rw::RuleSet rs = [] {
    using rw::op;
    rw::RuleSet rs("multi");
    rs.add(op(rw::alu_ops() | rw::OpSet{Op::CAST, Op::BITCAST}), elementwise, "elementwise.shards");
    rs.add(op({Op::RESHAPE, Op::PERMUTE, Op::EXPAND, Op::PAD, Op::SHRINK, Op::FLIP}), movement, "movement.shards");
    rs.add(op(Op::REDUCE_AXIS), reduce, "reduce.shards");
    rs.add(op({Op::CONTIGUOUS, Op::DETACH, Op::CONTIGUOUS_BACKWARD, Op::PRECAST}), [](const Match& m) -> const UOp* {
      auto sh = as_multi(m.g, m.root->src(0));
      if (!sh) return nullptr;
      std::vector<const UOp*> out;
      for (const UOp* p : sh->parts) out.push_back(m.g.make(m.root->op(), m.root->dtype(), {p}, m.root->arg()));
      return multi(m.g, out, sh->axis, m.root->dtype());
    }, "passthrough.shards");
    // COPY of a multi-device value to one device: its logical value there. Replicated:
    // the replica already on that device, else shard 0's copied. Sharded: a gather, each
    // shard copied over and zero-padded to the whole, stitched with WHERE over a padded
    // "this shard" mask (not a sum of the padded parts, which would turn -0.0 into +0.0
    // and has no bool).
    rs.add(op(Op::COPY), [](const Match& m) -> const UOp* {
      Graph& g = m.g;
      Ctx& c = *m.ctx<Ctx>();
      const UOp* x = m.root;
      auto sh = as_multi(g, x->src(0));
      if (!sh) return nullptr;
      const UOp* dev = x->src(1);
      auto to_dev = [&](const UOp* p) {
        return device_of(p) == dev ? p : g.make(Op::COPY, x->dtype(), {p, dev}, x->arg());
      };
      if (sh->axis < 0) {
        for (const UOp* p : sh->parts)
          if (device_of(p) == dev) return p;
        return to_dev(sh->parts[0]);
      }
      auto whole = c.shape(x->src(0));
      auto off = offsets(c, *sh);
      if (!whole || !off) return nullptr;
      const int64_t a = sh->axis;
      const UOp* acc = nullptr;
      for (size_t i = 0; i < sh->parts.size(); ++i) {
        auto part = c.shape(sh->parts[i]);
        if (!part) return nullptr;
        std::vector<int64_t> b(whole->size(), 0), e(whole->size(), 0);
        b[a] = (*off)[i];
        e[a] = (*whole)[a] - (*off)[i + 1];
        const UOp* pb = shape_node(g, b);
        const UOp* pe = shape_node(g, e);
        const UOp* padded = g.make(Op::PAD, x->dtype(), {to_dev(sh->parts[i]), pb, pe});
        if (!acc) {
          acc = padded;
          continue;
        }
        std::vector<int64_t> ones(part->size(), 1);
        const UOp* t = g.make(Op::RESHAPE, dtypes::bool_, {g.cnst_bool(true), shape_node(g, ones)});
        t = g.make(Op::EXPAND, dtypes::bool_, {t, shape_node(g, *part)});
        const UOp* mine = g.make(Op::PAD, dtypes::bool_, {t, pb, pe});
        acc = g.make(Op::WHERE, x->dtype(), {mine, padded, acc});
      }
      return acc;
    }, "copy.gather");
    rs.add(op(Op::MSELECT, {op(Op::MULTI)}), [](const Match& m) -> const UOp* {
      return m.root->src(0)->src(m.root->arg_as<IntArg>().value);
    }, "mselect.multi");
    return rs;
  }();
  return rs;
}

}  // namespace

absl::StatusOr<MultiLowered> lower_multi(Graph& g, const UOp* sink, ShapeInference& shapes) {
  bool any = false;
  for (const UOp* u : toposort(sink)) any |= u->op() == Op::MULTI;
  MultiLowered out;
  if (!any) {
    out.sink = sink;
    for (size_t i = 0; i < sink->num_src(); ++i) out.outputs.push_back({{i}, -1});
    return out;
  }
  Ctx ctx{shapes};
  auto r = rw::graph_rewrite(g, sink, rules(), &ctx);
  if (!r.ok()) return r.status();
  if (!ctx.error.ok()) return ctx.error;
  std::vector<const UOp*> parts;
  for (const UOp* o : (*r)->src()) {
    MultiLowered::Output mo;
    if (auto sh = as_multi(g, o)) {
      mo.axis = sh->axis;
      for (const UOp* p : sh->parts) {
        mo.parts.push_back(parts.size());
        parts.push_back(p);
      }
    } else {
      mo.parts.push_back(parts.size());
      parts.push_back(o);
    }
    out.outputs.push_back(std::move(mo));
  }
  out.sink = g.make(Op::SINK, dtypes::void_, parts);
  return out;
}

}  // namespace uop
