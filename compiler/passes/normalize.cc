#include "compiler/passes/normalize.h"

#include "absl/container/flat_hash_map.h"
#include "compiler/rewrite/graph_rewrite.h"

namespace uop {
namespace {

struct Ctx {
  absl::flat_hash_map<const UOp*, int64_t> slot;     // BUFFER -> slot
  absl::flat_hash_map<const UOp*, int64_t> axis;     // RANGE -> new axis id
};

const rw::RuleSet& rules() {
  static const rw::RuleSet rs = [] {
    rw::RuleSet rs("normalize");
    rs.add(rw::op(Op::BUFFER).named("b"), [](const rw::Match& m) -> const UOp* {
      const UOp* b = m["b"];
      int64_t size = b->arg_as<BufferArg>().size;
      int64_t slot = m.ctx<Ctx>()->slot.at(b);
      return m.g.make(Op::PARAM, b->dtype().ptr_to(AddrSpace::Global, size), {}, ParamArg{slot, size});
    }, "buffer.param");
    rs.add(rw::op(Op::RANGE).named("r"), [](const rw::Match& m) -> const UOp* {
      const UOp* r = m["r"];
      RangeArg a = r->arg_as<RangeArg>();
      auto it = m.ctx<Ctx>()->axis.find(r);
      if (it == m.ctx<Ctx>()->axis.end()) return nullptr;
      a.axis_id = it->second;
      a.renumbered = true;
      return m.g.make(Op::RANGE, r->dtype(), r->src(), a);
    }, "range.renumber");
    return rs;
  }();
  return rs;
}

}  // namespace

absl::StatusOr<const UOp*> normalize(Graph& g, const UOp* kernel) {
  Ctx ctx;
  for (const UOp* u : toposort(kernel)) {
    if (u->op() == Op::BUFFER) ctx.slot.emplace(u, static_cast<int64_t>(ctx.slot.size()));
    if (u->op() == Op::RANGE) ctx.axis.emplace(u, static_cast<int64_t>(ctx.axis.size()));
  }
  return rw::graph_rewrite(g, kernel, rules(), &ctx);
}

}  // namespace uop
