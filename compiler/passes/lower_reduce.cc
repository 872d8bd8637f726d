#include "compiler/passes/lower_reduce.h"

#include <algorithm>

#include "compiler/ir/eval.h"
#include "compiler/rewrite/graph_rewrite.h"

namespace uop {

const std::vector<const UOp*>& RangeSets::of(const UOp* root) {
  if (auto it = memo_.find(root); it != memo_.end()) return it->second;
  for (const UOp* u : toposort(root)) {
    if (memo_.contains(u)) continue;
    std::vector<const UOp*> s;
    if (u->op() == Op::RANGE) s.push_back(u);
    for (const UOp* src : u->src()) {
      const auto& ss = memo_.at(src);
      s.insert(s.end(), ss.begin(), ss.end());
    }
    int rs = op_info(u->op()).range_start;
    if (rs >= 0 && (u->op() == Op::END || u->op() == Op::REDUCE)) {
      for (const UOp* closed : u->src().subspan(rs)) s.erase(std::remove(s.begin(), s.end(), closed), s.end());
    }
    std::sort(s.begin(), s.end(), [](const UOp* a, const UOp* b) {
      return a->arg_as<RangeArg>().axis_id < b->arg_as<RangeArg>().axis_id || (a->arg_as<RangeArg>().axis_id == b->arg_as<RangeArg>().axis_id && a->id() < b->id());
    });
    s.erase(std::unique(s.begin(), s.end()), s.end());
    memo_.emplace(u, std::move(s));
  }
  return memo_.at(root);
}

namespace {

struct Ctx {
  RangeSets ranges;
  int64_t next_reg = 0;
};


// The reduction's starting value, one per lane for a vector accumulator.
const UOp* identity(Graph& g, ReduceOp op, DType dt) {
  ConstValue v = reduce_identity(op, dt.scalar);
  if (dt.count == 1) return g.cnst(dt, v);
  return g.make(Op::VCONST, dt, {}, VConstArg{std::vector<ConstValue>(dt.count, v)});
}

// END(x, r1, ..., rn) closing r1 outermost: END(...END(x, rn)..., r1).
const UOp* nest_ends(Graph& g, const UOp* x, std::span<const UOp* const> ranges) {
  for (size_t i = ranges.size(); i-- > 0;) x = g.make(Op::END, dtypes::void_, {x, ranges[i]});
  return x;
}

const rw::RuleSet& rules() {
  static const rw::RuleSet rs = [] {
    using rw::op;
    rw::RuleSet rs("lower_reduce");
    rs.add(op(Op::STORE).named("s"), [](const rw::Match& m) -> const UOp* {
      const UOp* s = m["s"];
      if (s->num_src() <= 2) return nullptr;
      const UOp* store = m.g.make(Op::STORE, dtypes::void_, {s->src(0), s->src(1)});
      return nest_ends(m.g, store, s->src().subspan(2));
    }, "store.ends");
    rs.add(op(Op::END).named("e"), [](const rw::Match& m) -> const UOp* {
      const UOp* e = m["e"];
      if (e->num_src() <= 2) return nullptr;
      return nest_ends(m.g, e->src(0), e->src().subspan(1));
    }, "end.nest");
    rs.add(op(Op::REDUCE).named("r"), [](const rw::Match& m) -> const UOp* {
      Graph& g = m.g;
      Ctx& c = *m.ctx<Ctx>();
      const UOp* r = m["r"];
      const UOp* value = r->src(0);
      auto own = r->src().subspan(1);
      ReduceOp rop = r->arg_as<ReduceOpArg>().op;
      DType dt = r->dtype();
      // Over no range the fold is identity (op) value, which is not always the value: a
      // float sum gives 0.0 + -0.0 = +0.0.
      if (own.empty()) return g.alu(reduce_combine_op(rop), {g.cnst(dt, reduce_identity(rop, dt.scalar)), value});
      std::vector<const UOp*> outer;
      for (const UOp* x : c.ranges.of(value))
        if (std::find(own.begin(), own.end(), x) == own.end()) outer.push_back(x);

      const UOp* acc = g.make(Op::DEFINE_REG, dt.ptr_to(AddrSpace::Reg, 1), {}, DefineRegArg{1, c.next_reg++});
      const UOp* zero = g.idx(0);
      std::vector<const UOp*> pin{acc};
      pin.insert(pin.end(), outer.begin(), outer.end());
      const UOp* init = g.make(Op::STORE, dtypes::void_,
                               {g.make(Op::INDEX, dt, {g.make(Op::AFTER, acc->dtype(), pin), zero}), identity(g, rop, dt)});
      std::vector<const UOp*> inside{acc, init};
      inside.insert(inside.end(), own.begin(), own.end());
      const UOp* cur = g.make(Op::INDEX, dt, {g.make(Op::AFTER, acc->dtype(), inside), zero});
      const UOp* prev = g.make(Op::LOAD, dt, {acc, cur});
      // A float sum of products accumulates with a fused multiply-add: one rounding
      // instead of two, within the reassociation the reduction is allowed anyway.
      const UOp* next = rop == ReduceOp::Add && value->op() == Op::MUL && dt.is_float()
                            ? g.make(Op::MULACC, dt, {value->src(0), value->src(1), prev})
                            : g.alu(reduce_combine_op(rop), {prev, value});
      const UOp* loop = nest_ends(g, g.make(Op::STORE, dtypes::void_, {cur, next}), own);
      const UOp* done = g.make(Op::INDEX, dt, {g.make(Op::AFTER, acc->dtype(), {acc, loop}), zero});
      return g.make(Op::LOAD, dt, {acc, done});
    }, "reduce.accumulator");
    return rs;
  }();
  return rs;
}

}  // namespace

absl::StatusOr<const UOp*> lower_reduce(Graph& g, const UOp* kernel) {
  Ctx ctx;
  return rw::graph_rewrite(g, kernel, rules(), &ctx);
}

}  // namespace uop
