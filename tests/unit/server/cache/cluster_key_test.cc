// ClusterKey: which key files are accepted, the embedded default's key made once and
// agreed on by servers starting together, and the entry format's authentication.
#include "server/cache/cluster_key.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "server/cache/cache_entry.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

std::string write_key(const std::string& path, std::string_view bytes, mode_t mode) {
  std::ofstream(path, std::ios::binary) << bytes;
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(ClusterKey, FromFileTakesOnlyAPrivateFileOfEnoughBytes) {
  ScratchDir d;
  std::string good = write_key(cat(d.path(), "/good"), std::string(32, 'k'), 0600);
  auto k = ClusterKey::from_file(good);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->fingerprint(), ClusterKey::from_bytes(std::string(32, 'k'))->fingerprint());
  EXPECT_TRUE(
      ClusterKey::from_file(write_key(cat(d.path(), "/owner-only"), std::string(64, 'k'), 0400))
          .ok());

  for (mode_t mode : {0640, 0604, 0620, 0602, 0660, 0644}) {
    std::string path = write_key(cat(d.path(), "/mode", mode), std::string(32, 'k'), mode);
    auto bad = ClusterKey::from_file(path);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << std::oct << mode;
    EXPECT_NE(bad.status().message().find("group or others"), std::string::npos) << bad.status();
    EXPECT_NE(bad.status().message().find("chmod 600"), std::string::npos) << bad.status();
    EXPECT_NE(bad.status().message().find(path), std::string::npos) << bad.status();
  }
  auto short_key =
      ClusterKey::from_file(write_key(cat(d.path(), "/short"), std::string(31, 'k'), 0600));
  EXPECT_EQ(short_key.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(short_key.status().message().find("at least 32"), std::string::npos)
      << short_key.status();
  auto huge =
      ClusterKey::from_file(write_key(cat(d.path(), "/huge"), std::string(5000, 'k'), 0600));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kFailedPrecondition) << huge.status();
  EXPECT_EQ(ClusterKey::from_file(cat(d.path(), "/missing")).status().code(),
            absl::StatusCode::kNotFound);
  fs::create_directory(cat(d.path(), "/dir"));
  ::chmod(cat(d.path(), "/dir").c_str(), 0700);
  EXPECT_EQ(ClusterKey::from_file(cat(d.path(), "/dir")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A FIFO is refused without waiting for a writer.
  std::string fifo = cat(d.path(), "/fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(ClusterKey::from_file(fifo).status().code(), absl::StatusCode::kFailedPrecondition);
  // Mounted secrets are links: the file behind the link is what is checked.
  fs::create_symlink(good, cat(d.path(), "/link"));
  EXPECT_TRUE(ClusterKey::from_file(cat(d.path(), "/link")).ok());
  fs::create_symlink(cat(d.path(), "/mode420"), cat(d.path(), "/link-to-readable"));
  EXPECT_FALSE(ClusterKey::from_file(cat(d.path(), "/link-to-readable")).ok());
}

TEST(ClusterKey, InDirectoryMakesAPrivateKeyOnceAndKeepsIt) {
  ScratchDir d;
  std::string dir = cat(d.path(), "/a/b/cache");  // made as needed
  auto first = ClusterKey::in_directory(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  std::string path = cat(dir, "/", ClusterKey::kFileName);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  EXPECT_EQ(st.st_uid, ::geteuid());
  auto again = ClusterKey::in_directory(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->fingerprint(), first->fingerprint());
  // Nothing else was left in the directory (the temp file is gone).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), {}), 1);
  // Another directory gets another key.
  EXPECT_NE(ClusterKey::in_directory(cat(d.path(), "/other"))->fingerprint(), first->fingerprint());
}

TEST(ClusterKey, ServersStartingTogetherAgreeOnOneKey) {
  ScratchDir d;
  std::string dir = cat(d.path(), "/cache");
  constexpr int kProcs = 8;
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<std::pair<pid_t, int>> children;
  for (int i = 0; i < kProcs; ++i) {
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      ::close(out[0]);
      char c;
      (void)!::read(go[0], &c, 1);  // returns when the parent closes its end: all start at once
      auto k = ClusterKey::in_directory(dir);
      std::string fp = k.ok() ? k->fingerprint() : cat("error: ", k.status().ToString());
      (void)!::write(out[1], fp.data(), fp.size());
      ::_exit(0);
    }
    ::close(out[1]);
    children.emplace_back(pid, out[0]);
  }
  ::close(go[0]);
  ::close(go[1]);
  std::set<std::string> fingerprints;
  for (auto [pid, fd] : children) {
    std::string fp;
    char buf[256];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) fp.append(buf, static_cast<size_t>(n));
    ::close(fd);
    ::waitpid(pid, nullptr, 0);
    EXPECT_FALSE(fp.starts_with("error")) << fp;
    fingerprints.insert(fp);
  }
  EXPECT_EQ(fingerprints.size(), 1u);
  EXPECT_EQ(*fingerprints.begin(), ClusterKey::in_directory(dir)->fingerprint());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), {}), 1);  // one key, no temp files left
}

TEST(ClusterKey, InDirectoryRefusesAKeyOthersCouldKnow) {
  ScratchDir d;
  std::string path = cat(d.path(), "/", ClusterKey::kFileName);
  write_key(path, std::string(32, 'k'), 0644);
  auto k = ClusterKey::in_directory(d.path());
  EXPECT_EQ(k.status().code(), absl::StatusCode::kFailedPrecondition)
      << k.status();  // not UNAVAILABLE: refuse to start
  ::chmod(path.c_str(), 0600);
  EXPECT_TRUE(ClusterKey::in_directory(d.path()).ok());
  // A link in its place, even to a private file of ours, is not the key uopd made.
  std::string elsewhere = write_key(cat(d.path(), "/elsewhere"), std::string(32, 'e'), 0600);
  fs::rename(path, cat(d.path(), "/kept"));
  fs::create_symlink(elsewhere, path);
  k = ClusterKey::in_directory(d.path());
  EXPECT_EQ(k.status().code(), absl::StatusCode::kFailedPrecondition) << k.status();
  EXPECT_NE(k.status().message().find("symbolic link"), std::string::npos) << k.status();
  fs::remove(path);
  fs::rename(cat(d.path(), "/kept"), path);
  // Planted by another user (in a directory others can write, like /tmp).
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    k = ClusterKey::in_directory(d.path());
    EXPECT_EQ(k.status().code(), absl::StatusCode::kFailedPrecondition) << k.status();
    EXPECT_NE(k.status().message().find("uid 65534"), std::string::npos) << k.status();
  }
}

TEST(ClusterKey, InDirectoryThatCannotBeUsedIsUnavailable) {
  ScratchDir d;
  std::string file = cat(d.path(), "/a-file");
  write_key(file, "x", 0600);
  auto k = ClusterKey::in_directory(cat(file, "/cache"));  // below a file: cannot be created
  EXPECT_EQ(k.status().code(), absl::StatusCode::kUnavailable) << k.status();
}

TEST(ClusterKey, TheMacCoversEveryByteUnderThisKeyOnly) {
  ClusterKey a = testing::cluster_key("a"), b = testing::cluster_key("b");
  EXPECT_EQ(a.mac({"ab", "c"}), a.mac({"a", "bc"}));  // of the concatenation
  EXPECT_NE(a.mac({"abc"}), a.mac({"abd"}));
  EXPECT_NE(a.mac({"abc"}), b.mac({"abc"}));
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  EXPECT_EQ(ClusterKey::from_bytes(std::string(31, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  // RFC 4231 test case 2's key is too short for a cluster key; case 6 (131 bytes of 0xaa,
  // "Test Using Larger Than Block-Size Key - Hash Key First") checks the HMAC itself.
  auto big = ClusterKey::from_bytes(std::string(131, '\xaa'));
  ASSERT_TRUE(big.ok());
  std::array<uint8_t, 32> mac =
      big->mac({"Test Using Larger Than Block-Size Key - Hash Key First"});
  std::string hex;
  for (uint8_t byte : mac)
    hex += cat(std::string(1, "0123456789abcdef"[byte >> 4]),
               std::string(1, "0123456789abcdef"[byte & 15]));
  EXPECT_EQ(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(CacheEntry, RoundTripsUnderItsKeyAndNoOther) {
  ClusterKey k = testing::cluster_key();
  std::string key = testing::key_of("kernel");
  std::string stored = cache_entry::encode(k, key, "payload");
  EXPECT_EQ(stored.size(), cache_entry::kHeaderSize + 7);
  EXPECT_EQ(*cache_entry::decode(k, key, stored, "here"), "payload");
  auto other = cache_entry::decode(testing::cluster_key("other"), key, stored, "here");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(other.status().message().find("HMAC mismatch"), std::string::npos) << other.status();
  auto old = cache_entry::decode(k, key, testing::checksummed_entry(key, "payload"), "here");
  EXPECT_EQ(old.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(old.status().message().find("bad magic"), std::string::npos) << old.status();
  // Every single bit flipped anywhere is caught.
  for (size_t i = 0; i < stored.size(); ++i) {
    std::string bad = stored;
    bad[i] ^= 0x10;
    EXPECT_EQ(cache_entry::decode(k, key, bad, "here").status().code(), absl::StatusCode::kDataLoss)
        << "byte " << i;
  }
}

}  // namespace
}  // namespace uop
