// uop-worker --device=cuda:N and the scheduler's CUDA slots, as real processes on
// 127.0.0.1. Everywhere: a worker whose GPU cannot be used (no driver here; on a GPU
// machine, an ordinal past the last GPU) exits at once with status 3 and says why, and a
// WorkerPool with such a CUDA slot marks it unavailable with that message, does not
// restart it, and keeps its CPU workers serving. With a GPU (the driver loads): buffers
// round trip through WorkerRuntime on a CudaDevice, a kernel written here in CUDA C and
// compiled by NVRTC (dlopen'ed from /usr/local/cuda/lib64) runs, bad images are refused,
// the embedded CUDA worker reports "cuda" and the GPU's arch, and a faulting kernel loses
// the context. Without one those tests skip, saying why.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "compiler/support/strings.h"
#include "server/workers.h"
#include "worker/cuda/cuda_device.h"
#include "worker/worker_service.h"

namespace uop {
namespace {

namespace wv1 = uopd::worker::v1;
// The build's uop-worker, or $UOP_WORKER_BINARY (tests/gpu/run.sh runs this test from a
// carried folder, where the build's path does not exist).
const std::string kBinary = [] {
  const char* e = std::getenv("UOP_WORKER_BINARY");
  return std::string(e && *e ? e : UOP_WORKER_BINARY);
}();

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// The GPUs this machine's driver sees; 0 without a driver.
int gpus() {
  auto d = CudaDriver::load();
  return d.ok() ? (*d)->device_count() : 0;
}

struct Exit {
  int status = -1;  // -1: did not exit within the limit (then killed)
  std::string out, err;
};

// Runs uop-worker with `flags` to its end, collecting stdout and stderr.
Exit run_worker(const std::vector<std::string>& flags, absl::Duration limit = absl::Seconds(30)) {
  std::vector<std::string> args = {kBinary};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2], err[2];
  Exit e;
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return e;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  absl::Time deadline = absl::Now() + limit;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* into[2] = {&e.out, &e.err};
  int open = 2;
  while (open > 0 && absl::Now() < deadline) {
    if (poll(fds, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !fds[i].revents) continue;
      char buf[512];
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        into[i]->append(buf, n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  if (open > 0) {  // still running past the limit
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return e;
  }
  waitpid(pid, &status, 0);
  e.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return e;
}

TEST(CudaWorker, ExitsAtOnceWhenItsDeviceIsUnavailable) {
  // No driver here: CUDA:0. With a driver: the first ordinal past its GPUs.
  const int n = gpus();
  Exit e = run_worker({cat("--device=cuda:", n), "--listen=127.0.0.1:0", "--insecure"});
  ASSERT_EQ(e.status, 3) << "stdout: " << e.out << "\nstderr: " << e.err;
  EXPECT_FALSE(contains(e.out, "LISTENING")) << e.out;
  std::string why = cat("CUDA:", n, " is unavailable: ");
  EXPECT_TRUE(e.out.starts_with(cat("UNAVAILABLE ", why))) << e.out;
  EXPECT_EQ(std::count(e.out.begin(), e.out.end(), '\n'), 1) << e.out;
  EXPECT_TRUE(contains(e.err, cat("uop-worker: ", why))) << e.err;
  if (n == 0) {
    // The worker says what loading the driver says here ("no CUDA driver: dlopen
    // libcuda.so.1: ..." on a machine without one).
    EXPECT_TRUE(contains(e.err, std::string(CudaDriver::load().status().message()))) << e.err;
  } else {
    EXPECT_TRUE(contains(e.err, cat("no GPU CUDA:", n, ": the CUDA driver sees ", n))) << e.err;
  }
}

TEST(CudaWorker, DeviceNamesAreCheckedAsUsage) {
  for (const char* bad : {"--device=cuda:x", "--device=gpu:0", "--device=cuda:99999"}) {
    Exit e = run_worker({bad});
    EXPECT_EQ(e.status, 2) << bad << ": " << e.err;
  }
}

wv1::InfoResponse info_of(WorkerHandle& w) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  wv1::InfoResponse resp;
  grpc::Status st = w.stub()->Info(&ctx, wv1::InfoRequest(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp;
}

TEST(CudaWorkerPool, AnUnavailableGpuIsReportedAndTheCpuWorkersServe) {
  const int n = gpus();
  WorkerOptions o;
  o.worker_binary = kBinary;
  o.embedded_cpu_workers = 1;
  o.embedded_cuda_workers = n + 1;  // CUDA:n cannot be used anywhere
  o.threads_per_worker = 1;
  WorkerPool pool;
  absl::Status started = pool.start_embedded(o);
  ASSERT_TRUE(started.ok()) << started;
  const std::string gone = cat("CUDA:", n);

  // Answered with why, not a wait that runs out (that would say it timed out).
  auto w = pool.worker_for(gone, absl::Seconds(30));
  ASSERT_EQ(w.status().code(), absl::StatusCode::kUnavailable) << w.status();
  EXPECT_TRUE(contains(std::string(w.status().message()), cat(gone, " is unavailable: "))) << w.status();
  if (n == 0) EXPECT_TRUE(contains(std::string(w.status().message()), std::string(CudaDriver::load().status().message()))) << w.status();

  // Not restarted in a loop: still unavailable, no process, no restarts.
  absl::SleepFor(absl::Milliseconds(1500));
  bool seen = false;
  for (const WorkerStatusSnapshot& s : pool.snapshot()) {
    if (s.device != gone) continue;
    seen = true;
    EXPECT_EQ(s.state, "unavailable");
    EXPECT_EQ(s.pid, 0);
    EXPECT_EQ(s.restarts, 0u);
    EXPECT_TRUE(contains(s.last_error, cat(gone, " is unavailable: "))) << s.last_error;
  }
  EXPECT_TRUE(seen);
  EXPECT_EQ(std::string(pool.worker_for(gone, absl::Seconds(1)).status().message()), std::string(w.status().message()));

  auto cpu = pool.worker_for("CPU:0");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(info_of(**cpu).backend(), "cpu");
  for (int i = 0; i < n; ++i) {  // the GPUs that are there serve
    auto g = pool.worker_for(cat("CUDA:", i));
    ASSERT_TRUE(g.ok()) << g.status();
    wv1::InfoResponse info = info_of(**g);
    EXPECT_EQ(info.device(), cat("CUDA:", i));
    EXPECT_EQ(info.backend(), "cuda");
    EXPECT_TRUE(info.target().starts_with("sm_")) << info.target();
  }
  pool.shutdown();
}

// ---- With a GPU. ----

// NVRTC through dlopen, like the driver: CUDA C -> cubin for one arch.
absl::StatusOr<std::string> nvrtc_cubin(const std::string& source, const std::string& arch) {
  const char* path = "/usr/local/cuda/lib64/libnvrtc.so";
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return absl::UnavailableError(cat("no NVRTC: ", dlerror()));
  using Program = struct NvrtcProgram*;
  auto sym = [&](const char* name) { return dlsym(lib, name); };
  auto create = reinterpret_cast<int (*)(Program*, const char*, const char*, int, const char* const*,
                                         const char* const*)>(sym("nvrtcCreateProgram"));
  auto compile = reinterpret_cast<int (*)(Program, int, const char* const*)>(sym("nvrtcCompileProgram"));
  auto log_size = reinterpret_cast<int (*)(Program, size_t*)>(sym("nvrtcGetProgramLogSize"));
  auto get_log = reinterpret_cast<int (*)(Program, char*)>(sym("nvrtcGetProgramLog"));
  auto cubin_size = reinterpret_cast<int (*)(Program, size_t*)>(sym("nvrtcGetCUBINSize"));
  auto get_cubin = reinterpret_cast<int (*)(Program, char*)>(sym("nvrtcGetCUBIN"));
  auto destroy = reinterpret_cast<int (*)(Program*)>(sym("nvrtcDestroyProgram"));
  if (!create || !compile || !log_size || !get_log || !cubin_size || !get_cubin || !destroy)
    return absl::UnavailableError(cat(path, " lacks the NVRTC functions"));
  Program prog = nullptr;
  if (create(&prog, source.c_str(), "uop_kernel.cu", 0, nullptr, nullptr) != 0)
    return absl::InternalError("nvrtcCreateProgram failed");
  std::string opt = cat("--gpu-architecture=", arch);
  const char* opts[] = {opt.c_str()};
  int rc = compile(prog, 1, opts);
  size_t n = 0;
  std::string out;
  if (rc != 0) {
    log_size(prog, &n);
    out.resize(n);
    get_log(prog, out.data());
    destroy(&prog);
    return absl::InvalidArgumentError(cat("NVRTC: ", out));
  }
  cubin_size(prog, &n);
  out.resize(n);
  get_cubin(prog, out.data());
  destroy(&prog);
  return out;
}

// out[i] = in[i] * 3 + i for i < n, one thread per element.
constexpr const char* kScaleSource = R"(
extern "C" __global__ void uop_kernel(int* out, const int* in, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 3 + (int)i;
}
)";

// Writes through a null pointer: CUDA_ERROR_ILLEGAL_ADDRESS.
constexpr const char* kFaultSource = R"(
extern "C" __global__ void uop_kernel(int* out, const int* in, long long n) {
  ((volatile int*)0x10)[threadIdx.x] = 1;
}
)";

constexpr int64_t N = 100000;

KernelAbi scale_abi() {
  KernelAbi abi;
  abi.params = {{0, dtypes::int32, N, false, true}, {1, dtypes::int32, N, true, false}};
  abi.vars = {{"n", 0, N}};
  return abi;
}

GpuLaunchShape scale_shape() {
  using Term = LaunchExpr::Term;
  GpuLaunchShape s;
  s.grid[0] = *LaunchExpr::from_terms({{Term::Kind::Var, 0, Op::ADD},
                                       {Term::Kind::Const, 255, Op::ADD},
                                       {Term::Kind::Op, 0, Op::ADD},
                                       {Term::Kind::Const, 256, Op::ADD},
                                       {Term::Kind::Op, 0, Op::IDIV}},
                                      1);
  s.block[0] = LaunchExpr::constant(256);
  return s;
}

class CudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = CudaDriver::load();
    if (!d.ok()) GTEST_SKIP() << "needs a GPU: " << std::string(d.status().message());
    CudaDeviceOptions o;
    o.on_context_lost = [this](const absl::Status& why) { lost_.emplace_back(why.message()); };
    auto dev = CudaDevice::open(*d, std::move(o));
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = dev->get();
    rt_ = std::make_unique<WorkerRuntime>(WorkerRuntimeOptions{.device = "CUDA:0", .max_buffer_bytes = 1 << 30},
                                          *std::move(dev));
  }
  absl::StatusOr<std::string> cubin(const char* source) {
    if (!std::filesystem::exists("/usr/local/cuda/lib64/libnvrtc.so"))
      return absl::UnavailableError("no /usr/local/cuda/lib64/libnvrtc.so to compile the test kernel with");
    return nvrtc_cubin(source, dev_->arch());
  }

  CudaDevice* dev_ = nullptr;  // owned by rt_
  std::unique_ptr<WorkerRuntime> rt_;
  std::vector<std::string> lost_;
};

TEST_F(CudaGpu, BuffersRoundTripThroughTheRuntime) {
  WorkerInfo i = rt_->info();
  EXPECT_EQ(i.backend, "cuda");
  EXPECT_EQ(i.target, dev_->arch());
  ASSERT_TRUE(rt_->alloc_buffer(1, 3 << 20).ok());
  auto fresh = rt_->read_buffer(1, 0, 0);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->bytes(), std::string(3 << 20, '\0'));
  std::string data(1 << 20, '\0');
  for (size_t k = 0; k < data.size(); ++k) data[k] = static_cast<char>(k * 13 + 5);
  ASSERT_TRUE(rt_->write_buffer(1, 12345, data).ok());
  auto back = rt_->read_buffer(1, 12345, data.size());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->bytes() == data);
  EXPECT_EQ(rt_->write_buffer(1, (3 << 20) - 1, "xy").code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(rt_->free_buffers(std::vector<uint64_t>{1}), 1u);
  EXPECT_TRUE(back->bytes() == data);  // a staging copy outlives the buffer
  EXPECT_EQ(rt_->alloc_buffer(2, uint64_t{1} << 31).code(), absl::StatusCode::kResourceExhausted);  // the budget
}

TEST_F(CudaGpu, RunsAKernelCompiledByNvrtc) {
  auto image = cubin(kScaleSource);
  if (!image.ok() && image.status().code() == absl::StatusCode::kUnavailable) GTEST_SKIP() << std::string(image.status().message());
  ASSERT_TRUE(image.ok()) << image.status();
  auto prog = dev_->load_program("scale-key", *image, scale_abi(), scale_shape());
  ASSERT_TRUE(prog.ok()) << prog.status();
  auto out = dev_->allocate(N * 4), in = dev_->allocate(N * 4);
  ASSERT_TRUE(out.ok() && in.ok());
  std::vector<int32_t> input(N);
  for (int64_t i = 0; i < N; ++i) input[i] = static_cast<int32_t>(i * 7 - 1000);
  ASSERT_TRUE(dev_->write(**in, 0, std::string_view(reinterpret_cast<const char*>(input.data()), N * 4)).ok());
  std::vector<DeviceMemory*> buffers = {out->get(), in->get()};
  const int64_t n = N - 3;
  absl::Status st = dev_->run(**prog, buffers, std::vector<int64_t>{n});
  ASSERT_TRUE(st.ok()) << st;
  auto got = dev_->read(*out, 0, N * 4);
  ASSERT_TRUE(got.ok()) << got.status();
  const auto* r = reinterpret_cast<const int32_t*>(got->data);
  for (int64_t i = 0; i < N; ++i) ASSERT_EQ(r[i], i < n ? input[i] * 3 + static_cast<int32_t>(i) : 0) << i;
  EXPECT_EQ(dev_->run(**prog, buffers, std::vector<int64_t>{N + 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(lost_.empty());
}

TEST_F(CudaGpu, RunsAProgramLoadedWithItsAbisLaunchDims) {
  // What LoadProgram + Execute do for a compiled kernel: the launch shape comes from the
  // ABI text (version 2, with its gpu section), not from the caller.
  auto image = cubin(kScaleSource);
  if (!image.ok() && image.status().code() == absl::StatusCode::kUnavailable) GTEST_SKIP() << std::string(image.status().message());
  ASSERT_TRUE(image.ok()) << image.status();
  KernelAbi abi = scale_abi();
  GpuLaunchShape s = scale_shape();
  abi.gpu = GpuLaunch{s.grid, s.block, 0};
  ASSERT_TRUE(rt_->load_program("scale-abi", *image, abi.serialize()).ok());
  ASSERT_TRUE(rt_->has_program("scale-abi"));
  ASSERT_TRUE(rt_->alloc_buffer(10, N * 4).ok());
  ASSERT_TRUE(rt_->alloc_buffer(11, N * 4).ok());
  std::vector<int32_t> input(N);
  for (int64_t i = 0; i < N; ++i) input[i] = static_cast<int32_t>(i % 1000);
  ASSERT_TRUE(rt_->write_buffer(11, 0, std::string_view(reinterpret_cast<const char*>(input.data()), N * 4)).ok());
  const int64_t n = 77777;
  std::vector<LaunchSpec> launches = {{"scale-abi", {10, 11}, {n}}};
  auto ran = rt_->execute(launches);
  ASSERT_TRUE(ran.ok()) << ran.status();
  auto got = rt_->read_buffer(10, 0, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  const auto* r = reinterpret_cast<const int32_t*>(got->data);
  for (int64_t i = 0; i < N; ++i) ASSERT_EQ(r[i], i < n ? input[i] * 3 + static_cast<int32_t>(i) : 0) << i;
  EXPECT_EQ(rt_->free_buffers(std::vector<uint64_t>{10, 11}), 2u);
  EXPECT_TRUE(lost_.empty());
}

TEST_F(CudaGpu, ImagesTheDeviceCannotLoad) {
  auto garbage = dev_->load_program("bad", "not a cubin at all", scale_abi(), scale_shape());
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument) << garbage.status();
  EXPECT_TRUE(contains(std::string(garbage.status().message()), "cuModuleLoadData: CUDA_ERROR_")) << garbage.status();
  // Through the runtime: an ABI without GPU launch dims is refused, naming the program.
  absl::Status cpu_abi = rt_->load_program("cpu-key", "x", scale_abi().serialize());
  EXPECT_FALSE(cpu_abi.ok());
  EXPECT_TRUE(contains(std::string(cpu_abi.message()), "program cpu-key")) << cpu_abi;
  EXPECT_FALSE(rt_->has_program("cpu-key"));
}

// Last: the fault leaves this process's primary context unusable.
TEST_F(CudaGpu, ZAFaultingKernelLosesTheContext) {
  auto image = cubin(kFaultSource);
  if (!image.ok() && image.status().code() == absl::StatusCode::kUnavailable) GTEST_SKIP() << std::string(image.status().message());
  ASSERT_TRUE(image.ok()) << image.status();
  auto prog = dev_->load_program("fault-key", *image, scale_abi(), scale_shape());
  ASSERT_TRUE(prog.ok()) << prog.status();
  auto out = dev_->allocate(N * 4), in = dev_->allocate(N * 4);
  ASSERT_TRUE(out.ok() && in.ok());
  std::vector<DeviceMemory*> buffers = {out->get(), in->get()};
  absl::Status st = dev_->run(**prog, buffers, std::vector<int64_t>{N});
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_TRUE(contains(std::string(st.message()), "CUDA_ERROR_ILLEGAL_ADDRESS")) << st;
  ASSERT_EQ(lost_.size(), 1u);
  EXPECT_TRUE(contains(lost_[0], "fault-key")) << lost_[0];
  EXPECT_EQ(dev_->allocate(16).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace uop
