// DiskTier: the compile cache's on-disk, content-addressed store. One file per entry at
// dir/ab/abcdef... (the key's first two hex digits name a subdirectory), holding the
// authenticated entry format of cache_entry.h. Entries are published whole (temp file +
// rename), re-verified on every read, and kept under a byte budget by evicting the least
// recently used. Several processes may share the directory: each keeps its own index, and
// the rename makes every file either absent or complete. Whatever else is found at an
// entry's path (a FIFO, a link, a directory, a device, an oversized file) is never read:
// it is an error, and it is removed.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <list>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/cache/cache_entry.h"
#include "server/cache/cache_tier.h"

namespace uop {

class DiskTier : public CacheTier {
 public:
  struct Options {
    // fsync the entry and its directory before the rename is considered done. Off by
    // default: a torn entry after a power cut fails verification and is recompiled.
    bool fsync = false;
    // The largest entry file read or written; a bigger file at an entry's path is removed
    // unread (an artifact is an object file: kilobytes to a few megabytes).
    int64_t max_entry_bytes = int64_t{256} << 20;
  };

  // Creates `dir` if needed and indexes the entries already there (oldest modification
  // time = least recently used). Never fails: a directory that cannot be created or read
  // leaves the tier empty, puts fail with a clear status, and open_status() says why.
  // `key` authenticates the entries: files written under another key are refused.
  DiskTier(std::string dir, int64_t byte_budget, ClusterKey key);
  DiskTier(std::string dir, int64_t byte_budget, ClusterKey key, Options options);

  std::string_view name() const override { return "disk"; }
  // DATA_LOSS (naming the key and file) for an entry that fails verification or is not a
  // regular file of at most max_entry_bytes; it is deleted, so the next get is a miss.
  // Never blocks on what it finds there (a FIFO is opened non-blocking, then refused).
  absl::StatusOr<std::optional<std::string>> get(std::string_view key) override;
  // PERMISSION_DENIED for a read-only directory, RESOURCE_EXHAUSTED for a full disk or an
  // entry larger than the budget; get() keeps working either way.
  absl::Status put(std::string_view key, std::string_view value) override;
  absl::Status remove(std::string_view key) override;

  const std::string& dir() const { return dir_; }
  std::string path_for(std::string_view key) const;  // where `key` is stored (key is valid)
  const absl::Status& open_status() const { return open_status_; }
  int64_t bytes() const;   // as this process's index knows them
  size_t entries() const;
  uint64_t evictions() const;

 private:
  struct Node {
    std::string key;
    int64_t size;
  };
  void scan();
  void touch_after_read(const std::string& key);
  // Marks `key` most recently used, recording its size; then evicts to the budget.
  void record_locked(const std::string& key, int64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void forget(const std::string& key);
  // Unlinks what is at `path` if it is still the file `st` describes, and forgets `key`;
  // returns `why` (DATA_LOSS) with a note when it could not be removed.
  absl::Status discard(const std::string& key, const std::string& path, const struct stat& st, absl::Status why);
  void evict_locked(const std::string& keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const int64_t budget_;
  const Options options_;
  const ClusterKey mac_key_;
  absl::Status open_status_;
  uint64_t tmp_salt_;  // random, so temp names from processes in other pid namespaces differ

  mutable absl::Mutex mu_;
  std::list<Node> lru_ ABSL_GUARDED_BY(mu_);  // front = most recently used
  absl::flat_hash_map<std::string, std::list<Node>::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tmp_counter_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace uop
