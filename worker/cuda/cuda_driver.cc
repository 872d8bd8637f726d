// Loading the driver and turning its results into statuses. The library is opened with
// RTLD_LOCAL and never closed: the driver keeps threads of its own, and unloading it under
// them at exit is asking for a crash.
#include "worker/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <utility>

#include "compiler/support/strings.h"

namespace uop {
namespace {

constexpr const char* kDriverLibrary = "libcuda.so.1";

// Names for the codes the worker declares, for when the driver cannot name them itself
// (a stub library answers every call, cuGetErrorName included, with an error).
std::string_view known_name(cu::Result r) {
  switch (r) {
    case cu::kSuccess: return "CUDA_SUCCESS";
    case cu::kErrorInvalidValue: return "CUDA_ERROR_INVALID_VALUE";
    case cu::kErrorOutOfMemory: return "CUDA_ERROR_OUT_OF_MEMORY";
    case cu::kErrorNotInitialized: return "CUDA_ERROR_NOT_INITIALIZED";
    case cu::kErrorDeinitialized: return "CUDA_ERROR_DEINITIALIZED";
    case cu::kErrorStubLibrary: return "CUDA_ERROR_STUB_LIBRARY";
    case cu::kErrorInsufficientDriver: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case cu::kErrorDeviceUnavailable: return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case cu::kErrorNoDevice: return "CUDA_ERROR_NO_DEVICE";
    case cu::kErrorInvalidDevice: return "CUDA_ERROR_INVALID_DEVICE";
    case cu::kErrorInvalidImage: return "CUDA_ERROR_INVALID_IMAGE";
    case cu::kErrorInvalidContext: return "CUDA_ERROR_INVALID_CONTEXT";
    case cu::kErrorNoBinaryForGpu: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case cu::kErrorEccUncorrectable: return "CUDA_ERROR_ECC_UNCORRECTABLE";
    case cu::kErrorInvalidPtx: return "CUDA_ERROR_INVALID_PTX";
    case cu::kErrorUnsupportedPtxVersion: return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    case cu::kErrorInvalidHandle: return "CUDA_ERROR_INVALID_HANDLE";
    case cu::kErrorNotFound: return "CUDA_ERROR_NOT_FOUND";
    case cu::kErrorNotReady: return "CUDA_ERROR_NOT_READY";
    case cu::kErrorIllegalAddress: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case cu::kErrorLaunchOutOfResources: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    case cu::kErrorLaunchTimeout: return "CUDA_ERROR_LAUNCH_TIMEOUT";
    case cu::kErrorContextIsDestroyed: return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    case cu::kErrorAssert: return "CUDA_ERROR_ASSERT";
    case cu::kErrorHardwareStackError: return "CUDA_ERROR_HARDWARE_STACK_ERROR";
    case cu::kErrorIllegalInstruction: return "CUDA_ERROR_ILLEGAL_INSTRUCTION";
    case cu::kErrorMisalignedAddress: return "CUDA_ERROR_MISALIGNED_ADDRESS";
    case cu::kErrorInvalidAddressSpace: return "CUDA_ERROR_INVALID_ADDRESS_SPACE";
    case cu::kErrorInvalidPc: return "CUDA_ERROR_INVALID_PC";
    case cu::kErrorLaunchFailed: return "CUDA_ERROR_LAUNCH_FAILED";
    case cu::kErrorNotSupported: return "CUDA_ERROR_NOT_SUPPORTED";
    case cu::kErrorSystemDriverMismatch: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case cu::kErrorCompatNotSupportedOnDevice: return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    case cu::kErrorUnknown: return "CUDA_ERROR_UNKNOWN";
    default: return "";
  }
}

// Resolves one field; `name` is the field's (unversioned) name.
template <typename Fn>
absl::Status resolve(void* lib, const std::string& library, std::string_view name, Fn* field) {
  std::string symbol(driver_symbol(name));
  dlerror();
  void* p = dlsym(lib, symbol.c_str());
  if (!p) {
    const char* why = dlerror();
    return absl::UnavailableError(cat("no CUDA driver: ", library, " has no ", symbol,
                                      why ? cat(" (", why, ")") : std::string(), "; is the driver too old?"));
  }
  *field = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

#define UOP_RESOLVE(fn)                                                    \
  if (absl::Status st = resolve(lib, library, #fn, &api.fn); !st.ok()) \
    return st

absl::Status resolve_all(void* lib, const std::string& library, CudaApi& api) {
  UOP_RESOLVE(cuInit);
  UOP_RESOLVE(cuDriverGetVersion);
  UOP_RESOLVE(cuDeviceGetCount);
  UOP_RESOLVE(cuDeviceGet);
  UOP_RESOLVE(cuDeviceGetName);
  UOP_RESOLVE(cuDeviceGetAttribute);
  UOP_RESOLVE(cuDevicePrimaryCtxRetain);
  UOP_RESOLVE(cuDevicePrimaryCtxRelease);
  UOP_RESOLVE(cuCtxSetCurrent);
  UOP_RESOLVE(cuMemGetInfo);
  UOP_RESOLVE(cuMemAlloc);
  UOP_RESOLVE(cuMemFree);
  UOP_RESOLVE(cuMemcpyHtoD);
  UOP_RESOLVE(cuMemcpyDtoH);
  UOP_RESOLVE(cuMemcpyDtoD);
  UOP_RESOLVE(cuMemsetD8);
  UOP_RESOLVE(cuModuleLoadData);
  UOP_RESOLVE(cuModuleGetFunction);
  UOP_RESOLVE(cuModuleUnload);
  UOP_RESOLVE(cuFuncSetAttribute);
  UOP_RESOLVE(cuLaunchKernel);
  UOP_RESOLVE(cuStreamCreate);
  UOP_RESOLVE(cuStreamSynchronize);
  UOP_RESOLVE(cuStreamQuery);
  UOP_RESOLVE(cuStreamDestroy);
  UOP_RESOLVE(cuGetErrorName);
  UOP_RESOLVE(cuGetErrorString);
  // Optional (CudaApi::has_events): a missing one costs profiles their device timer only.
  for (auto [name, field] : std::initializer_list<std::pair<const char*, void**>>{
           {"cuEventCreate", reinterpret_cast<void**>(&api.cuEventCreate)},
           {"cuEventRecord", reinterpret_cast<void**>(&api.cuEventRecord)},
           {"cuEventSynchronize", reinterpret_cast<void**>(&api.cuEventSynchronize)},
           {"cuEventElapsedTime", reinterpret_cast<void**>(&api.cuEventElapsedTime)},
           {"cuEventDestroy", reinterpret_cast<void**>(&api.cuEventDestroy)}}) {
    dlerror();
    *field = dlsym(lib, std::string(driver_symbol(name)).c_str());
  }
  return absl::OkStatus();
}

#undef UOP_RESOLVE

}  // namespace

std::string_view driver_symbol(std::string_view function) {
  // cuda.h (CUDA 13) maps these to their _v2 entry points; the rest keep their names.
  // (cuStreamSynchronize and cuLaunchKernel get a _ptsz suffix only with per-thread
  // default streams, which the worker does not use.)
  static constexpr std::pair<std::string_view, std::string_view> kVersioned[] = {
      {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"},
      {"cuMemGetInfo", "cuMemGetInfo_v2"},
      {"cuMemAlloc", "cuMemAlloc_v2"},
      {"cuMemFree", "cuMemFree_v2"},
      {"cuMemcpyHtoD", "cuMemcpyHtoD_v2"},
      {"cuMemcpyDtoH", "cuMemcpyDtoH_v2"},
      {"cuMemcpyDtoD", "cuMemcpyDtoD_v2"},
      {"cuMemsetD8", "cuMemsetD8_v2"},
      {"cuStreamDestroy", "cuStreamDestroy_v2"},
      {"cuEventElapsedTime", "cuEventElapsedTime_v2"},
      {"cuEventDestroy", "cuEventDestroy_v2"},
  };
  for (const auto& [name, symbol] : kVersioned)
    if (name == function) return symbol;
  return function;
}

absl::StatusCode status_code_of(cu::Result r) {
  switch (r) {
    case cu::kSuccess:
      return absl::StatusCode::kOk;
    case cu::kErrorInvalidValue:
    case cu::kErrorInvalidImage:
    case cu::kErrorNoBinaryForGpu:
    case cu::kErrorInvalidPtx:
    case cu::kErrorUnsupportedPtxVersion:
    case cu::kErrorInvalidHandle:
    case cu::kErrorNotFound:
      return absl::StatusCode::kInvalidArgument;
    case cu::kErrorOutOfMemory:
    case cu::kErrorLaunchOutOfResources:
      return absl::StatusCode::kResourceExhausted;
    case cu::kErrorNotInitialized:
    case cu::kErrorDeinitialized:
    case cu::kErrorStubLibrary:
    case cu::kErrorInsufficientDriver:
    case cu::kErrorDeviceUnavailable:
    case cu::kErrorNoDevice:
    case cu::kErrorInvalidDevice:
    case cu::kErrorSystemDriverMismatch:
    case cu::kErrorCompatNotSupportedOnDevice:
      return absl::StatusCode::kUnavailable;
    case cu::kErrorLaunchTimeout:
      return absl::StatusCode::kDeadlineExceeded;
    case cu::kErrorNotSupported:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

bool is_sticky(cu::Result r) {
  switch (r) {
    case cu::kErrorIllegalAddress:
    case cu::kErrorLaunchTimeout:
    case cu::kErrorContextIsDestroyed:
    case cu::kErrorAssert:
    case cu::kErrorHardwareStackError:
    case cu::kErrorIllegalInstruction:
    case cu::kErrorMisalignedAddress:
    case cu::kErrorInvalidAddressSpace:
    case cu::kErrorInvalidPc:
    case cu::kErrorLaunchFailed:
    case cu::kErrorEccUncorrectable:
      return true;
    default:
      return false;
  }
}

std::string CudaDriver::error_name(cu::Result r) const {
  const char* name = nullptr;
  if (api_.cuGetErrorName && api_.cuGetErrorName(r, &name) == cu::kSuccess && name && *name) return name;
  std::string_view known = known_name(r);
  return known.empty() ? cat("CUresult ", r) : std::string(known);
}

absl::Status CudaDriver::check(cu::Result r, std::string_view function) const {
  if (r == cu::kSuccess) return absl::OkStatus();
  const char* text = nullptr;
  bool has_text = api_.cuGetErrorString && api_.cuGetErrorString(r, &text) == cu::kSuccess && text && *text;
  return absl::Status(status_code_of(r),
                      cat(function, ": ", error_name(r), has_text ? cat(" (", text, ")") : std::string()));
}

absl::Status CudaDriver::init() {
  cu::Result r = api_.cuInit(0);
  if (r == cu::kErrorNoDevice)
    return absl::UnavailableError(cat("no GPU: ", check(r, "cuInit").message()));
  if (r != cu::kSuccess) return absl::UnavailableError(cat("cuInit failed: ", check(r, "cuInit").message()));
  if (absl::Status st = UOP_CU(*this, cuDriverGetVersion, &version_); !st.ok())
    return absl::UnavailableError(cat("cuInit failed: ", st.message()));
  r = api_.cuDeviceGetCount(&device_count_);
  if (r != cu::kSuccess)
    return absl::UnavailableError(cat("no GPU: ", check(r, "cuDeviceGetCount").message()));
  if (device_count_ <= 0) return absl::UnavailableError("no GPU: the CUDA driver sees no devices");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::load_from(const std::string& library) {
  dlerror();
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    return absl::UnavailableError(cat("no CUDA driver: dlopen ", library, ": ", why ? why : "unknown error"));
  }
  CudaApi api;
  if (absl::Status st = resolve_all(lib, library, api); !st.ok()) return st;
  return from_table(api, library);
}

absl::StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::from_table(const CudaApi& api, std::string name) {
  auto driver = std::make_unique<CudaDriver>(api, std::move(name));
  if (absl::Status st = driver->init(); !st.ok()) return st;
  return driver;
}

absl::StatusOr<CudaDriver*> CudaDriver::load() {
  // Made once and never destroyed: buffers and programs may be freed during exit.
  static const absl::StatusOr<CudaDriver*> loaded = []() -> absl::StatusOr<CudaDriver*> {
    auto d = load_from(kDriverLibrary);
    if (!d.ok()) return d.status();
    return d->release();
  }();
  return loaded;
}

}  // namespace uop
