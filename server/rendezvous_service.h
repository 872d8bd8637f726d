// The scheduler's Rendezvous service (proto/worker.proto): the key-value store through
// which the members of a Gloo collective on different hosts (and NCCL's members, for
// their unique id) find each other. It listens on the internal listener only, behind the
// cluster's credentials (transport/cluster_auth.h).
//
// Keys live in groups, one per collective: "<group>/<rest>". The scheduler opens a group
// (RendezvousStore::open_group, in process: no RPC does it) before it sends the members
// their Collective requests and closes it when they have answered, and every group has a
// budget (keys, bytes) fitted to its members and an expiry, should the scheduler never
// close it. Set and Get of a key outside an open group are refused (NOT_FOUND); a Set
// past the group's budget is RESOURCE_EXHAUSTED naming the limit; a key is written once
// (ALREADY_EXISTS after). Group names are 128 random bits (the executor makes them), so
// a holder of the cluster secret that is not a member cannot find, fill or overwrite
// another collective's keys, and the store never holds more than the open groups'
// budgets together.
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
#include "compiler/support/clock.h"
#include "proto/worker.grpc.pb.h"

namespace uop {

struct RendezvousOptions {
  absl::Duration max_wait = absl::Minutes(10);  // longer Get timeouts are cut to this
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 1 << 20;
  size_t max_keys_per_get = 4096;
  size_t max_groups = 4096;                        // open at once
  uint64_t max_total_bytes = uint64_t{256} << 20;  // the open groups' byte budgets together
  // Times the groups' expiry and the Gets' waits; not owned, outlives the store.
  const Clock* clock = Clock::real();
};

struct RendezvousGroup {
  std::string name;      // 1 to 128 bytes of [A-Za-z0-9_.-]
  size_t max_keys = 0;   // keys set at once
  uint64_t max_bytes = 0;  // their keys and values together
  absl::Duration ttl;    // closed this long after it opened, if nobody closes it first

  // The budget of a collective of `members`: what Gloo's full mesh (each member's
  // addresses for every peer), the members' own records and failure reports, and NCCL's
  // unique id take, with room to spare.
  static RendezvousGroup for_members(std::string name, int members, absl::Duration ttl);
};

class RendezvousStore {
 public:
  explicit RendezvousStore(RendezvousOptions options = {});

  // INVALID_ARGUMENT for a bad name or budget, ALREADY_EXISTS for a group open already,
  // RESOURCE_EXHAUSTED when max_groups are open or the budgets would pass max_total_bytes.
  absl::Status open_group(const RendezvousGroup& group);
  // Drops the group and its keys; Gets waiting on it fail NOT_FOUND. Unknown names: nothing.
  void close_group(const std::string& name);

  // Stores a key and wakes the Gets waiting for it. INVALID_ARGUMENT for an empty or
  // oversized key or value, NOT_FOUND outside an open group, ALREADY_EXISTS for a key set
  // before, RESOURCE_EXHAUSTED past the group's budget.
  absl::Status set(const std::string& key, std::string value);
  // The values of `keys`, in order, once all exist. NOT_FOUND when a key's group is not
  // open (or closes meanwhile); DEADLINE_EXCEEDED naming the missing keys after `wait`
  // (0: do not wait); CANCELLED when `cancelled` says so.
  absl::StatusOr<std::vector<std::string>> get(const std::vector<std::string>& keys, absl::Duration wait,
                                               const std::function<bool()>& cancelled = {});

  // Closes the groups past their expiry at `now`; returns how many. open_group runs it
  // too, so no thread of its own is needed.
  size_t expire(absl::Time now);
  size_t groups() const;
  size_t waiting() const;  // Gets waiting now for a key that is missing
  size_t size() const;     // keys, all groups together
  uint64_t bytes() const;  // their keys and values

 private:
  struct Group {
    absl::flat_hash_map<std::string, std::string> entries;  // full key -> value
    size_t max_keys = 0;
    uint64_t max_bytes = 0, bytes = 0;
    absl::Time expires;
  };
  // The open group `key` belongs to, or null (and why, in *why).
  Group* group_of_locked(const std::string& key, absl::Time now, absl::Status* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t expire_locked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RendezvousOptions opts_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  absl::flat_hash_map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);
  uint64_t budgets_ ABSL_GUARDED_BY(mu_) = 0;  // max_bytes of the open groups together
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// The gRPC adapter. Synchronous, like the scheduler's other services: a waiting Get holds
// its handler thread, and there are only as many of those as collective members joining.
class RendezvousService : public uopd::worker::v1::Rendezvous::Service {
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
