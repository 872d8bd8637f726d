// LINEAR -> CUDA C. The LINEAR is emitted op by op in its own order: RANGE / END and IF /
// ENDIF open and close C blocks, every value becomes a const local (a vector one local per
// lane), SPECIAL reads blockIdx / threadIdx, DEFINE_LOCAL is a __shared__ array, DEFINE_REG
// a local array, BARRIER is __syncthreads(), WMMA one mma.sync (cuda_prelude.cc). The walk
// (linear_walk.h, shared with the CPU backend) runs on a verified LINEAR, so a value is used
// only inside the block that computes it and the C compiles. Values are spelled by cuda_alu.cc.
//
// Memory: a buffer is a pointer to its element type; an INDEX i into a buffer of
// count-wide vectors addresses element i*count. A vector access to a kernel argument is
// done in aligned chunks of up to 16 bytes when the index is provably a multiple of the
// chunk (ABI: arguments are 16-byte aligned), else lane by lane; registers and shared
// memory are always accessed lane by lane, which keeps register arrays in registers.
#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "compiler/codegen/cuda.h"
#include "compiler/codegen/cuda_alu.h"
#include "compiler/codegen/linear_walk.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

using cuda_c::reg_type;

using K = EmitKind;

// What an emitted op stands for (linear_walk.h).
struct Emitted {
  K kind = K::None;
  std::vector<std::string> lanes;  // Value: one C expression per lane
  std::string base;                // Buffer / Address: the pointer or array
  DType mem;                       // Buffer / Address: the element dtype (may be a vector)
  bool global = false;             // a kernel argument: vector accesses allowed
  std::string index;               // Address: the element index (long long)
  int64_t align = 1;               // Address: the scalar offset is a multiple of this
  std::vector<std::string> gate;   // Address: none, one, or one per lane
  int scope = 0;                   // the block that computed it (0: anywhere)
};

// A power of two (at most 64) that divides every value of the integer expression `u`.
int64_t multiple_of(const UOp* u, absl::flat_hash_map<const UOp*, int64_t>& memo) {
  if (auto it = memo.find(u); it != memo.end()) return it->second;
  int64_t m = 1;
  if (const ConstValue* c = u->const_value()) {
    uint64_t b = c->bits();
    m = b == 0 ? 64 : std::min<int64_t>(64, int64_t{1} << __builtin_ctzll(b));
  } else if (u->dtype().is_int() || u->dtype().is_index()) {
    switch (u->op()) {
      case Op::ADD: case Op::SUB: m = std::min(multiple_of(u->src(0), memo), multiple_of(u->src(1), memo)); break;
      case Op::MUL: m = std::min<int64_t>(64, multiple_of(u->src(0), memo) * multiple_of(u->src(1), memo)); break;
      case Op::NEG: m = multiple_of(u->src(0), memo); break;
      case Op::SHL:
        if (const ConstValue* k = u->src(1)->const_value(); k && k->to_int() >= 0 && k->to_int() < 7)
          m = std::min<int64_t>(64, multiple_of(u->src(0), memo) << k->to_int());
        break;
      case Op::CAST:
        if (u->src(0)->dtype().is_int() || u->src(0)->dtype().is_index()) m = multiple_of(u->src(0), memo);
        break;
      default: break;
    }
  }
  memo[u] = m;
  return m;
}

class Renderer : public LinearWalk<Emitted> {
 public:
  Renderer(const UOp* linear, const KernelAbi& abi) : LinearWalk(linear), abi_(abi) {}

  absl::Status render(const UOp* linear) {
    RETURN_IF_ERROR(walk(linear));
    if (threads_ > 1024) return absl::InvalidArgumentError(cat("a block of ", threads_, " threads, over 1024 [cuda.block]"));
    return absl::OkStatus();
  }

  std::string kernel(std::string_view entry) const {
    std::vector<std::string> args;
    for (int64_t slot = 0, p = 0; slot < abi_.num_buffers(); ++slot) {
      if (abi_.params[p].slot != slot) {
        args.push_back(cat("const void* __restrict__ b", slot));  // a hole in the slots
        continue;
      }
      const KernelParam& kp = abi_.params[p++];
      args.push_back(cat(kp.written ? "" : "const ", cuda_c::mem_type(kp.dtype.scalar), "* __restrict__ b", kp.slot));
    }
    for (size_t k = 0; k < abi_.vars.size(); ++k) args.push_back(cat("long long var", k));
    std::string out;
    for (size_t k = 0; k < abi_.vars.size(); ++k)
      out += cat("// var", k, ": ", abi_.vars[k].name, " in [", abi_.vars[k].min, ", ", abi_.vars[k].max, "]\n");
    out += cat("extern \"C\" __global__ void __launch_bounds__(", threads_, ") ", entry, "(", join(args, ", "), ") {\n");
    return out + decls_ + body_ + "}\n";
  }
  int64_t threads() const { return threads_; }

 private:
  std::string name(const UOp* u) const { return cat("v", index().at(u)); }
  void line(const std::string& s) { body_ += std::string(2 + 2 * depth(), ' ') + s + "\n"; }

  absl::StatusOr<std::vector<std::string>> lanes_of(const UOp* u, const UOp* s) {
    ASSIGN_OR_RETURN(const Emitted* e, value(u, s));
    return e->lanes;
  }

  // An integer scalar (the verifier makes indices and loop ends `index`) as a long long.
  absl::StatusOr<std::string> index_value(const UOp* u, const UOp* s) {
    ASSIGN_OR_RETURN(std::vector<std::string> v, lanes_of(u, s));
    return s->dtype().is_index() ? v[0] : cat("((long long)(", v[0], "))");
  }

  // Declares `u` as a value with these lane expressions: const locals, named after u.
  void define_value(const UOp* u, const std::vector<std::string>& exprs) {
    std::vector<std::string> lanes;
    std::string T(reg_type(u->dtype().scalar));
    for (size_t l = 0; l < exprs.size(); ++l) {
      std::string n = exprs.size() == 1 ? name(u) : cat(name(u), "_", l);
      line(cat("const ", T, " ", n, " = ", exprs[l], ";"));
      lanes.push_back(n);
    }
    define(u, {K::Value, lanes});
  }
  // A value whose lanes are other values' (no code), usable where its sources are.
  void alias(const UOp* u, std::vector<std::string> lanes) { define(u, {K::Value, std::move(lanes)}); }
  void alias_anywhere(const UOp* u, std::vector<std::string> lanes) { define_anywhere(u, {K::Value, std::move(lanes)}); }

  absl::Status emit(const UOp* u) override;
  absl::Status emit_alu(const UOp* u);
  absl::Status emit_vector(const UOp* u);
  absl::Status emit_index(const UOp* u);
  absl::Status emit_load(const UOp* u);
  absl::Status emit_store(const UOp* u);
  absl::Status emit_special(const UOp* u);
  absl::Status emit_wmma(const UOp* u);

  // The C element `elem` scalars past an address (folded when the index is a constant).
  static std::string at(const Emitted& a, int64_t elem) {
    std::string off = a.mem.count == 1 ? a.index : cat("(", a.index, ") * ", a.mem.count);
    return elem == 0 ? off : cat(off, " + ", elem);
  }
  // Lanes per access for `count` lanes of `s` at address `a`: the widest aligned chunk
  // of at most 16 bytes, 1 where only scalar accesses are possible.
  static int64_t chunk(const Emitted& a, Scalar s, int64_t count) {
    if (!a.global || a.gate.size() > 1) return 1;
    int64_t c = 1;
    while (c * 2 <= count && count % (c * 2) == 0 && c * 2 * scalar_bytes(s) <= 16 && a.align % (c * 2) == 0) c *= 2;
    return c;
  }
  static std::string vec_type(Scalar s, int64_t n) {
    return cat("uop_vec<", cuda_c::mem_type(s), ", ", n, ", ", n * scalar_bytes(s), ">");
  }

  const KernelAbi& abi_;
  absl::flat_hash_map<const UOp*, int64_t> multiples_;
  std::string decls_, body_;
  absl::flat_hash_map<std::string, const UOp*> specials_;
  int64_t threads_ = 1;
  int next_array_ = 0;
};

absl::Status Renderer::emit(const UOp* u) {
  const Op op = u->op();
  if (is_alu(op) || op == Op::CAST || op == Op::BITCAST) return emit_alu(u);
  switch (op) {
    case Op::PARAM:
      define_anywhere(u, {K::Buffer, {}, cat("b", u->arg_as<ParamArg>().slot), u->dtype().pointee(), true});
      return absl::OkStatus();
    case Op::DEFINE_VAR:
      alias_anywhere(u, {cat("var", abi_.var_position(u->arg_as<DefineVarArg>().name))});
      return absl::OkStatus();
    case Op::DEFINE_REG: case Op::DEFINE_LOCAL: {
      DType d = u->dtype();
      bool local = op == Op::DEFINE_LOCAL;
      int64_t size = local ? d.size : u->arg_as<DefineRegArg>().size;
      if (size < 1 || size * d.bytes() > (local ? 48 << 10 : 64 << 10))
        return refuse(u, cat(op_name(op), " of ", size, " elements: the CUDA backend takes 1 .. ", local ? "48" : "64",
                             " KiB [cuda.", local ? "local" : "reg", "]"));
      std::string n = cat(local ? "smem" : "reg", next_array_++);
      decls_ += cat("  ", local ? "__shared__ " : "", "alignas(16) ", cuda_c::mem_type(d.scalar), " ", n, "[",
                    size * d.count, "];\n");
      define_anywhere(u, {K::Buffer, {}, n, d.pointee()});
      return absl::OkStatus();
    }
    case Op::CONST: case Op::VCONST: {
      std::vector<ConstValue> vals = op == Op::CONST ? std::vector<ConstValue>{u->arg_as<ConstValue>()} : u->arg_as<VConstArg>().values;
      // The verifier allows one empty VCONST (a rank-0 shape), which is no value here.
      if (vals.empty()) return refuse(u, cat("a constant of dtype ", u->dtype().str(), " [cuda.const]"));
      std::vector<std::string> lanes;
      for (uint32_t l = 0; l < u->dtype().count; ++l)
        lanes.push_back(cuda_c::constant(u->dtype().scalar, vals[vals.size() == 1 ? 0 : l]));
      alias_anywhere(u, std::move(lanes));
      return absl::OkStatus();
    }
    case Op::VECTORIZE: case Op::CAT: case Op::GEP: return emit_vector(u);
    case Op::INDEX: return emit_index(u);
    case Op::LOAD: return emit_load(u);
    case Op::STORE: return emit_store(u);
    case Op::SPECIAL: return emit_special(u);
    case Op::WMMA: return emit_wmma(u);
    case Op::RANGE: {
      ASSIGN_OR_RETURN(std::string end, index_value(u, u->src(0)));
      std::string n = name(u);
      line(cat("for (long long ", n, " = 0, ", n, "_end = ", end, "; ", n, " < ", n, "_end; ++", n, ") {"));
      open_scope(u);
      alias(u, {n});  // the verifier makes a RANGE `index`: long long itself
      return absl::OkStatus();
    }
    case Op::END:
      for (const UOp* r : closed_ranges(u)) {
        RETURN_IF_ERROR(close_scope(u, r).status());
        line("}");
      }
      done(u);
      return absl::OkStatus();
    case Op::IF: {
      ASSIGN_OR_RETURN(std::vector<std::string> c, lanes_of(u, u->src(0)));
      line(cat("if (", c[0], ") {"));
      open_scope(u);
      done(u);
      return absl::OkStatus();
    }
    case Op::ENDIF:
      RETURN_IF_ERROR(close_scope(u, u->src(0)).status());
      line("}");
      done(u);
      return absl::OkStatus();
    case Op::AFTER: return same_as(u, u->src(0));  // AFTER only orders: it is its first source
    case Op::BARRIER:
      // Every thread of the block must reach it: the lowering never puts one under a
      // condition that differs between threads.
      line("__syncthreads();");
      if (u->num_src() > 0 && !u->dtype().is_void()) return same_as(u, u->src(0));  // the value passes through
      done(u);
      return absl::OkStatus();
    case Op::SINK: case Op::DEVICE: case Op::GROUP:
      done(u);
      return absl::OkStatus();
    default:
      return refuse(u, cat(op_name(op), " is not supported by the CUDA backend [cuda.op]"));
  }
}

absl::Status Renderer::emit_alu(const UOp* u) {
  if (absl::Status st = cuda_c::check_alu(u); !st.ok()) return refuse(u, std::string(st.message()));
  std::vector<std::vector<std::string>> srcs;
  for (const UOp* s : u->src()) {
    ASSIGN_OR_RETURN(std::vector<std::string> v, lanes_of(u, s));
    srcs.push_back(std::move(v));
  }
  const uint32_t n = u->dtype().count;
  const Scalar t = u->src(u->is(Op::WHERE) ? 1 : 0)->dtype().scalar;
  std::vector<std::string> lanes;
  for (uint32_t l = 0; l < n; ++l) {
    std::vector<std::string> a;
    for (const auto& s : srcs) a.push_back(s.size() == 1 ? s[0] : s[l]);
    if (u->is(Op::CAST)) lanes.push_back(cuda_c::cast(t, u->dtype().scalar, a[0]));
    else if (u->is(Op::BITCAST)) lanes.push_back(cuda_c::bitcast(t, u->dtype().scalar, a[0]));
    else lanes.push_back(cuda_c::alu(u->op(), t, a));
  }
  define_value(u, lanes);
  return absl::OkStatus();
}

absl::Status Renderer::emit_vector(const UOp* u) {
  std::vector<std::string> lanes;
  for (const UOp* s : u->src()) {
    ASSIGN_OR_RETURN(std::vector<std::string> v, lanes_of(u, s));
    lanes.insert(lanes.end(), v.begin(), v.end());
  }
  if (u->is(Op::GEP)) {
    std::vector<std::string> picked;
    for (int64_t i : u->arg_as<IntsArg>().values) picked.push_back(lanes[i]);
    lanes = std::move(picked);
  }
  alias(u, std::move(lanes));
  return absl::OkStatus();
}

absl::Status Renderer::emit_index(const UOp* u) {
  const bool gated = u->num_src() == 3;
  if (u->src(1)->dtype().is_vector()) return refuse(u, "a vector of indices (a gather) [cuda.gather]");
  ASSIGN_OR_RETURN(const Emitted* buf, get(u, u->src(0), K::Buffer));
  Emitted a = *buf;
  a.kind = K::Address;
  ASSIGN_OR_RETURN(a.index, index_value(u, u->src(1)));
  a.align = std::min<int64_t>(64, multiple_of(u->src(1), multiples_) * a.mem.count);
  if (gated) {
    ASSIGN_OR_RETURN(a.gate, lanes_of(u, u->src(2)));
  }
  define(u, std::move(a));
  return absl::OkStatus();
}

absl::Status Renderer::emit_load(const UOp* u) {
  ASSIGN_OR_RETURN(Access access, load_operands(u));
  const Emitted& a = access.address;
  const DType d = u->dtype();
  const int64_t n = d.count;
  std::vector<std::string> alt(1, cuda_c::constant(d.scalar, ConstValue::Int(0)));
  if (access.data) alt = access.data_emitted.lanes;
  const std::string T(reg_type(d.scalar));
  std::vector<std::string> lanes;
  for (int64_t l = 0; l < n; ++l) lanes.push_back(n == 1 ? name(u) : cat(name(u), "_", l));
  auto read = [&](int64_t l) { return cuda_c::from_memory(d.scalar, cat(a.base, "[", at(a, l), "]")); };
  if (a.gate.empty() && n == 1) {
    line(cat("const ", T, " ", lanes[0], " = ", read(0), ";"));
  } else if (a.gate.size() > 1 || (n == 1 && a.gate.size() == 1)) {  // no memory is touched where a gate is off
    for (int64_t l = 0; l < n; ++l)
      line(cat("const ", T, " ", lanes[l], " = (", a.gate[a.gate.size() == 1 ? 0 : l], ") ? ", read(l), " : ",
               alt[alt.size() == 1 ? 0 : l], ";"));
  } else {
    line(cat(T, " ", join(lanes, ", "), ";"));
    if (!a.gate.empty()) line(cat("if (", a.gate[0], ") {"));
    const int64_t c = chunk(a, d.scalar, n);
    std::string pre = a.gate.empty() ? "" : "  ";
    for (int64_t j = 0; j < n; j += c) {
      if (c == 1) {
        line(cat(pre, lanes[j], " = ", read(j), ";"));
        continue;
      }
      std::string vt = vec_type(d.scalar, c);
      std::string parts = cat(pre, "{ const ", vt, " t = *(const ", vt, "*)(", a.base, " + ", at(a, j), ");");
      for (int64_t l = 0; l < c; ++l) parts += cat(" ", lanes[j + l], " = ", cuda_c::from_memory(d.scalar, cat("t.v[", l, "]")), ";");
      line(parts + " }");
    }
    if (!a.gate.empty()) {
      line("} else {");
      for (int64_t l = 0; l < n; ++l) line(cat("  ", lanes[l], " = ", alt[alt.size() == 1 ? 0 : l], ";"));
      line("}");
    }
  }
  define(u, {K::Value, lanes});
  return absl::OkStatus();
}

absl::Status Renderer::emit_store(const UOp* u) {
  ASSIGN_OR_RETURN(Access access, store_operands(u));
  const Emitted& a = access.address;
  const DType d = access.data->dtype();
  const std::vector<std::string>* v = &access.data_emitted.lanes;
  const int64_t n = d.count;
  auto write = [&](int64_t l) { return cat(a.base, "[", at(a, l), "] = ", cuda_c::to_memory(d.scalar, (*v)[l]), ";"); };
  if (a.gate.size() > 1) {
    for (int64_t l = 0; l < n; ++l) line(cat("if (", a.gate[l], ") ", write(l)));
  } else {
    std::string pre;
    if (a.gate.size() == 1) {
      line(cat("if (", a.gate[0], ") {"));
      pre = "  ";
    }
    const int64_t c = chunk(a, d.scalar, n);
    for (int64_t j = 0; j < n; j += c) {
      if (c == 1) {
        line(pre + write(j));
        continue;
      }
      std::string vt = vec_type(d.scalar, c);
      std::string parts = cat(pre, "{ ", vt, " t;");
      for (int64_t l = 0; l < c; ++l) parts += cat(" t.v[", l, "] = ", cuda_c::to_memory(d.scalar, (*v)[j + l]), ";");
      line(cat(parts, " *(", vt, "*)(", a.base, " + ", at(a, j), ") = t; }"));
    }
    if (a.gate.size() == 1) line("}");
  }
  done(u);
  return absl::OkStatus();
}

absl::Status Renderer::emit_special(const UOp* u) {
  const std::string& n = u->arg_as<StrArg>().value;
  // abi_of has checked the name (blockIdx / threadIdx .x .y .z) and the verifier the dtype.
  auto [it, fresh] = specials_.try_emplace(n, u);
  if (!fresh) {  // the same dim under another node: read it once more
    ASSIGN_OR_RETURN(const Emitted* same, get(u, it->second));
    alias_anywhere(u, same->lanes);
    return absl::OkStatus();
  }
  if (n.starts_with("threadIdx")) {
    const ConstValue* c = u->src(0)->const_value();
    if (!c || c->to_int() < 1 || c->to_int() > 1024) return refuse(u, "a threadIdx extent must be a constant in 1 .. 1024 [cuda.block]");
    threads_ *= c->to_int();
  }
  std::string v = name(u);
  decls_ += cat("  const long long ", v, " = (long long)", n, ";\n");
  alias_anywhere(u, {v});
  return absl::OkStatus();
}

absl::Status Renderer::emit_wmma(const UOp* u) {
  if (!is_mma_m16n8k16(u))
    return refuse(u, "WMMA must be m16n8k16 (a: 8 x f16 / bf16, b: 4 x the same, c and d: 4 x f32) [cuda.wmma]");
  const bool f16 = u->arg_as<WmmaArg>().dtype_in == Scalar::Float16;
  std::vector<std::string> args;
  for (int i = 0; i < 4; ++i) args.push_back(cat(name(u), "_", i));
  line(cat("float ", join(args, ", "), ";"));
  std::vector<std::string> all = args;
  for (int s = 0; s < 3; ++s) {
    ASSIGN_OR_RETURN(std::vector<std::string> v, lanes_of(u, u->src(s)));
    all.insert(all.end(), v.begin(), v.end());
  }
  line(cat(f16 ? "uop_mma_m16n8k16_f16(" : "uop_mma_m16n8k16_bf16(", join(all, ", "), ");"));
  define(u, {K::Value, args});
  return absl::OkStatus();
}

}  // namespace

bool is_mma_m16n8k16(const UOp* u) {
  if (!u->is(Op::WMMA) || u->num_src() != 3) return false;
  const auto& w = u->arg_as<WmmaArg>();
  DType a = u->src(0)->dtype(), b = u->src(1)->dtype(), c = u->src(2)->dtype();
  return w.m == 16 && w.n == 8 && w.k == 16 && w.threads == 32 &&
         (w.dtype_in == Scalar::Float16 || w.dtype_in == Scalar::BFloat16) && w.dtype_out == Scalar::Float32 &&
         a == DType(w.dtype_in, 8) && b == DType(w.dtype_in, 4) && c == DType(Scalar::Float32, 4) && u->dtype() == c;
}

absl::StatusOr<CudaSource> render_cuda(const UOp* linear, std::string_view entry, bool with_prelude) {
  RETURN_IF_ERROR(verify_for_rendering(linear, "render_cuda"));
  ASSIGN_OR_RETURN(KernelAbi abi, abi_of(linear));
  if (abi.has_thread_range) return absl::InvalidArgumentError("a CUDA kernel has no Thread range (it is a CPU axis) [cuda.thread]");
  Renderer r(linear, abi);
  RETURN_IF_ERROR(r.render(linear));
  if (!abi.gpu) abi.gpu.emplace();  // one block of one thread: still a GPU launch
  CudaSource out;
  out.entry = std::string(entry);
  out.source = cat(with_prelude ? cuda_prelude() : "", with_prelude ? "\n" : "", r.kernel(entry));
  out.abi = std::move(abi);
  out.threads_per_block = r.threads();
  return out;
}

}  // namespace uop
