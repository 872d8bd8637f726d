#include "compiler/passes/unit_ranges.h"

#include "compiler/ir/eval.h"
#include "compiler/rewrite/graph_rewrite.h"

namespace uop {
namespace {

// Whether `x` closes a loop with no iterations.
bool closes_empty(const UOp* x) {
  for (const UOp* r : x->src().subspan(static_cast<size_t>(op_info(x->op()).range_start)))
    if (r->op() == Op::RANGE && r->src(0)->const_value() && r->src(0)->const_value()->to_int() <= 0) return true;
  return false;
}

const rw::RuleSet& rules() {
  static const rw::RuleSet rs = [] {
    using rw::op;
    rw::RuleSet rs("unit_ranges");
    rs.add(op(Op::RANGE, {rw::cnst(1)}), [](const rw::Match& m) { return m.g.idx(0); }, "range.one");
    rs.add(op(Op::REDUCE).named("r"), [](const rw::Match& m) -> const UOp* {
      const UOp* r = m["r"];
      if (!closes_empty(r)) return nullptr;
      return m.g.cnst(r->dtype(), reduce_identity(r->arg_as<ReduceOpArg>().op, r->dtype().scalar));
    }, "reduce.empty");
    rs.add(op(Op::SINK).named("s"), [](const rw::Match& m) -> const UOp* {
      const UOp* s = m["s"];
      std::vector<const UOp*> keep;
      for (const UOp* x : s->src())
        if (!((x->op() == Op::STORE || x->op() == Op::END) && closes_empty(x))) keep.push_back(x);
      if (keep.size() == s->num_src()) return nullptr;
      return m.g.make(Op::SINK, s->dtype(), keep, s->arg());
    }, "sink.empty_loops");
    // A closed "range" that is no longer a RANGE (it was one iteration) is dropped.
    rs.add(op({Op::STORE, Op::REDUCE, Op::END}).named("x"), [](const rw::Match& m) -> const UOp* {
      const UOp* x = m["x"];
      size_t start = static_cast<size_t>(op_info(x->op()).range_start);
      std::vector<const UOp*> src(x->src().begin(), x->src().begin() + start);
      for (const UOp* r : x->src().subspan(start))
        if (r->op() == Op::RANGE) src.push_back(r);
      if (src.size() == x->num_src()) return nullptr;
      if (x->op() == Op::END && src.size() == 1) return src[0];  // nothing left to close
      return m.g.make(x->op(), x->dtype(), src, x->arg());
    }, "closed.drop_constant");
    return rs;
  }();
  return rs;
}

}  // namespace

absl::StatusOr<const UOp*> drop_unit_ranges(Graph& g, const UOp* root) {
  return rw::graph_rewrite(g, root, rules());
}

}  // namespace uop
