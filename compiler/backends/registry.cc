// The built-in targets, one line each: the first is the default (a request that names no
// backend, a device no target claims).
#include "compiler/backends/cpu/cpu_backend.h"
#include "compiler/backends/cuda/cuda_backend.h"

namespace uop {

std::vector<BackendKind> builtin_backends() {
  return {
      cpu_backend_kind(),
      cuda_backend_kind(),
  };
}

}  // namespace uop
