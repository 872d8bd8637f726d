// Registry.Register -> WorkerPool::register_remote. The pool reaches the worker before it
// answers, so an address nobody can dial is refused (UNAVAILABLE) and the worker retries.
// Workers call it again every heartbeat; the answer names the slot the worker serves.
#include "server/registry_service.h"

#include <string>

#include "transport/grpc_absl.h"

namespace uop {

grpc::Status RegistryService::Register(grpc::ServerContext*, const uopd::worker::v1::RegisterRequest* req,
                                       uopd::worker::v1::RegisterResponse* resp) {
  RemoteRegistration r;
  r.address = req->address();
  r.device = req->device();
  r.name = req->name();
  r.instance = req->instance();
  r.previous_name = req->previous_name();
  auto got = pool_->register_remote(r);
  if (!got.ok()) return transport::to_grpc(got.status());
  resp->set_worker_id(got->worker_id);
  resp->set_name(got->name);
  return grpc::Status::OK;
}

}  // namespace uop
