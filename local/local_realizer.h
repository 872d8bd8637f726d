// LocalRealizer: realizes tensors with an in-process LocalRunner (the compiler and the CPU
// backend in this process). It links LLVM, so it lives in its own library
// (uop_tensor_local) for tests and tools; the thin client's uop_tensor stays LLVM-free.
#pragma once

#include <vector>

#include "client/realize.h"
#include "local/local_runner.h"

namespace uop::client {

class LocalRealizer : public Realizer {
 public:
  explicit LocalRealizer(LocalRunner& runner) : runner_(runner) {}

  // Lowers in a Graph of its own (the context's arena does not grow); results on the host.
  absl::StatusOr<std::vector<LeafStorage>> run(Graph& g, const CanonicalGraph& graph, const RealizeOptions& opts) override;
  // The kernels of the last run; `compiled` false means the runner had it already.
  const std::vector<KernelReport>& last_kernels() const { return last_; }

 private:
  LocalRunner& runner_;
  std::vector<KernelReport> last_;
};

}  // namespace uop::client
