// The CUDA driver API, loaded at run time: dlopen("libcuda.so.1") and dlsym of the few
// functions the worker uses, under the versioned names cuda.h's macros pick (cuMemAlloc is
// cuMemAlloc_v2). Never linked, so the worker builds and starts on machines without CUDA,
// and with no cuda.h: the handful of driver types and constants are declared here, with
// the values cuda.h gives them (tests/unit/worker/cuda_driver_test.cc compares them when
// cuda.h is around). Every CUresult becomes an absl::Status naming the function and the
// driver's own error name and text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace uop {
namespace cu {

// Driver types, ABI-compatible with cuda.h's (CUresult is an int-sized enum there).
using Result = int;
using Device = int;
using DevicePtr = unsigned long long;  // CUdeviceptr_v2
struct ContextOpaque;
struct ModuleOpaque;
struct FunctionOpaque;
struct StreamOpaque;
struct EventOpaque;
using Context = ContextOpaque*;
using Module = ModuleOpaque*;
using Function = FunctionOpaque*;
using Stream = StreamOpaque*;
using Event = EventOpaque*;

// CUresult values the worker reacts to (cuda.h's CUDA_SUCCESS, CUDA_ERROR_*).
inline constexpr Result kSuccess = 0;
inline constexpr Result kErrorInvalidValue = 1;
inline constexpr Result kErrorOutOfMemory = 2;
inline constexpr Result kErrorNotInitialized = 3;
inline constexpr Result kErrorDeinitialized = 4;
inline constexpr Result kErrorStubLibrary = 34;
inline constexpr Result kErrorInsufficientDriver = 35;
inline constexpr Result kErrorDeviceUnavailable = 46;
inline constexpr Result kErrorNoDevice = 100;
inline constexpr Result kErrorInvalidDevice = 101;
inline constexpr Result kErrorInvalidImage = 200;
inline constexpr Result kErrorInvalidContext = 201;
inline constexpr Result kErrorNoBinaryForGpu = 209;
inline constexpr Result kErrorEccUncorrectable = 214;
inline constexpr Result kErrorInvalidPtx = 218;
inline constexpr Result kErrorUnsupportedPtxVersion = 222;
inline constexpr Result kErrorInvalidHandle = 400;
inline constexpr Result kErrorNotFound = 500;
inline constexpr Result kErrorNotReady = 600;
inline constexpr Result kErrorIllegalAddress = 700;
inline constexpr Result kErrorLaunchOutOfResources = 701;
inline constexpr Result kErrorLaunchTimeout = 702;
inline constexpr Result kErrorContextIsDestroyed = 709;
inline constexpr Result kErrorAssert = 710;
inline constexpr Result kErrorHardwareStackError = 714;
inline constexpr Result kErrorIllegalInstruction = 715;
inline constexpr Result kErrorMisalignedAddress = 716;
inline constexpr Result kErrorInvalidAddressSpace = 717;
inline constexpr Result kErrorInvalidPc = 718;
inline constexpr Result kErrorLaunchFailed = 719;
inline constexpr Result kErrorNotSupported = 801;
inline constexpr Result kErrorSystemDriverMismatch = 803;
inline constexpr Result kErrorCompatNotSupportedOnDevice = 804;
inline constexpr Result kErrorUnknown = 999;

// CUdevice_attribute values.
inline constexpr int kAttrMaxThreadsPerBlock = 1;
inline constexpr int kAttrMaxBlockDimX = 2;  // Y = 3, Z = 4
inline constexpr int kAttrMaxGridDimX = 5;   // Y = 6, Z = 7
inline constexpr int kAttrComputeCapabilityMajor = 75;
inline constexpr int kAttrComputeCapabilityMinor = 76;
inline constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;
// CUfunction_attribute: how much dynamic shared memory a kernel may ask for.
inline constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;

}  // namespace cu

// One pointer per driver function the worker calls. Fields carry the unversioned name
// (what messages say); CudaDriver::load resolves the symbol cuda.h maps it to.
struct CudaApi {
  cu::Result (*cuInit)(unsigned flags) = nullptr;
  cu::Result (*cuDriverGetVersion)(int* version) = nullptr;
  cu::Result (*cuDeviceGetCount)(int* count) = nullptr;
  cu::Result (*cuDeviceGet)(cu::Device* device, int ordinal) = nullptr;
  cu::Result (*cuDeviceGetName)(char* name, int len, cu::Device device) = nullptr;
  cu::Result (*cuDeviceGetAttribute)(int* value, int attribute, cu::Device device) = nullptr;
  cu::Result (*cuDevicePrimaryCtxRetain)(cu::Context* ctx, cu::Device device) = nullptr;
  cu::Result (*cuDevicePrimaryCtxRelease)(cu::Device device) = nullptr;  // _v2
  cu::Result (*cuCtxSetCurrent)(cu::Context ctx) = nullptr;
  cu::Result (*cuMemGetInfo)(size_t* free, size_t* total) = nullptr;  // _v2
  cu::Result (*cuMemAlloc)(cu::DevicePtr* ptr, size_t bytes) = nullptr;  // _v2
  cu::Result (*cuMemFree)(cu::DevicePtr ptr) = nullptr;  // _v2
  cu::Result (*cuMemcpyHtoD)(cu::DevicePtr dst, const void* src, size_t bytes) = nullptr;  // _v2
  cu::Result (*cuMemcpyDtoH)(void* dst, cu::DevicePtr src, size_t bytes) = nullptr;  // _v2
  cu::Result (*cuMemcpyDtoD)(cu::DevicePtr dst, cu::DevicePtr src, size_t bytes) = nullptr;  // _v2
  cu::Result (*cuMemsetD8)(cu::DevicePtr dst, unsigned char value, size_t count) = nullptr;  // _v2
  cu::Result (*cuModuleLoadData)(cu::Module* module, const void* image) = nullptr;
  cu::Result (*cuModuleGetFunction)(cu::Function* fn, cu::Module module, const char* name) = nullptr;
  cu::Result (*cuModuleUnload)(cu::Module module) = nullptr;
  cu::Result (*cuFuncSetAttribute)(cu::Function fn, int attribute, int value) = nullptr;
  cu::Result (*cuLaunchKernel)(cu::Function fn, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                               unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
                               cu::Stream stream, void** params, void** extra) = nullptr;
  cu::Result (*cuStreamCreate)(cu::Stream* stream, unsigned flags) = nullptr;
  cu::Result (*cuStreamSynchronize)(cu::Stream stream) = nullptr;
  cu::Result (*cuStreamQuery)(cu::Stream stream) = nullptr;  // kSuccess when done, kErrorNotReady while busy
  cu::Result (*cuStreamDestroy)(cu::Stream stream) = nullptr;  // _v2
  // Profiled launches only, and optional: a driver without them (or a fake table) leaves
  // them null, and a launch is then timed by the host's clock.
  cu::Result (*cuEventCreate)(cu::Event* event, unsigned flags) = nullptr;
  cu::Result (*cuEventRecord)(cu::Event event, cu::Stream stream) = nullptr;
  cu::Result (*cuEventSynchronize)(cu::Event event) = nullptr;
  cu::Result (*cuEventElapsedTime)(float* ms, cu::Event start, cu::Event end) = nullptr;  // _v2
  cu::Result (*cuEventDestroy)(cu::Event event) = nullptr;  // _v2
  bool has_events() const {
    return cuEventCreate && cuEventRecord && cuEventSynchronize && cuEventElapsedTime && cuEventDestroy;
  }
  cu::Result (*cuGetErrorName)(cu::Result error, const char** name) = nullptr;
  cu::Result (*cuGetErrorString)(cu::Result error, const char** text) = nullptr;
};

// The absl code a CUresult stands for: a bad image or argument is INVALID_ARGUMENT, out
// of memory RESOURCE_EXHAUSTED, a missing or broken driver or device UNAVAILABLE, a kernel
// that faulted INTERNAL (the bounds stage proved its accesses, so a fault is our bug).
absl::StatusCode status_code_of(cu::Result r);

// Errors after which the context is unusable: every later call fails the same way, so
// the worker has to start again with a fresh one.
bool is_sticky(cu::Result r);

// The symbol CudaDriver::load looks up for a CudaApi field ("cuMemAlloc" -> "cuMemAlloc_v2").
std::string_view driver_symbol(std::string_view function);

class CudaDriver {
 public:
  // The process's driver, loaded once: dlopen("libcuda.so.1"), every function resolved,
  // cuInit(0), at least one device. UNAVAILABLE with "no CUDA driver: dlopen
  // libcuda.so.1: <dlerror>", "no CUDA driver: libcuda.so.1 has no <symbol>", "no GPU:
  // ..." or "cuInit failed: ..."; later calls give the same answer.
  static absl::StatusOr<CudaDriver*> load();
  // The same steps on another library (tests: the toolkit's stub libcuda.so, a library
  // that is not a driver). Not cached; the library stays loaded.
  static absl::StatusOr<std::unique_ptr<CudaDriver>> load_from(const std::string& library);

  // A driver over a table the caller filled (tests: a fake device), started like a loaded
  // one (cuInit, the device count).
  static absl::StatusOr<std::unique_ptr<CudaDriver>> from_table(const CudaApi& api, std::string name = "(table)");
  // The same without starting it: only check() and error_name() make sense on it.
  explicit CudaDriver(const CudaApi& api, std::string library = "(table)")
      : api_(api), library_(std::move(library)) {}

  const CudaApi& api() const { return api_; }
  const std::string& library() const { return library_; }
  int version() const { return version_; }  // cuDriverGetVersion: 13000 for CUDA 13.0
  int device_count() const { return device_count_; }

  // OK for CUDA_SUCCESS, else status_code_of(r) with "<function>: <NAME> (<text>)".
  absl::Status check(cu::Result r, std::string_view function) const;
  // "CUDA_ERROR_OUT_OF_MEMORY", or "CUresult 12345" for a code the driver does not name.
  std::string error_name(cu::Result r) const;

 private:
  absl::Status init();

  CudaApi api_;
  std::string library_;
  int version_ = 0;
  int device_count_ = 0;
};

// Calls a driver function through `driver` and checks it, naming it in the status.
#define UOP_CU(driver, fn, ...) (driver).check((driver).api().fn(__VA_ARGS__), #fn)

}  // namespace uop
