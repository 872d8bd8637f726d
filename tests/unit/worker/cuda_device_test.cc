// CudaDevice, the CUDA backend, over a fake driver table: its "GPU" is host memory and its
// kernels are host functions run over every thread of the launch. Buffers are zeroed and
// copied both ways, modules that cannot load say why, launches get their dims from the
// ABI's LaunchExprs and their arguments by slot, and a kernel fault loses the context
// once. Runs everywhere; tests/e2e/cuda_worker_test.cc does the same on a real GPU.
#include "worker/cuda/cuda_device.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace uop {
namespace {

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

cu::Result fake_error_name(cu::Result r, const char** out) {
  switch (r) {
    case cu::kErrorOutOfMemory: *out = "CUDA_ERROR_OUT_OF_MEMORY"; return cu::kSuccess;
    case cu::kErrorIllegalAddress: *out = "CUDA_ERROR_ILLEGAL_ADDRESS"; return cu::kSuccess;
    default: return cu::kErrorInvalidValue;  // the name comes from the runtime's own table
  }
}

cu::Result fake_error_string(cu::Result r, const char** out) {
  if (r != cu::kErrorOutOfMemory) return cu::kErrorInvalidValue;
  *out = "out of memory";
  return cu::kSuccess;
}

using Term = LaunchExpr::Term;

struct FakeGpu {
  int devices = 1;
  std::map<cu::DevicePtr, size_t> allocations;
  size_t alloc_limit = size_t{1} << 30;
  cu::Result load_result = cu::kSuccess;
  bool has_entry = true;
  int unloads = 0;
  cu::Result sync_result = cu::kSuccess;
  int launches = 0;
  std::array<unsigned, 3> grid{}, block{};
  size_t nargs = 0;  // how many arguments the kernel takes (a real kernel knows its own)
  std::vector<uint64_t> args;
  // The kernel, run on the host over every (block, thread) of the launch.
  void (*kernel)(const FakeGpu&, uint64_t global_thread) = nullptr;
  // Events (with_events): how many were made and are still alive, and the launch count
  // each was recorded at.
  int events_made = 0, events_alive = 0;
  std::map<cu::Event, int> recorded_at;
};
FakeGpu* gpu = nullptr;

// out[i] = in[i] * 3 + i for i < n; arguments (int* out, const int* in, long long n).
void scale_kernel(const FakeGpu& g, uint64_t i) {
  auto* out = reinterpret_cast<int32_t*>(g.args[0]);
  auto* in = reinterpret_cast<const int32_t*>(g.args[1]);
  if (static_cast<int64_t>(i) < static_cast<int64_t>(g.args[2])) out[i] = in[i] * 3 + static_cast<int32_t>(i);
}

CudaApi fake_api() {
  CudaApi a;
  a.cuInit = [](unsigned) { return cu::kSuccess; };
  a.cuDriverGetVersion = [](int* v) { return *v = 13000, cu::kSuccess; };
  a.cuDeviceGetCount = [](int* n) { return *n = gpu->devices, cu::kSuccess; };
  a.cuDeviceGet = [](cu::Device* d, int ordinal) { return *d = ordinal, cu::kSuccess; };
  a.cuDeviceGetName = [](char* name, int len, cu::Device) {
    std::snprintf(name, static_cast<size_t>(len), "Fake GPU");
    return cu::kSuccess;
  };
  a.cuDeviceGetAttribute = [](int* v, int attr, cu::Device) {
    switch (attr) {
      case cu::kAttrComputeCapabilityMajor: *v = 9; break;
      case cu::kAttrComputeCapabilityMinor: *v = 0; break;
      case cu::kAttrMaxGridDimX: *v = 2147483647; break;
      case cu::kAttrMaxGridDimX + 1: case cu::kAttrMaxGridDimX + 2: *v = 65535; break;
      case cu::kAttrMaxBlockDimX + 2: *v = 64; break;
      case cu::kAttrMaxSharedMemoryPerBlockOptin: *v = 227 << 10; break;
      default: *v = 1024;
    }
    return cu::kSuccess;
  };
  a.cuDevicePrimaryCtxRetain = [](cu::Context* c, cu::Device) {
    return *c = reinterpret_cast<cu::Context>(0x1000), cu::kSuccess;
  };
  a.cuDevicePrimaryCtxRelease = [](cu::Device) { return cu::kSuccess; };
  a.cuCtxSetCurrent = [](cu::Context) { return cu::kSuccess; };
  a.cuMemGetInfo = [](size_t* free, size_t* total) { return *free = 3 << 20, *total = 4 << 20, cu::kSuccess; };
  a.cuMemAlloc = [](cu::DevicePtr* p, size_t n) {
    if (n > gpu->alloc_limit) return cu::kErrorOutOfMemory;
    void* m = std::aligned_alloc(256, n);
    std::memset(m, 0xab, n);  // what an earlier user left behind
    *p = reinterpret_cast<cu::DevicePtr>(m);
    gpu->allocations[*p] = n;
    return cu::kSuccess;
  };
  a.cuMemFree = [](cu::DevicePtr p) {
    if (!gpu->allocations.erase(p)) return cu::kErrorInvalidValue;
    std::free(reinterpret_cast<void*>(p));
    return cu::kSuccess;
  };
  a.cuMemcpyHtoD = [](cu::DevicePtr d, const void* s, size_t n) {
    return std::memcpy(reinterpret_cast<void*>(d), s, n), cu::kSuccess;
  };
  a.cuMemcpyDtoH = [](void* d, cu::DevicePtr s, size_t n) {
    return std::memcpy(d, reinterpret_cast<const void*>(s), n), cu::kSuccess;
  };
  a.cuMemcpyDtoD = [](cu::DevicePtr d, cu::DevicePtr s, size_t n) {
    return std::memcpy(reinterpret_cast<void*>(d), reinterpret_cast<const void*>(s), n), cu::kSuccess;
  };
  a.cuMemsetD8 = [](cu::DevicePtr d, unsigned char v, size_t n) {
    return std::memset(reinterpret_cast<void*>(d), v, n), cu::kSuccess;
  };
  a.cuModuleLoadData = [](cu::Module* m, const void*) {
    *m = reinterpret_cast<cu::Module>(0x2000);
    return gpu->load_result;
  };
  a.cuModuleGetFunction = [](cu::Function* f, cu::Module, const char* name) {
    if (!gpu->has_entry || std::string_view(name) != "uop_kernel") return cu::kErrorNotFound;
    return *f = reinterpret_cast<cu::Function>(0x3000), cu::kSuccess;
  };
  a.cuModuleUnload = [](cu::Module) { return ++gpu->unloads, cu::kSuccess; };
  a.cuFuncSetAttribute = [](cu::Function, int, int) { return cu::kSuccess; };
  a.cuLaunchKernel = [](cu::Function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned, cu::Stream, void** params, void**) {
    FakeGpu& g = *gpu;
    ++g.launches;
    g.grid = {gx, gy, gz};
    g.block = {bx, by, bz};
    g.args.clear();
    for (size_t i = 0; i < g.nargs; ++i) g.args.push_back(*static_cast<const uint64_t*>(params[i]));
    uint64_t threads = uint64_t{gx} * gy * gz * bx * by * bz;
    for (uint64_t t = 0; g.kernel && t < threads; ++t) g.kernel(g, t);
    return cu::kSuccess;
  };
  a.cuStreamCreate = [](cu::Stream* s, unsigned) { return *s = reinterpret_cast<cu::Stream>(0x4000), cu::kSuccess; };
  a.cuStreamSynchronize = [](cu::Stream) { return gpu->sync_result; };
  a.cuStreamDestroy = [](cu::Stream) { return cu::kSuccess; };
  a.cuGetErrorName = fake_error_name;
  a.cuGetErrorString = fake_error_string;
  return a;
}

// fake_api() with events: two recorded around one launch are 2.5 ms apart; any other
// pair is an error.
CudaApi with_events(CudaApi a) {
  a.cuEventCreate = [](cu::Event* e, unsigned) {
    ++gpu->events_alive;
    return *e = reinterpret_cast<cu::Event>(uintptr_t{0x5000} + ++gpu->events_made), cu::kSuccess;
  };
  a.cuEventRecord = [](cu::Event e, cu::Stream) { return gpu->recorded_at[e] = gpu->launches, cu::kSuccess; };
  a.cuEventSynchronize = [](cu::Event) { return cu::kSuccess; };
  a.cuEventElapsedTime = [](float* ms, cu::Event start, cu::Event end) {
    if (!gpu->recorded_at.contains(start) || gpu->recorded_at[end] != gpu->recorded_at[start] + 1)
      return cu::kErrorInvalidValue;
    return *ms = 2.5f, cu::kSuccess;
  };
  a.cuEventDestroy = [](cu::Event) { return --gpu->events_alive, cu::kSuccess; };
  return a;
}

class CudaDeviceFake : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu = &fake_;
    auto d = CudaDriver::from_table(fake_api(), "fake");
    ASSERT_TRUE(d.ok()) << d.status();
    driver_ = *std::move(d);
  }
  void TearDown() override { gpu = nullptr; }
  std::unique_ptr<CudaDevice> open(CudaDeviceOptions o = {}) {
    auto d = CudaDevice::open(driver_.get(), std::move(o));
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *std::move(d) : nullptr;
  }

  FakeGpu fake_;
  std::unique_ptr<CudaDriver> driver_;
};

constexpr int64_t N = 1000;

KernelAbi scale_abi() {
  KernelAbi abi;
  abi.params = {{0, dtypes::int32, N, false, true}, {1, dtypes::int32, N, true, false}};
  abi.vars = {{"n", 0, N}};
  return abi;
}

// grid x = (n + 255) / 256, block x = 256.
GpuLaunchShape scale_shape() {
  GpuLaunchShape s;
  auto grid = LaunchExpr::from_terms({{Term::Kind::Var, 0, Op::ADD},
                                      {Term::Kind::Const, 255, Op::ADD},
                                      {Term::Kind::Op, 0, Op::ADD},
                                      {Term::Kind::Const, 256, Op::ADD},
                                      {Term::Kind::Op, 0, Op::IDIV}},
                                     1);
  EXPECT_TRUE(grid.ok());
  if (grid.ok()) s.grid[0] = *grid;
  s.block[0] = LaunchExpr::constant(256);
  return s;
}

TEST_F(CudaDeviceFake, OpensOnlyTheDevicesTheDriverHas) {
  auto missing = CudaDevice::open(driver_.get(), {.ordinal = 1});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(std::string(missing.status().message()), "no GPU CUDA:1: the CUDA driver sees 1 device");
  auto dev = open();
  ASSERT_TRUE(dev);
  EXPECT_EQ(dev->name(), "Fake GPU");
  EXPECT_EQ(dev->arch(), "sm_90");
  BackendInfo i = dev->info();
  EXPECT_EQ(i.backend, "cuda");
  EXPECT_EQ(i.target, "sm_90");
  EXPECT_EQ(dev->limits().max_grid[1], 65535);
  EXPECT_EQ(dev->limits().max_block[2], 64);
  EXPECT_EQ(dev->limits().max_shared_bytes, 227 << 10);
  auto mem = dev->memory_info();
  ASSERT_TRUE(mem.ok());
  EXPECT_EQ(mem->second, 4u << 20);
}

TEST_F(CudaDeviceFake, BuffersAreZeroedAndCopiedBothWays) {
  auto dev = open();
  ASSERT_TRUE(dev);
  auto m = dev->allocate(100);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->size(), 100u);
  EXPECT_EQ((*m)->address() % 256, 0u);
  EXPECT_EQ(fake_.allocations.at((*m)->address()), 256u);  // whole blocks, all zeroed
  auto fresh = dev->read(*m, 0, 100);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->bytes(), std::string(100, '\0'));
  ASSERT_TRUE(dev->write(**m, 95, "world").ok());
  auto tail = dev->read(*m, 93, 7);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->bytes(), std::string("\0\0world", 7));
  EXPECT_EQ(tail->offset, 93u);
  // The staging copy outlives the device memory.
  m->reset();
  EXPECT_TRUE(fake_.allocations.empty());
  EXPECT_EQ(tail->bytes(), std::string("\0\0world", 7));
  auto empty = dev->allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_NE((*empty)->address(), 0u);

  fake_.alloc_limit = 1000;
  auto big = dev->allocate(5000);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(std::string(big.status().message()), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)")) << big.status();
}

TEST_F(CudaDeviceFake, ModulesThatCannotLoad) {
  auto dev = open();
  ASSERT_TRUE(dev);
  // An ABI without GPU launch dims is a CPU kernel's.
  auto cpu = dev->load_program("k", "image", scale_abi());
  EXPECT_EQ(cpu.status().code(), absl::StatusCode::kFailedPrecondition) << cpu.status();
  fake_.load_result = cu::kErrorNoBinaryForGpu;
  auto arch = dev->load_program("k", "image", scale_abi(), scale_shape());
  EXPECT_EQ(arch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(std::string(arch.status().message()), "cuModuleLoadData: CUDA_ERROR_NO_BINARY_FOR_GPU")) << arch.status();
  fake_.load_result = cu::kSuccess;
  fake_.has_entry = false;
  auto entry = dev->load_program("k", "image", scale_abi(), scale_shape());
  EXPECT_EQ(entry.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(std::string(entry.status().message()), "entry uop_kernel: cuModuleGetFunction")) << entry.status();
  EXPECT_EQ(fake_.unloads, 1);  // the module without the entry
  EXPECT_EQ(dev->load_program("k", "", scale_abi(), scale_shape()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceFake, LaunchesWithDimsFromTheShapeAndArgumentsBySlot) {
  auto dev = open();
  ASSERT_TRUE(dev);
  auto prog = dev->load_program("scale-key", "image", scale_abi(), scale_shape());
  ASSERT_TRUE(prog.ok()) << prog.status();
  auto out = dev->allocate(N * 4), in = dev->allocate(N * 4);
  ASSERT_TRUE(out.ok() && in.ok());
  std::vector<int32_t> input(N);
  for (int i = 0; i < N; ++i) input[i] = i - 500;
  ASSERT_TRUE(dev->write(**in, 0, std::string_view(reinterpret_cast<const char*>(input.data()), N * 4)).ok());
  fake_.nargs = 3;
  fake_.kernel = scale_kernel;
  std::vector<DeviceMemory*> buffers = {out->get(), in->get()};
  absl::Status st = dev->run(**prog, buffers, std::vector<int64_t>{N - 1});
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(fake_.grid, (std::array<unsigned, 3>{4, 1, 1}));
  EXPECT_EQ(fake_.block, (std::array<unsigned, 3>{256, 1, 1}));
  EXPECT_EQ(fake_.args, (std::vector<uint64_t>{(*out)->address(), (*in)->address(), N - 1}));
  auto got = dev->read(*out, 0, N * 4);
  ASSERT_TRUE(got.ok());
  const auto* r = reinterpret_cast<const int32_t*>(got->data);
  for (int i = 0; i < N; ++i) ASSERT_EQ(r[i], i < N - 1 ? input[i] * 3 + i : 0) << i;

  // Refused before the driver sees it; an empty launch does not reach it either.
  EXPECT_EQ(dev->run(**prog, buffers, std::vector<int64_t>{N + 1}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<DeviceMemory*> aliased = {out->get(), out->get()};
  EXPECT_EQ(dev->run(**prog, aliased, std::vector<int64_t>{N}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dev->run(**prog, buffers, std::vector<int64_t>{0}).ok());
  EXPECT_EQ(fake_.launches, 1);
  prog->reset();
  EXPECT_EQ(fake_.unloads, 1);
}

// A timed launch is timed by a pair of events around it on the stream, freed after; an
// untimed one makes no event; a driver without events leaves the time to the runtime's
// clock; an empty launch took no time.
TEST_F(CudaDeviceFake, ATimedLaunchIsTimedByEventsAroundIt) {
  std::vector<int64_t> n = {N};
  {
    auto dev = open();  // the fake driver has no events
    ASSERT_TRUE(dev);
    auto prog = dev->load_program("scale-key", "image", scale_abi(), scale_shape());
    ASSERT_TRUE(prog.ok()) << prog.status();
    auto out = dev->allocate(N * 4), in = dev->allocate(N * 4);
    ASSERT_TRUE(out.ok() && in.ok());
    std::vector<DeviceMemory*> buffers = {out->get(), in->get()};
    double ms = -1;
    ASSERT_TRUE(dev->run(**prog, buffers, n, nullptr, &ms).ok());
    EXPECT_EQ(ms, -1);
  }
  auto d = CudaDriver::from_table(with_events(fake_api()), "fake with events");
  ASSERT_TRUE(d.ok()) << d.status();
  auto opened = CudaDevice::open(d->get(), {});
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto& dev = *opened;
  auto prog = dev->load_program("scale-key", "image", scale_abi(), scale_shape());
  ASSERT_TRUE(prog.ok()) << prog.status();
  auto out = dev->allocate(N * 4), in = dev->allocate(N * 4);
  ASSERT_TRUE(out.ok() && in.ok());
  std::vector<DeviceMemory*> buffers = {out->get(), in->get()};
  fake_.nargs = 3;
  fake_.kernel = scale_kernel;
  ASSERT_TRUE(dev->run(**prog, buffers, n).ok());
  EXPECT_EQ(fake_.events_made, 0) << "an untimed launch makes no event";
  double ms = -1;
  ASSERT_TRUE(dev->run(**prog, buffers, n, nullptr, &ms).ok());
  EXPECT_EQ(ms, 2.5);
  EXPECT_EQ(fake_.events_made, 2);
  EXPECT_EQ(fake_.events_alive, 0);
  ms = -1;
  ASSERT_TRUE(dev->run(**prog, buffers, std::vector<int64_t>{0}, nullptr, &ms).ok());
  EXPECT_EQ(ms, 0);
  EXPECT_EQ(fake_.events_made, 2) << "an empty launch is not launched, nor timed";
}

// What the compiler hands the worker: the scale kernel's ABI with its launch dims in
// abi.gpu, through the text form the cache and LoadProgram carry.
KernelAbi scale_gpu_abi(int64_t shared_bytes = 0) {
  KernelAbi abi = scale_abi();
  GpuLaunchShape s = scale_shape();
  abi.gpu = GpuLaunch{s.grid, s.block, shared_bytes};
  auto parsed = parse_abi(abi.serialize());
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed.ok() && *parsed == abi);
  return parsed.ok() ? *parsed : abi;
}

TEST(GpuLaunchShape, ComesFromTheAbisGpuLaunchDims) {
  EXPECT_EQ(gpu_launch_shape(scale_abi()).status().code(), absl::StatusCode::kFailedPrecondition);
  auto shape = gpu_launch_shape(scale_gpu_abi(4096));
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->grid[0], scale_shape().grid[0]);
  EXPECT_EQ(shape->block[0], LaunchExpr::constant(256));
  EXPECT_EQ(shape->grid[1], LaunchExpr::constant(1));
  EXPECT_EQ(shape->block[2], LaunchExpr::constant(1));
  EXPECT_EQ(shape->dynamic_shared_bytes, 4096);
  EXPECT_EQ(shape->str(scale_abi().vars), "grid (((n + 255) / 256), 1, 1) block (256, 1, 1)") << shape->str(scale_abi().vars);
  auto dims = eval_launch_dims(*shape, scale_abi().vars, std::vector<int64_t>{1000}, GpuLimits{});
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_EQ(dims->str(), "grid (4, 1, 1) block (256, 1, 1) shared 4096");

  // An ABI built in memory whose dims name a variable it does not have.
  KernelAbi bad = scale_gpu_abi();
  bad.vars.clear();
  auto refused = gpu_launch_shape(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(std::string(refused.status().message()), "grid x extent names variable 0")) << refused.status();
  KernelAbi negative = scale_gpu_abi();
  negative.gpu->dynamic_shared_bytes = -1;
  EXPECT_EQ(gpu_launch_shape(negative).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceFake, ACompiledKernelsAbiLaunchesWithItsOwnDims) {
  auto dev = open();
  ASSERT_TRUE(dev);
  // The DeviceBackend path LoadProgram takes: no shape given, the ABI's is used.
  auto prog = dev->load_program("abi-key", "image", scale_gpu_abi());
  ASSERT_TRUE(prog.ok()) << prog.status();
  auto out = dev->allocate(N * 4), in = dev->allocate(N * 4);
  ASSERT_TRUE(out.ok() && in.ok());
  std::vector<int32_t> input(N, 7);
  ASSERT_TRUE(dev->write(**in, 0, std::string_view(reinterpret_cast<const char*>(input.data()), N * 4)).ok());
  fake_.nargs = 3;
  fake_.kernel = scale_kernel;
  std::vector<DeviceMemory*> buffers = {out->get(), in->get()};
  ASSERT_TRUE(dev->run(**prog, buffers, std::vector<int64_t>{513}).ok());
  EXPECT_EQ(fake_.grid, (std::array<unsigned, 3>{3, 1, 1}));
  EXPECT_EQ(fake_.block, (std::array<unsigned, 3>{256, 1, 1}));
  auto got = dev->read(*out, 0, N * 4);
  ASSERT_TRUE(got.ok());
  const auto* r = reinterpret_cast<const int32_t*>(got->data);
  for (int i = 0; i < N; ++i) ASSERT_EQ(r[i], i < 513 ? 21 + i : 0) << i;

  // More dynamic shared memory than the device has is refused at load.
  auto big = dev->load_program("big", "image", scale_gpu_abi(int64_t{228} << 10));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  // A block past the device's limit is refused at launch, naming the expressions.
  KernelAbi wide = scale_gpu_abi();
  wide.gpu->block[0] = LaunchExpr::constant(2048);
  auto wprog = dev->load_program("wide", "image", wide);
  ASSERT_TRUE(wprog.ok()) << wprog.status();
  absl::Status st = dev->run(**wprog, buffers, std::vector<int64_t>{N});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(std::string(st.message()), "block x is past the device's 1024")) << st;
  EXPECT_EQ(fake_.launches, 1);
}

TEST_F(CudaDeviceFake, AKernelFaultLosesTheContextOnce) {
  std::vector<std::string> told;
  auto dev = open({.ordinal = 0, .on_context_lost = [&](const absl::Status& why) { told.emplace_back(why.message()); }});
  ASSERT_TRUE(dev);
  auto prog = dev->load_program("faulty-key", "image", scale_abi(), scale_shape());
  auto out = dev->allocate(N * 4), in = dev->allocate(N * 4);
  ASSERT_TRUE(prog.ok() && out.ok() && in.ok());
  fake_.sync_result = cu::kErrorIllegalAddress;
  std::vector<DeviceMemory*> buffers = {out->get(), in->get()};
  absl::Status st = dev->run(**prog, buffers, std::vector<int64_t>{N});
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  for (const char* part : {"the kernel faulted", "grid (4, 1, 1) block (256, 1, 1)", "cuStreamSynchronize",
                           "CUDA_ERROR_ILLEGAL_ADDRESS", "the CUDA context is lost"})
    EXPECT_TRUE(contains(std::string(st.message()), part)) << part << ": " << st;
  ASSERT_EQ(told.size(), 1u);
  EXPECT_TRUE(contains(told[0], "kernel faulty-key")) << told[0];
  EXPECT_TRUE(dev->context_lost());
  // Everything after fails at once, saying why; the owner is not told again.
  auto after = dev->allocate(16);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(contains(std::string(after.status().message()), "the CUDA context was lost")) << after.status();
  EXPECT_EQ(dev->run(**prog, buffers, std::vector<int64_t>{N}).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(told.size(), 1u);
}

}  // namespace
}  // namespace uop
