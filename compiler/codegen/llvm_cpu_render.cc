// LINEAR -> LLVM module (render_module, llvm_cpu_render.h).
//
// The module has two functions. `uop_body` takes one noalias pointer per buffer and one
// i64 per variable, which is what lets the loop vectorizer prove that stores do not
// clobber loads; `uop_kernel` is the C entry point of PIPELINE.md: it checks the task
// numbers, loads the pointers and variables (with their ABI bounds as !range) and calls
// the body, which the inliner folds into it. The LINEAR is emitted op by op in its own
// order; RANGE / END and IF / ENDIF open and close blocks, and a value may only be used
// where its defining block dominates (checked, so bad input is an error, not bad IR).
// Value lowering (ALU, CAST, BITCAST, constants) is in llvm_cpu_alu.cc.
//
// Stop checks (stop_checks.h): a loop checked every iteration reads the stop word at its
// latch; one checked every K iterations is strip-mined into chunks of K, read once per
// chunk, so its body loop is the same loop as without a check. The read is a
// monotonic (relaxed) atomic load, which LLVM neither hoists out of the loop nor deletes
// with it; a set word branches to a block that returns.
#include "compiler/codegen/llvm_cpu_render.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "compiler/codegen/llvm_cpu_alu.h"
#include "compiler/codegen/stop_checks.h"
#include "compiler/support/strings.h"

namespace uop::llvm_cpu {
namespace {

using llvm::BasicBlock;
using llvm::Value;

// DEFINE_REG lives on the task's stack; keep it well under a pool thread's 8 MiB.
constexpr int64_t kMaxRegBytes = 1 << 20;

// What an emitted op stands for. Buffers and addresses are pointers with the dtype of
// what they point at; `scope` is the block that computed the value (0: the function's
// entry, usable anywhere).
struct Emitted {
  enum class Kind { None, Value, Buffer, Address };
  Kind kind = Kind::None;
  Value* v = nullptr;
  Value* gate = nullptr;  // Address only: the INDEX's gate
  DType mem;              // Buffer / Address: the element dtype in memory
  int scope = 0;
};

struct Scope {
  int id;
  const UOp* node;   // RANGE or IF
  BasicBlock* header = nullptr;  // RANGE: the block with the induction phi
  BasicBlock* exit = nullptr;    // where control goes after the loop / the IF
  llvm::PHINode* iv = nullptr;
  bool check_each = false;  // a RANGE checked every iteration: at its latch
  // A RANGE strip-mined for its stop check: the chunk loop around the body loop.
  BasicBlock* next_chunk = nullptr;  // where the body loop goes when its chunk is done
  llvm::PHINode* chunk_start = nullptr;
  Value* chunk_end = nullptr;
};

class Renderer {
 public:
  Renderer(llvm::Module& m, const KernelAbi& abi, const CpuTarget& target, const UOp* linear, bool stop_checks)
      : m_(m), ctx_(m.getContext()), abi_(abi), target_(target), ix_(index_by_toposort(linear)),
        b_(ctx_), entry_b_(ctx_) {
    if (stop_checks) stop_plan_ = plan_stop_checks(linear);
  }

  absl::Status render(const UOp* linear) {
    make_functions();
    for (const UOp* u : linear->src()) {
      if (done_.contains(u)) {
        if (is_definition(u)) continue;  // made on an earlier use
        return bad(u, "listed twice in the LINEAR [linear.order]");
      }
      if (auto st = emit(u); !st.ok()) return st;
    }
    if (!scopes_.empty())
      return bad(scopes_.back().node, "RANGE / IF is never closed [linear.scope]");
    b_.CreateRetVoid();
    return absl::OkStatus();
  }

 private:
  absl::Status bad(const UOp* u, std::string_view why) const {
    auto it = ix_.find(u);
    return absl::InvalidArgumentError(
        cat("node ", it == ix_.end() ? 0u : it->second, " (", op_name(u->op()), "): ", why));
  }

  void make_functions() {
    llvm::Type* ptr = b_.getPtrTy();
    llvm::Type* i64 = b_.getInt64Ty();
    std::vector<llvm::Type*> args(abi_.params.size(), ptr);
    args.insert(args.end(), abi_.vars.size() + 2, i64);
    args.push_back(ptr);  // the stop word
    auto* body_ty = llvm::FunctionType::get(b_.getVoidTy(), args, false);
    body_ = llvm::Function::Create(body_ty, llvm::Function::InternalLinkage, "uop_body", m_);
    for (size_t i = 0; i < abi_.params.size(); ++i) {
      const KernelParam& p = abi_.params[i];
      llvm::Argument* a = body_->getArg(i);
      // Distinct buffers (the runtime refuses overlapping written ones).
      a->addAttr(llvm::Attribute::NoAlias);
      a->addAttr(llvm::Attribute::NoCapture);
      a->addAttr(llvm::Attribute::NoUndef);
      a->addAttrs(llvm::AttrBuilder(ctx_).addAlignmentAttr(llvm::Align(std::max(1, p.dtype.itemsize()))));
      if (p.size > 0 && p.size <= INT64_MAX / std::max<int64_t>(1, p.dtype.bytes()))
        a->addAttrs(llvm::AttrBuilder(ctx_).addDereferenceableAttr(p.size * p.dtype.bytes()));
      if (p.read != p.written) a->addAttr(p.read ? llvm::Attribute::ReadOnly : llvm::Attribute::WriteOnly);
      if (!p.read && !p.written) a->addAttr(llvm::Attribute::ReadNone);
      slot_arg_[p.slot] = a;
    }
    for (size_t i = abi_.params.size(); i < args.size(); ++i) body_->getArg(i)->addAttr(llvm::Attribute::NoUndef);
    task_ = body_->getArg(args.size() - 3);
    ntasks_ = body_->getArg(args.size() - 2);
    llvm::Argument* stop = body_->getArg(args.size() - 1);
    stop->addAttr(llvm::Attribute::NoCapture);
    stop->addAttr(llvm::Attribute::ReadOnly);
    stop->addAttr(llvm::Attribute::NonNull);
    stop->addAttrs(llvm::AttrBuilder(ctx_).addAlignmentAttr(llvm::Align(4)).addDereferenceableAttr(4));
    stop_ = stop;
    set_target_attrs(body_);

    BasicBlock* entry = BasicBlock::Create(ctx_, "entry", body_);
    BasicBlock* start = BasicBlock::Create(ctx_, "start", body_);
    entry_b_.SetInsertPoint(entry);
    entry_b_.SetInsertPoint(entry_b_.CreateBr(start));  // allocas go before this branch
    b_.SetInsertPoint(start);
    make_entry_point(body_ty);
  }

  void set_target_attrs(llvm::Function* f) {
    f->addFnAttr(llvm::Attribute::NoUnwind);
    if (!target_.cpu.empty()) f->addFnAttr("target-cpu", target_.cpu);
    if (!target_.features.empty()) f->addFnAttr("target-features", target_.features);
  }

  // void uop_kernel(void* const* buffers, const int64_t* vars, int64_t task, int64_t ntasks,
  //                 const uint32_t* stop)
  void make_entry_point(llvm::FunctionType* body_ty) {
    llvm::Type* ptr = b_.getPtrTy();
    llvm::Type* i64 = b_.getInt64Ty();
    auto* ty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, ptr, i64, i64, ptr}, false);
    llvm::Function* f = llvm::Function::Create(ty, llvm::Function::ExternalLinkage, "uop_kernel", m_);
    set_target_attrs(f);
    llvm::IRBuilder<> b(BasicBlock::Create(ctx_, "entry", f));
    Value* task = f->getArg(2);
    Value* ntasks = f->getArg(3);
    // Out-of-range task numbers do nothing; without a Thread range only task 0 runs.
    Value* ok = b.CreateAnd(b.CreateAnd(b.CreateICmpSGE(ntasks, b.getInt64(1)), b.CreateICmpSGE(task, b.getInt64(0))),
                            b.CreateICmpSLT(task, ntasks));
    if (!abi_.has_thread_range) ok = b.CreateAnd(ok, b.CreateICmpEQ(task, b.getInt64(0)));
    BasicBlock* run = BasicBlock::Create(ctx_, "run", f);
    BasicBlock* done = BasicBlock::Create(ctx_, "done", f);
    b.CreateCondBr(ok, run, done);
    b.SetInsertPoint(run);
    std::vector<Value*> args;
    for (const KernelParam& p : abi_.params)
      args.push_back(b.CreateAlignedLoad(ptr, b.CreateConstInBoundsGEP1_64(ptr, f->getArg(0), p.slot), llvm::Align(8)));
    llvm::MDBuilder md(ctx_);
    for (size_t k = 0; k < abi_.vars.size(); ++k) {
      auto* ld = b.CreateAlignedLoad(i64, b.CreateConstInBoundsGEP1_64(i64, f->getArg(1), k), llvm::Align(8));
      const KernelVar& v = abi_.vars[k];
      // The runtime checks the bounds before a launch; [min, max + 1) wraps at INT64_MAX.
      llvm::APInt lo(64, v.min, true), hi = llvm::APInt(64, v.max, true) + 1;
      if (lo != hi) ld->setMetadata(llvm::LLVMContext::MD_range, md.createRange(lo, hi));
      args.push_back(ld);
    }
    args.push_back(task);
    args.push_back(ntasks);
    args.push_back(f->getArg(4));
    b.CreateCall(body_ty, body_, args);
    b.CreateBr(done);
    b.SetInsertPoint(done);
    b.CreateRetVoid();
  }

  bool in_scope(int id) const {
    if (id == 0) return true;
    for (const Scope& s : scopes_)
      if (s.id == id) return true;
    return false;
  }

  // Definitions the linearizer may leave out of the list or list late (constants, PARAM,
  // DEFINE_VAR) are made on first use; they are valid anywhere.
  static bool is_definition(const UOp* s) {
    return s->is(Op::CONST) || s->is(Op::VCONST) || s->is(Op::PARAM) || s->is(Op::DEFINE_VAR);
  }

  // The emitted form of source `s` of `u`, if `u` may use it here.
  absl::StatusOr<const Emitted*> get(const UOp* u, const UOp* s) {
    auto it = done_.find(s);
    if (it == done_.end()) {
      if (!is_definition(s))
        return bad(u, cat("uses node ", ix_.at(s), " (", op_name(s->op()), ") before it is listed [linear.order]"));
      if (auto st = emit(s); !st.ok()) return st;
      it = done_.find(s);
    }
    if (!in_scope(it->second.scope))
      return bad(u, cat("uses node ", ix_.at(s), " (", op_name(s->op()),
                        ") outside the RANGE / IF that computes it [linear.scope]"));
    return &it->second;
  }

  absl::StatusOr<Value*> value(const UOp* u, const UOp* s) {
    auto e = get(u, s);
    if (!e.ok()) return e.status();
    if ((*e)->kind != Emitted::Kind::Value)
      return bad(u, cat("operand node ", ix_.at(s), " (", op_name(s->op()), ") is not a value [linear.operand]"));
    return (*e)->v;
  }

  // An index-typed scalar as i64.
  absl::StatusOr<Value*> index_value(const UOp* u, const UOp* s) {
    if (s->dtype().is_vector() || !(s->dtype().is_int() || s->dtype().is_index()))
      return bad(u, cat("needs an integer scalar index, got ", s->dtype().str(), " [linear.index]"));
    auto v = value(u, s);
    if (!v.ok()) return v;
    if (s->dtype().is_unsigned()) return b_.CreateZExtOrTrunc(*v, b_.getInt64Ty());
    return b_.CreateSExtOrTrunc(*v, b_.getInt64Ty());
  }

  // A value or address computed here: usable only inside the current scope.
  void define(const UOp* u, Emitted e) {
    e.scope = current_scope();
    done_[u] = e;
  }
  int current_scope() const { return scopes_.empty() ? 0 : scopes_.back().id; }
  // Exit blocks are made with their RANGE / IF (so the function owns them even if an
  // error stops rendering) and moved to the end when closed, keeping program order.
  void to_end(BasicBlock* bb) {
    if (bb != &body_->back()) bb->moveAfter(&body_->back());
  }

  absl::Status emit(const UOp* u);
  absl::Status emit_vector(const UOp* u);
  absl::Status emit_index(const UOp* u);
  absl::Status emit_load(const UOp* u);
  absl::Status emit_store(const UOp* u);
  absl::Status emit_range(const UOp* u);
  absl::Status emit_end(const UOp* u);
  absl::Status emit_custom(const UOp* u);
  // Reads the stop word here and goes on in a new block, or to the kernel's exit.
  void check_stop();

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  const KernelAbi& abi_;
  const CpuTarget& target_;
  NodeIndex ix_;
  llvm::IRBuilder<> b_;
  llvm::IRBuilder<> entry_b_;  // allocas, in the entry block so SROA / mem2reg promote them
  llvm::Function* body_ = nullptr;
  Value* task_ = nullptr;
  Value* ntasks_ = nullptr;
  Value* stop_ = nullptr;
  StopCheckPlan stop_plan_;
  BasicBlock* stopped_ = nullptr;  // returns: where a set stop word goes
  absl::flat_hash_map<int64_t, Value*> slot_arg_;
  absl::flat_hash_map<const UOp*, Emitted> done_;
  std::vector<Scope> scopes_;
  int next_scope_ = 1;
};

absl::Status Renderer::emit(const UOp* u) {
  using K = Emitted::Kind;
  const Op op = u->op();
  if (is_alu(op) || op == Op::CAST || op == Op::BITCAST) {
    std::vector<Value*> srcs;
    for (const UOp* s : u->src()) {
      auto v = value(u, s);
      if (!v.ok()) return v.status();
      srcs.push_back(*v);
    }
    auto r = lower_alu(b_, u, srcs);
    if (!r.ok()) return bad(u, cat(r.status().message()));
    define(u, {K::Value, *r});
    return absl::OkStatus();
  }
  switch (op) {
    case Op::PARAM: {
      if (!u->dtype().ptr) return bad(u, "PARAM needs a pointer dtype [linear.param]");
      done_[u] = {K::Buffer, slot_arg_.at(u->arg_as<ParamArg>().slot), nullptr, u->dtype().pointee(), 0};
      return absl::OkStatus();
    }
    case Op::DEFINE_VAR: {
      llvm::Type* t = value_type(b_, u->dtype());
      if (!t || !t->isIntegerTy() || u->dtype().is_bool())
        return bad(u, cat("DEFINE_VAR must be an integer scalar, not ", u->dtype().str(), " [linear.var]"));
      Value* arg = body_->getArg(abi_.params.size() + abi_.var_position(u->arg_as<DefineVarArg>().name));
      llvm::IRBuilderBase::InsertPointGuard guard(b_);  // at the entry, so it is valid anywhere
      b_.SetInsertPoint(entry_b_.GetInsertBlock()->getTerminator());
      done_[u] = {K::Value, b_.CreateTrunc(arg, t), nullptr, {}, 0};
      return absl::OkStatus();
    }
    case Op::DEFINE_REG: {
      DType d = u->dtype();
      int64_t size = u->arg_as<DefineRegArg>().size;
      llvm::Type* mt = memory_type(b_, d);
      if (!d.ptr || !mt || size < 1 || size > kMaxRegBytes / std::max<int64_t>(1, d.bytes()))
        return bad(u, cat("DEFINE_REG needs a pointer dtype and 1 to ", kMaxRegBytes, " bytes [linear.reg]"));
      auto* a = entry_b_.CreateAlloca(llvm::ArrayType::get(mt, size), nullptr, "reg");
      a->setAlignment(llvm::Align(std::max(1, d.itemsize())));
      done_[u] = {K::Buffer, a, nullptr, d.pointee(), 0};
      return absl::OkStatus();
    }
    case Op::CONST:
    case Op::VCONST: {
      if (!value_type(b_, u->dtype()))
        return bad(u, cat("a constant of dtype ", u->dtype().str(), " [linear.const]"));
      std::vector<ConstValue> lanes;
      if (op == Op::CONST) lanes.push_back(u->arg_as<ConstValue>());
      else lanes = u->arg_as<VConstArg>().values;
      if (lanes.empty() || (op == Op::VCONST && lanes.size() != u->dtype().count && lanes.size() != 1))
        return bad(u, cat("VCONST has ", lanes.size(), " values for ", u->dtype().str(), " [linear.const]"));
      done_[u] = {K::Value, constant(b_, u->dtype(), lanes), nullptr, {}, 0};
      return absl::OkStatus();
    }
    case Op::VECTORIZE: case Op::CAT: case Op::GEP: return emit_vector(u);
    case Op::INDEX: return emit_index(u);
    case Op::LOAD: return emit_load(u);
    case Op::STORE: return emit_store(u);
    case Op::RANGE: return emit_range(u);
    case Op::END: return emit_end(u);
    case Op::CUSTOM: return emit_custom(u);
    case Op::AFTER: {
      for (const UOp* dep : u->src().subspan(1))
        if (!done_.contains(dep)) return bad(u, cat("depends on node ", ix_.at(dep), " before it is listed [linear.order]"));
      auto e = get(u, u->src(0));
      if (!e.ok()) return e.status();
      // AFTER only orders: it is its first source. A copy first: *e points into done_,
      // which the insertion may rehash.
      Emitted first = **e;
      done_[u] = first;
      return absl::OkStatus();
    }
    case Op::IF: {
      const UOp* c = u->src(0);
      if (c->dtype() != dtypes::bool_) return bad(u, "IF needs a scalar bool condition [linear.if]");
      auto cond = value(u, c);
      if (!cond.ok()) return cond.status();
      BasicBlock* then = BasicBlock::Create(ctx_, "then", body_);
      BasicBlock* merge = BasicBlock::Create(ctx_, "endif", body_);
      b_.CreateCondBr(*cond, then, merge);
      b_.SetInsertPoint(then);
      scopes_.push_back({next_scope_++, u, nullptr, merge, nullptr});
      done_[u] = {};
      return absl::OkStatus();
    }
    case Op::ENDIF: {
      if (scopes_.empty() || scopes_.back().node != u->src(0))
        return bad(u, "ENDIF does not close the innermost open IF [linear.scope]");
      BasicBlock* merge = scopes_.back().exit;
      scopes_.pop_back();
      b_.CreateBr(merge);
      to_end(merge);
      b_.SetInsertPoint(merge);
      done_[u] = {};
      return absl::OkStatus();
    }
    case Op::SINK: case Op::BARRIER: case Op::DEVICE: case Op::GROUP:  // one thread per task: nothing to do
      done_[u] = {};
      return absl::OkStatus();
    default:
      return bad(u, cat(op_name(op), " is not supported by the LLVM CPU backend [llvm_cpu.op]"));
  }
}

absl::Status Renderer::emit_vector(const UOp* u) {
  std::vector<Value*> srcs;
  for (const UOp* s : u->src()) {
    auto v = value(u, s);
    if (!v.ok()) return v.status();
    srcs.push_back(*v);
  }
  auto r = lower_vector(b_, u, srcs);
  if (!r.ok()) return bad(u, cat(r.status().message()));
  define(u, {Emitted::Kind::Value, *r});
  return absl::OkStatus();
}

absl::Status Renderer::emit_index(const UOp* u) {
  size_t n = u->num_src();
  bool gated = n >= 3 && u->src(n - 1)->dtype().scalar == Scalar::Bool;
  if (n != (gated ? 3u : 2u)) return bad(u, "INDEX needs one linear index and an optional gate [linear.index]");
  auto buf = get(u, u->src(0));
  if (!buf.ok()) return buf.status();
  if ((*buf)->kind != Emitted::Kind::Buffer) return bad(u, "INDEX of something that is not a buffer [linear.index]");
  auto i = index_value(u, u->src(1));
  if (!i.ok()) return i.status();
  Value* gate = nullptr;
  if (gated) {
    auto g = value(u, u->src(2));
    if (!g.ok()) return g.status();
    gate = *g;
  }
  DType mem = (*buf)->mem;
  llvm::Type* et = memory_type(b_, mem);
  // Ungated indices are proven in bounds (stage 8); a gated one may point anywhere.
  Value* addr = gated ? b_.CreateGEP(et, (*buf)->v, *i) : b_.CreateInBoundsGEP(et, (*buf)->v, *i);
  define(u, {Emitted::Kind::Address, addr, gate, mem});
  return absl::OkStatus();
}

absl::Status Renderer::emit_load(const UOp* u) {
  auto a = get(u, u->src(1));
  if (!a.ok()) return a.status();
  const Emitted addr = **a;
  DType d = u->dtype();
  if (addr.kind != Emitted::Kind::Address) return bad(u, "LOAD needs an INDEX as its second source [linear.load]");
  if (d.ptr || d.scalar != addr.mem.scalar || !value_type(b_, d))
    return bad(u, cat("LOAD of ", d.str(), " from a buffer of ", addr.mem.str(), " [linear.load]"));
  llvm::Type* mt = memory_type(b_, d);
  llvm::Align align(std::max(1, d.itemsize()));
  if (!addr.gate) {
    define(u, {Emitted::Kind::Value, from_memory(b_, b_.CreateAlignedLoad(mt, addr.v, align), d)});
    return absl::OkStatus();
  }
  Value* alt = llvm::Constant::getNullValue(value_type(b_, d));
  if (u->num_src() > 2) {
    const UOp* s = u->src(2);
    if (s->dtype() != d && s->dtype() != d.element())
      return bad(u, cat("LOAD alt of ", s->dtype().str(), " for a LOAD of ", d.str(), " [linear.load]"));
    auto v = value(u, s);
    if (!v.ok()) return v.status();
    alt = s->dtype() == d ? *v : b_.CreateVectorSplat(d.count, *v);
  }
  if (addr.gate->getType()->isVectorTy()) {  // one gate per lane: lanes that are off are not read
    if (llvm::cast<llvm::FixedVectorType>(addr.gate->getType())->getNumElements() != d.count)
      return bad(u, "a per-lane gate needs one lane per loaded element [linear.load]");
    Value* r = b_.CreateMaskedLoad(mt, addr.v, align, addr.gate, to_memory(b_, alt, d));
    define(u, {Emitted::Kind::Value, from_memory(b_, r, d)});
    return absl::OkStatus();
  }
  BasicBlock* from = b_.GetInsertBlock();
  BasicBlock* load = BasicBlock::Create(ctx_, "gated.load", body_);
  BasicBlock* join = BasicBlock::Create(ctx_, "gated.join", body_);
  b_.CreateCondBr(addr.gate, load, join);
  b_.SetInsertPoint(load);
  Value* x = from_memory(b_, b_.CreateAlignedLoad(mt, addr.v, align), d);
  BasicBlock* loaded = b_.GetInsertBlock();
  b_.CreateBr(join);
  b_.SetInsertPoint(join);
  llvm::PHINode* phi = b_.CreatePHI(x->getType(), 2);
  phi->addIncoming(x, loaded);
  phi->addIncoming(alt, from);
  define(u, {Emitted::Kind::Value, phi});
  return absl::OkStatus();
}

absl::Status Renderer::emit_store(const UOp* u) {
  // Sources past the value are ranges the STORE closes at kernel level; at linear level
  // END closes them, so they only order here.
  auto a = get(u, u->src(0));
  if (!a.ok()) return a.status();
  const Emitted addr = **a;
  DType d = u->src(1)->dtype();
  if (addr.kind != Emitted::Kind::Address) return bad(u, "STORE needs an INDEX as its first source [linear.store]");
  if (d.ptr || d.scalar != addr.mem.scalar) return bad(u, cat("STORE of ", d.str(), " into a buffer of ", addr.mem.str(), " [linear.store]"));
  auto v = value(u, u->src(1));
  if (!v.ok()) return v.status();
  Value* mv = to_memory(b_, *v, d);
  llvm::Align align(std::max(1, d.itemsize()));
  if (!addr.gate) {
    b_.CreateAlignedStore(mv, addr.v, align);
  } else if (addr.gate->getType()->isVectorTy()) {
    if (llvm::cast<llvm::FixedVectorType>(addr.gate->getType())->getNumElements() != d.count)
      return bad(u, "a per-lane gate needs one lane per stored element [linear.store]");
    b_.CreateMaskedStore(mv, addr.v, align, addr.gate);
  } else {
    BasicBlock* store = BasicBlock::Create(ctx_, "gated.store", body_);
    BasicBlock* join = BasicBlock::Create(ctx_, "gated.join", body_);
    b_.CreateCondBr(addr.gate, store, join);
    b_.SetInsertPoint(store);
    b_.CreateAlignedStore(mv, addr.v, align);
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
  }
  done_[u] = {};
  return absl::OkStatus();
}

absl::Status Renderer::emit_range(const UOp* u) {
  auto end = index_value(u, u->src(0));
  if (!end.ok()) return end.status();
  if (u->dtype() != dtypes::index && !(u->dtype().is_int() && !u->dtype().is_vector()))
    return bad(u, "RANGE must be an integer scalar [linear.range]");
  Value* lo = b_.getInt64(0);
  Value* hi = *end;
  if (u->arg_as<RangeArg>().type == AxisType::Thread) {
    // Task t covers [t*N/ntasks, (t+1)*N/ntasks), computed as t*q + t*r/ntasks
    // (N = q*ntasks + r) so that nothing overflows.
    Value* n = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, *end, b_.getInt64(0));
    Value* q = b_.CreateUDiv(n, ntasks_);
    Value* r = b_.CreateURem(n, ntasks_);
    auto bound = [&](Value* t) { return b_.CreateAdd(b_.CreateMul(t, q), b_.CreateUDiv(b_.CreateMul(t, r), ntasks_)); };
    lo = bound(task_);
    hi = bound(b_.CreateAdd(task_, b_.getInt64(1)));
  }
  auto checked = stop_plan_.find(u);
  const int64_t every = checked == stop_plan_.end() ? 0 : checked->second;
  BasicBlock* exit = BasicBlock::Create(ctx_, "loop.exit", body_);
  Scope scope{next_scope_++, u, nullptr, exit, nullptr};
  if (every > 1) {
    // Chunks of `every` iterations: [c, c + min(every, hi - c)) for c = lo, lo + every, ...
    // hi - c > 0 inside, and c + that <= hi, so nothing wraps.
    BasicBlock* pre = b_.GetInsertBlock();
    BasicBlock* chunk = BasicBlock::Create(ctx_, "chunk", body_);
    BasicBlock* chunk_body = BasicBlock::Create(ctx_, "chunk.body", body_);
    scope.next_chunk = BasicBlock::Create(ctx_, "chunk.next", body_);
    b_.CreateBr(chunk);
    b_.SetInsertPoint(chunk);
    scope.chunk_start = b_.CreatePHI(b_.getInt64Ty(), 2, "chunk.start");
    scope.chunk_start->addIncoming(lo, pre);
    b_.CreateCondBr(b_.CreateICmpSLT(scope.chunk_start, hi), chunk_body, exit);
    b_.SetInsertPoint(chunk_body);
    check_stop();
    Value* left = b_.CreateSub(hi, scope.chunk_start, "chunk.left", /*HasNUW=*/true, /*HasNSW=*/true);
    Value* step = b_.CreateBinaryIntrinsic(llvm::Intrinsic::umin, left, b_.getInt64(every));
    scope.chunk_end = b_.CreateAdd(scope.chunk_start, step, "chunk.end", /*HasNUW=*/true, /*HasNSW=*/true);
    lo = scope.chunk_start;
    hi = scope.chunk_end;
  }
  BasicBlock* pre = b_.GetInsertBlock();
  BasicBlock* header = BasicBlock::Create(ctx_, "loop", body_);
  BasicBlock* body = BasicBlock::Create(ctx_, "loop.body", body_);
  b_.CreateBr(header);
  b_.SetInsertPoint(header);
  llvm::PHINode* iv = b_.CreatePHI(b_.getInt64Ty(), 2, "r");
  iv->addIncoming(lo, pre);
  b_.CreateCondBr(b_.CreateICmpSLT(iv, hi), body, every > 1 ? scope.next_chunk : exit);
  b_.SetInsertPoint(body);
  scope.check_each = every == 1;
  scope.header = header;
  scope.iv = iv;
  scopes_.push_back(scope);
  Value* v = b_.CreateTrunc(iv, value_type(b_, u->dtype()));
  define(u, {Emitted::Kind::Value, v});
  return absl::OkStatus();
}

void Renderer::check_stop() {
  if (!stopped_) {
    stopped_ = BasicBlock::Create(ctx_, "stopped", body_);
    llvm::IRBuilder<> b(stopped_);
    b.CreateRetVoid();
  }
  llvm::LoadInst* word = b_.CreateAlignedLoad(b_.getInt32Ty(), stop_, llvm::Align(4), "stop");
  word->setAtomic(llvm::AtomicOrdering::Monotonic);
  BasicBlock* go_on = BasicBlock::Create(ctx_, "not.stopped", body_);
  // Almost never taken: keep the hot path the fall-through.
  llvm::MDBuilder md(ctx_);
  b_.CreateCondBr(b_.CreateICmpNE(word, b_.getInt32(0)), stopped_, go_on, md.createBranchWeights(1, 1 << 20));
  b_.SetInsertPoint(go_on);
}

// `name({0}, {1}, ...)`: an identifier, then exactly the sources in order.
absl::Status Renderer::emit_custom(const UOp* u) {
  const std::string& text = u->arg_as<StrArg>().value;
  auto refuse = [&](std::string_view why) {
    return bad(u, cat("CUSTOM '", text, "': ", why, "; the CPU backend calls a C function: `name({0}, {1}, ...)` [llvm_cpu.custom]"));
  };
  size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && text[i] == ' ') ++i;
  };
  auto ident_char = [](char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!first && c >= '0' && c <= '9');
  };
  while (i < text.size() && ident_char(text[i], i == 0)) ++i;
  const std::string name = text.substr(0, i);
  if (name.empty() || name.size() > 128) return refuse("it does not start with a function name");
  // Our own functions and the compiler's reserved names are not for calling.
  if (name.rfind("uop_", 0) == 0 || name.rfind("__", 0) == 0) return refuse("the name is reserved");
  skip_space();
  if (i >= text.size() || text[i++] != '(') return refuse("no '(' after the name");
  for (size_t k = 0; k < u->num_src(); ++k) {
    skip_space();
    const std::string want = cat("{", k, "}");
    if (text.compare(i, want.size(), want) != 0) return refuse(cat("argument ", k, " is not ", want));
    i += want.size();
    skip_space();
    if (k + 1 < u->num_src()) {
      if (i >= text.size() || text[i++] != ',') return refuse(cat("no ',' after argument ", k));
    }
  }
  skip_space();
  if (i >= text.size() || text[i++] != ')') return refuse(cat("its arguments are not its ", u->num_src(), " sources"));
  skip_space();
  if (i != text.size()) return refuse("something follows the ')'");

  // C's scalar types: integers (widened as the C ABI says), float, double.
  auto c_type = [&](DType d) -> llvm::Type* {
    if (d.ptr || d.is_vector() || d.is_bool()) return nullptr;
    if (d.scalar == Scalar::Float32 || d.scalar == Scalar::Float64 || d.is_int() || d.is_index())
      return value_type(b_, d);
    return nullptr;
  };
  const bool returns = u->dtype().scalar != Scalar::Void;
  llvm::Type* ret = returns ? c_type(u->dtype()) : b_.getVoidTy();
  if (!ret) return refuse(cat("it returns ", u->dtype().str(), ", not a C scalar (an integer, float32, float64 or void)"));
  std::vector<llvm::Type*> types;
  std::vector<Value*> args;
  for (const UOp* s : u->src()) {
    llvm::Type* t = c_type(s->dtype());
    if (!t) return refuse(cat("a source is ", s->dtype().str(), ", not a C scalar (an integer, float32 or float64)"));
    auto v = value(u, s);
    if (!v.ok()) return v.status();
    types.push_back(t);
    args.push_back(*v);
  }
  if (llvm::Function* mine = m_.getFunction(name); mine && !mine->isDeclaration()) return refuse("the name is reserved");
  auto* fty = llvm::FunctionType::get(ret, types, false);
  llvm::FunctionCallee callee = m_.getOrInsertFunction(name, fty);
  llvm::CallInst* call = b_.CreateCall(callee, args);
  // Integers narrower than 32 bits travel sign- or zero-extended (the SysV ABI).
  auto extend = [&](DType d, auto&& add) {
    if (!(d.is_int() || d.is_index()) || d.bytes() >= 4) return;
    add(d.is_unsigned() ? llvm::Attribute::ZExt : llvm::Attribute::SExt);
  };
  for (size_t k = 0; k < u->num_src(); ++k)
    extend(u->src(k)->dtype(), [&](llvm::Attribute::AttrKind a) { call->addParamAttr(static_cast<unsigned>(k), a); });
  if (returns) extend(u->dtype(), [&](llvm::Attribute::AttrKind a) { call->addRetAttr(a); });
  if (returns) define(u, {Emitted::Kind::Value, call});
  else done_[u] = {};
  return absl::OkStatus();
}

absl::Status Renderer::emit_end(const UOp* u) {
  std::vector<const UOp*> closes(u->src().begin() + 1, u->src().end());
  if (closes.empty()) return bad(u, "END closes no RANGE [linear.scope]");
  while (!closes.empty()) {
    if (scopes_.empty() || !scopes_.back().node->is(Op::RANGE))
      return bad(u, "END does not close the innermost open RANGE [linear.scope]");
    auto it = std::find(closes.begin(), closes.end(), scopes_.back().node);
    if (it == closes.end()) return bad(u, "END does not close the innermost open RANGE [linear.scope]");
    closes.erase(it);
    Scope s = scopes_.back();
    scopes_.pop_back();
    // At the latch, not the top of the body: the code leading into the body's own loops
    // stays as it is without checks (and so does their alignment).
    if (s.check_each) check_stop();
    // i < end <= INT64_MAX and i >= 0, so the increment wraps in neither sense.
    Value* next = b_.CreateAdd(s.iv, b_.getInt64(1), "r.next", /*HasNUW=*/true, /*HasNSW=*/true);
    s.iv->addIncoming(next, b_.GetInsertBlock());
    b_.CreateBr(s.header);
    if (s.next_chunk) {
      to_end(s.next_chunk);
      b_.SetInsertPoint(s.next_chunk);
      s.chunk_start->addIncoming(s.chunk_end, s.next_chunk);
      b_.CreateBr(s.chunk_start->getParent());
    }
    to_end(s.exit);
    b_.SetInsertPoint(s.exit);
  }
  done_[u] = {};
  return absl::OkStatus();
}

}  // namespace

absl::Status render_module(llvm::Module& m, const UOp* linear, const KernelAbi& abi, const CpuTarget& target,
                           bool stop_checks) {
  Renderer r(m, abi, target, linear, stop_checks);
  return r.render(linear);
}

}  // namespace uop::llvm_cpu
