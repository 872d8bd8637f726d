// The compile cache as someone who can write its directory (but lacks the cluster key)
// sees it, for the e2e tests of the cache's trust: where an entry lives, the artifact
// inside one, and an entry forged around another kernel's machine code.
#pragma once

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "client/client.h"
#include "compiler/support/strings.h"
#include "proto/artifact.pb.h"
#include "server/cache/cache_entry.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop::testing {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void overwrite(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The path of `key`'s entry in the disk tier at `dir`.
inline std::string entry_path(const std::string& dir, const std::string& key) {
  return cat(dir, "/", key.substr(0, 2), "/", key);
}

// The artifact inside a stored entry: the payload after the header, which is not secret.
inline uopd::v1::Artifact artifact_at(const std::string& path) {
  uopd::v1::Artifact a;
  std::string stored = slurp(path);
  EXPECT_GT(stored.size(), cache_entry::kHeaderSize) << path;
  EXPECT_TRUE(a.ParseFromString(stored.substr(std::min(stored.size(), cache_entry::kHeaderSize)))) << path;
  return a;
}

// What someone who can write the cache but lacks the key makes for kernel `victim`: the
// artifact it would have, with `donor`'s machine code, in the previous format (a valid
// header and SHA-256 checksum), which uopd used to serve as a hit.
inline std::string forged_entry(const client::Kernel& victim, const uopd::v1::Artifact& victim_art,
                                const uopd::v1::Artifact& donor) {
  uopd::v1::Artifact a = victim_art;
  a.set_object(donor.object());
  return checksummed_entry(victim.cache_key, a.SerializeAsString());
}

}  // namespace uop::testing
