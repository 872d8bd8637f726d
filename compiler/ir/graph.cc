#include <cassert>

#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/uop.h"

namespace uop {

namespace {
const Arg kNoArg{NoArg{}};
}  // namespace

Graph::Graph() = default;

Graph::~Graph() {
  for (size_t i = 0; i < count_; ++i)
    reinterpret_cast<UOp*>(chunks_[i / kChunk].get() + (i % kChunk) * sizeof(UOp))->~UOp();
}

size_t Graph::hash_of(Op op, const DType& dtype, std::span<const UOp* const> src, const Arg& arg) {
  return absl::HashOf(op, dtype, absl::MakeConstSpan(src.data(), src.size()), hash_arg(arg));
}

bool Graph::Eq::operator()(const Key& k, const UOp* u) const {
  if (k.hash != u->structural_hash() || k.op != u->op() || !(*k.dtype == u->dtype()) ||
      k.src.size() != u->num_src())
    return false;
  for (size_t i = 0; i < k.src.size(); ++i)
    if (k.src[i] != u->src(i)) return false;
  return *k.arg == u->arg();
}

const UOp* Graph::make(Op op, DType dtype, std::span<const UOp* const> src, Arg arg) {
  assert(arg_kind(arg) == op_info(op).arg && "arg kind must match the op (ops.def)");
  Key key{op, &dtype, src, &arg, hash_of(op, dtype, src, arg)};
  if (auto it = interned_.find(key); it != interned_.end()) return *it;
  const UOp** stored = nullptr;
  if (!src.empty()) {
    stored = static_cast<const UOp**>(src_pool_.allocate(src.size() * sizeof(const UOp*), alignof(const UOp*)));
    std::copy(src.begin(), src.end(), stored);
  }
  const Arg* stored_arg = std::holds_alternative<NoArg>(arg) ? &kNoArg : &args_.emplace_back(std::move(arg));
  if (count_ % kChunk == 0) chunks_.emplace_back(new unsigned char[kChunk * sizeof(UOp)]);  // operator new[] aligns for max_align_t
  void* slot = chunks_.back().get() + (count_ % kChunk) * sizeof(UOp);
  const UOp* u = new (slot) UOp(UOp::Passkey(), op, dtype, stored, static_cast<uint32_t>(src.size()), stored_arg,
                                static_cast<uint32_t>(count_), key.hash);
  ++count_;
  interned_.insert(u);
  return u;
}

const UOp* Graph::make(Op op, DType dtype, std::span<const UOp* const> src) {
  return make(op, dtype, src, default_arg(op_info(op).arg));
}

const UOp* Graph::replace_src(const UOp* u, std::span<const UOp* const> src) {
  if (src.size() == u->num_src() && std::equal(src.begin(), src.end(), u->src().begin())) return u;
  return make(u->op(), u->dtype(), src, u->arg());
}

const UOp* Graph::replace_dtype(const UOp* u, DType dtype) {
  if (dtype == u->dtype()) return u;
  return make(u->op(), dtype, u->src(), u->arg());
}

const UOp* Graph::cnst(DType dtype, ConstValue v) {
  return make(Op::CONST, dtype, {}, cast_value(v, dtype.scalar));
}

const UOp* Graph::alu(Op op, std::span<const UOp* const> src) {
  assert(!src.empty());
  DType dt = src[0]->dtype();
  if (is_comparison(op)) dt = dtypes::bool_.vec(dt.count);
  else if (op == Op::WHERE && src.size() == 3) dt = src[1]->dtype();
  return make(op, dt, src);
}

const UOp* Graph::alu(Op op, std::initializer_list<const UOp*> src) {
  return alu(op, std::span<const UOp* const>(src.begin(), src.size()));
}

std::vector<const UOp*> toposort(std::span<const UOp* const> roots) {
  std::vector<const UOp*> order;
  absl::flat_hash_set<const UOp*> seen;
  struct Frame { const UOp* u; size_t next; };
  std::vector<Frame> stack;
  for (const UOp* root : roots) {
    if (!root || !seen.insert(root).second) continue;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (f.next < f.u->num_src()) {
        const UOp* s = f.u->src(f.next++);
        if (seen.insert(s).second) stack.push_back({s, 0});
      } else {
        order.push_back(f.u);
        stack.pop_back();
      }
    }
  }
  return order;
}

const UOp* substitute(Graph& g, const UOp* root, const absl::flat_hash_map<const UOp*, const UOp*>& replace) {
  absl::flat_hash_map<const UOp*, const UOp*> done(replace.begin(), replace.end());
  struct Frame { const UOp* u; size_t next; };
  std::vector<Frame> stack;
  if (!done.contains(root)) stack.push_back({root, 0});
  std::vector<const UOp*> src;
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next < f.u->num_src()) {
      const UOp* s = f.u->src(f.next++);
      if (!done.contains(s)) stack.push_back({s, 0});
      continue;
    }
    src.clear();
    for (const UOp* s : f.u->src()) src.push_back(done.at(s));
    done.emplace(f.u, g.replace_src(f.u, src));
    stack.pop_back();
  }
  return done.at(root);
}

const UOp* clone_into(Graph& dst, const UOp* root) {
  absl::flat_hash_map<const UOp*, const UOp*> done;
  std::vector<const UOp*> src;
  for (const UOp* u : toposort(root)) {
    src.clear();
    for (const UOp* s : u->src()) src.push_back(done.at(s));
    done.emplace(u, dst.make(u->op(), u->dtype(), src, u->arg()));
  }
  return done.at(root);
}

NodeIndex index_by_toposort(const UOp* root) {
  NodeIndex index;
  auto order = toposort(root);
  index.reserve(order.size());
  for (size_t i = 0; i < order.size(); ++i) index.emplace(order[i], static_cast<uint32_t>(i));
  return index;
}

}  // namespace uop
