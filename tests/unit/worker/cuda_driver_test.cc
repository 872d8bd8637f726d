// The CUDA runtime where there is no GPU: what loading the driver says when it cannot
// (no libcuda.so.1, a library that is not a driver, the toolkit's stub), that our own
// declarations agree with cuda.h where it is around, how CUresults become statuses, launch
// shapes from LaunchExprs, the kernel argument block and the launch checks.
#include "worker/cuda/cuda_driver.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "compiler/support/strings.h"
#include "worker/cuda/cuda_program.h"

#ifdef UOPD_HAVE_CUDA_H
#include <cuda.h>
// cuda.h renames these to their versioned symbols, which would rename CudaApi's fields in
// this file too; the comparisons below name the versioned functions outright.
#undef cuDevicePrimaryCtxRelease
#undef cuMemGetInfo
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemcpyHtoD
#undef cuMemcpyDtoH
#undef cuMemcpyDtoD
#undef cuMemsetD8
#undef cuStreamDestroy
#undef cuStreamSynchronize
#undef cuLaunchKernel
#undef cuEventRecord
#undef cuEventElapsedTime
#undef cuEventDestroy
#endif

namespace uop {
namespace {

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

TEST(CudaDriver, LoadSaysWhyThereIsNoDriver) {
  auto d = CudaDriver::load();
  if (d.ok()) GTEST_SKIP() << "a CUDA driver with " << (*d)->device_count() << " GPU(s) is present";
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable) << d.status();
  std::string msg(d.status().message());
  if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(lib);
    // A driver without a GPU (or a broken one).
    EXPECT_TRUE(msg.starts_with("no GPU") || msg.starts_with("cuInit failed: ")) << msg;
  } else {
    EXPECT_TRUE(msg.starts_with("no CUDA driver: dlopen libcuda.so.1: ")) << msg;
    EXPECT_TRUE(contains(msg, "libcuda.so.1: cannot open shared object file")) << msg;
  }
  // The answer is made once.
  EXPECT_EQ(CudaDriver::load().status(), d.status());
}

TEST(CudaDriver, LoadFromALibraryThatIsNotADriver) {
  auto missing = CudaDriver::load_from("/nonexistent/libcuda.so.1");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(std::string(missing.status().message()).starts_with("no CUDA driver: dlopen /nonexistent/libcuda.so.1: "))
      << missing.status();
  auto libc = CudaDriver::load_from("libc.so.6");
  EXPECT_EQ(libc.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(contains(std::string(libc.status().message()), "no CUDA driver: libc.so.6 has no cuInit")) << libc.status();
}

TEST(CudaDriver, TheToolkitStubIsNoDriver) {
  const char* stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (!std::filesystem::exists(stub)) GTEST_SKIP() << stub << " is not here (no CUDA toolkit)";
  auto d = CudaDriver::load_from(stub);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  // Every symbol resolves (the stub has them all); cuInit says what it is.
  EXPECT_TRUE(std::string(d.status().message()).starts_with("cuInit failed: cuInit: CUDA_ERROR_STUB_LIBRARY")) << d.status();
}

TEST(CudaDriver, VersionedSymbolsAsCudaHMapsThem) {
  EXPECT_EQ(driver_symbol("cuMemAlloc"), "cuMemAlloc_v2");
  EXPECT_EQ(driver_symbol("cuMemcpyDtoH"), "cuMemcpyDtoH_v2");
  EXPECT_EQ(driver_symbol("cuDevicePrimaryCtxRelease"), "cuDevicePrimaryCtxRelease_v2");
  EXPECT_EQ(driver_symbol("cuStreamDestroy"), "cuStreamDestroy_v2");
  EXPECT_EQ(driver_symbol("cuLaunchKernel"), "cuLaunchKernel");
  EXPECT_EQ(driver_symbol("cuEventElapsedTime"), "cuEventElapsedTime_v2");
  EXPECT_EQ(driver_symbol("cuEventDestroy"), "cuEventDestroy_v2");
  EXPECT_EQ(driver_symbol("cuEventRecord"), "cuEventRecord");
  EXPECT_EQ(driver_symbol("cuInit"), "cuInit");
}

#ifdef UOPD_HAVE_CUDA_H
// The declarations the runtime makes for itself agree with the toolkit's.
static_assert(sizeof(CUdeviceptr) == sizeof(cu::DevicePtr));
static_assert(sizeof(CUresult) == sizeof(cu::Result));
static_assert(sizeof(CUdevice) == sizeof(cu::Device));
static_assert(CUDA_ERROR_OUT_OF_MEMORY == cu::kErrorOutOfMemory);
static_assert(CUDA_ERROR_STUB_LIBRARY == cu::kErrorStubLibrary);
static_assert(CUDA_ERROR_NO_DEVICE == cu::kErrorNoDevice);
static_assert(CUDA_ERROR_INVALID_IMAGE == cu::kErrorInvalidImage);
static_assert(CUDA_ERROR_NO_BINARY_FOR_GPU == cu::kErrorNoBinaryForGpu);
static_assert(CUDA_ERROR_NOT_FOUND == cu::kErrorNotFound);
static_assert(CUDA_ERROR_ILLEGAL_ADDRESS == cu::kErrorIllegalAddress);
static_assert(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES == cu::kErrorLaunchOutOfResources);
static_assert(CUDA_ERROR_LAUNCH_FAILED == cu::kErrorLaunchFailed);
static_assert(CUDA_ERROR_MISALIGNED_ADDRESS == cu::kErrorMisalignedAddress);
static_assert(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH == cu::kErrorSystemDriverMismatch);
static_assert(CUDA_ERROR_UNKNOWN == cu::kErrorUnknown);
static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR == cu::kAttrComputeCapabilityMajor);
static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR == cu::kAttrComputeCapabilityMinor);
static_assert(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK == cu::kAttrMaxThreadsPerBlock);
static_assert(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X == cu::kAttrMaxBlockDimX);
static_assert(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z == cu::kAttrMaxBlockDimX + 2);
static_assert(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X == cu::kAttrMaxGridDimX);
static_assert(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z == cu::kAttrMaxGridDimX + 2);
static_assert(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN == cu::kAttrMaxSharedMemoryPerBlockOptin);
static_assert(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == cu::kFuncAttrMaxDynamicSharedSizeBytes);
// And the functions, parameter by parameter, by size (the handle types are ours, and
// CUresult is an enum there).
template <typename R, typename... A>
constexpr std::array<size_t, sizeof...(A) + 1> shape_of(R (*)(A...)) {
  return {sizeof(R), sizeof(A)...};
}
#define UOP_SAME_SHAPE(field, symbol) \
  static_assert(shape_of(&::symbol) == shape_of(decltype(CudaApi::field){}), #symbol)
UOP_SAME_SHAPE(cuInit, cuInit);
UOP_SAME_SHAPE(cuDriverGetVersion, cuDriverGetVersion);
UOP_SAME_SHAPE(cuDeviceGetCount, cuDeviceGetCount);
UOP_SAME_SHAPE(cuDeviceGet, cuDeviceGet);
UOP_SAME_SHAPE(cuDeviceGetName, cuDeviceGetName);
UOP_SAME_SHAPE(cuDeviceGetAttribute, cuDeviceGetAttribute);
UOP_SAME_SHAPE(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
UOP_SAME_SHAPE(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2);
UOP_SAME_SHAPE(cuCtxSetCurrent, cuCtxSetCurrent);
UOP_SAME_SHAPE(cuMemGetInfo, cuMemGetInfo_v2);
UOP_SAME_SHAPE(cuMemAlloc, cuMemAlloc_v2);
UOP_SAME_SHAPE(cuMemFree, cuMemFree_v2);
UOP_SAME_SHAPE(cuMemcpyHtoD, cuMemcpyHtoD_v2);
UOP_SAME_SHAPE(cuMemcpyDtoH, cuMemcpyDtoH_v2);
UOP_SAME_SHAPE(cuMemcpyDtoD, cuMemcpyDtoD_v2);
UOP_SAME_SHAPE(cuMemsetD8, cuMemsetD8_v2);
UOP_SAME_SHAPE(cuModuleLoadData, cuModuleLoadData);
UOP_SAME_SHAPE(cuModuleGetFunction, cuModuleGetFunction);
UOP_SAME_SHAPE(cuModuleUnload, cuModuleUnload);
UOP_SAME_SHAPE(cuFuncSetAttribute, cuFuncSetAttribute);
UOP_SAME_SHAPE(cuLaunchKernel, cuLaunchKernel);
UOP_SAME_SHAPE(cuStreamCreate, cuStreamCreate);
UOP_SAME_SHAPE(cuStreamSynchronize, cuStreamSynchronize);
UOP_SAME_SHAPE(cuStreamDestroy, cuStreamDestroy_v2);
UOP_SAME_SHAPE(cuGetErrorName, cuGetErrorName);
UOP_SAME_SHAPE(cuGetErrorString, cuGetErrorString);
UOP_SAME_SHAPE(cuEventCreate, cuEventCreate);
UOP_SAME_SHAPE(cuEventRecord, cuEventRecord);
UOP_SAME_SHAPE(cuEventSynchronize, cuEventSynchronize);
UOP_SAME_SHAPE(cuEventElapsedTime, cuEventElapsedTime_v2);
UOP_SAME_SHAPE(cuEventDestroy, cuEventDestroy_v2);
#undef UOP_SAME_SHAPE
#endif

// ---- CUresult -> absl::Status, through a fake table of error names. ----

cu::Result fake_error_name(cu::Result r, const char** out) {
  switch (r) {
    case cu::kErrorOutOfMemory: *out = "CUDA_ERROR_OUT_OF_MEMORY"; return cu::kSuccess;
    case cu::kErrorIllegalAddress: *out = "CUDA_ERROR_ILLEGAL_ADDRESS"; return cu::kSuccess;
    case cu::kErrorNoBinaryForGpu: *out = "CUDA_ERROR_NO_BINARY_FOR_GPU"; return cu::kSuccess;
    default: return cu::kErrorInvalidValue;  // what the driver says for a code it does not know
  }
}

cu::Result fake_error_string(cu::Result r, const char** out) {
  switch (r) {
    case cu::kErrorOutOfMemory: *out = "out of memory"; return cu::kSuccess;
    case cu::kErrorIllegalAddress: *out = "an illegal memory access was encountered"; return cu::kSuccess;
    default: return cu::kErrorInvalidValue;
  }
}

TEST(CudaDriver, ResultsBecomeStatusesNamingTheFunctionAndTheError) {
  CudaApi api;
  api.cuGetErrorName = fake_error_name;
  api.cuGetErrorString = fake_error_string;
  CudaDriver drv(api);
  EXPECT_TRUE(drv.check(cu::kSuccess, "cuInit").ok());

  absl::Status oom = drv.check(cu::kErrorOutOfMemory, "cuMemAlloc");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(oom.message(), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)");

  absl::Status fault = drv.check(cu::kErrorIllegalAddress, "cuStreamSynchronize");
  EXPECT_EQ(fault.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(fault.message(), "cuStreamSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)");

  absl::Status arch = drv.check(cu::kErrorNoBinaryForGpu, "cuModuleLoadData");
  EXPECT_EQ(arch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arch.message(), "cuModuleLoadData: CUDA_ERROR_NO_BINARY_FOR_GPU");

  // Names the driver does not give: ours, or the number.
  EXPECT_EQ(drv.check(cu::kErrorStubLibrary, "cuInit").message(), "cuInit: CUDA_ERROR_STUB_LIBRARY");
  EXPECT_EQ(drv.check(12345, "cuInit").message(), "cuInit: CUresult 12345");
  EXPECT_EQ(CudaDriver(CudaApi{}).check(cu::kErrorInvalidImage, "cuModuleLoadData").message(),
            "cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE");
}

TEST(CudaDriver, StatusCodesAndStickyErrors) {
  using C = absl::StatusCode;
  struct Case {
    cu::Result r;
    C code;
    bool sticky;
  } cases[] = {
      {cu::kErrorInvalidValue, C::kInvalidArgument, false},  {cu::kErrorInvalidImage, C::kInvalidArgument, false},
      {cu::kErrorInvalidPtx, C::kInvalidArgument, false},    {cu::kErrorNotFound, C::kInvalidArgument, false},
      {cu::kErrorOutOfMemory, C::kResourceExhausted, false}, {cu::kErrorLaunchOutOfResources, C::kResourceExhausted, false},
      {cu::kErrorNoDevice, C::kUnavailable, false},          {cu::kErrorStubLibrary, C::kUnavailable, false},
      {cu::kErrorInsufficientDriver, C::kUnavailable, false}, {cu::kErrorNotSupported, C::kUnimplemented, false},
      {cu::kErrorIllegalAddress, C::kInternal, true},        {cu::kErrorLaunchFailed, C::kInternal, true},
      {cu::kErrorMisalignedAddress, C::kInternal, true},     {cu::kErrorIllegalInstruction, C::kInternal, true},
      {cu::kErrorLaunchTimeout, C::kDeadlineExceeded, true}, {cu::kErrorUnknown, C::kInternal, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(status_code_of(c.r), c.code) << c.r;
    EXPECT_EQ(is_sticky(c.r), c.sticky) << c.r;
  }
  EXPECT_EQ(status_code_of(cu::kSuccess), C::kOk);
}

// ---- Launch shapes. ----

using Term = LaunchExpr::Term;

LaunchExpr expr(std::vector<Term> terms, size_t vars = 2) {
  auto e = LaunchExpr::from_terms(std::move(terms), vars);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *e : LaunchExpr();
}
Term c(int64_t v) { return {Term::Kind::Const, v, Op::ADD}; }
Term var(int64_t i) { return {Term::Kind::Var, i, Op::ADD}; }
Term op(Op o) { return {Term::Kind::Op, 0, o}; }

// grid x = (n + 255) / 256, grid y = m, block x = 256.
GpuLaunchShape ceil_div_shape() {
  GpuLaunchShape s;
  s.grid[0] = expr({var(0), c(255), op(Op::ADD), c(256), op(Op::IDIV)});
  s.grid[1] = expr({var(1)});
  s.block[0] = LaunchExpr::constant(256);
  return s;
}

const std::vector<KernelVar> kVars = {{"n", 0, 1 << 30}, {"m", 0, 1 << 20}};

TEST(CudaLaunch, GridFromLaunchExprs) {
  GpuLaunchShape s = ceil_div_shape();
  GpuLimits limits;
  auto d = eval_launch_dims(s, kVars, std::vector<int64_t>{1000, 3}, limits);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->empty);
  EXPECT_EQ(d->grid, (std::array<uint32_t, 3>{4, 3, 1}));
  EXPECT_EQ(d->block, (std::array<uint32_t, 3>{256, 1, 1}));
  EXPECT_EQ(d->shared_bytes, 0u);
  EXPECT_EQ(d->str(), "grid (4, 3, 1) block (256, 1, 1)");
  d = eval_launch_dims(s, kVars, std::vector<int64_t>{1024, 1}, limits);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->grid[0], 4u);
  d = eval_launch_dims(s, kVars, std::vector<int64_t>{1025, 1}, limits);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->grid[0], 5u);
  // No work: nothing to launch, like a Thread range with no iterations.
  d = eval_launch_dims(s, kVars, std::vector<int64_t>{0, 1}, limits);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->empty);
  d = eval_launch_dims(s, kVars, std::vector<int64_t>{10, 0}, limits);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->empty);
  EXPECT_EQ(s.str(kVars), "grid (((n + 255) / 256), m, 1) block (256, 1, 1)");
}

TEST(CudaLaunch, DimsPastTheDeviceLimitsAreRefused) {
  GpuLaunchShape s = ceil_div_shape();
  GpuLimits limits;
  auto tall = eval_launch_dims(s, kVars, std::vector<int64_t>{10, 70000}, limits);
  EXPECT_EQ(tall.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* part : {"grid (1, 70000, 1)", "grid y", "65535", "m"})
    EXPECT_TRUE(contains(std::string(tall.status().message()), part)) << part << ": " << tall.status();

  limits.max_grid[0] = 3;  // a device with a small grid
  EXPECT_EQ(eval_launch_dims(s, kVars, std::vector<int64_t>{1000, 1}, limits).status().code(),
            absl::StatusCode::kInvalidArgument);

  GpuLaunchShape wide;
  wide.block = {LaunchExpr::constant(32), LaunchExpr::constant(32), LaunchExpr::constant(2)};
  auto threads = eval_launch_dims(wide, {}, {}, GpuLimits{});
  EXPECT_EQ(threads.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(std::string(threads.status().message()), "2048 threads in a block")) << threads.status();
  wide.block = {LaunchExpr::constant(1), LaunchExpr::constant(1), LaunchExpr::constant(65)};
  EXPECT_EQ(eval_launch_dims(wide, {}, {}, GpuLimits{}).status().code(), absl::StatusCode::kInvalidArgument);
  wide.block = {LaunchExpr::constant(1), LaunchExpr::constant(1), LaunchExpr::constant(1)};
  wide.dynamic_shared_bytes = 64 << 10;
  EXPECT_EQ(eval_launch_dims(wide, {}, {}, GpuLimits{}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaLaunch, ArgumentsAreBufferPointersBySlotThenVariables) {
  std::vector<cu::DevicePtr> buffers = {0x7000, 0, 0x9100};
  std::vector<int64_t> vars = {-5, int64_t{1} << 40};
  KernelArgs a = pack_kernel_args(buffers, vars);
  ASSERT_EQ(a.pointers.size(), 5u);
  auto at = [&](size_t i) { return *static_cast<const uint64_t*>(a.pointers[i]); };
  EXPECT_EQ(at(0), 0x7000u);
  EXPECT_EQ(at(1), 0u);
  EXPECT_EQ(at(2), 0x9100u);
  EXPECT_EQ(static_cast<int64_t>(at(3)), -5);
  EXPECT_EQ(static_cast<int64_t>(at(4)), int64_t{1} << 40);
}

TEST(CudaLaunch, SharedLaunchChecks) {
  KernelAbi abi;
  abi.params = {{0, dtypes::int32, 16, false, true}, {1, dtypes::int32, 16, true, false}};
  abi.vars = {{"n", 0, 16}};
  auto check = [&](std::vector<uintptr_t> a, std::vector<int64_t> v) { return check_launch_args(abi, a, v); };
  EXPECT_TRUE(check({0x1000, 0x2000}, {16}).ok());
  EXPECT_EQ(check({0x1000, 0x2000}, {17}).message(), "variable 'n' = 17 is outside [0, 16]");
  EXPECT_EQ(check({0x1000, 0x2000}, {}).message(), "kernel takes 1 variables, got 0");
  EXPECT_EQ(check({0x1000}, {1}).message(), "kernel takes 2 buffers, got 1");
  EXPECT_EQ(check({0x1000, 0}, {1}).message(), "buffer 1 is null");
  EXPECT_EQ(check({0x1002, 0x2000}, {1}).message(), "buffer 0 is not aligned to its 4-byte elements");
  EXPECT_EQ(check({0x1000, 0x1020}, {1}).message(), "buffer 0 is written and overlaps buffer 1");
  EXPECT_TRUE(check({0x1000, 0x1040}, {1}).ok());
}

}  // namespace
}  // namespace uop
