// The CUDA backend on a GPU: every case of the corpus (cuda_corpus.h) compiled for the
// device's arch, run through the worker's CUDA runtime and compared with the reference
// interpreter under the backend's documented tolerances (exact but for transcendentals
// and reassociated reductions); and the GPU emulator (compiler/gpu_emu, which CI runs in
// its place) on the same kernels against the GPU, so that what the emulator passes is
// what the hardware computes. Skips, saying why, where there is no driver or no GPU.
#include <gtest/gtest.h>

#include "compiler/interp/interp.h"
#include "tests/gpu/cuda_corpus.h"
#include "tests/gpu/cuda_runner.h"
#include "tests/gpu/emu_runner.h"

namespace uop {
namespace {

cudatest::CudaRunner* runner(std::string* why) {
  static absl::StatusOr<std::unique_ptr<cudatest::CudaRunner>>* r =
      new absl::StatusOr<std::unique_ptr<cudatest::CudaRunner>>(cudatest::CudaRunner::open());
  if (!r->ok()) {
    *why = std::string(r->status().message());
    return nullptr;
  }
  return r->value().get();
}

TEST(CudaGpu, EveryCorpusCaseMatchesTheInterpreter) {
  std::string why;
  cudatest::CudaRunner* gpu = runner(&why);
  if (!gpu) GTEST_SKIP() << "needs a GPU: " << why;
  if (absl::Status s = nvrtc_status(); !s.ok()) GTEST_SKIP() << "needs NVRTC: " << std::string(s.message());
  int cases = 0;
  for (cudatest::Case& c : cudatest::corpus()) {
    SCOPED_TRACE(c.name);
    auto want = interpret(*c.g, c.sink, c.inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = gpu->run(*c.g, c.sink, c.inputs);
    ASSERT_TRUE(got.ok()) << c.name << ": " << got.status();
    EXPECT_EQ(cudatest::compare_outputs(c, *want, *got), "") << c.name;
    ++cases;
  }
  EXPECT_GT(cases, 60);
}

// The emulator, lowering for the GPU's own arch, against the GPU under the same
// tolerances: both are within them of the interpreter, and the emulator computes every
// scalar op as the interpreter does.
TEST(CudaGpu, TheEmulatorAgreesWithTheGpu) {
  std::string why;
  cudatest::CudaRunner* gpu = runner(&why);
  if (!gpu) GTEST_SKIP() << "needs a GPU: " << why;
  if (absl::Status s = nvrtc_status(); !s.ok()) GTEST_SKIP() << "needs NVRTC: " << std::string(s.message());
  gputest::EmuRunner emu(gpu->target());
  int cases = 0;
  for (cudatest::Case& c : cudatest::corpus()) {
    SCOPED_TRACE(c.name);
    auto on_gpu = gpu->run(*c.g, c.sink, c.inputs);
    ASSERT_TRUE(on_gpu.ok()) << c.name << ": " << on_gpu.status();
    auto emulated = emu.run(*c.g, c.sink, c.inputs);
    ASSERT_TRUE(emulated.ok()) << c.name << ": " << emulated.status();
    EXPECT_EQ(cudatest::compare_outputs(c, *emulated, *on_gpu), "") << c.name;
    ++cases;
  }
  EXPECT_GT(cases, 60);
  EXPECT_GT(emu.totals().wmmas, 0) << "the tensor-core matmuls ran on both";
}

}  // namespace
}  // namespace uop
