// Allreduce among CUDA workers with NCCL (docs/ARCHITECTURE.md, The service), in place in device memory.
//
// libnccl.so.2 is loaded at run time with dlopen, never linked, and no nccl.h is needed:
// the few NCCL types and functions used are declared here, with the values nccl.h gives
// them (tests/unit/worker/collectives/nccl_allreduce_test.cc compares them when nccl.h is
// around). Without the library a call is UNAVAILABLE "no NCCL: dlopen libnccl.so.2: ...".
//
// One collective instance: rank 0 makes the ncclUniqueId and publishes it through the
// scheduler's Rendezvous store ("<group>/nccl/id", the client the Gloo transport uses);
// every member also publishes what it is about to reduce ("<group>/nccl/member/<rank>"),
// so a member that never comes is DEADLINE_EXCEEDED "rank i never joined" and members
// that disagree are INVALID_ARGUMENT, all before NCCL is involved. Then, with the
// member's CUDA context current, a non-blocking communicator (ncclCommInitRankConfig),
// ncclAllReduce on a stream of its own, and polling (ncclCommGetAsyncError, cuStreamQuery)
// bounded by the timeout and the caller's `cancelled`: on either the communicator is
// aborted (ncclCommAbort), so a dead or stalled peer never hangs a worker. The
// communicator is destroyed after the call (groups are unique per collective instance,
// so there is nothing to cache).
//
// Arithmetic: NCCL's own kernels, not reduce.h's. Integers wrap and MAX / MIN on them are
// exact, as in eval.h; float ADD / MUL are summed in NCCL's order (a few ulps from the
// shm ring's, like Gloo); float MAX / MIN agree with eval.h on ordered values, but how
// NCCL treats NaN and -0 vs +0 is NCCL's business.
#pragma once

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/ir/arg.h"
#include "compiler/ir/dtype.h"
#include "worker/cuda/cuda_driver.h"

namespace uop {

class CudaContext;
namespace cluster_auth {
struct Dialer;
}

namespace nccl {

// nccl.h's types, ABI-compatible (its enums are int-sized).
using Result = int;    // ncclResult_t
using DataType = int;  // ncclDataType_t
using RedOp = int;     // ncclRedOp_t
struct CommOpaque;
using Comm = CommOpaque*;  // ncclComm_t

inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct UniqueId {
  char internal[kUniqueIdBytes];
};

inline constexpr Result kSuccess = 0;
inline constexpr Result kUnhandledCudaError = 1;
inline constexpr Result kSystemError = 2;
inline constexpr Result kInternalError = 3;
inline constexpr Result kInvalidArgument = 4;
inline constexpr Result kInvalidUsage = 5;
inline constexpr Result kRemoteError = 6;
inline constexpr Result kInProgress = 7;

inline constexpr DataType kInt8 = 0;
inline constexpr DataType kUint8 = 1;
inline constexpr DataType kInt32 = 2;
inline constexpr DataType kUint32 = 3;
inline constexpr DataType kInt64 = 4;
inline constexpr DataType kUint64 = 5;
inline constexpr DataType kFloat16 = 6;
inline constexpr DataType kFloat32 = 7;
inline constexpr DataType kFloat64 = 8;
inline constexpr DataType kBfloat16 = 9;

inline constexpr RedOp kSum = 0;
inline constexpr RedOp kProd = 1;
inline constexpr RedOp kMax = 2;
inline constexpr RedOp kMin = 3;

// The leading fields of ncclConfig_t as NCCL 2.14 laid them out. NCCL reads `size` bytes
// of a config and takes its defaults for the rest, so this prefix is a complete config
// for every NCCL since 2.14; only `blocking` is set.
struct ConfigPrefix {
  size_t size = sizeof(ConfigPrefix);
  unsigned int magic = 0xcafebeef;  // what NCCL_CONFIG_INITIALIZER puts there
  unsigned int version = 21400;     // NCCL_VERSION(2, 14, 0): the layout above
  int blocking = INT_MIN;           // NCCL_CONFIG_UNDEF_INT
  int cga_cluster_size = INT_MIN;
};

}  // namespace nccl

// One pointer per NCCL function used; the fields carry nccl.h's names (the symbols).
struct NcclApi {
  nccl::Result (*ncclGetVersion)(int* version) = nullptr;
  nccl::Result (*ncclGetUniqueId)(nccl::UniqueId* id) = nullptr;
  nccl::Result (*ncclCommInitRankConfig)(nccl::Comm* comm, int nranks, nccl::UniqueId id, int rank,
                                         nccl::ConfigPrefix* config) = nullptr;
  nccl::Result (*ncclCommFinalize)(nccl::Comm comm) = nullptr;
  nccl::Result (*ncclCommDestroy)(nccl::Comm comm) = nullptr;
  nccl::Result (*ncclCommAbort)(nccl::Comm comm) = nullptr;
  nccl::Result (*ncclCommGetAsyncError)(nccl::Comm comm, nccl::Result* async_error) = nullptr;
  nccl::Result (*ncclAllReduce)(const void* send, void* recv, size_t count, nccl::DataType dtype, nccl::RedOp op,
                                nccl::Comm comm, cu::Stream stream) = nullptr;
  const char* (*ncclGetErrorString)(nccl::Result result) = nullptr;
  const char* (*ncclGetLastError)(nccl::Comm comm) = nullptr;
};

class NcclLibrary {
 public:
  // The process's NCCL, loaded once: dlopen("libnccl.so.2") and every function resolved.
  // UNAVAILABLE "no NCCL: dlopen libnccl.so.2: <dlerror>" or "no NCCL: libnccl.so.2 has
  // no <symbol> ..."; later calls give the same answer. Needs no GPU.
  static absl::StatusOr<const NcclLibrary*> load();
  // The same on another library (tests). Not cached; the library stays loaded.
  static absl::StatusOr<std::unique_ptr<NcclLibrary>> load_from(const std::string& library);

  const NcclApi& api() const { return api_; }
  const std::string& library() const { return library_; }
  int version() const { return version_; }  // ncclGetVersion: 22809 for 2.28.9
  std::string version_string() const;       // "2.28.9"

  // OK for ncclSuccess, else status_code_of(r) with "<function>: <name> (<text>)".
  absl::Status check(nccl::Result r, std::string_view function) const;
  // "ncclRemoteError", or "ncclResult_t 42" for a code NCCL does not name.
  static std::string result_name(nccl::Result r);
  // A peer that died or a system call that failed is UNAVAILABLE, a bad argument
  // INVALID_ARGUMENT, misuse FAILED_PRECONDITION, a CUDA error or NCCL's own INTERNAL.
  static absl::StatusCode status_code_of(nccl::Result r);

  NcclLibrary(const NcclApi& api, std::string library) : api_(api), library_(std::move(library)) {}

 private:
  NcclApi api_;
  std::string library_;
  int version_ = 0;
};

// NCCL's type for a dtype (int8/uint8/int32/uint32/int64/uint64/float16/bfloat16/float32/
// float64; index is int64); INVALID_ARGUMENT naming the dtype for the others (bool, the
// 16-bit integers), which the scheduler reduces through shm or gloo instead.
absl::StatusOr<nccl::DataType> nccl_datatype(Scalar dtype);
// add -> ncclSum, mul -> ncclProd, max -> ncclMax, min -> ncclMin.
nccl::RedOp nccl_redop(ReduceOp op);

struct NcclOptions {
  std::string group;       // unique per collective instance: the rendezvous namespace
  int rank = 0;
  int size = 1;
  std::string rendezvous;  // host:port of the Rendezvous service (the scheduler)
  std::shared_ptr<const cluster_auth::Dialer> rendezvous_dial;  // how to reach it; null: plaintext, no secret
  // Bounds joining (the rendezvous, the communicator) and the allreduce, each.
  std::chrono::milliseconds timeout{30000};
  // Asked while waiting; true aborts the communicator: CANCELLED.
  std::function<bool()> cancelled;
  // The member's GPU: bound on the calling thread before any NCCL call.
  std::shared_ptr<const CudaContext> context;
  // Tests: the library to use instead of NcclLibrary::load().
  const NcclLibrary* library = nullptr;
};

// Reduces `elements` values of `dtype` at device address `data` in place with the other
// members. INVALID_ARGUMENT for a dtype NCCL lacks, bad options or members that disagree;
// UNAVAILABLE without NCCL or when a peer is gone (naming the ranks that stopped
// answering when the survivors can tell); DEADLINE_EXCEEDED "rank i never joined" or when
// the reduction does not finish in time; CANCELLED.
absl::Status nccl_allreduce(const NcclOptions& options, cu::DevicePtr data, uint64_t elements, ReduceOp op,
                            Scalar dtype);

}  // namespace uop
