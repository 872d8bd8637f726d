// Registry.Register -> WorkerPool::register_remote. The pool reaches the worker before it
// answers, so an address nobody can dial is refused (UNAVAILABLE) and the worker retries.
#include "server/registry_service.h"

#include <string>

namespace uop {

grpc::Status RegistryService::Register(grpc::ServerContext*, const uopd::worker::v1::RegisterRequest* req,
                                       uopd::worker::v1::RegisterResponse* resp) {
  auto id = pool_->register_remote(req->address(), req->device());
  if (!id.ok())
    return grpc::Status(static_cast<grpc::StatusCode>(id.status().code()), std::string(id.status().message()));
  resp->set_worker_id(*id);
  return grpc::Status::OK;
}

}  // namespace uop
