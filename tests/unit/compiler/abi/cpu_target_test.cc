// CpuTarget::host() reads CPUID itself so that the worker needs no LLVM; LLVM's own
// detection is the reference for what the names mean, so both must name this machine
// with the same string (or the scheduler and a worker would name one CPU two ways).
#include "compiler/abi/cpu_target.h"

#include <gtest/gtest.h>
#include <llvm/ADT/StringMap.h>
#include <llvm/TargetParser/Host.h>

#include <algorithm>
#include <string>
#include <vector>

#include "compiler/support/strings.h"

namespace uop {
namespace {

// Features as "+name" / "-name", one per entry, sorted.
std::vector<std::string> split(const std::string& features) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < features.size()) {
    size_t comma = features.find(',', at);
    if (comma == std::string::npos) comma = features.size();
    out.push_back(features.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

std::vector<std::string> llvm_features() {
  std::vector<std::string> out;
  for (const auto& f : llvm::sys::getHostCPUFeatures())
    out.push_back(cat(f.second ? "+" : "-", std::string_view(f.first())));
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CpuTargetTest, HostMatchesLlvmsDetection) {
  const CpuTarget t = CpuTarget::host();
  EXPECT_EQ(t.triple, llvm::sys::getProcessTriple());
#if defined(__x86_64__)
  EXPECT_EQ(t.cpu, llvm::sys::getHostCPUName().str());
  // Compared feature by feature, so that a difference names the feature.
  const std::vector<std::string> mine = split(t.features), theirs = llvm_features();
  std::vector<std::string> only_mine, only_llvm;
  std::set_difference(mine.begin(), mine.end(), theirs.begin(), theirs.end(), std::back_inserter(only_mine));
  std::set_difference(theirs.begin(), theirs.end(), mine.begin(), mine.end(), std::back_inserter(only_llvm));
  EXPECT_TRUE(only_mine.empty() && only_llvm.empty())
      << "only here: " << join(only_mine, ",") << "\nonly in LLVM: " << join(only_llvm, ",");
  EXPECT_EQ(t.features, join(theirs, ","));
#else
  GTEST_SKIP() << "host detection names x86-64 CPUs only; here it says " << t.cpu;
#endif
}

TEST(CpuTargetTest, HostIsStableAndSorted) {
  const CpuTarget a = CpuTarget::host(), b = CpuTarget::host();
  EXPECT_EQ(a, b);
  const std::vector<std::string> f = split(a.features);
  EXPECT_TRUE(std::is_sorted(f.begin(), f.end()));
  for (const std::string& x : f) EXPECT_TRUE(x.starts_with("+") || x.starts_with("-")) << x;
  EXPECT_EQ(a.id(), cat(a.triple, "/", a.cpu, "/", a.features));
}

TEST(CpuTargetTest, VectorBitsFromFeatures) {
  CpuTarget t{"x86_64-pc-linux-gnu", "x", "+avx2,+avx512f,+sse2"};
  EXPECT_EQ(t.vector_bits(), 512);
  t.features = "+avx,+avx2,-avx512f";
  EXPECT_EQ(t.vector_bits(), 256);
  t.features = "+avx512fp16,-avx,-avx2,-avx512f";  // a longer name is not the feature
  EXPECT_EQ(t.vector_bits(), 128);
}

}  // namespace
}  // namespace uop
