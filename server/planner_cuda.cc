// The planner's CUDA compile step (planner.h): each distinct kernel of a plan lowered for
// the GPU (lower_for_cuda), rendered to CUDA C and compiled by NVRTC for one arch, once
// per cache key through the same tiered cache, compile pool and bounds as the CPU kernels.
#include <chrono>
#include <future>

#include "compiler/codegen/cuda.h"
#include "compiler/ir/digest.h"
#include "compiler/pipeline.h"
#include "compiler/support/strings.h"
#include "proto/artifact.pb.h"
#include "server/planner.h"

namespace uop::server {

std::string Planner::cuda_cache_key(const Digest& kernel, const std::string& arch,
                                    std::string_view cache_namespace) const {
  std::string material = cat("uopd-kernel-key/1\n", kernel.hex(), "\ncuda/", arch, "\n", cuda_build_id(),
                             "\nkeep_source=", opts_.keep_source);
  if (!cache_namespace.empty()) material = cat(material, "\nnamespace=", cache_namespace);
  return sha256(material).hex();
}

absl::StatusOr<std::string> Planner::build_cuda(const PlannedKernel& k, const std::string& arch, const std::string& key,
                                                const std::function<bool()>& wanted) {
  auto target = CudaTarget::parse(arch);
  if (!target.ok()) return target.status();
  auto t0 = std::chrono::steady_clock::now();
  auto g = decode_binary(k.encoded);  // a private Graph: compiles run on several threads
  if (!g.ok()) return absl::InternalError(cat("planner: cannot decode kernel ", k.name, ": ", g.status().message()));
  PipelineOptions po = compile_options(k, wanted);
  GpuLowerOptions go;
  go.sm = target->sm();
  auto linear = lower_for_cuda(*g->graph, g->root, po, k.name, go);
  if (!linear.ok()) return linear.status();
  // NVRTC, like LLVM, cannot be stopped once started: the LINEAR's size bounds it.
  if (absl::Status s = po.keep_going(); !s.ok()) return s;
  auto art = uop::compile_cuda(*linear, *target, CudaCompileOptions{.emit_ptx = false});
  if (!art.ok()) return art.status();
  uopd::v1::Artifact a;
  a.set_key(key);
  a.set_kernel_digest(k.digest.hex());
  a.set_name(k.name);
  a.set_target(target->id());
  a.set_build_id(cuda_build_id());
  a.set_abi(art->abi.serialize());
  a.set_object(art->cubin);
  if (opts_.keep_source) a.set_source(art->source);
  a.set_compile_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return a.SerializeAsString();
}

absl::StatusOr<std::vector<CompiledKernel>> Planner::compile_cuda(const Plan& plan, const std::string& arch,
                                                                  std::string_view cache_namespace, const Requester& who) {
  if (auto t = CudaTarget::parse(arch); !t.ok()) return t.status();
  return compile_per_kernel(plan, std::vector<std::string>(plan.kernels.size(), arch), cache_namespace, who);
}

}  // namespace uop::server
