// CpuTarget::host() without LLVM: CPUID and XGETBV read directly, named with LLVM's CPU
// names and feature names (the strings LLVM's target machine takes), so that a worker and
// the compiler name one machine with one string. The CPU name follows the family / model
// numbers the vendors publish; a model not in the tables is named by its features. A
// feature that needs OS support (AVX, AVX-512, AMX, APX state in XCR0) is reported only
// where the OS saves that state, as LLVM does: code using it would fault otherwise.
#include "compiler/abi/cpu_target.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "compiler/support/strings.h"

namespace uop {
namespace {

#if defined(__x86_64__)

struct Regs {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

// Leaf `leaf`, subleaf `sub`; zeros for a leaf above the CPU's maximum.
Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
  Regs r;
  const uint32_t max = __get_cpuid_max(leaf & 0x80000000u, nullptr);
  if (leaf > max) return r;
  __cpuid_count(leaf, sub, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

bool bit(uint32_t reg, int b) { return (reg >> b) & 1u; }

// XCR0: which register state the OS saves on a context switch (0 without OSXSAVE).
uint64_t xcr0(const Regs& leaf1) {
  if (!bit(leaf1.ecx, 27)) return 0;
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

using Features = std::vector<std::pair<std::string_view, bool>>;

bool has(const Features& f, std::string_view name) {
  for (const auto& [n, on] : f)
    if (n == name) return on;
  return false;
}

Features host_features() {
  const Regs l1 = cpuid(1);
  const Regs l7 = cpuid(7, 0);
  const Regs l7s1 = cpuid(7).eax >= 1 ? cpuid(7, 1) : Regs{};
  const Regs ld1 = cpuid(0xd, 1);
  const Regs l14 = cpuid(0x14, 0);
  const Regs l19 = cpuid(0x19, 0);
  const Regs e1 = cpuid(0x80000001u);
  const Regs e8 = cpuid(0x80000008u);
  const uint64_t x = xcr0(l1);
  // XMM and YMM state; then opmask, ZMM_Hi256 and Hi16_ZMM; AMX tile config and data;
  // APX's extended GPRs.
  const bool avx_os = (x & 0x6) == 0x6;
  const bool avx512_os = avx_os && (x & 0xe0) == 0xe0;
  const bool amx_os = (x & 0x60000) == 0x60000;
  const bool apx_os = bit(static_cast<uint32_t>(x), 19);
  const bool avx10 = bit(l7s1.edx, 19);
  const Regs l24 = avx10 ? cpuid(0x24, 0) : Regs{};
  const bool apx = bit(l7s1.edx, 21) && apx_os;
  const bool avx512f = bit(l7.ebx, 16) && avx512_os;

  Features f{
      // Leaf 1.
      {"cx8", bit(l1.edx, 8)},
      {"cmov", bit(l1.edx, 15)},
      {"mmx", bit(l1.edx, 23)},
      {"fxsr", bit(l1.edx, 24)},
      {"sse", bit(l1.edx, 25)},
      {"sse2", bit(l1.edx, 26)},
      {"sse3", bit(l1.ecx, 0)},
      {"pclmul", bit(l1.ecx, 1)},
      {"ssse3", bit(l1.ecx, 9)},
      {"fma", bit(l1.ecx, 12) && avx_os},
      {"cx16", bit(l1.ecx, 13)},
      {"sse4.1", bit(l1.ecx, 19)},
      {"sse4.2", bit(l1.ecx, 20)},
      {"crc32", bit(l1.ecx, 20)},  // SSE4.2's CRC32 instruction
      {"movbe", bit(l1.ecx, 22)},
      {"popcnt", bit(l1.ecx, 23)},
      {"aes", bit(l1.ecx, 25)},
      {"xsave", bit(l1.ecx, 26) && avx_os},
      {"avx", bit(l1.ecx, 28) && avx_os},
      {"f16c", bit(l1.ecx, 29) && avx_os},
      {"rdrnd", bit(l1.ecx, 30)},
      // Extended leaf 0x80000001.
      {"sahf", bit(e1.ecx, 0)},
      {"lzcnt", bit(e1.ecx, 5)},
      {"sse4a", bit(e1.ecx, 6)},
      {"prfchw", bit(e1.ecx, 8)},
      {"xop", bit(e1.ecx, 11) && avx_os},
      {"lwp", bit(e1.ecx, 15)},
      {"fma4", bit(e1.ecx, 16) && avx_os},
      {"tbm", bit(e1.ecx, 21)},
      {"mwaitx", bit(e1.ecx, 29)},
      {"64bit", bit(e1.edx, 29)},
      // Extended leaf 0x80000008.
      {"clzero", bit(e8.ebx, 0)},
      {"rdpru", bit(e8.ebx, 4)},
      {"wbnoinvd", bit(e8.ebx, 9)},
      // Leaf 7, subleaf 0: EBX.
      {"fsgsbase", bit(l7.ebx, 0)},
      {"sgx", bit(l7.ebx, 2)},
      {"bmi", bit(l7.ebx, 3)},
      {"avx2", bit(l7.ebx, 5) && avx_os},
      {"bmi2", bit(l7.ebx, 8)},
      {"invpcid", bit(l7.ebx, 10)},
      {"rtm", bit(l7.ebx, 11)},
      {"avx512f", avx512f},
      {"avx512dq", bit(l7.ebx, 17) && avx512_os},
      {"rdseed", bit(l7.ebx, 18)},
      {"adx", bit(l7.ebx, 19)},
      {"avx512ifma", bit(l7.ebx, 21) && avx512_os},
      {"clflushopt", bit(l7.ebx, 23)},
      {"clwb", bit(l7.ebx, 24)},
      {"avx512cd", bit(l7.ebx, 28) && avx512_os},
      {"sha", bit(l7.ebx, 29)},
      {"avx512bw", bit(l7.ebx, 30) && avx512_os},
      {"avx512vl", bit(l7.ebx, 31) && avx512_os},
      // ECX.
      {"avx512vbmi", bit(l7.ecx, 1) && avx512_os},
      {"pku", bit(l7.ecx, 4)},  // OSPKE: the OS turned protection keys on
      {"waitpkg", bit(l7.ecx, 5)},
      {"avx512vbmi2", bit(l7.ecx, 6) && avx512_os},
      {"shstk", bit(l7.ecx, 7)},
      {"gfni", bit(l7.ecx, 8)},
      {"vaes", bit(l7.ecx, 9) && avx_os},
      {"vpclmulqdq", bit(l7.ecx, 10) && avx_os},
      {"avx512vnni", bit(l7.ecx, 11) && avx512_os},
      {"avx512bitalg", bit(l7.ecx, 12) && avx512_os},
      {"avx512vpopcntdq", bit(l7.ecx, 14) && avx512_os},
      {"rdpid", bit(l7.ecx, 22)},
      {"kl", bit(l7.ecx, 23)},
      {"cldemote", bit(l7.ecx, 25)},
      {"movdiri", bit(l7.ecx, 27)},
      {"movdir64b", bit(l7.ecx, 28)},
      {"enqcmd", bit(l7.ecx, 29)},
      // EDX.
      {"uintr", bit(l7.edx, 5)},
      {"avx512vp2intersect", bit(l7.edx, 8) && avx512_os},
      {"serialize", bit(l7.edx, 14)},
      {"tsxldtrk", bit(l7.edx, 16)},
      {"pconfig", bit(l7.edx, 18)},
      {"amx-bf16", bit(l7.edx, 22) && amx_os},
      {"avx512fp16", bit(l7.edx, 23) && avx512_os},
      {"amx-tile", bit(l7.edx, 24) && amx_os},
      {"amx-int8", bit(l7.edx, 25) && amx_os},
      // Leaf 7, subleaf 1: EAX.
      {"sha512", bit(l7s1.eax, 0) && avx_os},
      {"sm3", bit(l7s1.eax, 1) && avx_os},
      {"sm4", bit(l7s1.eax, 2) && avx_os},
      {"raoint", bit(l7s1.eax, 3)},
      {"avxvnni", bit(l7s1.eax, 4) && avx_os},
      {"avx512bf16", bit(l7s1.eax, 5) && avx512_os},
      {"cmpccxadd", bit(l7s1.eax, 7)},
      {"amx-fp16", bit(l7s1.eax, 21) && amx_os},
      {"hreset", bit(l7s1.eax, 22)},
      {"avxifma", bit(l7s1.eax, 23) && avx_os},
      // EDX.
      {"avxvnniint8", bit(l7s1.edx, 4) && avx_os},
      {"avxneconvert", bit(l7s1.edx, 5) && avx_os},
      {"amx-complex", bit(l7s1.edx, 8) && amx_os},
      {"avxvnniint16", bit(l7s1.edx, 10) && avx_os},
      {"prefetchi", bit(l7s1.edx, 14)},
      {"usermsr", bit(l7s1.edx, 15)},
      // AVX10 (leaf 0x24: its version and whether 512-bit vectors exist).
      {"avx10.1-256", avx10 && avx512_os && (l24.ebx & 0xff) >= 1},
      {"avx10.1-512", avx10 && avx512_os && (l24.ebx & 0xff) >= 1 && bit(l24.ebx, 18)},
      // 512-bit EVEX: AVX-512, unless AVX10 says the vectors stop at 256 bits.
      {"evex512", avx512f && (!avx10 || bit(l24.ebx, 18))},
      // APX: the extended GPRs and the instructions that come with them.
      {"egpr", apx},
      {"push2pop2", apx},
      {"ppx", apx},
      {"ndd", apx},
      {"ccmp", apx},
      {"cf", apx},
      // XSAVE variants (leaf 0xd, subleaf 1), processor trace, Key Locker.
      {"xsaveopt", bit(ld1.eax, 0) && avx_os},
      {"xsavec", bit(ld1.eax, 1) && avx_os},
      {"xsaves", bit(ld1.eax, 3) && avx_os},
      {"ptwrite", bit(l14.ebx, 4)},
      {"widekl", bit(l7.ecx, 23) && bit(l19.ebx, 2)},
  };
  // LLVM names evex512 only where the OS saves AVX-512 state (a CPU without AVX-512, an
  // AMD Zen 3 say, has neither +evex512 nor -evex512 in its list): the same here, so the
  // target id is LLVM's on either kind of machine.
  if (!avx512_os) std::erase_if(f, [](const auto& e) { return e.first == "evex512"; });
  return f;
}

// Intel family 6 models, by the names LLVM gives them.
std::string intel_family6(uint32_t model, const Features& f) {
  switch (model) {
    case 0x0f: case 0x16: return "core2";
    case 0x17: case 0x1d: return "penryn";
    case 0x1a: case 0x1e: case 0x1f: case 0x2e: return "nehalem";
    case 0x25: case 0x2c: case 0x2f: return "westmere";
    case 0x2a: case 0x2d: return "sandybridge";
    case 0x3a: case 0x3e: return "ivybridge";
    case 0x3c: case 0x3f: case 0x45: case 0x46: return "haswell";
    case 0x3d: case 0x47: case 0x4f: case 0x56: return "broadwell";
    case 0x4e: case 0x5e: case 0x8e: case 0x9e: case 0xa5: case 0xa6: return "skylake";
    case 0xa7: return "rocketlake";
    case 0x55:  // one model number for three server generations
      if (has(f, "avx512bf16")) return "cooperlake";
      if (has(f, "avx512vnni")) return "cascadelake";
      return "skylake-avx512";
    case 0x66: return "cannonlake";
    case 0x7d: case 0x7e: return "icelake-client";
    case 0x8c: case 0x8d: return "tigerlake";
    case 0x6a: case 0x6c: return "icelake-server";
    case 0x97: case 0x9a: return "alderlake";
    case 0xb7: case 0xba: case 0xbf: return "raptorlake";
    case 0xaa: case 0xac: return "meteorlake";
    case 0xbe: return "gracemont";
    case 0xc5: case 0xb5: return "arrowlake";
    case 0xc6: return "arrowlake-s";
    case 0xbd: return "lunarlake";
    case 0xcc: return "pantherlake";
    case 0x8f: case 0xcf: return "sapphirerapids";  // Sapphire Rapids, Emerald Rapids
    case 0xad: return "graniterapids";
    case 0xae: return "graniterapids-d";
    case 0x1c: case 0x26: case 0x27: case 0x35: case 0x36: return "bonnell";
    case 0x37: case 0x4a: case 0x4d: case 0x5a: case 0x5d: case 0x4c: return "silvermont";
    case 0x5c: case 0x5f: return "goldmont";
    case 0x7a: return "goldmont-plus";
    case 0x86: case 0x8a: case 0x96: case 0x9c: return "tremont";
    case 0xaf: return "sierraforest";
    case 0xb6: return "grandridge";
    case 0xdd: return "clearwaterforest";
    case 0x57: return "knl";
    case 0x85: return "knm";
    default: break;
  }
  // A model newer than the table: the newest generation whose features it has.
  if (has(f, "avx512vp2intersect")) return "tigerlake";
  if (has(f, "avx512vbmi2")) return "icelake-client";
  if (has(f, "avx512vbmi")) return "cannonlake";
  if (has(f, "avx512bf16")) return "cooperlake";
  if (has(f, "avx512vnni")) return "cascadelake";
  if (has(f, "avx512vl")) return "skylake-avx512";
  if (has(f, "clflushopt")) return "skylake";
  if (has(f, "adx")) return "broadwell";
  if (has(f, "avx2")) return "haswell";
  if (has(f, "avx")) return "sandybridge";
  if (has(f, "sse4.2")) return "nehalem";
  if (has(f, "sse4.1")) return "penryn";
  if (has(f, "ssse3")) return "core2";
  return "x86-64";
}

std::string amd(uint32_t family, uint32_t model) {
  switch (family) {
    case 0x10: return "amdfam10";
    case 0x14: return "btver1";
    case 0x15:
      if (model >= 0x60 && model <= 0x7f) return "bdver4";
      if (model >= 0x30 && model <= 0x3f) return "bdver3";
      if (model == 0x02 || (model >= 0x10 && model <= 0x1f)) return "bdver2";
      return "bdver1";
    case 0x16: return "btver2";
    case 0x17:
      if ((model >= 0x30 && model <= 0x3f) || model == 0x47 || (model >= 0x60 && model <= 0x7f) ||
          (model >= 0x84 && model <= 0x87) || (model >= 0x90 && model <= 0xaf))
        return "znver2";
      return "znver1";
    case 0x19:
      if ((model >= 0x10 && model <= 0x1f) || (model >= 0x60 && model <= 0x7f) || (model >= 0xa0 && model <= 0xaf))
        return "znver4";
      return "znver3";
    case 0x1a: return "znver5";
    default: return family == 0xf ? "k8" : "x86-64";
  }
}

std::string host_cpu_name(const Features& f) {
  const Regs l0 = cpuid(0);
  const Regs l1 = cpuid(1);
  uint32_t family = (l1.eax >> 8) & 0xf;
  uint32_t model = (l1.eax >> 4) & 0xf;
  // The extended model extends families 6 and 15; the extended family adds to 15.
  if (family == 6 || family == 0xf) model |= ((l1.eax >> 16) & 0xf) << 4;
  if (family == 0xf) family += (l1.eax >> 20) & 0xff;
  const bool intel = l0.ebx == 0x756e6547 && l0.edx == 0x49656e69 && l0.ecx == 0x6c65746e;  // GenuineIntel
  const bool amd_cpu = l0.ebx == 0x68747541 && l0.edx == 0x69746e65 && l0.ecx == 0x444d4163;  // AuthenticAMD
  if (intel && family == 6) return intel_family6(model, f);
  if (amd_cpu) return amd(family, model);
  return "x86-64";
}

#endif  // __x86_64__

// LLVM's names for this build's own triple: what it was compiled for.
std::string process_triple() {
#if defined(__x86_64__)
  const char* arch = "x86_64-pc";
#elif defined(__aarch64__)
  const char* arch = "aarch64-unknown";
#else
  const char* arch = "unknown-unknown";
#endif
#if defined(__linux__) && defined(__GLIBC__)
  return cat(arch, "-linux-gnu");
#elif defined(__linux__)
  return cat(arch, "-linux-musl");
#else
  return cat(arch, "-unknown");
#endif
}

}  // namespace

CpuTarget CpuTarget::host() {
  static const CpuTarget host = [] {
    CpuTarget t;
    t.triple = process_triple();
#if defined(__x86_64__)
    const Features f = host_features();
    t.cpu = host_cpu_name(f);
    std::vector<std::string> parts;
    for (const auto& [name, on] : f) parts.push_back(cat(on ? "+" : "-", name));
    std::sort(parts.begin(), parts.end());
    t.features = join(parts, ",");
#else
    t.cpu = "generic";
#endif
    return t;
  }();
  return host;
}

std::string CpuTarget::id() const { return cat(triple, "/", cpu, "/", features); }

int CpuTarget::vector_bits() const {
  auto has_feature = [&](const std::string& f) {
    std::string tag = "+" + f;
    size_t at = features.find(tag);
    while (at != std::string::npos) {
      size_t end = at + tag.size();
      if (end == features.size() || features[end] == ',') return true;
      at = features.find(tag, end);
    }
    return false;
  };
  if (has_feature("avx512f")) return 512;
  if (has_feature("avx2") || has_feature("avx")) return 256;
  return 128;
}

}  // namespace uop
