#include "server/cache/disk_tier.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

namespace fs = std::filesystem;
using testing::key_of;
using testing::ScratchDir;

constexpr int64_t kEntry = cache_entry::kHeaderSize;  // bytes on disk beyond the payload

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string entry_path(const std::string& dir, const std::string& key) {
  return cat(dir, "/", key.substr(0, 2), "/", key);
}

std::optional<std::string> get_ok(CacheTier& t, const std::string& key) {
  auto r = t.get(key);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::nullopt;
}

// Files under `dir` whose names start with the temp prefix: none may be left behind.
int temp_files(const std::string& dir) {
  int n = 0;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().starts_with(".tmp.")) ++n;
  return n;
}

TEST(DiskTier, RoundTripStoresOneVerifiedFilePerKey) {
  ScratchDir d;
  DiskTier t(d.path(), 1 << 20, testing::cluster_key());
  ASSERT_TRUE(t.open_status().ok()) << t.open_status();
  std::string k = key_of("kernel");
  EXPECT_EQ(get_ok(t, k), std::nullopt);
  ASSERT_TRUE(t.put(k, "machine code").ok());
  EXPECT_EQ(get_ok(t, k), "machine code");

  std::string path = entry_path(d.path(), k);
  EXPECT_EQ(t.path_for(k), path);
  std::string stored = read_file(path);
  EXPECT_EQ(stored.size(), kEntry + 12);
  EXPECT_TRUE(stored.starts_with("UOPDCACHE2"));
  EXPECT_EQ(temp_files(d.path()), 0);
  EXPECT_EQ(t.bytes(), kEntry + 12);

  ASSERT_TRUE(t.put(key_of("empty"), "").ok());
  EXPECT_EQ(get_ok(t, key_of("empty")), "");
}

TEST(DiskTier, KeysThatAreNotDigestsAreRefused) {
  ScratchDir d;
  DiskTier t(cat(d.path(), "/cache"), 1 << 20, testing::cluster_key());
  std::string upper = key_of("x");
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  for (std::string bad : {std::string("../../escape"), std::string(""), key_of("x").substr(1),
                          key_of("x") + "0", upper, "../" + key_of("x").substr(3),
                          std::string(62, 'a') + "/."}) {
    EXPECT_EQ(t.put(bad, "v").code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(t.get(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // Nothing was written anywhere, inside the cache or next to it.
  EXPECT_TRUE(fs::is_empty(cat(d.path(), "/cache")));
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path()), {}), 1);
}

class DiskCorruption : public ::testing::TestWithParam<std::string> {};

TEST_P(DiskCorruption, IsDataLossAndTheEntryIsDeleted) {
  ScratchDir d;
  DiskTier t(d.path(), 1 << 20, testing::cluster_key());
  std::string k = key_of("kernel");
  std::string payload(1000, 'p');
  ASSERT_TRUE(t.put(k, payload).ok());
  std::string path = t.path_for(k);
  std::string stored = read_file(path);

  const std::string& how = GetParam();
  if (how == "flip_payload") stored[kEntry + 500] ^= 0x01;
  if (how == "flip_mac") stored[10 + 32 + 3] ^= 0x80;
  if (how == "flip_key") stored[10 + 5] ^= 0x01;
  if (how == "flip_length") stored[10 + 64] ^= 0x01;
  if (how == "flip_magic") stored[0] = 'X';
  if (how == "truncate") stored.resize(stored.size() - 1);
  if (how == "truncate_header") stored.resize(20);
  if (how == "extend") stored += "junk";
  if (how == "empty") stored.clear();
  if (how == "other_key") stored = cache_entry::encode(testing::cluster_key(), key_of("other"), payload);
  // Without the key: the previous format (a valid header and checksum) around other bytes,
  // or the current one made under another cluster's key.
  if (how == "checksummed") stored = testing::checksummed_entry(k, "another kernel's machine code");
  if (how == "other_cluster_key") stored = cache_entry::encode(testing::cluster_key("another cluster"), k, payload);
  write_file(path, stored);

  auto r = t.get(k);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find(k), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(get_ok(t, k), std::nullopt);
  EXPECT_EQ(t.entries(), 0u);
  // The key is usable again.
  ASSERT_TRUE(t.put(k, payload).ok());
  EXPECT_EQ(get_ok(t, k), payload);
}

INSTANTIATE_TEST_SUITE_P(Ways, DiskCorruption,
                         ::testing::Values("flip_payload", "flip_mac", "flip_key", "flip_length", "flip_magic",
                                           "truncate", "truncate_header", "extend", "empty", "other_key",
                                           "checksummed", "other_cluster_key"),
                         [](const auto& info) { return info.param; });

TEST(DiskTier, EvictsLeastRecentlyUsedToStayInBudget) {
  ScratchDir d;
  const int64_t each = kEntry + 100;
  DiskTier t(d.path(), 3 * each, testing::cluster_key());
  std::string v(100, 'v');
  for (auto k : {"a", "b", "c"}) ASSERT_TRUE(t.put(key_of(k), v).ok());
  EXPECT_EQ(t.bytes(), 3 * each);
  EXPECT_TRUE(get_ok(t, key_of("a")));  // b is now the least recently used
  ASSERT_TRUE(t.put(key_of("d"), v).ok());
  EXPECT_FALSE(fs::exists(t.path_for(key_of("b"))));
  EXPECT_EQ(get_ok(t, key_of("b")), std::nullopt);
  for (auto k : {"a", "c", "d"}) EXPECT_TRUE(get_ok(t, key_of(k))) << k;
  EXPECT_EQ(t.evictions(), 1u);
  EXPECT_EQ(t.bytes(), 3 * each);

  absl::Status s = t.put(key_of("huge"), std::string(4 * each, 'h'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(t.entries(), 3u);
}

TEST(DiskTier, RestartFindsEntriesAndKeepsRecencyAcrossRuns) {
  ScratchDir d;
  const int64_t each = kEntry + 100;
  std::string v(100, 'v');
  {
    DiskTier t(d.path(), 10 * each, testing::cluster_key());
    for (auto k : {"a", "b", "c"}) ASSERT_TRUE(t.put(key_of(k), v).ok());
  }
  // Make the recorded last use explicit: b oldest, then c, then a.
  auto age = [&](const char* k, int seconds_ago) {
    struct timespec ts[2];
    ::clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= seconds_ago;
    ts[1] = ts[0];
    ASSERT_EQ(::utimensat(AT_FDCWD, entry_path(d.path(), key_of(k)).c_str(), ts, 0), 0);
  };
  age("b", 300);
  age("c", 200);
  age("a", 100);
  {
    DiskTier t(d.path(), 10 * each, testing::cluster_key());
    EXPECT_EQ(t.entries(), 3u);
    EXPECT_EQ(t.bytes(), 3 * each);
    EXPECT_EQ(get_ok(t, key_of("c")), v);  // a hit after a restart; also touches c
  }
  {
    // A smaller budget on the next start evicts the least recently used: b, then a.
    DiskTier t(d.path(), 1 * each, testing::cluster_key());
    EXPECT_EQ(t.entries(), 1u);
    EXPECT_EQ(get_ok(t, key_of("c")), v);
    EXPECT_EQ(get_ok(t, key_of("a")), std::nullopt);
    EXPECT_EQ(get_ok(t, key_of("b")), std::nullopt);
  }
}

TEST(DiskTier, StartupRemovesOnlyStaleTempFiles) {
  ScratchDir d;
  std::string k = key_of("a");
  {
    DiskTier t(d.path(), 1 << 20, testing::cluster_key());
    ASSERT_TRUE(t.put(k, "v").ok());
  }
  std::string sub = cat(d.path(), "/", k.substr(0, 2));
  std::string stale = cat(sub, "/.tmp.", k, ".1.1.1");
  std::string fresh = cat(sub, "/.tmp.", k, ".2.2.2");  // another process may be writing it
  write_file(stale, "partial");
  write_file(fresh, "partial");
  struct timespec old[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, stale.c_str(), old, 0), 0);
  write_file(cat(sub, "/not-a-key"), "left alone");

  DiskTier t(d.path(), 1 << 20, testing::cluster_key());
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_TRUE(fs::exists(cat(sub, "/not-a-key")));
  EXPECT_EQ(t.entries(), 1u);
  EXPECT_EQ(get_ok(t, k), "v");
}

// The read-only checks, run by whoever cannot write the directory. Returns the failures.
std::string read_only_failures(const std::string& dir, const std::string& k) {
  std::string failures;
  DiskTier t(dir, 1 << 20, testing::cluster_key());
  if (t.entries() != 1) failures += "the existing entry was not indexed; ";
  auto got = t.get(k);
  if (!got.ok() || *got != std::optional<std::string>("v")) failures += "get failed; ";
  for (const std::string& key : {key_of("b"), k}) {
    absl::Status s = t.put(key, "w");
    if (s.code() != absl::StatusCode::kPermissionDenied)
      failures += cat("put gave ", s.ToString(), "; ");
    else if (s.message().find(dir) == std::string_view::npos)
      failures += cat("put error does not name the directory: ", s.ToString(), "; ");
  }
  got = t.get(k);
  if (!got.ok() || *got != std::optional<std::string>("v")) failures += "get after put failed; ";
  return failures;
}

TEST(DiskTier, ReadOnlyDirectoryFailsPutsButServesGets) {
  ScratchDir d;
  std::string k = key_of("a");
  {
    DiskTier t(d.path(), 1 << 20, testing::cluster_key());
    ASSERT_TRUE(t.put(k, "v").ok());
  }
  if (::geteuid() != 0) {
    for (auto& e : fs::recursive_directory_iterator(d.path()))
      if (e.is_directory()) fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::remove);
    fs::permissions(d.path(), fs::perms::owner_write, fs::perm_options::remove);
    EXPECT_EQ(read_only_failures(d.path(), k), "");
    return;
  }
  // Root writes anywhere, so run the checks in a child that has become `nobody`, to whom
  // the root-owned cache directory is readable but not writable.
  for (auto& e : fs::recursive_directory_iterator(d.path()))
    if (e.is_directory()) fs::permissions(e.path(), fs::perms::others_read | fs::perms::others_exec,
                                          fs::perm_options::add);
  fs::permissions(d.path(), fs::perms::others_read | fs::perms::others_exec, fs::perm_options::add);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    std::string failures = read_only_failures(d.path(), k);
    (void)!::write(pipe_fds[1], failures.data(), failures.size());
    ::_exit(failures.empty() ? 0 : 1);
  }
  ::close(pipe_fds[1]);
  std::string failures;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) failures.append(buf, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3)
    GTEST_SKIP() << "running as root without the right to become nobody";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << failures;
  EXPECT_EQ(failures, "");
}

TEST(DiskTier, FullDiskFailsPutsCleanlyButServesGets) {
  // RLIMIT_FSIZE makes writes past a size fail with EFBIG, as a full disk fails them with
  // ENOSPC, and it holds even for root.
  ScratchDir d;
  DiskTier t(d.path(), 1 << 30, testing::cluster_key());
  std::string k = key_of("a");
  ASSERT_TRUE(t.put(k, "small").ok());

  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::Status s = t.put(key_of("big"), std::string(64 * 1024, 'x'));
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(temp_files(d.path()), 0);  // the partial temp file was removed
  EXPECT_FALSE(fs::exists(t.path_for(key_of("big"))));
  EXPECT_EQ(get_ok(t, key_of("big")), std::nullopt);
  EXPECT_EQ(get_ok(t, k), "small");
}

// Values that can be checked for wholeness without the cache's own verification: a
// prefix naming the writer, then a fill that depends on it.
std::string value_from(int writer, int round) {
  std::string v = cat("writer ", writer, " round ", round, ":");
  v.resize(64 * 1024 + writer * 1000, static_cast<char>('a' + writer));
  return v;
}
bool is_whole(const std::string& v) {
  int writer = -1, round = -1;
  if (std::sscanf(v.c_str(), "writer %d round %d:", &writer, &round) != 2) return false;
  return v == value_from(writer, round);
}

TEST(DiskTier, ConcurrentWritersNeverExposeAPartialEntry) {
  // Two tiers over one directory stand for two processes: separate indexes, shared files.
  ScratchDir d;
  DiskTier a(d.path(), 1 << 30, testing::cluster_key()), b(d.path(), 1 << 30, testing::cluster_key());
  std::string k = key_of("contended");
  std::atomic<bool> done{false};
  std::atomic<int> hits{0}, errors{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      DiskTier& t = w % 2 ? a : b;
      for (int round = 0; round < 150; ++round) ASSERT_TRUE(t.put(k, value_from(w, round)).ok());
    });
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      DiskTier& t = r % 2 ? a : b;
      while (!done.load()) {
        auto got = t.get(k);
        if (!got.ok()) {
          ++errors;
          ADD_FAILURE() << got.status();
        } else if (got->has_value()) {
          ++hits;
          EXPECT_TRUE(is_whole(**got));
        }
      }
    });
  for (int w = 0; w < 4; ++w) threads[w].join();
  done = true;
  for (size_t i = 4; i < threads.size(); ++i) threads[i].join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_EQ(temp_files(d.path()), 0);
  auto last = a.get(k);
  ASSERT_TRUE(last.ok() && last->has_value());
  EXPECT_TRUE(is_whole(**last));
}

TEST(DiskTier, ConcurrentPutsOfManyKeysKeepTheBudget) {
  ScratchDir d;
  const int64_t budget = 40 * (kEntry + 1000);
  DiskTier t(d.path(), budget, testing::cluster_key());
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      for (int i = 0; i < 100; ++i) {
        std::string k = key_of(cat(w, "/", i));
        ASSERT_TRUE(t.put(k, std::string(1000, 'v')).ok());
        auto got = t.get(k);
        ASSERT_TRUE(got.ok()) << got.status();
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_LE(t.bytes(), budget);
  int64_t on_disk = 0;
  for (auto& e : fs::recursive_directory_iterator(d.path()))
    if (e.is_regular_file()) on_disk += static_cast<int64_t>(e.file_size());
  EXPECT_EQ(on_disk, t.bytes());
  EXPECT_EQ(DiskTier(d.path(), budget, testing::cluster_key()).bytes(), on_disk);  // a restart agrees
}

// What is at an entry's path but is not a regular file is refused without being read
// (a FIFO would block the open for good), counted as DATA_LOSS, and removed.
class DiskNonRegular : public ::testing::TestWithParam<std::string> {};

TEST_P(DiskNonRegular, IsDataLossRemovedAndNeverBlocks) {
  ScratchDir d;
  DiskTier t(d.path(), 1 << 20, testing::cluster_key());
  std::string k = key_of("kernel");
  // A valid entry elsewhere, for the link to point at: even a good entry behind a link is
  // refused (links would let whoever writes the directory alias entries or read files).
  ASSERT_TRUE(t.put(key_of("elsewhere"), "good").ok());
  std::string path = t.path_for(k);
  fs::create_directories(fs::path(path).parent_path());
  const std::string& what = GetParam();
  if (what == "fifo") ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  if (what == "symlink") fs::create_symlink(t.path_for(key_of("elsewhere")), path);
  if (what == "dangling_symlink") fs::create_symlink("/nonexistent/entry", path);
  if (what == "directory") fs::create_directory(path);
  if (what == "device") {
    if (::mknod(path.c_str(), S_IFCHR | 0644, makedev(1, 3)) != 0) GTEST_SKIP() << "cannot mknod here";
  }
  auto r = t.get(k);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(fs::symlink_status(path))) << "still there: " << path;
  EXPECT_EQ(get_ok(t, k), std::nullopt);
  ASSERT_TRUE(t.put(k, "v").ok());
  EXPECT_EQ(get_ok(t, k), "v");
  EXPECT_EQ(get_ok(t, key_of("elsewhere")), "good");  // what the link pointed at is untouched
}

INSTANTIATE_TEST_SUITE_P(Kinds, DiskNonRegular,
                         ::testing::Values("fifo", "symlink", "dangling_symlink", "directory", "device"),
                         [](const auto& info) { return info.param; });

TEST(DiskTier, AnEntryOverTheCapIsRemovedUnread) {
  ScratchDir d;
  DiskTier::Options o;
  o.max_entry_bytes = 4096;
  DiskTier t(d.path(), 1 << 20, testing::cluster_key(), o);
  std::string k = key_of("kernel");
  EXPECT_EQ(t.put(k, std::string(5000, 'x')).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(t.put(k, "small").ok());
  write_file(t.path_for(k), std::string(1 << 20, 'x'));
  auto r = t.get(k);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("cap"), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(t.path_for(k)));
}

TEST(DiskTier, RemoveDropsTheEntry) {
  ScratchDir d;
  DiskTier t(d.path(), 1 << 20, testing::cluster_key());
  std::string k = key_of("kernel");
  ASSERT_TRUE(t.put(k, "v").ok());
  ASSERT_TRUE(t.remove(k).ok());
  EXPECT_FALSE(fs::exists(t.path_for(k)));
  EXPECT_EQ(t.entries(), 0u);
  EXPECT_EQ(t.bytes(), 0);
  EXPECT_TRUE(t.remove(k).ok());  // nothing there: fine
  EXPECT_EQ(t.remove("../x").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace uop
