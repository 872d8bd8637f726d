#include "compiler/passes/group_reduce.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/ir/eval.h"
#include "compiler/rewrite/graph_rewrite.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

struct Ctx {
  int64_t next_local = 0;
  // The kernel's other thread ranges (Local): threads that differ in them fold
  // different values, so each has its own row of the shared array.
  std::vector<const UOp*> locals;
  absl::flat_hash_map<const UOp*, const UOp*> thread_of;  // a folded result -> its GroupReduce range
  absl::flat_hash_set<const UOp*> gated;                   // STOREs this pass made
  absl::Status error;
};

bool depends_on(const UOp* x, const UOp* r) {
  for (const UOp* u : toposort(x))
    if (u == r) return true;
  return false;
}

// The shared-memory tree of the header comment, for REDUCE `r` over GroupReduce range `t`.
const UOp* fold_in_block(Graph& g, Ctx& c, const UOp* r, const UOp* t) {
  const DType dt = r->dtype();
  const int64_t L = t->src(0)->const_value()->to_int();
  const Op combine = reduce_combine_op(r->arg_as<ReduceOpArg>().op);
  const UOp* identity = g.cnst(dt, reduce_identity(r->arg_as<ReduceOpArg>().op, dt.scalar));
  std::vector<const UOp*> others{r->src(0)};
  for (const UOp* s : r->src().subspan(1))
    if (s != t) others.push_back(s);
  const UOp* partial = others.size() == 1 ? r->src(0) : g.make(Op::REDUCE, dt, others, r->arg());
  // row * L + t: the row of this thread's other thread ranges.
  const UOp* row = nullptr;
  int64_t rows = 1;
  for (const UOp* l : c.locals) {
    const int64_t e = l->src(0)->const_value()->to_int();
    row = row ? g.alu(Op::ADD, {g.alu(Op::MUL, {row, g.idx(e)}), l}) : l;
    rows *= e;
  }
  const UOp* base = row ? g.alu(Op::MUL, {row, g.idx(L)}) : nullptr;
  auto slot = [&](const UOp* i) { return base ? g.alu(Op::ADD, {base, i}) : i; };
  const UOp* smem = g.make(Op::DEFINE_LOCAL, dt.ptr_to(AddrSpace::Local, L * rows), {}, IntArg{c.next_local++});
  // Each access after a barrier goes through AFTER(smem, barrier): it orders the access
  // and keeps the INDEX nodes of different steps apart under hash consing.
  auto at = [&](const UOp* bar, const UOp* i, const UOp* gate = nullptr) {
    const UOp* buf = bar ? g.make(Op::AFTER, smem->dtype(), {smem, bar}) : smem;
    i = slot(i);
    if (gate) return g.make(Op::INDEX, dt, {buf, i, gate});
    return g.make(Op::INDEX, dt, {buf, i});
  };
  const UOp* bar = g.make(Op::BARRIER, dtypes::void_, {g.make(Op::STORE, dtypes::void_, {at(nullptr, t), partial})});
  int64_t p = 1;
  while (p < L) p *= 2;
  for (int64_t s = p / 2; s >= 1; s /= 2) {
    const UOp* ts = g.alu(Op::ADD, {t, g.idx(s)});
    const UOp* gate = g.alu(Op::CMPLT, {t, g.idx(s)});
    if (s * 2 > L) gate = g.alu(Op::AND, {gate, g.alu(Op::CMPLT, {ts, g.idx(L)})});
    const UOp* mine = g.make(Op::LOAD, dt, {smem, at(bar, t)});
    const UOp* theirs = g.make(Op::LOAD, dt, {smem, at(bar, ts, gate), identity});
    const UOp* st = g.make(Op::STORE, dtypes::void_, {at(bar, t, gate), g.alu(combine, {mine, theirs})});
    bar = g.make(Op::BARRIER, dtypes::void_, {st});
  }
  const UOp* result = g.make(Op::LOAD, dt, {smem, at(bar, g.idx(0))});
  return g.make(Op::BARRIER, dt, {result});
}

const rw::RuleSet& rules() {
  static const rw::RuleSet rs = [] {
    rw::RuleSet rs("group_reduce");
    rs.add(rw::op(Op::REDUCE).named("r"), [](const rw::Match& m) -> const UOp* {
      Ctx& c = *m.ctx<Ctx>();
      const UOp* r = m["r"];
      const UOp* t = nullptr;
      for (const UOp* s : r->src().subspan(1)) {
        if (s->op() != Op::RANGE || s->arg_as<RangeArg>().type != AxisType::GroupReduce) continue;
        const ConstValue* end = s->src(0)->const_value();
        if (t || !end || end->to_int() < 1 || end->to_int() > 1024 || r->dtype().is_vector()) {
          if (c.error.ok()) c.error = absl::InternalError("group_reduce: one GroupReduce range of constant extent per scalar REDUCE");
          return nullptr;
        }
        t = s;
      }
      if (!t) return nullptr;
      const UOp* out = fold_in_block(m.g, c, r, t);
      c.thread_of[out] = t;
      return out;
    }, "reduce.group");
    // One thread writes a folded result to memory: every thread holds the same value.
    rs.add(rw::op(Op::STORE).named("s"), [](const rw::Match& m) -> const UOp* {
      Ctx& c = *m.ctx<Ctx>();
      const UOp* s = m["s"];
      if (c.thread_of.empty() || c.gated.contains(s) || s->src(0)->op() != Op::INDEX) return nullptr;
      const UOp* index = s->src(0);
      const UOp* buf = index->src(0);
      while (buf->op() == Op::AFTER) buf = buf->src(0);
      if (buf->op() != Op::PARAM) return nullptr;
      const UOp* gate = nullptr;
      for (auto& [res, t] : c.thread_of) {
        if (!depends_on(s->src(1), res) || depends_on(index, t)) continue;
        const UOp* first = m.g.alu(Op::CMPLT, {t, m.g.idx(1)});
        gate = gate ? m.g.alu(Op::AND, {gate, first}) : first;
      }
      if (!gate) return nullptr;
      std::vector<const UOp*> isrc(index->src().begin(), index->src().end());
      if (isrc.size() > 2 && isrc.back()->dtype().is_bool()) isrc.back() = m.g.alu(Op::AND, {isrc.back(), gate});
      else isrc.push_back(gate);
      std::vector<const UOp*> src(s->src().begin(), s->src().end());
      src[0] = m.g.make(Op::INDEX, index->dtype(), isrc, index->arg());
      const UOp* out = m.g.make(Op::STORE, s->dtype(), src, s->arg());
      c.gated.insert(out);
      return out;
    }, "store.one_thread");
    return rs;
  }();
  return rs;
}

}  // namespace

absl::StatusOr<const UOp*> group_reduce(Graph& g, const UOp* kernel) {
  Ctx c;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::RANGE && u->arg_as<RangeArg>().type == AxisType::Local) {
      const ConstValue* e = u->src(0)->const_value();
      if (!e || e->to_int() < 1 || e->to_int() > 1024)
        return absl::InternalError("group_reduce: a Local range needs a constant extent in 1 .. 1024");
      c.locals.push_back(u);
    }
  auto k = rw::graph_rewrite(g, kernel, rules(), &c);
  if (!k.ok()) return k.status();
  if (!c.error.ok()) return c.error;
  return k;
}

}  // namespace uop
