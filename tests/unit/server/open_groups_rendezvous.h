// The Rendezvous service as a test that plays the scheduler needs it: the scheduler opens
// each collective's group before it calls the members (server/rendezvous_service.h);
// tests and benchmarks that call the members themselves, in other processes, let this
// service open the group of every key it is asked about instead, with room for many groups.
#pragma once

#include <cstdint>
#include <string>

#include "server/rendezvous_service.h"

namespace uop::testing {

class OpenGroupsRendezvous final : public RendezvousService {
 public:
  OpenGroupsRendezvous() : RendezvousService(options()) {}

  grpc::Status Set(grpc::ServerContext* ctx, const uopd::worker::v1::RendezvousSetRequest* req,
                   uopd::worker::v1::RendezvousSetResponse* resp) override {
    open(req->key());
    return RendezvousService::Set(ctx, req, resp);
  }
  grpc::Status Get(grpc::ServerContext* ctx, const uopd::worker::v1::RendezvousGetRequest* req,
                   uopd::worker::v1::RendezvousGetResponse* resp) override {
    for (const std::string& k : req->keys()) open(k);
    return RendezvousService::Get(ctx, req, resp);
  }

 private:
  static RendezvousOptions options() {
    RendezvousOptions o;
    o.max_groups = size_t{1} << 20;
    o.max_total_bytes = UINT64_MAX;
    return o;
  }
  // A group of up to 16 members; open already (another member came first) is fine.
  void open(const std::string& key) {
    (void)store().open_group(RendezvousGroup::for_members(key.substr(0, key.find('/')), 16, absl::Hours(1)));
  }
};

}  // namespace uop::testing
