#include "compiler/passes/expand.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/eval.h"
#include "compiler/passes/bounds.h"
#include "compiler/rewrite/graph_rewrite.h"
#include "compiler/support/strings.h"

namespace uop {

std::optional<int64_t> affine_coeff(const UOp* e, const UOp* r) {
  absl::flat_hash_map<const UOp*, std::optional<int64_t>> coeff;
  for (const UOp* u : toposort(e)) {
    std::optional<int64_t> c;
    bool moves = false;
    for (const UOp* s : u->src()) moves |= coeff.at(s) != 0;
    if (u == r) {
      c = 1;
    } else if (!moves) {
      c = 0;
    } else {
      auto a = coeff.at(u->src(0));
      auto b = u->num_src() > 1 ? coeff.at(u->src(1)) : std::nullopt;
      int64_t out;
      switch (u->op()) {
        case Op::ADD: if (a && b && !__builtin_add_overflow(*a, *b, &out)) c = out; break;
        case Op::SUB: if (a && b && !__builtin_sub_overflow(*a, *b, &out)) c = out; break;
        case Op::NEG: if (a && *a != INT64_MIN) c = -*a; break;
        case Op::MUL:
          for (int i = 0; i < 2; ++i) {
            const ConstValue* k = u->src(1 - i)->const_value();
            auto s = coeff.at(u->src(i));
            if (k && s && !__builtin_mul_overflow(*s, k->to_int(), &out)) c = out;
          }
          break;
        default: break;
      }
    }
    coeff[u] = c;
  }
  return coeff.at(e);
}

namespace {

struct Axis {
  const UOp* range;
  int64_t id;
  int64_t ext;
  bool operator==(const Axis& o) const { return range == o.range; }
};
using Axes = std::vector<Axis>;  // sorted by id; lane order is row-major over them

int64_t lanes(const Axes& a) {
  int64_t n = 1;
  for (const Axis& x : a) n *= x.ext;
  return n;
}

// The value of each axis at lane `l` of a vector over `a`.
std::vector<int64_t> decode(const Axes& a, int64_t l) {
  std::vector<int64_t> v(a.size());
  for (size_t i = a.size(); i-- > 0;) {
    v[i] = l % a[i].ext;
    l /= a[i].ext;
  }
  return v;
}

// The lane of `sub` (a subset of `full`) that lane `l` of `full` projects to.
int64_t project(const Axes& full, const Axes& sub, int64_t l) {
  std::vector<int64_t> v = decode(full, l);
  int64_t out = 0;
  for (const Axis& s : sub) {
    size_t i = std::find(full.begin(), full.end(), s) - full.begin();
    out = out * s.ext + v[i];
  }
  return out;
}

Axes merge(const Axes& a, const Axes& b) {
  Axes out = a;
  for (const Axis& x : b)
    if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
  std::sort(out.begin(), out.end(), [](const Axis& x, const Axis& y) { return x.id < y.id; });
  return out;
}

AxisFactorsArg factors(const Axes& a) {
  AxisFactorsArg f;
  for (const Axis& x : a) f.factors.emplace_back(x.id, x.ext);
  return f;
}

struct Address {
  const UOp* buf;
  const UOp* idx;
  const UOp* gate;
};
Address address(const UOp* index) {
  return {index->src(0), index->src(1), index->num_src() > 2 ? index->src(2) : nullptr};
}

struct Ctx {
  absl::flat_hash_map<const UOp*, Axis> upcast;    // upcast RANGE -> its axis
  absl::flat_hash_map<int64_t, Axis> by_id;
  // e -> n where every STORE of the kernel is gated by e < n (a constant) and e reads an
  // upcast axis: a masked tail's lanes past n, which store nothing (tail_lanes).
  absl::flat_hash_map<const UOp*, int64_t> dead_past;
  absl::Status error;

  // The upcast axes a node's value depends on (through UNROLL tags too).
  Axes deps(const UOp* x) {
    Axes out;
    for (const UOp* u : toposort(x)) {
      if (auto it = upcast.find(u); it != upcast.end()) out = merge(out, {it->second});
      if (u->op() == Op::UNROLL) out = merge(out, axes_of(u));
    }
    return out;
  }
  // The lanes of an access: its index's and gate's, not its buffer's (a shared array
  // reached through AFTER(smem, BARRIER(STORE(smem[t], partial))) orders after what was
  // stored, whose lanes are not the access's; expanding by those never ends).
  Axes deps(const Address& at) {
    Axes out = deps(at.idx);
    if (at.gate) out = merge(out, deps(at.gate));
    return out;
  }
  Axes axes_of(const UOp* unroll) {
    Axes a;
    for (auto& [id, ext] : unroll->arg_as<AxisFactorsArg>().factors) a.push_back(by_id.at(id));
    return a;
  }
};

// `x` with every upcast range set to its value at lane `l` of `a` (UNROLL-tagged vectors
// give their lane), as a scalar expression.
const UOp* at_lane(Graph& g, Ctx& c, const UOp* x, const Axes& a, int64_t l) {
  std::vector<int64_t> v = decode(a, l);
  absl::flat_hash_map<const UOp*, const UOp*> repl;
  for (size_t i = 0; i < a.size(); ++i) repl[a[i].range] = g.idx(v[i]);
  for (const UOp* u : toposort(x)) {
    if (u->op() != Op::UNROLL) continue;
    Axes ua = c.axes_of(u);
    int64_t lane = project(a, ua, l);
    repl[u] = g.make(Op::GEP, u->dtype().element(), {u->src(0)}, IntsArg{{lane}});
  }
  return substitute(g, x, repl);
}

// `x` over lanes [l, l + n) of `a` as one vector expression: each upcast range a vector
// of its values at those lanes, the ops that read one made lane-wise (their other operands
// broadcast). A gate so made is a few vector compares where one VECTORIZE of per-lane
// scalars is a mask assembled bit by bit. nullptr where x reads an UNROLL or an op that is
// not lane-wise (the caller then goes lane by lane).
const UOp* vector_over(Graph& g, const UOp* x, const Axes& a, int64_t l, int64_t n) {
  const uint32_t w = static_cast<uint32_t>(n);
  absl::flat_hash_map<const UOp*, const UOp*> vec;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<ConstValue> values;
    for (int64_t k = 0; k < n; ++k) values.push_back(ConstValue::Int(decode(a, l + k)[i]));
    vec[a[i].range] = g.make(Op::VCONST, a[i].range->dtype().vec(w), {}, VConstArg{std::move(values)});
  }
  for (const UOp* u : toposort(x)) {
    if (u->op() == Op::UNROLL) return nullptr;
    if (vec.contains(u)) continue;
    bool reads = false;
    for (const UOp* s : u->src()) reads |= vec.contains(s);
    if (!reads) continue;
    const Op op = u->op();
    if ((!is_alu(op) && op != Op::CAST && op != Op::BITCAST) || u->dtype().count != 1) return nullptr;
    std::vector<const UOp*> src;
    for (const UOp* s : u->src()) {
      if (auto it = vec.find(s); it != vec.end()) src.push_back(it->second);
      else src.push_back(g.make(Op::VECTORIZE, s->dtype().vec(w), std::vector<const UOp*>(n, s)));
    }
    vec[u] = g.make(op, u->dtype().vec(w), src, u->arg());
  }
  auto it = vec.find(x);
  return it == vec.end() ? nullptr : it->second;
}

// How an address moves over the lanes of `a`: the number of lanes C of the innermost axes
// along which it is contiguous (1: none), or 0 when it is not affine.
int64_t contiguous_lanes(const UOp* idx, const Axes& a) {
  for (const UOp* u : toposort(idx))
    if (u->op() == Op::UNROLL) return 0;
  int64_t chunk = 1;
  for (size_t i = a.size(); i-- > 0;) {
    auto c = affine_coeff(idx, a[i].range);
    if (!c) return 0;
    if (*c != chunk) break;
    chunk *= a[i].ext;
  }
  return chunk;
}

// The parts of INDEX(buf, idx [, gate]).

const UOp* make_index(Graph& g, const UOp* buf, const UOp* idx, const UOp* gate, DType dt) {
  std::vector<const UOp*> src{buf, idx};
  if (gate) src.push_back(gate);
  return g.make(Op::INDEX, dt, src);
}

// `idx` without the clamps into a buffer of `size` elements around it: max(x, c) with
// c <= 0 and min(x, c) with c >= size - 1 are x wherever x is inside the buffer, which is
// what the caller then has proven of x (a tinygrad gated read arrives clamped so).
const UOp* unclamp(const UOp* idx, int64_t size) {
  for (;;) {
    if ((idx->op() != Op::MAX && idx->op() != Op::MIN) || size <= 0) return idx;
    const int side = idx->src(1)->const_value() ? 1 : 0;
    const ConstValue* k = idx->src(side)->const_value();
    if (!k || k->kind() != ConstValue::Kind::Int || !idx->dtype().is_int()) return idx;
    int64_t v = k->as_int();
    if (idx->op() == Op::MAX ? v > 0 : v < size - 1) return idx;
    idx = idx->src(1 - side);
  }
}

// An access's `e` (its gate, a load's alternative) over lanes [l, l + n) of `a`: one scalar
// where the lanes share it, else a lane-wise vector expression, else the lanes' scalars.
const UOp* lanes_of(Graph& g, Ctx& c, const UOp* e, const Axes& a, int64_t l, int64_t n) {
  std::vector<const UOp*> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(at_lane(g, c, e, a, l + i));
  if (std::all_of(v.begin(), v.end(), [&](const UOp* y) { return y == v[0]; })) return v[0];
  if (const UOp* vx = vector_over(g, e, a, l, n)) return vx;
  return g.make(Op::VECTORIZE, e->dtype().vec(static_cast<uint32_t>(n)), v);
}

// INDEX(buf, idx) without its gate, where the bounds stage proves it so (the index is
// clamped into the buffer): loaded unconditionally and selected by the gate, it is
// branch-free where a gated scalar load is a branch. Global memory only: a gated read of
// shared memory or registers may be what keeps it from a slot another thread has not
// written yet. nullptr otherwise.
const UOp* ungated(Graph& g, const Address& at, DType t) {
  if (!at.buf->dtype().ptr || at.buf->dtype().addrspace != AddrSpace::Global) return nullptr;
  const UOp* plain = make_index(g, at.buf, at.idx, nullptr, t);
  return check_index(g, plain).ok() ? plain : nullptr;
}

// The conjuncts of a gate (an AND tree).
void conjuncts(const UOp* gate, std::vector<const UOp*>& out) {
  if (gate->op() == Op::AND && gate->dtype().is_bool()) {
    conjuncts(gate->src(0), out);
    conjuncts(gate->src(1), out);
  } else {
    out.push_back(gate);
  }
}

// Where a range is split by a factor that does not divide it, its lanes past the end run
// as a clamped copy of the last one (split_range: r becomes min(flat, n - 1)) and every
// STORE is gated by flat < n. No value of such a lane reaches memory: the lanes of a
// STORE's loops are independent iterations, which meet only in a REDUCE over a loop of
// their own (one a STORE's gate cannot read) or through a STORE. So within a load's index
// the clamp may be dropped for the gate flat < n: a tail lane then loads nothing (zero)
// where it loaded the last lane's element, and the index stays contiguous over the lanes,
// one masked vector load where the clamps made it one scalar load per lane (ResNet-18's
// 7 x 7 maps in a 4 x 4 pixel tile). `dead_past` holds what the kernel's STOREs are
// gated so by.
absl::flat_hash_map<const UOp*, int64_t> tail_lanes(const UOp* kernel, const Ctx& c) {
  absl::flat_hash_map<const UOp*, int64_t> common;
  bool first = true;
  for (const UOp* u : toposort(kernel)) {
    if (u->op() != Op::STORE || u->src(0)->op() != Op::INDEX) continue;
    absl::flat_hash_map<const UOp*, int64_t> here;
    if (u->src(0)->num_src() > 2) {
      std::vector<const UOp*> cs;
      conjuncts(u->src(0)->src(2), cs);
      for (const UOp* x : cs) {
        if (x->op() != Op::CMPLT || x->dtype().count != 1 || !x->src(0)->dtype().is_int()) continue;
        const ConstValue* k = x->src(1)->const_value();
        if (!k || k->kind() != ConstValue::Kind::Int) continue;
        bool lanes = false;
        for (const UOp* y : toposort(x->src(0))) lanes |= c.upcast.contains(y);
        if (lanes) here[x->src(0)] = k->as_int();
      }
    }
    if (first) {
      common = std::move(here);
      first = false;
      continue;
    }
    absl::erase_if(common, [&](const auto& kv) {
      auto it = here.find(kv.first);
      return it == here.end() || it->second != kv.second;
    });
  }
  return common;
}

// `idx` with each clamp min(e, n - 1) of a dead tail (tail_lanes) replaced by e, and the
// conjunction of their gates e < n; {idx, nullptr} where it has none.
std::pair<const UOp*, const UOp*> drop_tail_clamps(Graph& g, const Ctx& c, const UOp* idx) {
  absl::flat_hash_map<const UOp*, const UOp*> repl;
  const UOp* gate = nullptr;
  for (const UOp* u : toposort(idx)) {
    if (u->op() != Op::MIN || u->dtype().count != 1) continue;
    for (int side = 0; side < 2; ++side) {
      const ConstValue* k = u->src(1 - side)->const_value();
      auto it = c.dead_past.find(u->src(side));
      if (!k || k->kind() != ConstValue::Kind::Int || it == c.dead_past.end() || k->as_int() != it->second - 1) continue;
      repl[u] = u->src(side);
      const UOp* valid = g.alu(Op::CMPLT, {u->src(side), g.idx(it->second)});
      gate = gate ? g.alu(Op::AND, {gate, valid}) : valid;
      break;
    }
  }
  if (!gate) return {idx, nullptr};
  return {substitute(g, idx, repl), gate};
}

const rw::RuleSet& memory_rules() {
  static const rw::RuleSet rs = [] {
    rw::RuleSet rs("expand.memory");
    rs.add(rw::op(Op::LOAD).named("ld"), [](const rw::Match& m) -> const UOp* {
      Graph& g = m.g;
      Ctx& c = *m.ctx<Ctx>();
      const UOp* ld = m["ld"];
      if (ld->src(1)->op() != Op::INDEX || ld->src(1)->num_src() < 2) return nullptr;
      Address at = address(ld->src(1));
      const UOp* alt = ld->num_src() > 2 ? ld->src(2) : nullptr;
      DType t = ld->dtype();
      Axes a = c.deps(at);
      if (alt) a = merge(a, c.deps(alt));
      if (a.empty()) {
        if (!at.gate || ld->src(1)->dtype().count != 1) return nullptr;
        const UOp* plain = ungated(g, at, t);
        return plain ? g.make(Op::WHERE, t, {at.gate, g.make(Op::LOAD, t, {at.buf, plain}), alt ? alt : g.cnst_int(t, 0)})
                     : nullptr;
      }
      const int64_t n = lanes(a);
      // The lanes' loads as one vector over `a`: scalars VECTORIZEd, vectors CATed.
      auto whole = [&](bool scalar_parts, const std::vector<const UOp*>& parts) {
        DType vt = t.vec(static_cast<uint32_t>(n));
        const UOp* v = parts.size() == 1 ? parts[0] : g.make(scalar_parts ? Op::VECTORIZE : Op::CAT, vt, parts);
        return g.make(Op::UNROLL, vt, {v}, factors(a));
      };
      // A gated load is a vector load too where its index is contiguous over the lanes:
      // with its gate one per lane (a masked load: the lanes that are off touch no memory)
      // or one for all where the lanes share it, if the bounds stage will prove it (asked
      // here; else lane by lane). A clamp of the index into the buffer is the identity
      // wherever the unclamped index is proven inside it, so it is looked through.
      if (at.gate) {
        const UOp* x = unclamp(at.idx, buffer_elements(at.buf));
        int64_t chunk = contiguous_lanes(x, a);
        std::vector<const UOp*> parts;
        for (int64_t l = 0; chunk > 1 && l < n; l += chunk) {
          DType vt = t.vec(static_cast<uint32_t>(chunk));
          const UOp* index = make_index(g, at.buf, at_lane(g, c, x, a, l), lanes_of(g, c, at.gate, a, l, chunk), vt);
          if (!check_index(g, index).ok()) {
            parts.clear();
            break;
          }
          if (!alt) {
            parts.push_back(g.make(Op::LOAD, vt, {at.buf, index}));
            continue;
          }
          const UOp* other = lanes_of(g, c, alt, a, l, chunk);
          if (other->dtype().count == 1) other = g.make(Op::VECTORIZE, vt, std::vector<const UOp*>(chunk, other));
          parts.push_back(g.make(Op::LOAD, vt, {at.buf, index, other}));
        }
        if (!parts.empty()) return whole(false, parts);
        // Lane by lane: each a load without its gate, selected by it, where that load is
        // proven in bounds (a clamped index: branch-free), else a gated load (a branch).
        for (int64_t l = 0; l < n; ++l) {
          Address lane{at.buf, at_lane(g, c, at.idx, a, l), at_lane(g, c, at.gate, a, l)};
          const UOp* other = alt ? at_lane(g, c, alt, a, l) : nullptr;
          if (const UOp* plain = ungated(g, lane, t)) {
            parts.push_back(g.make(Op::WHERE, t, {lane.gate, g.make(Op::LOAD, t, {at.buf, plain}),
                                                  other ? other : g.cnst_int(t, 0)}));
            continue;
          }
          const UOp* index = make_index(g, at.buf, lane.idx, lane.gate, t);
          parts.push_back(other ? g.make(Op::LOAD, t, {at.buf, index, other}) : g.make(Op::LOAD, t, {at.buf, index}));
        }
        return whole(true, parts);
      }
      int64_t chunk = alt ? 1 : std::max<int64_t>(contiguous_lanes(at.idx, a), 1);
      std::vector<const UOp*> parts;
      // A dead tail's clamps dropped: masked vector loads where the clamps broke the lanes
      // apart (tail_lanes).
      if (!alt && chunk < n && !c.dead_past.empty() && at.buf->dtype().ptr &&
          at.buf->dtype().addrspace == AddrSpace::Global) {
        auto [x, gate] = drop_tail_clamps(g, c, at.idx);
        const int64_t wide = gate ? contiguous_lanes(x, a) : 0;
        for (int64_t l = 0; wide > chunk && l < n; l += wide) {
          DType vt = t.vec(static_cast<uint32_t>(wide));
          const UOp* index = make_index(g, at.buf, at_lane(g, c, x, a, l), lanes_of(g, c, gate, a, l, wide), vt);
          if (!check_index(g, index).ok()) {
            parts.clear();
            break;
          }
          parts.push_back(g.make(Op::LOAD, vt, {at.buf, index}));
        }
        if (!parts.empty()) return whole(false, parts);
      }
      for (int64_t l = 0; l < n; l += chunk) {
        const UOp* base = at_lane(g, c, at.idx, a, l);
        if (chunk == 1) {
          const UOp* index = make_index(g, at.buf, base, nullptr, t);
          parts.push_back(alt ? g.make(Op::LOAD, t, {at.buf, index, at_lane(g, c, alt, a, l)})
                              : g.make(Op::LOAD, t, {at.buf, index}));
        } else {
          DType vt = t.vec(static_cast<uint32_t>(chunk));
          parts.push_back(g.make(Op::LOAD, vt, {at.buf, make_index(g, at.buf, base, nullptr, vt)}));
        }
      }
      return whole(chunk == 1, parts);
    }, "load.vector");

    rs.add(rw::op(Op::STORE).named("st"), [](const rw::Match& m) -> const UOp* {
      Graph& g = m.g;
      Ctx& c = *m.ctx<Ctx>();
      const UOp* st = m["st"];
      if (st->src(0)->op() != Op::INDEX || st->src(0)->num_src() < 2) return nullptr;
      Address at = address(st->src(0));
      Axes a = c.deps(at);
      std::vector<const UOp*> loops;
      for (const UOp* r : st->src().subspan(2)) {
        if (auto it = c.upcast.find(r); it != c.upcast.end()) a = merge(a, {it->second});
        else loops.push_back(r);
      }
      if (a.empty()) return nullptr;
      // The element type: a stored LOAD is already a vector here (rules run bottom-up).
      DType t = st->src(1)->op() == Op::UNROLL ? st->src(1)->dtype().element() : st->src(1)->dtype();
      int64_t n = lanes(a);
      const UOp* value = g.make(Op::CONTRACT, t.vec(static_cast<uint32_t>(n)), {st->src(1)}, factors(a));
      // A gated store is a vector store too where its index is contiguous over the lanes
      // (a masked store where the gate differs by lane: a tail, a pad's border), if the
      // bounds stage will prove it; else lane by lane, as a clamped index is.
      const UOp* plain = at.gate ? unclamp(at.idx, buffer_elements(at.buf)) : at.idx;
      auto store_chunks = [&](int64_t chunk) {
        std::vector<const UOp*> out;
        const UOp* x = chunk > 1 ? plain : at.idx;
        for (int64_t l = 0; l < n; l += chunk) {
          const UOp* base = at_lane(g, c, x, a, l);
          DType vt = chunk == 1 ? t : t.vec(static_cast<uint32_t>(chunk));
          const UOp* gate = !at.gate ? nullptr : chunk == 1 ? at_lane(g, c, at.gate, a, l) : lanes_of(g, c, at.gate, a, l, chunk);
          const UOp* index = make_index(g, at.buf, base, gate, vt);
          if (at.gate && chunk > 1 && !check_index(g, index).ok()) return std::vector<const UOp*>{};
          std::vector<int64_t> lanes_of_chunk;
          for (int64_t i = 0; i < chunk; ++i) lanes_of_chunk.push_back(l + i);
          const UOp* v = chunk == n ? value : g.make(Op::GEP, vt, {value}, IntsArg{lanes_of_chunk});
          out.push_back(g.make(Op::STORE, dtypes::void_, {index, v}));
        }
        return out;
      };
      std::vector<const UOp*> stores = store_chunks(std::max<int64_t>(contiguous_lanes(plain, a), 1));
      if (stores.empty()) stores = store_chunks(1);
      if (stores.size() == 1) {
        std::vector<const UOp*> src(stores[0]->src().begin(), stores[0]->src().end());
        src.insert(src.end(), loops.begin(), loops.end());
        return g.make(Op::STORE, dtypes::void_, src);
      }
      const UOp* group = g.make(Op::GROUP, dtypes::void_, stores);
      if (loops.empty()) return group;
      std::vector<const UOp*> src{group};
      src.insert(src.end(), loops.begin(), loops.end());
      return g.make(Op::END, dtypes::void_, src);
    }, "store.vector");
    return rs;
  }();
  return rs;
}

// `x` as a plain vector over `to` (which holds x's axes): broadcast a scalar, line up the
// lanes of an UNROLL-tagged vector.
const UOp* swizzle(Graph& g, Ctx& c, const UOp* x, const Axes& to) {
  int64_t n = lanes(to);
  if (x->op() != Op::UNROLL) {
    DType vt = x->dtype().vec(static_cast<uint32_t>(n));
    if (const ConstValue* k = x->const_value()) return g.make(Op::VCONST, vt, {}, VConstArg{std::vector<ConstValue>(n, *k)});
    return g.make(Op::VECTORIZE, vt, std::vector<const UOp*>(n, x));
  }
  Axes from = c.axes_of(x);
  if (from == to) return x->src(0);
  for (const Axis& f : from)
    if (std::find(to.begin(), to.end(), f) == to.end() && c.error.ok())
      c.error = absl::InternalError("expand: a value has lanes its user does not");
  std::vector<int64_t> map;
  for (int64_t l = 0; l < n; ++l) map.push_back(project(to, from, l));
  return g.make(Op::GEP, x->dtype().element().vec(static_cast<uint32_t>(n)), {x->src(0)}, IntsArg{map});
}

const rw::RuleSet& vectorize_rules() {
  static const rw::RuleSet rs = [] {
    rw::RuleSet rs("expand.vectorize");
    rs.add(rw::op(Op::RANGE).named("r"), [](const rw::Match& m) -> const UOp* {
      Ctx& c = *m.ctx<Ctx>();
      auto it = c.upcast.find(m["r"]);
      if (it == c.upcast.end()) return nullptr;
      std::vector<ConstValue> v;
      for (int64_t i = 0; i < it->second.ext; ++i) v.push_back(ConstValue::Int(i));
      DType vt = dtypes::index.vec(static_cast<uint32_t>(v.size()));
      return m.g.make(Op::UNROLL, vt, {m.g.make(Op::VCONST, vt, {}, VConstArg{v})}, factors({it->second}));
    }, "range.lanes");

    rs.add(rw::op(rw::alu_ops() | rw::OpSet{Op::CAST, Op::BITCAST}).named("x"), [](const rw::Match& m) -> const UOp* {
      Ctx& c = *m.ctx<Ctx>();
      const UOp* x = m["x"];
      Axes a;
      for (const UOp* s : x->src())
        if (s->op() == Op::UNROLL) a = merge(a, c.axes_of(s));
      if (a.empty()) return nullptr;
      std::vector<const UOp*> src;
      for (const UOp* s : x->src()) src.push_back(swizzle(m.g, c, s, a));
      DType vt = x->dtype().element().vec(static_cast<uint32_t>(lanes(a)));
      return m.g.make(Op::UNROLL, vt, {m.g.make(x->op(), vt, src, x->arg())}, factors(a));
    }, "alu.lanes");

    rs.add(rw::op(Op::CONTRACT).named("x"), [](const rw::Match& m) -> const UOp* {
      Ctx& c = *m.ctx<Ctx>();
      const UOp* x = m["x"];
      Axes to;
      for (auto& [id, ext] : x->arg_as<AxisFactorsArg>().factors) to.push_back(c.by_id.at(id));
      return swizzle(m.g, c, x->src(0), to);
    }, "contract");

    rs.add(rw::op(Op::REDUCE).named("r"), [](const rw::Match& m) -> const UOp* {
      Graph& g = m.g;
      Ctx& c = *m.ctx<Ctx>();
      const UOp* r = m["r"];
      const UOp* v = r->src(0);
      Axes folded;
      std::vector<const UOp*> loops;
      for (const UOp* s : r->src().subspan(1)) {
        if (s->op() == Op::UNROLL) folded = merge(folded, c.axes_of(s));
        else loops.push_back(s);
      }
      if (folded.empty() && v->op() != Op::UNROLL) return nullptr;
      Axes full = v->op() == Op::UNROLL ? merge(c.axes_of(v), folded) : folded;
      DType t = r->dtype().element();
      const UOp* acc = swizzle(g, c, v, full);
      const ReduceOp rop = r->arg_as<ReduceOpArg>().op;
      if (!loops.empty()) {
        std::vector<const UOp*> src{acc};
        src.insert(src.end(), loops.begin(), loops.end());
        acc = g.make(Op::REDUCE, acc->dtype(), src, r->arg());
      } else {
        // No loop left: the fold of each lane still starts from the identity (0.0 + -0.0
        // is +0.0).
        acc = g.alu(reduce_combine_op(rop), {swizzle(g, c, g.cnst(t, reduce_identity(rop, t.scalar)), full), acc});
      }
      if (folded.empty()) return g.make(Op::UNROLL, acc->dtype(), {acc}, factors(full));
      // Fold the lanes of the closed upcast ranges, one slice of the kept lanes per value.
      Axes keep;
      for (const Axis& x : full)
        if (std::find(folded.begin(), folded.end(), x) == folded.end()) keep.push_back(x);
      int64_t nk = lanes(keep), nf = lanes(folded);
      std::vector<const UOp*> parts;
      for (int64_t f = 0; f < nf; ++f) {
        std::vector<int64_t> idx;
        std::vector<int64_t> fv = decode(folded, f);
        for (int64_t k = 0; k < nk; ++k) {
          std::vector<int64_t> kv = decode(keep, k);
          int64_t lane = 0;
          for (const Axis& x : full) {
            auto in_keep = std::find(keep.begin(), keep.end(), x);
            int64_t val = in_keep != keep.end() ? kv[in_keep - keep.begin()]
                                                 : fv[std::find(folded.begin(), folded.end(), x) - folded.begin()];
            lane = lane * x.ext + val;
          }
          idx.push_back(lane);
        }
        parts.push_back(g.make(Op::GEP, t.vec(static_cast<uint32_t>(nk)), {acc}, IntsArg{idx}));
      }
      Op combine = reduce_combine_op(rop);
      while (parts.size() > 1) {  // a balanced tree keeps the dependency chains short
        std::vector<const UOp*> next;
        for (size_t i = 0; i + 1 < parts.size(); i += 2) next.push_back(g.alu(combine, {parts[i], parts[i + 1]}));
        if (parts.size() % 2) next.push_back(parts.back());
        parts = std::move(next);
      }
      return keep.empty() ? parts[0] : g.make(Op::UNROLL, parts[0]->dtype(), {parts[0]}, factors(keep));
    }, "reduce.lanes");
    return rs;
  }();
  return rs;
}

const rw::RuleSet& strip_rules() {
  static const rw::RuleSet rs = [] {
    rw::RuleSet rs("expand.strip");
    rs.add(rw::op(Op::UNROLL).named("x"), [](const rw::Match& m) { return m["x"]->src(0); }, "unroll.strip");
    return rs;
  }();
  return rs;
}

}  // namespace

absl::StatusOr<const UOp*> expand_upcasts(Graph& g, const UOp* kernel) {
  Ctx c;
  for (const UOp* u : toposort(kernel)) {
    if (u->op() != Op::RANGE || u->arg_as<RangeArg>().type != AxisType::Upcast) continue;
    const ConstValue* end = u->src(0)->const_value();
    if (!end || end->to_int() < 1 || end->to_int() > 1024)
      return absl::InvalidArgumentError(cat("expand: an Upcast range needs a constant trip count in [1, 1024] [expand.upcast]"));
    Axis a{u, u->arg_as<RangeArg>().axis_id, end->to_int()};
    if (c.by_id.contains(a.id)) return absl::InvalidArgumentError("expand: two Upcast ranges share an axis id [expand.upcast]");
    c.upcast.emplace(u, a);
    c.by_id.emplace(a.id, a);
  }
  if (c.upcast.empty()) return kernel;
  c.dead_past = tail_lanes(kernel, c);
  auto k = rw::graph_rewrite(g, kernel, memory_rules(), &c);
  if (k.ok()) k = rw::graph_rewrite(g, *k, vectorize_rules(), &c);
  if (k.ok()) k = rw::graph_rewrite(g, *k, strip_rules(), &c);
  if (!k.ok()) return k.status();
  if (!c.error.ok()) return c.error;
  return k;
}

}  // namespace uop
