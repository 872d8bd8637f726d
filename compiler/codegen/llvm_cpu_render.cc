// LINEAR -> LLVM module (render_module, llvm_cpu_render.h).
//
// The module has two functions. `uop_body` takes one noalias pointer per buffer and one
// i64 per variable, which is what lets the loop vectorizer prove that stores do not
// clobber loads; `uop_kernel` is the C entry point of PIPELINE.md: it checks the task
// numbers, loads the pointers and variables (with their ABI bounds as !range) and calls
// the body, which the inliner folds into it. The LINEAR is emitted op by op in its own
// order by the walk both renderers share (linear_walk.h); RANGE / END and IF / ENDIF open
// and close blocks, and a value is used only where its defining block dominates (the
// verifier's [linear.scope], so a verified LINEAR makes valid IR).
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
#include "compiler/codegen/linear_walk.h"
#include "compiler/codegen/llvm_cpu_alu.h"
#include "compiler/codegen/stop_checks.h"
#include "compiler/support/strings.h"

namespace uop::llvm_cpu {
namespace {

using llvm::BasicBlock;
using llvm::Value;

// DEFINE_REG lives on the task's stack; keep it well under a pool thread's 8 MiB.
constexpr int64_t kMaxRegBytes = 1 << 20;

using K = EmitKind;

// What an emitted op stands for (linear_walk.h). Buffers and addresses are pointers with
// the dtype of what they point at.
struct Emitted {
  K kind = K::None;
  Value* v = nullptr;
  Value* gate = nullptr;  // Address only: the INDEX's gate
  DType mem;              // Buffer / Address: the element dtype in memory
  int scope = 0;
};

// The LLVM blocks of an open RANGE or IF.
struct Blocks {
  BasicBlock* header = nullptr;  // RANGE: the block with the induction phi
  BasicBlock* exit = nullptr;    // where control goes after the loop / the IF
  llvm::PHINode* iv = nullptr;
  bool check_each = false;  // a RANGE checked every iteration: at its latch
  // A RANGE strip-mined for its stop check: the chunk loop around the body loop.
  BasicBlock* next_chunk = nullptr;  // where the body loop goes when its chunk is done
  llvm::PHINode* chunk_start = nullptr;
  Value* chunk_end = nullptr;
};

class Renderer : public LinearWalk<Emitted, Blocks> {
 public:
  Renderer(llvm::Module& m, const KernelAbi& abi, const CpuTarget& target, const UOp* linear, bool stop_checks)
      : LinearWalk(linear), m_(m), ctx_(m.getContext()), abi_(abi), target_(target), b_(ctx_), entry_b_(ctx_) {
    if (stop_checks) stop_plan_ = plan_stop_checks(linear);
  }

  absl::Status render(const UOp* linear) {
    make_functions();
    RETURN_IF_ERROR(walk(linear));
    b_.CreateRetVoid();
    return absl::OkStatus();
  }

 private:
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

  absl::StatusOr<Value*> value_of(const UOp* u, const UOp* s) {
    ASSIGN_OR_RETURN(const Emitted* e, value(u, s));
    return e->v;
  }

  // An integer scalar (the verifier makes indices and loop ends `index`) as i64.
  absl::StatusOr<Value*> index_value(const UOp* u, const UOp* s) {
    ASSIGN_OR_RETURN(Value* v, value_of(u, s));
    if (s->dtype().is_unsigned()) return b_.CreateZExtOrTrunc(v, b_.getInt64Ty());
    return b_.CreateSExtOrTrunc(v, b_.getInt64Ty());
  }

  // Exit blocks are made with their RANGE / IF (so the function owns them even if an
  // error stops rendering) and moved to the end when closed, keeping program order.
  void to_end(BasicBlock* bb) {
    if (bb != &body_->back()) bb->moveAfter(&body_->back());
  }

  absl::Status emit(const UOp* u) override;
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
  llvm::IRBuilder<> b_;
  llvm::IRBuilder<> entry_b_;  // allocas, in the entry block so SROA / mem2reg promote them
  llvm::Function* body_ = nullptr;
  Value* task_ = nullptr;
  Value* ntasks_ = nullptr;
  Value* stop_ = nullptr;
  StopCheckPlan stop_plan_;
  BasicBlock* stopped_ = nullptr;  // returns: where a set stop word goes
  absl::flat_hash_map<int64_t, Value*> slot_arg_;
};

absl::Status Renderer::emit(const UOp* u) {
  const Op op = u->op();
  if (is_alu(op) || op == Op::CAST || op == Op::BITCAST) {
    std::vector<Value*> srcs;
    for (const UOp* s : u->src()) {
      ASSIGN_OR_RETURN(Value* v, value_of(u, s));
      srcs.push_back(v);
    }
    Value* r = lower_alu(b_, u, srcs);
    if (!r) return broken(u, "has dtypes the ALU lowering does not know");
    define(u, {K::Value, r});
    return absl::OkStatus();
  }
  switch (op) {
    case Op::PARAM:
      define_anywhere(u, {K::Buffer, slot_arg_.at(u->arg_as<ParamArg>().slot), nullptr, u->dtype().pointee()});
      return absl::OkStatus();
    case Op::DEFINE_VAR: {
      Value* arg = body_->getArg(abi_.params.size() + abi_.var_position(u->arg_as<DefineVarArg>().name));
      llvm::IRBuilderBase::InsertPointGuard guard(b_);  // at the entry, so it is valid anywhere
      b_.SetInsertPoint(entry_b_.GetInsertBlock()->getTerminator());
      define_anywhere(u, {K::Value, b_.CreateTrunc(arg, value_type(b_, u->dtype()))});
      return absl::OkStatus();
    }
    case Op::DEFINE_REG: {
      DType d = u->dtype();
      int64_t size = u->arg_as<DefineRegArg>().size;
      if (size < 1 || size > kMaxRegBytes / std::max<int64_t>(1, d.bytes()))
        return refuse(u, cat("DEFINE_REG of ", size, " elements: the CPU backend keeps 1 to ", kMaxRegBytes,
                             " bytes on the task's stack [llvm_cpu.reg]"));
      auto* a = entry_b_.CreateAlloca(llvm::ArrayType::get(memory_type(b_, d), size), nullptr, "reg");
      a->setAlignment(llvm::Align(std::max(1, d.itemsize())));
      define_anywhere(u, {K::Buffer, a, nullptr, d.pointee()});
      return absl::OkStatus();
    }
    case Op::CONST:
    case Op::VCONST: {
      // The verifier allows one empty VCONST (a rank-0 shape), which is no value here.
      if (!value_type(b_, u->dtype())) return refuse(u, cat("a constant of dtype ", u->dtype().str(), " [llvm_cpu.const]"));
      std::vector<ConstValue> lanes;
      if (op == Op::CONST) lanes.push_back(u->arg_as<ConstValue>());
      else lanes = u->arg_as<VConstArg>().values;
      define_anywhere(u, {K::Value, constant(b_, u->dtype(), lanes)});
      return absl::OkStatus();
    }
    case Op::VECTORIZE: case Op::CAT: case Op::GEP: return emit_vector(u);
    case Op::INDEX: return emit_index(u);
    case Op::LOAD: return emit_load(u);
    case Op::STORE: return emit_store(u);
    case Op::RANGE: return emit_range(u);
    case Op::END: return emit_end(u);
    case Op::CUSTOM: return emit_custom(u);
    case Op::AFTER: return same_as(u, u->src(0));  // AFTER only orders: it is its first source
    case Op::IF: {
      ASSIGN_OR_RETURN(Value* cond, value_of(u, u->src(0)));
      BasicBlock* then = BasicBlock::Create(ctx_, "then", body_);
      BasicBlock* merge = BasicBlock::Create(ctx_, "endif", body_);
      b_.CreateCondBr(cond, then, merge);
      b_.SetInsertPoint(then);
      open_scope(u, {.exit = merge});
      done(u);
      return absl::OkStatus();
    }
    case Op::ENDIF: {
      ASSIGN_OR_RETURN(Scope s, close_scope(u, u->src(0)));
      b_.CreateBr(s.data.exit);
      to_end(s.data.exit);
      b_.SetInsertPoint(s.data.exit);
      done(u);
      return absl::OkStatus();
    }
    case Op::SINK: case Op::BARRIER: case Op::DEVICE: case Op::GROUP:  // one thread per task: nothing to do
      done(u);
      return absl::OkStatus();
    default:
      return refuse(u, cat(op_name(op), " is not supported by the LLVM CPU backend [llvm_cpu.op]"));
  }
}

absl::Status Renderer::emit_vector(const UOp* u) {
  std::vector<Value*> srcs;
  for (const UOp* s : u->src()) {
    ASSIGN_OR_RETURN(Value* v, value_of(u, s));
    srcs.push_back(v);
  }
  define(u, {K::Value, lower_vector(b_, u, srcs)});
  return absl::OkStatus();
}

absl::Status Renderer::emit_index(const UOp* u) {
  const bool gated = u->num_src() == 3;
  if (u->src(1)->dtype().is_vector()) return refuse(u, "a vector of indices (a gather) [llvm_cpu.gather]");
  ASSIGN_OR_RETURN(const Emitted* buf, get(u, u->src(0), K::Buffer));
  Value* base = buf->v;
  const DType mem = buf->mem;
  ASSIGN_OR_RETURN(Value* i, index_value(u, u->src(1)));
  Value* gate = nullptr;
  if (gated) {
    ASSIGN_OR_RETURN(gate, value_of(u, u->src(2)));
  }
  llvm::Type* et = memory_type(b_, mem);
  // Ungated indices are proven in bounds (stage 8); a gated one may point anywhere.
  Value* addr = gated ? b_.CreateGEP(et, base, i) : b_.CreateInBoundsGEP(et, base, i);
  define(u, {K::Address, addr, gate, mem});
  return absl::OkStatus();
}

absl::Status Renderer::emit_load(const UOp* u) {
  ASSIGN_OR_RETURN(Access a, load_operands(u));
  const Emitted& addr = a.address;
  const DType d = u->dtype();
  llvm::Type* mt = memory_type(b_, d);
  llvm::Align align(std::max(1, d.itemsize()));
  if (!addr.gate) {
    define(u, {K::Value, from_memory(b_, b_.CreateAlignedLoad(mt, addr.v, align), d)});
    return absl::OkStatus();
  }
  Value* alt = a.data ? a.data_emitted.v : llvm::Constant::getNullValue(value_type(b_, d));
  if (addr.gate->getType()->isVectorTy()) {  // one gate per lane: lanes that are off are not read
    Value* r = b_.CreateMaskedLoad(mt, addr.v, align, addr.gate, to_memory(b_, alt, d));
    define(u, {K::Value, from_memory(b_, r, d)});
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
  define(u, {K::Value, phi});
  return absl::OkStatus();
}

absl::Status Renderer::emit_store(const UOp* u) {
  ASSIGN_OR_RETURN(Access a, store_operands(u));
  const Emitted& addr = a.address;
  const DType d = a.data->dtype();
  Value* mv = to_memory(b_, a.data_emitted.v, d);
  llvm::Align align(std::max(1, d.itemsize()));
  if (!addr.gate) {
    b_.CreateAlignedStore(mv, addr.v, align);
  } else if (addr.gate->getType()->isVectorTy()) {
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
  done(u);
  return absl::OkStatus();
}

absl::Status Renderer::emit_range(const UOp* u) {
  ASSIGN_OR_RETURN(Value* end, index_value(u, u->src(0)));
  Value* lo = b_.getInt64(0);
  Value* hi = end;
  if (u->arg_as<RangeArg>().type == AxisType::Thread) {
    // Task t covers [t*N/ntasks, (t+1)*N/ntasks), computed as t*q + t*r/ntasks
    // (N = q*ntasks + r) so that nothing overflows.
    Value* n = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, end, b_.getInt64(0));
    Value* q = b_.CreateUDiv(n, ntasks_);
    Value* r = b_.CreateURem(n, ntasks_);
    auto bound = [&](Value* t) { return b_.CreateAdd(b_.CreateMul(t, q), b_.CreateUDiv(b_.CreateMul(t, r), ntasks_)); };
    lo = bound(task_);
    hi = bound(b_.CreateAdd(task_, b_.getInt64(1)));
  }
  auto checked = stop_plan_.find(u);
  const int64_t every = checked == stop_plan_.end() ? 0 : checked->second;
  BasicBlock* exit = BasicBlock::Create(ctx_, "loop.exit", body_);
  Blocks scope{.exit = exit};
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
  open_scope(u, scope);
  define(u, {K::Value, iv});  // the verifier makes a RANGE `index`: i64 itself
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
  auto reject = [&](std::string_view why) {
    return refuse(u, cat("CUSTOM '", text, "': ", why, "; the CPU backend calls a C function: `name({0}, {1}, ...)` [llvm_cpu.custom]"));
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
  if (name.empty() || name.size() > 128) return reject("it does not start with a function name");
  // Our own functions and the compiler's reserved names are not for calling.
  if (name.rfind("uop_", 0) == 0 || name.rfind("__", 0) == 0) return reject("the name is reserved");
  skip_space();
  if (i >= text.size() || text[i++] != '(') return reject("no '(' after the name");
  for (size_t k = 0; k < u->num_src(); ++k) {
    skip_space();
    const std::string want = cat("{", k, "}");
    if (text.compare(i, want.size(), want) != 0) return reject(cat("argument ", k, " is not ", want));
    i += want.size();
    skip_space();
    if (k + 1 < u->num_src()) {
      if (i >= text.size() || text[i++] != ',') return reject(cat("no ',' after argument ", k));
    }
  }
  skip_space();
  if (i >= text.size() || text[i++] != ')') return reject(cat("its arguments are not its ", u->num_src(), " sources"));
  skip_space();
  if (i != text.size()) return reject("something follows the ')'");

  // C's scalar types: integers (widened as the C ABI says), float, double.
  auto c_type = [&](DType d) -> llvm::Type* {
    if (d.ptr || d.is_vector() || d.is_bool()) return nullptr;
    if (d.scalar == Scalar::Float32 || d.scalar == Scalar::Float64 || d.is_int() || d.is_index())
      return value_type(b_, d);
    return nullptr;
  };
  const bool returns = u->dtype().scalar != Scalar::Void;
  llvm::Type* ret = returns ? c_type(u->dtype()) : b_.getVoidTy();
  if (!ret) return reject(cat("it returns ", u->dtype().str(), ", not a C scalar (an integer, float32, float64 or void)"));
  std::vector<llvm::Type*> types;
  std::vector<Value*> args;
  for (const UOp* s : u->src()) {
    llvm::Type* t = c_type(s->dtype());
    if (!t) return reject(cat("a source is ", s->dtype().str(), ", not a C scalar (an integer, float32 or float64)"));
    ASSIGN_OR_RETURN(Value* v, value_of(u, s));
    types.push_back(t);
    args.push_back(v);
  }
  if (llvm::Function* mine = m_.getFunction(name); mine && !mine->isDeclaration()) return reject("the name is reserved");
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
  if (returns) define(u, {K::Value, call});
  else done(u);
  return absl::OkStatus();
}

absl::Status Renderer::emit_end(const UOp* u) {
  for (const UOp* r : closed_ranges(u)) {
    ASSIGN_OR_RETURN(Scope closed, close_scope(u, r));
    Blocks& s = closed.data;
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
  done(u);
  return absl::OkStatus();
}

}  // namespace

absl::Status render_module(llvm::Module& m, const UOp* linear, const KernelAbi& abi, const CpuTarget& target,
                           bool stop_checks) {
  Renderer r(m, abi, target, linear, stop_checks);
  return r.render(linear);
}

}  // namespace uop::llvm_cpu
