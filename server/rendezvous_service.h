// The scheduler's Rendezvous service (proto/worker.proto): the key-value store through
// which the members of a Gloo collective on different hosts find each other (DESIGN §4).
// RendezvousStore is the plain in-memory map: Set stores, Get waits until every key it
// names exists. Keys are namespaced by the collective's group name by the workers, and
// expire a while after they were set, so the keys of a group whose members crashed (and
// of every finished one: nobody deletes) do not pile up. Sizes are bounded: the
// service is reachable by anything that can reach the scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.grpc.pb.h"

namespace uop {

struct RendezvousOptions {
  absl::Duration ttl = absl::Minutes(10);       // a key lives this long after its Set
  absl::Duration max_wait = absl::Minutes(10);  // longer Get timeouts are cut to this
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 1 << 20;
  size_t max_keys_per_get = 4096;
  uint64_t max_total_bytes = uint64_t{256} << 20;  // keys and values together
};

class RendezvousStore {
 public:
  explicit RendezvousStore(RendezvousOptions options = {});

  // Stores (or replaces) a key and wakes the Gets waiting for it. INVALID_ARGUMENT for
  // an empty or oversized key or value, RESOURCE_EXHAUSTED when the store is full.
  absl::Status set(const std::string& key, std::string value);
  // The values of `keys`, in order, once all exist. DEADLINE_EXCEEDED naming the missing
  // keys after `wait` (0: do not wait); CANCELLED when `cancelled` says so.
  absl::StatusOr<std::vector<std::string>> get(const std::vector<std::string>& keys, absl::Duration wait,
                                               const std::function<bool()>& cancelled = {});

  // Drops the keys older than the TTL at `now`; returns how many. set() runs it too, at
  // most once per ttl / 8, so no thread of its own is needed.
  size_t expire(absl::Time now);
  size_t size() const;
  uint64_t bytes() const;

 private:
  struct Entry {
    std::string value;
    absl::Time expires;
  };
  size_t expire_locked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RendezvousOptions opts_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The gRPC adapter. Synchronous, like the scheduler's other services: a waiting Get holds
// its handler thread, and there are only as many of those as collective members joining.
class RendezvousService final : public uopd::worker::v1::Rendezvous::Service {
 public:
  explicit RendezvousService(RendezvousOptions options = {}) : store_(options) {}

  grpc::Status Set(grpc::ServerContext*, const uopd::worker::v1::RendezvousSetRequest*,
                   uopd::worker::v1::RendezvousSetResponse*) override;
  grpc::Status Get(grpc::ServerContext*, const uopd::worker::v1::RendezvousGetRequest*,
                   uopd::worker::v1::RendezvousGetResponse*) override;

  RendezvousStore& store() { return store_; }

 private:
  RendezvousStore store_;
};

}  // namespace uop
