// What the fuzz targets' replay builds (UOPD_FUZZ_REPLAY: a fixed-seed corpus run as a
// ctest, no libFuzzer needed) share: writing the seeds a libFuzzer run starts from, and the
// byte-level mutations of a seed. Header-only, like the targets.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace uop::fuzz {

// Writes seeds[i] to DIR/seed<i>. The process's exit code: 0, or 1 after saying why.
inline int write_seeds(const std::vector<std::string>& seeds, const char* dir) {
  std::filesystem::create_directories(dir);
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(std::filesystem::path(dir) / ("seed" + std::to_string(i)), std::ios::binary);
    out << seeds[i];
    if (!out) {
      std::fprintf(stderr, "cannot write the seeds under %s\n", dir);
      return 1;
    }
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir);
  return 0;
}

// One to eight random byte edits of `s` (a flipped bit, a byte inserted, a run erased or
// repeated, a cut) at or after byte `from`, which stays as it is (a tag byte saying what
// the rest is). `s` keeps at least max(from, 1) bytes.
inline void mutate_bytes(std::string& s, std::mt19937_64& rng, size_t from = 0) {
  const size_t keep = std::max<size_t>(from, 1);
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits && s.size() > keep; ++e) {
    size_t at = from + rng() % (s.size() - from);
    switch (rng() % 5) {
      case 0: s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8))); break;
      case 1: s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), static_cast<char>(rng())); break;
      case 2: s.erase(at, 1 + rng() % 8); break;
      case 3: s.insert(at, s.substr(at, 1 + rng() % 16)); break;
      default: s.resize(std::max(at, keep)); break;
    }
  }
}

}  // namespace uop::fuzz
