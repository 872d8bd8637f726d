// CUDA targets, NVRTC (loaded with dlopen on first use) and the cubin check. Rendering is
// in cuda_render.cc; without the CUDA toolkit at build time (UOPD_CUDA=0) everything here
// but NVRTC works, and compiling answers UNIMPLEMENTED.
#include "compiler/codegen/cuda.h"

#include <dlfcn.h>

#include <chrono>
#include <cstring>

#include "absl/status/status.h"
#include "compiler/abi/kernel_abi.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"

#if UOPD_CUDA
#include <nvrtc.h>
#endif

namespace uop {
namespace {

// Bump on any change to the code this backend generates: it is in every cache key.
constexpr int kBackendVersion = 2;  // 2: kernels as loop schedules, GEMM tiles in shared memory

#if UOPD_CUDA
// The NVRTC entry points this backend calls, resolved once per process.
struct Nvrtc {
  decltype(&nvrtcVersion) version = nullptr;
  decltype(&nvrtcGetErrorString) error_string = nullptr;
  decltype(&nvrtcCreateProgram) create = nullptr;
  decltype(&nvrtcDestroyProgram) destroy = nullptr;
  decltype(&nvrtcCompileProgram) compile = nullptr;
  decltype(&nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&nvrtcGetProgramLog) log = nullptr;
  decltype(&nvrtcGetPTXSize) ptx_size = nullptr;
  decltype(&nvrtcGetPTX) ptx = nullptr;
  decltype(&nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&nvrtcGetCUBIN) cubin = nullptr;
  int major = 0, minor = 0;
  absl::Status status;
};

const Nvrtc& nvrtc() {
  static const Nvrtc* lib = [] {
    auto* n = new Nvrtc;
    void* h = nullptr;
    std::string errors;
    // The soname first (the loader's search path, ldconfig), then the toolkit this was
    // built against.
    for (const char* path : {"libnvrtc.so.13", "libnvrtc.so.12", UOPD_CUDA_LIBDIR "/libnvrtc.so.13",
                             UOPD_CUDA_LIBDIR "/libnvrtc.so.12", "libnvrtc.so", UOPD_CUDA_LIBDIR "/libnvrtc.so"}) {
      h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h) break;
      const char* e = dlerror();
      errors += cat("\n  ", e ? e : path);
    }
    if (!h) {
      n->status = absl::UnavailableError(cat("cannot load NVRTC:", errors));
      return n;
    }
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      ok &= fn != nullptr;
    };
    sym(n->version, "nvrtcVersion");
    sym(n->error_string, "nvrtcGetErrorString");
    sym(n->create, "nvrtcCreateProgram");
    sym(n->destroy, "nvrtcDestroyProgram");
    sym(n->compile, "nvrtcCompileProgram");
    sym(n->log_size, "nvrtcGetProgramLogSize");
    sym(n->log, "nvrtcGetProgramLog");
    sym(n->ptx_size, "nvrtcGetPTXSize");
    sym(n->ptx, "nvrtcGetPTX");
    sym(n->cubin_size, "nvrtcGetCUBINSize");
    sym(n->cubin, "nvrtcGetCUBIN");
    if (!ok || n->version(&n->major, &n->minor) != NVRTC_SUCCESS)
      n->status = absl::UnavailableError("the NVRTC library found lacks the functions this backend needs");
    return n;
  }();
  return *lib;
}

// A program handle destroyed on every path out.
class Program {
 public:
  explicit Program(const Nvrtc& n) : n_(n) {}
  ~Program() {
    if (p_) n_.destroy(&p_);
  }
  nvrtcProgram* addr() { return &p_; }
  nvrtcProgram get() const { return p_; }

 private:
  const Nvrtc& n_;
  nvrtcProgram p_ = nullptr;
};
#endif

// Little-endian reads from an untrusted buffer; false when out of range.
template <typename T>
bool read_at(std::string_view b, uint64_t off, T& out) {
  if (off > b.size() || b.size() - off < sizeof(T)) return false;
  std::memcpy(&out, b.data() + off, sizeof(T));
  return true;
}

}  // namespace

absl::StatusOr<CudaTarget> CudaTarget::parse(std::string_view arch) {
  std::string_view digits = arch.starts_with("sm_") ? arch.substr(3) : std::string_view{};
  if (digits.ends_with("a")) digits.remove_suffix(1);
  bool ok = digits.size() >= 2 && digits.size() <= 3;
  for (char c : digits) ok &= c >= '0' && c <= '9';
  if (!ok || std::stoi(std::string(digits)) < 70)
    return absl::InvalidArgumentError(cat("CUDA target '", arch, "' is not sm_XX (sm_70 or newer), e.g. sm_80 [cuda.target]"));
  return CudaTarget{std::string(arch)};
}

std::string CudaTarget::id() const { return cat("cuda/", arch); }

int CudaTarget::sm() const {
  int v = 0;
  for (char c : std::string_view(arch).substr(std::min<size_t>(3, arch.size())))
    if (c >= '0' && c <= '9') v = v * 10 + (c - '0');
  return v;
}

absl::Status nvrtc_status() {
#if UOPD_CUDA
  return nvrtc().status;
#else
  return absl::UnimplementedError("uopd was built without CUDA (UOPD_CUDA=OFF): no NVRTC");
#endif
}

std::string nvrtc_version() {
#if UOPD_CUDA
  if (nvrtc().status.ok()) return cat(nvrtc().major, ".", nvrtc().minor);
#endif
  return "none";
}

// The ABI version is in it, as in the CPU build id: a kernel of an older ABI text (without
// the work estimate) never shares a cache key with a newer one.
std::string cuda_build_id() { return cat("uopd-cuda/", kBackendVersion, " abi-", kAbiVersion, " nvrtc-", nvrtc_version()); }

absl::StatusOr<CudaModule> nvrtc_compile(std::string_view source, const CudaTarget& target,
                                         const CudaCompileOptions& options, std::string_view file_name) {
  if (absl::Status s = nvrtc_status(); !s.ok()) return s;
#if UOPD_CUDA
  const Nvrtc& n = nvrtc();
  auto t0 = std::chrono::steady_clock::now();
  Program prog(n);
  std::string src(source), file(file_name);
  if (nvrtcResult r = n.create(prog.addr(), src.c_str(), file.c_str(), 0, nullptr, nullptr); r != NVRTC_SUCCESS)
    return absl::InternalError(cat("nvrtcCreateProgram: ", n.error_string(r)));
  // No contraction into FMA (eval.h rounds every op), IEEE division and square root,
  // denormals kept: NVRTC's defaults except --fmad.
  std::vector<std::string> opts = {cat("--gpu-architecture=", target.arch), "--fmad=false", "--prec-div=true",
                                   "--prec-sqrt=true", "--ftz=false", "--std=c++17"};
  if (options.line_info) opts.push_back("--generate-line-info");
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  nvrtcResult r = n.compile(prog.get(), static_cast<int>(argv.size()), argv.data());
  CudaModule m;
  size_t size = 0;
  if (n.log_size(prog.get(), &size) == NVRTC_SUCCESS && size > 1) {
    m.log.resize(size);
    n.log(prog.get(), m.log.data());
    m.log.resize(size - 1);  // the terminating NUL
  }
  if (r == NVRTC_ERROR_COMPILATION || r == NVRTC_ERROR_INVALID_OPTION)
    return absl::InvalidArgumentError(cat("NVRTC refused the kernel for ", target.arch, ": ", n.error_string(r), "\n", m.log));
  if (r != NVRTC_SUCCESS) return absl::InternalError(cat("NVRTC failed: ", n.error_string(r), "\n", m.log));
  if (n.cubin_size(prog.get(), &size) != NVRTC_SUCCESS || size == 0)
    return absl::InternalError(cat("NVRTC made no cubin for ", target.arch));
  m.cubin.resize(size);
  if (n.cubin(prog.get(), m.cubin.data()) != NVRTC_SUCCESS) return absl::InternalError("nvrtcGetCUBIN failed");
  if (options.emit_ptx && n.ptx_size(prog.get(), &size) == NVRTC_SUCCESS && size > 1) {
    m.ptx.resize(size);
    if (n.ptx(prog.get(), m.ptx.data()) != NVRTC_SUCCESS) return absl::InternalError("nvrtcGetPTX failed");
    m.ptx.resize(size - 1);
  }
  m.compile_ms = ms_since(t0);
  return m;
#else
  return absl::UnimplementedError("built without CUDA");
#endif
}

absl::StatusOr<CudaArtifact> compile_cuda(const UOp* linear, const CudaTarget& target, const CudaCompileOptions& options) {
  if (!linear || !linear->is(Op::LINEAR)) return absl::InvalidArgumentError("compile_cuda needs a LINEAR");
  for (const UOp* u : linear->src())
    if (u->is(Op::WMMA) && target.sm() < 80)
      return absl::InvalidArgumentError(cat("WMMA (mma.sync m16n8k16) needs sm_80 or newer, not ", target.arch, " [cuda.wmma]"));
  auto t0 = std::chrono::steady_clock::now();
  auto src = render_cuda(linear, options.entry);
  if (!src.ok()) return src.status();
  CudaArtifact art;
  art.render_ms = ms_since(t0);
  art.source = std::move(src->source);
  art.abi = std::move(src->abi);
  art.entry = options.entry;
  auto m = nvrtc_compile(art.source, target, options);
  if (!m.ok()) return m.status();
  art.cubin = std::move(m->cubin);
  art.ptx = std::move(m->ptx);
  art.compile_ms = m->compile_ms;
  return art;
}

absl::StatusOr<CubinInfo> inspect_cubin(std::string_view b) {
  auto bad = [](std::string_view why) { return absl::InvalidArgumentError(cat("not a cubin: ", why)); };
  if (b.size() < 64 || b.substr(0, 4) != "\x7f" "ELF") return bad("no ELF header");
  if (b[4] != 2 || b[5] != 1) return bad("not a 64-bit little-endian ELF");
  uint16_t machine = 0, shentsize = 0, shnum = 0;
  uint32_t flags = 0;
  uint64_t shoff = 0;
  read_at(b, 18, machine);
  read_at(b, 40, shoff);
  read_at(b, 48, flags);
  read_at(b, 58, shentsize);
  read_at(b, 60, shnum);
  if (machine != 190) return bad(cat("e_machine is ", machine, ", not EM_CUDA (190)"));
  CubinInfo info;
  info.abi_version = static_cast<uint8_t>(b[8]);
  // ELF ABI version 8 (CUDA 12.8 and newer) keeps the SM in bits 8..15 of e_flags,
  // earlier versions in bits 0..7.
  info.sm = info.abi_version >= 8 ? (flags >> 8) & 0xff : flags & 0xff;
  if (shentsize < 64 || shnum == 0 || shoff >= b.size()) return bad("no section headers");
  struct Section { uint32_t name, type; uint64_t off, size, link, entsize; };
  std::vector<Section> sec(shnum);
  for (uint16_t i = 0; i < shnum; ++i) {
    uint64_t h = shoff + uint64_t{i} * shentsize;
    uint32_t link = 0;
    if (!read_at(b, h, sec[i].name) || !read_at(b, h + 4, sec[i].type) || !read_at(b, h + 24, sec[i].off) ||
        !read_at(b, h + 32, sec[i].size) || !read_at(b, h + 40, link) || !read_at(b, h + 56, sec[i].entsize))
      return bad("truncated section header");
    sec[i].link = link;
    // SHT_NOBITS (8: .bss, .nv.shared.*) occupies no bytes of the file.
    if (sec[i].type != 8 && (sec[i].off > b.size() || sec[i].size > b.size() - sec[i].off))
      return bad("a section past the end");
  }
  for (const Section& s : sec) {
    if (s.type != 2 || s.entsize < 24 || s.link >= shnum) continue;  // SHT_SYMTAB
    const Section& strtab = sec[s.link];
    if (strtab.type == 8) continue;  // no bytes to read names from
    for (uint64_t off = s.off; off + 24 <= s.off + s.size; off += s.entsize) {
      uint32_t name = 0;
      uint8_t st_info = 0;
      read_at(b, off, name);
      read_at(b, off + 4, st_info);
      if ((st_info & 0xf) != 2 || name >= strtab.size) continue;  // STT_FUNC
      std::string_view str = b.substr(strtab.off + name, strtab.size - name);
      info.kernels.emplace_back(str.substr(0, str.find('\0')));
    }
  }
  return info;
}

}  // namespace uop
