// A worker's part of one collective (proto/worker.proto, CollectiveRequest): checks the
// request against the buffer and dispatches by transport. The Worker service's handler
// only finds the buffer and calls run_collective; everything here is reachable from
// tests without a socket.
//
//   "shm"   workers on one host: the shared-memory ring (shm_ring.h)
//   "gloo"  workers on different hosts: Gloo over TCP, the scheduler's Rendezvous (gloo_allreduce.h)
//   "nccl"  CUDA workers: NCCL in device memory, its unique id handed out through the same
//           rendezvous (nccl_allreduce.h)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace uop {

class CudaContext;
namespace cluster_auth {
struct Dialer;
}

struct CollectiveSpec {
  // The group's name: 128 random bits from the scheduler, which alone can send Collective
  // requests (the cluster secret) and never hands a group's name to a client.
  std::string group;
  int rank = 0;
  int size = 1;
  std::string op;         // "add", "mul", "max", "min"
  std::string dtype;      // dtype.h's scalar name: "float32", "int64", ...
  uint64_t elements = 0;  // one buffer's; unused for a bucket
  // A bucket: several buffers reduced by one collective, bucket[i] elements of buffer i.
  // Every element ends with the bits it would have if its buffer were reduced alone.
  // Empty: one buffer of `elements`.
  std::vector<uint64_t> bucket;
  // The group lives on: formed (joined, connected) by the first call that names it and
  // reused by every later one, until a call on it fails (then it is dropped and the
  // scheduler forms another under a new name). false: formed and left by this call.
  bool keep_group = false;
  std::string transport;  // "shm", "gloo", "nccl"
  std::string rendezvous; // gloo, nccl: host:port of the scheduler's Rendezvous service
  // How to reach it (transport/cluster_auth.h: the cluster's credentials); null: plaintext,
  // no secret.
  std::shared_ptr<const cluster_auth::Dialer> rendezvous_dial;
  uint32_t timeout_ms = 0;  // 0: kDefaultCollectiveTimeoutMs
};

inline constexpr uint32_t kDefaultCollectiveTimeoutMs = 30000;

// Reduces spec.elements values at `data` (a buffer of `data_bytes`) in place with the
// other members. INVALID_ARGUMENT for a bad op / dtype / rank / size / transport or a
// buffer smaller than elements x dtype, and for nccl (host memory: NCCL reduces device
// memory); the transports' own errors otherwise (UNAVAILABLE / DEADLINE_EXCEEDED naming
// the group and the peer).
absl::Status run_collective(const CollectiveSpec& spec, void* data, uint64_t data_bytes,
                            const std::function<bool()>& cancelled = {});

// The same over several host buffers: one (spec.elements of it) or a bucket (spec.bucket,
// one entry per buffer; INVALID_ARGUMENT when they do not match or a buffer is smaller
// than its part).
struct HostBuffer {
  void* data = nullptr;
  uint64_t bytes = 0;
};
inline constexpr size_t kMaxBucketBuffers = 4096;
absl::Status run_collective(const CollectiveSpec& spec, std::span<const HostBuffer> buffers,
                            const std::function<bool()>& cancelled = {});

// The groups this process keeps (keep_group) right now.
size_t live_collective_groups();

// A buffer in a GPU's memory (worker/cuda/cuda_device.h's CudaMemory).
struct DeviceBufferRef {
  std::shared_ptr<const CudaContext> context;  // bound on the calling thread before NCCL runs
  uint64_t address = 0;                        // the device pointer
  uint64_t bytes = 0;
};

// The same on device memory, in place, for transport "nccl" (nccl_allreduce.h): the same
// checks, then UNAVAILABLE "no NCCL: ..." where libnccl.so.2 cannot be loaded and
// INVALID_ARGUMENT naming the dtype for one NCCL does not have. Other transports work on
// host memory: INVALID_ARGUMENT (the caller stages the buffer through the host for them).
absl::Status run_collective(const CollectiveSpec& spec, const DeviceBufferRef& buffer,
                            const std::function<bool()>& cancelled = {});

}  // namespace uop
