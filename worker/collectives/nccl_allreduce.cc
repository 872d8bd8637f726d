// NCCL loaded with dlopen, the unique id through the Rendezvous store, and one
// non-blocking communicator per collective instance, polled so that every wait is bounded.
// The library is opened with RTLD_LOCAL and never closed (NCCL keeps threads of its own).
#include "worker/collectives/nccl_allreduce.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "compiler/support/strings.h"
#include "worker/collectives/reduce.h"
#include "worker/collectives/rendezvous_client.h"
#include "worker/cuda/cuda_context.h"

namespace uop {
namespace {

constexpr const char* kNcclLibrary = "libnccl.so.2";
using Millis = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr Millis kRendezvousSlice{250};  // a wait at the rendezvous asks `cancelled` this often
constexpr Millis kPostMortem{3000};      // how long survivors wait for each other's reports

template <typename Fn>
absl::Status resolve(void* lib, const std::string& library, const char* name, Fn* field, bool required = true) {
  dlerror();
  void* p = dlsym(lib, name);
  if (!p) {
    if (!required) return absl::OkStatus();
    const char* why = dlerror();
    return absl::UnavailableError(cat("no NCCL: ", library, " has no ", name, why ? cat(" (", why, ")") : std::string(),
                                      "; NCCL 2.14 or later is needed"));
  }
  *field = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

absl::Status resolve_all(void* lib, const std::string& library, NcclApi& api) {
#define UOP_RESOLVE(fn) \
  if (absl::Status st = resolve(lib, library, #fn, &api.fn); !st.ok()) return st
  UOP_RESOLVE(ncclGetVersion);
  UOP_RESOLVE(ncclGetUniqueId);
  UOP_RESOLVE(ncclCommInitRankConfig);
  UOP_RESOLVE(ncclCommFinalize);
  UOP_RESOLVE(ncclCommDestroy);
  UOP_RESOLVE(ncclCommAbort);
  UOP_RESOLVE(ncclCommGetAsyncError);
  UOP_RESOLVE(ncclAllReduce);
  UOP_RESOLVE(ncclGetErrorString);
#undef UOP_RESOLVE
  // Only for messages (NCCL 2.13 and later).
  return resolve(lib, library, "ncclGetLastError", &api.ncclGetLastError, /*required=*/false);
}

// Sleeps a little longer each time, up to 1 ms: a small allreduce is done in tens of
// microseconds, a large one is not worth polling hard.
class Backoff {
 public:
  void wait() {
    if (spins_ < 64) {
      ++spins_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(step_));
    step_ = std::min(step_ * 2, 1000);
  }

 private:
  int spins_ = 0;
  int step_ = 10;
};

// One member's part of one collective instance.
class Member {
 public:
  Member(const NcclOptions& o, const NcclLibrary& lib) : o_(o), lib_(lib), api_(lib.api()) {}
  ~Member() { release(); }

  absl::Status run(cu::DevicePtr data, uint64_t elements, ReduceOp op, Scalar dtype, nccl::DataType type);

 private:
  std::string where() const {
    return cat("nccl allreduce in group '", o_.group, "' (rank ", o_.rank, " of ", o_.size, "): ");
  }
  std::string member(int q) const {
    return q >= 0 && q < static_cast<int>(members_.size()) && !members_[q].empty() ? cat("rank ", q, " (", members_[q], ")")
                                                                                  : cat("rank ", q);
  }
  bool cancelled() const { return o_.cancelled && o_.cancelled(); }
  absl::Status fail(absl::StatusCode code, const std::string& what) { return absl::Status(code, cat(where(), what)); }
  // "<fn>: <name> (<text>)", and NCCL's last message about the communicator if it has one.
  std::string describe(nccl::Result r, std::string_view fn) const {
    const char* last = comm_ && api_.ncclGetLastError ? api_.ncclGetLastError(comm_) : nullptr;
    return cat(lib_.check(r, fn).message(), last && *last ? cat(": ", last) : std::string());
  }
  absl::Status nccl_error(nccl::Result r, std::string_view fn) { return fail(lib_.status_code_of(r), describe(r, fn)); }

  absl::Status rendezvous(uint64_t elements, ReduceOp op, Scalar dtype, nccl::UniqueId* id);
  // Waits until the communicator's pending operation (init, finalize) is done.
  absl::Status settle(Clock::time_point deadline, std::string_view what);
  // The collective went wrong on our side or a peer's: abort, report, name the silent.
  absl::Status lost(absl::StatusCode code, const std::string& what);
  void abort();
  void release();

  const NcclOptions& o_;
  const NcclLibrary& lib_;
  const NcclApi& api_;
  std::unique_ptr<RendezvousClient> client_;
  std::vector<std::string> members_;  // "pid P on H" by rank, for messages
  nccl::Comm comm_ = nullptr;
  cu::Stream stream_ = nullptr;
};

absl::Status Member::rendezvous(uint64_t elements, ReduceOp op, Scalar dtype, nccl::UniqueId* id) {
  const int n = o_.size, r = o_.rank;
  const Millis timeout = o_.timeout;
  const std::string prefix = cat(o_.group, "/nccl/");
  client_ = std::make_unique<RendezvousClient>(o_.rendezvous, o_.rendezvous_dial ? *o_.rendezvous_dial : cluster_auth::Dialer{});
  auto unreachable = [&](const absl::Status& st) {
    return fail(st.code() == absl::StatusCode::kDeadlineExceeded ? st.code() : absl::StatusCode::kUnavailable,
                cat("rendezvous at ", o_.rendezvous, ": ", st.message()));
  };
  if (r == 0) {
    if (nccl::Result res = api_.ncclGetUniqueId(id); res != nccl::kSuccess) return nccl_error(res, "ncclGetUniqueId");
    if (absl::Status st = client_->set(prefix + "id", std::string(id->internal, nccl::kUniqueIdBytes), timeout); !st.ok())
      return unreachable(st);
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  // "<elements> <dtype> <op>|pid P on H": what it reduces, then who it is.
  const std::string mine = cat(elements, " ", scalar_name(dtype), " (", reduce_op_wire_name(op), ")|pid ",
                               static_cast<int64_t>(getpid()), " on ", host);
  if (absl::Status st = client_->set(cat(prefix, "member/", r), mine, timeout); !st.ok()) return unreachable(st);

  std::vector<std::string> keys;
  for (int q = 0; q < n; ++q) keys.push_back(cat(prefix, "member/", q));
  keys.push_back(prefix + "id");
  const auto deadline = Clock::now() + timeout;
  absl::StatusOr<std::vector<std::string>> got;
  for (;;) {
    if (cancelled()) return fail(absl::StatusCode::kCancelled, "cancelled by the caller while joining");
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    got = client_->get(keys, std::clamp(left, Millis(0), kRendezvousSlice));
    if (got.ok()) break;
    if (got.status().code() != absl::StatusCode::kDeadlineExceeded) return unreachable(got.status());
    if (left <= kRendezvousSlice) {
      // Which members never came (the id comes with rank 0's).
      std::vector<int> missing;
      for (int q = 0; q < n; ++q)
        if (!client_->get({keys[q]}, Millis(0)).ok()) missing.push_back(q);
      if (missing.empty()) return unreachable(got.status());
      return fail(absl::StatusCode::kDeadlineExceeded,
                  cat(missing.size() == 1 ? "rank " : "ranks ", join(missing, ", "),
                      " never joined (nothing at the rendezvous within ", timeout.count(), " ms)"));
    }
  }
  const std::vector<std::string>& v = *got;
  members_.assign(n, "");
  std::vector<std::string> what(n);
  for (int q = 0; q < n; ++q) {
    size_t bar = v[q].find('|');
    what[q] = v[q].substr(0, bar);
    if (bar != std::string::npos) members_[q] = v[q].substr(bar + 1);
  }
  // Every member names the same pair: rank 0 and the first rank unlike it.
  for (int q = 1; q < n; ++q)
    if (what[q] != what[0])
      return fail(absl::StatusCode::kInvalidArgument,
                  cat("the members disagree: rank 0 reduces ", what[0], " elements, rank ", q, " reduces ", what[q], " elements"));
  if (v[n].size() != nccl::kUniqueIdBytes)
    return fail(absl::StatusCode::kInternal, cat("the unique id at the rendezvous has ", v[n].size(), " bytes, not ",
                                                 nccl::kUniqueIdBytes));
  std::memcpy(id->internal, v[n].data(), nccl::kUniqueIdBytes);
  return absl::OkStatus();
}

absl::Status Member::settle(Clock::time_point deadline, std::string_view what) {
  Backoff backoff;
  for (;;) {
    nccl::Result state = nccl::kSuccess;
    if (nccl::Result r = api_.ncclCommGetAsyncError(comm_, &state); r != nccl::kSuccess)
      return lost(lib_.status_code_of(r), describe(r, "ncclCommGetAsyncError"));
    if (state == nccl::kSuccess) return absl::OkStatus();
    if (state != nccl::kInProgress)
      return lost(lib_.status_code_of(state), cat(what, ": ", describe(state, "ncclCommGetAsyncError")));
    if (cancelled()) return lost(absl::StatusCode::kCancelled, cat("cancelled by the caller during ", what));
    if (Clock::now() > deadline)
      return lost(absl::StatusCode::kDeadlineExceeded, cat(what, " did not finish within ", o_.timeout.count(), " ms"));
    backoff.wait();
  }
}

absl::Status Member::lost(absl::StatusCode code, const std::string& what) {
  abort();
  if (code == absl::StatusCode::kCancelled || !client_ || o_.size == 1) return fail(code, what);
  // Every survivor reports; whoever stays silent is the one that is gone.
  const auto deadline = Clock::now() + std::min(o_.timeout, kPostMortem);
  (void)client_->set(cat(o_.group, "/nccl/failed/", o_.rank), what, kPostMortem);
  std::vector<int> silent;
  for (int q = 0; q < o_.size; ++q) {
    if (q == o_.rank) continue;
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (!client_->get({cat(o_.group, "/nccl/failed/", q)}, std::max(Millis(0), left)).ok()) silent.push_back(q);
  }
  if (silent.empty()) return fail(code, what);
  std::string who;
  for (int q : silent) who += cat(who.empty() ? "" : ", ", member(q));
  // A peer that is gone, not a slow one: ours was only a symptom.
  if (code == absl::StatusCode::kDeadlineExceeded || code == absl::StatusCode::kInternal)
    code = absl::StatusCode::kUnavailable;
  return fail(code, cat(who, " stopped answering: ", what));
}

void Member::abort() {
  if (comm_) (void)api_.ncclCommAbort(comm_);
  comm_ = nullptr;
}

void Member::release() {
  abort();
  if (stream_) (void)o_.context->driver().api().cuStreamDestroy(stream_);
  stream_ = nullptr;
}

absl::Status Member::run(cu::DevicePtr data, uint64_t elements, ReduceOp op, Scalar dtype, nccl::DataType type) {
  nccl::UniqueId id{};
  if (o_.size > 1) {
    if (absl::Status st = rendezvous(elements, op, dtype, &id); !st.ok()) return st;
  }
  if (elements == 0) return absl::OkStatus();  // everyone agreed on nothing to do
  const CudaDriver& drv = o_.context->driver();
  if (absl::Status st = o_.context->bind(); !st.ok()) return fail(absl::StatusCode::kUnavailable, std::string(st.message()));
  if (o_.size == 1)
    if (nccl::Result r = api_.ncclGetUniqueId(&id); r != nccl::kSuccess) return nccl_error(r, "ncclGetUniqueId");
  // A blocking stream: it waits for the synchronous copies and launches before it.
  if (absl::Status st = UOP_CU(drv, cuStreamCreate, &stream_, 0u); !st.ok()) return fail(st.code(), std::string(st.message()));

  nccl::ConfigPrefix config;
  config.blocking = 0;
  auto deadline = Clock::now() + o_.timeout;
  nccl::Result r = api_.ncclCommInitRankConfig(&comm_, o_.size, id, o_.rank, &config);
  if (r != nccl::kSuccess && r != nccl::kInProgress)
    return lost(lib_.status_code_of(r), describe(r, "ncclCommInitRankConfig"));
  if (absl::Status st = settle(deadline, "joining the communicator"); !st.ok()) return st;

  deadline = Clock::now() + o_.timeout;
  void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(data));
  r = api_.ncclAllReduce(p, p, static_cast<size_t>(elements), type, nccl_redop(op), comm_, stream_);
  if (r != nccl::kSuccess && r != nccl::kInProgress) return lost(lib_.status_code_of(r), describe(r, "ncclAllReduce"));
  if (r == nccl::kInProgress)
    if (absl::Status st = settle(deadline, "enqueueing the allreduce"); !st.ok()) return st;
  // The kernels run: poll the stream, and the communicator for a peer's failure.
  Backoff backoff;
  for (;;) {
    cu::Result q = drv.api().cuStreamQuery(stream_);
    if (q == cu::kSuccess) break;
    if (q != cu::kErrorNotReady) {
      absl::Status st = drv.check(q, "cuStreamQuery");
      return lost(absl::StatusCode::kInternal, cat("the allreduce failed on the GPU: ", st.message()));
    }
    nccl::Result state = nccl::kSuccess;
    api_.ncclCommGetAsyncError(comm_, &state);
    if (state != nccl::kSuccess && state != nccl::kInProgress)
      return lost(lib_.status_code_of(state), cat("the allreduce: ", describe(state, "ncclCommGetAsyncError")));
    if (cancelled()) return lost(absl::StatusCode::kCancelled, "cancelled by the caller during the allreduce");
    if (Clock::now() > deadline)
      return lost(absl::StatusCode::kDeadlineExceeded, cat("the allreduce did not finish within ", o_.timeout.count(), " ms"));
    backoff.wait();
  }
  // Done: finalize (non-blocking too) and destroy.
  deadline = Clock::now() + o_.timeout;
  r = api_.ncclCommFinalize(comm_);
  if (r == nccl::kInProgress) {
    if (absl::Status st = settle(deadline, "finalizing the communicator"); !st.ok()) return st;
  } else if (r != nccl::kSuccess) {
    absl::Status st = nccl_error(r, "ncclCommFinalize");
    abort();
    return st;
  }
  r = api_.ncclCommDestroy(comm_);
  comm_ = nullptr;
  if (r != nccl::kSuccess && r != nccl::kInProgress) return nccl_error(r, "ncclCommDestroy");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclLibrary>> NcclLibrary::load_from(const std::string& library) {
  dlerror();
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    return absl::UnavailableError(cat("no NCCL: dlopen ", library, ": ", why ? why : "unknown error"));
  }
  NcclApi api;
  if (absl::Status st = resolve_all(lib, library, api); !st.ok()) return st;
  auto nccl = std::make_unique<NcclLibrary>(api, library);
  if (nccl::Result r = api.ncclGetVersion(&nccl->version_); r != nccl::kSuccess)
    return absl::UnavailableError(cat("no NCCL: ", library, ": ", nccl->check(r, "ncclGetVersion").message()));
  if (nccl->version_ < 21400)
    return absl::UnavailableError(cat("no NCCL: ", library, " is NCCL ", nccl->version_string(),
                                      "; NCCL 2.14 or later is needed"));
  return nccl;
}

absl::StatusOr<const NcclLibrary*> NcclLibrary::load() {
  // Made once and never destroyed, like the CUDA driver.
  static const absl::StatusOr<const NcclLibrary*> loaded = []() -> absl::StatusOr<const NcclLibrary*> {
    auto l = load_from(kNcclLibrary);
    if (!l.ok()) return l.status();
    return l->release();
  }();
  return loaded;
}

std::string NcclLibrary::version_string() const {
  // NCCL_VERSION(X, Y, Z): X * 1000 + Y * 100 + Z before 2.9, X * 10000 + Y * 100 + Z since.
  int v = version_;
  if (v >= 20900) return cat(v / 10000, ".", v / 100 % 100, ".", v % 100);
  return cat(v / 1000, ".", v / 100 % 10, ".", v % 100);
}

std::string NcclLibrary::result_name(nccl::Result r) {
  switch (r) {
    case nccl::kSuccess: return "ncclSuccess";
    case nccl::kUnhandledCudaError: return "ncclUnhandledCudaError";
    case nccl::kSystemError: return "ncclSystemError";
    case nccl::kInternalError: return "ncclInternalError";
    case nccl::kInvalidArgument: return "ncclInvalidArgument";
    case nccl::kInvalidUsage: return "ncclInvalidUsage";
    case nccl::kRemoteError: return "ncclRemoteError";
    case nccl::kInProgress: return "ncclInProgress";
    default: return cat("ncclResult_t ", r);
  }
}

absl::StatusCode NcclLibrary::status_code_of(nccl::Result r) {
  switch (r) {
    case nccl::kSuccess: return absl::StatusCode::kOk;
    case nccl::kSystemError:
    case nccl::kRemoteError: return absl::StatusCode::kUnavailable;
    case nccl::kInvalidArgument: return absl::StatusCode::kInvalidArgument;
    case nccl::kInvalidUsage: return absl::StatusCode::kFailedPrecondition;
    case nccl::kInProgress: return absl::StatusCode::kDeadlineExceeded;  // only when a wait ran out
    default: return absl::StatusCode::kInternal;  // a CUDA error, NCCL's own, or one we do not know
  }
}

absl::Status NcclLibrary::check(nccl::Result r, std::string_view function) const {
  if (r == nccl::kSuccess) return absl::OkStatus();
  const char* text = api_.ncclGetErrorString ? api_.ncclGetErrorString(r) : nullptr;
  return absl::Status(status_code_of(r),
                      cat(function, ": ", result_name(r), text && *text ? cat(" (", text, ")") : std::string()));
}

absl::StatusOr<nccl::DataType> nccl_datatype(Scalar dtype) {
  switch (dtype) {
    case Scalar::Int8: return nccl::kInt8;
    case Scalar::UInt8: return nccl::kUint8;
    case Scalar::Int32: return nccl::kInt32;
    case Scalar::UInt32: return nccl::kUint32;
    case Scalar::Int64:
    case Scalar::Index: return nccl::kInt64;
    case Scalar::UInt64: return nccl::kUint64;
    case Scalar::Float16: return nccl::kFloat16;
    case Scalar::BFloat16: return nccl::kBfloat16;
    case Scalar::Float32: return nccl::kFloat32;
    case Scalar::Float64: return nccl::kFloat64;
    default:
      return absl::InvalidArgumentError(cat("NCCL cannot reduce ", scalar_name(dtype),
                                            " (it has int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, "
                                            "float32 and float64)"));
  }
}

nccl::RedOp nccl_redop(ReduceOp op) {
  switch (op) {
    case ReduceOp::Add: return nccl::kSum;
    case ReduceOp::Mul: return nccl::kProd;
    case ReduceOp::Max: return nccl::kMax;
    case ReduceOp::Min: return nccl::kMin;
  }
  return nccl::kSum;
}

absl::Status nccl_allreduce(const NcclOptions& options, cu::DevicePtr data, uint64_t elements, ReduceOp op,
                            Scalar dtype) {
  const std::string where =
      cat("nccl allreduce in group '", options.group, "' (rank ", options.rank, " of ", options.size, "): ");
  if (options.group.empty() || options.size < 1 || options.rank < 0 || options.rank >= options.size)
    return absl::InvalidArgumentError(cat(where, "needs a group and 0 <= rank < size"));
  if (options.size > 1 && options.rendezvous.empty())
    return absl::InvalidArgumentError(cat(where, "needs the scheduler's rendezvous address"));
  auto type = nccl_datatype(dtype);
  if (!type.ok()) return absl::InvalidArgumentError(cat(where, type.status().message()));
  if (!options.context) return absl::InvalidArgumentError(cat(where, "needs the buffer's CUDA context"));
  if (elements > SIZE_MAX / 8) return absl::InvalidArgumentError(cat(where, elements, " elements overflow"));
  const NcclLibrary* lib = options.library;
  if (!lib) {
    auto loaded = NcclLibrary::load();
    if (!loaded.ok()) return absl::UnavailableError(cat(where, loaded.status().message()));
    lib = *loaded;
  }
  Member m(options, *lib);
  return m.run(data, elements, op, dtype, *type);
}

}  // namespace uop
