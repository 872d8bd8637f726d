// The NCCL transport. Without a GPU: loading libnccl.so.2 (what it says when it
// cannot, that every symbol resolves when it can), our declarations against nccl.h where
// it is around, the dtype / op mapping, run_collective's checks for device buffers, and
// the whole protocol over a fake NCCL and a fake CUDA driver (the unique id through a real
// Rendezvous server to every member, members that never join or disagree, a stream that
// never finishes, a peer that fails, a caller that cancels: the communicator is aborted
// and nothing hangs). With GPUs: allreduce of every (dtype, op) NCCL has across the GPUs
// there are (one GPU: a 1-rank communicator, still through NCCL; N: N processes), against
// eval_alu, directly and through WorkerRuntime on a CUDA buffer.
//
// Members are forked processes (collective_testing.h); the parent never starts gRPC or
// CUDA, which a forked child could not then use.
#include "worker/collectives/nccl_allreduce.h"

#include <grpcpp/grpcpp.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>

#include "server/rendezvous_service.h"
#include "tests/unit/worker/collectives/collective_testing.h"
#include "tests/unit/worker/collectives/rendezvous_testing.h"
#include "worker/collectives/collective.h"
#include "worker/cuda/cuda_context.h"
#include "worker/cuda/cuda_device.h"
#include "worker/worker_service.h"

#ifdef UOPD_HAVE_NCCL_H
#include <nccl.h>  // and through it cuda_runtime.h (not cuda.h, whose macros rename CudaApi's fields)
#endif

namespace uop {
namespace {

using namespace uop::testing;
using std::chrono::milliseconds;

// Debian's Abseil has a string_view of its own: a status message goes through std::string.
template <typename S>
bool contains(const S& s, std::string_view part) {
  return std::string(s).find(part) != std::string::npos;
}

// ---- declarations against nccl.h -------------------------------------------------------

#ifdef UOPD_HAVE_NCCL_H
static_assert(nccl::kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(sizeof(nccl::UniqueId) == sizeof(ncclUniqueId));
static_assert(sizeof(nccl::Result) == sizeof(ncclResult_t));
static_assert(sizeof(nccl::DataType) == sizeof(ncclDataType_t));
static_assert(sizeof(nccl::RedOp) == sizeof(ncclRedOp_t));
static_assert(nccl::kSuccess == ncclSuccess && nccl::kUnhandledCudaError == ncclUnhandledCudaError &&
              nccl::kSystemError == ncclSystemError && nccl::kInternalError == ncclInternalError &&
              nccl::kInvalidArgument == ncclInvalidArgument && nccl::kInvalidUsage == ncclInvalidUsage &&
              nccl::kRemoteError == ncclRemoteError && nccl::kInProgress == ncclInProgress);
static_assert(nccl::kInt8 == ncclInt8 && nccl::kUint8 == ncclUint8 && nccl::kInt32 == ncclInt32 &&
              nccl::kUint32 == ncclUint32 && nccl::kInt64 == ncclInt64 && nccl::kUint64 == ncclUint64 &&
              nccl::kFloat16 == ncclFloat16 && nccl::kFloat32 == ncclFloat32 && nccl::kFloat64 == ncclFloat64 &&
              nccl::kBfloat16 == ncclBfloat16);
static_assert(nccl::kSum == ncclSum && nccl::kProd == ncclProd && nccl::kMax == ncclMax && nccl::kMin == ncclMin);
// The config prefix is ncclConfig_t's first fields, at the same places.
static_assert(offsetof(nccl::ConfigPrefix, size) == offsetof(ncclConfig_t, size));
static_assert(offsetof(nccl::ConfigPrefix, magic) == offsetof(ncclConfig_t, magic));
static_assert(offsetof(nccl::ConfigPrefix, version) == offsetof(ncclConfig_t, version));
static_assert(offsetof(nccl::ConfigPrefix, blocking) == offsetof(ncclConfig_t, blocking));
static_assert(offsetof(nccl::ConfigPrefix, cga_cluster_size) == offsetof(ncclConfig_t, cgaClusterSize));
static_assert(sizeof(nccl::ConfigPrefix) == offsetof(ncclConfig_t, cgaClusterSize) + sizeof(int));
static_assert(cu::kErrorNotReady == static_cast<int>(cudaErrorNotReady));  // the driver's and the runtime's 600

TEST(NcclDeclarations, ConfigPrefixIsWhatTheInitializerMakes) {
  ncclConfig_t full = NCCL_CONFIG_INITIALIZER;
  nccl::ConfigPrefix mine;
  EXPECT_EQ(mine.magic, full.magic);
  EXPECT_EQ(mine.blocking, full.blocking);
  EXPECT_EQ(mine.cga_cluster_size, full.cgaClusterSize);
  EXPECT_EQ(mine.version, static_cast<unsigned>(NCCL_VERSION(2, 14, 0)));
  EXPECT_LE(mine.version, full.version);
}
#endif

// ---- loading the library ---------------------------------------------------------------

TEST(NcclLibrary, LoadResolvesEverySymbolOrSaysWhy) {
  auto lib = NcclLibrary::load();
  if (!lib.ok()) {
    EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable) << lib.status();
    EXPECT_TRUE(std::string(lib.status().message()).starts_with("no NCCL: ")) << lib.status();
    EXPECT_EQ(NcclLibrary::load().status(), lib.status());  // made once
    GTEST_SKIP() << "no NCCL here: " << lib.status();
  }
  const NcclApi& api = (*lib)->api();
  EXPECT_NE(api.ncclGetVersion, nullptr);
  EXPECT_NE(api.ncclGetUniqueId, nullptr);
  EXPECT_NE(api.ncclCommInitRankConfig, nullptr);
  EXPECT_NE(api.ncclCommFinalize, nullptr);
  EXPECT_NE(api.ncclCommDestroy, nullptr);
  EXPECT_NE(api.ncclCommAbort, nullptr);
  EXPECT_NE(api.ncclCommGetAsyncError, nullptr);
  EXPECT_NE(api.ncclAllReduce, nullptr);
  EXPECT_NE(api.ncclGetErrorString, nullptr);
  EXPECT_GE((*lib)->version(), 21400);
  EXPECT_EQ((*lib)->library(), "libnccl.so.2");
  std::string v = (*lib)->version_string();
  EXPECT_EQ(std::count(v.begin(), v.end(), '.'), 2) << v;
#ifdef UOPD_HAVE_NCCL_H
  // The header and the library may be different releases of one major version.
  EXPECT_TRUE(v.starts_with(cat(NCCL_MAJOR, "."))) << v;
#endif
  // NCCL's own text for a result, through the loaded library.
  absl::Status st = (*lib)->check(nccl::kRemoteError, "ncclAllReduce");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(std::string(st.message()).starts_with("ncclAllReduce: ncclRemoteError (")) << st;
  EXPECT_EQ(NcclLibrary::load().value(), *lib);  // made once
}

TEST(NcclLibrary, LoadFromAMissingLibrary) {
  auto lib = NcclLibrary::load_from("/nonexistent/libnccl.so.2");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable);
  std::string msg(lib.status().message());
  EXPECT_TRUE(msg.starts_with("no NCCL: dlopen /nonexistent/libnccl.so.2: ")) << msg;
  EXPECT_TRUE(contains(msg, "No such file")) << msg;
}

TEST(NcclLibrary, LoadFromALibraryThatIsNotNccl) {
  auto lib = NcclLibrary::load_from("libm.so.6");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(contains(lib.status().message(), "no NCCL: libm.so.6 has no ncclGetVersion")) << lib.status();
}

TEST(NcclLibrary, ResultsBecomeStatuses) {
  using C = absl::StatusCode;
  EXPECT_EQ(NcclLibrary::status_code_of(nccl::kSuccess), C::kOk);
  EXPECT_EQ(NcclLibrary::status_code_of(nccl::kRemoteError), C::kUnavailable);
  EXPECT_EQ(NcclLibrary::status_code_of(nccl::kSystemError), C::kUnavailable);
  EXPECT_EQ(NcclLibrary::status_code_of(nccl::kInvalidArgument), C::kInvalidArgument);
  EXPECT_EQ(NcclLibrary::status_code_of(nccl::kInvalidUsage), C::kFailedPrecondition);
  EXPECT_EQ(NcclLibrary::status_code_of(nccl::kUnhandledCudaError), C::kInternal);
  EXPECT_EQ(NcclLibrary::status_code_of(nccl::kInternalError), C::kInternal);
  EXPECT_EQ(NcclLibrary::status_code_of(42), C::kInternal);
  EXPECT_EQ(NcclLibrary::result_name(nccl::kInvalidUsage), "ncclInvalidUsage");
  EXPECT_EQ(NcclLibrary::result_name(42), "ncclResult_t 42");
  NcclLibrary none(NcclApi{}, "(none)");  // no ncclGetErrorString: the name alone
  EXPECT_EQ(none.check(nccl::kSystemError, "ncclCommInitRankConfig").message(),
            "ncclCommInitRankConfig: ncclSystemError");
  EXPECT_TRUE(none.check(nccl::kSuccess, "x").ok());
}

TEST(NcclLibrary, GetUniqueIdWithoutAGpu) {
  // In a child: NCCL starts its bootstrap root for the id, which the parent should not keep.
  auto lib = NcclLibrary::load();
  if (!lib.ok()) GTEST_SKIP() << lib.status();
  SharedMemory out(sizeof(nccl::UniqueId) + sizeof(int));
  auto reports = run_members(1, [&](int) -> absl::Status {
    nccl::UniqueId id{};
    nccl::Result r = (*lib)->api().ncclGetUniqueId(&id);
    std::memcpy(out.data(), &r, sizeof r);
    std::memcpy(out.data() + sizeof r, &id, sizeof id);
    return (*lib)->check(r, "ncclGetUniqueId");
  });
  if (!reports[0].status().ok()) GTEST_SKIP() << "NCCL makes no unique id here: " << reports[0].status();
  const uint8_t* id = out.data() + sizeof(int);
  EXPECT_TRUE(std::any_of(id, id + nccl::kUniqueIdBytes, [](uint8_t b) { return b != 0; }));
}

// ---- the mapping -----------------------------------------------------------------------

TEST(NcclMapping, Dtypes) {
  const std::pair<Scalar, nccl::DataType> has[] = {
      {Scalar::Int8, nccl::kInt8},       {Scalar::UInt8, nccl::kUint8},     {Scalar::Int32, nccl::kInt32},
      {Scalar::UInt32, nccl::kUint32},   {Scalar::Int64, nccl::kInt64},     {Scalar::UInt64, nccl::kUint64},
      {Scalar::Index, nccl::kInt64},     {Scalar::Float16, nccl::kFloat16}, {Scalar::BFloat16, nccl::kBfloat16},
      {Scalar::Float32, nccl::kFloat32}, {Scalar::Float64, nccl::kFloat64},
  };
  for (auto [t, want] : has) {
    auto got = nccl_datatype(t);
    ASSERT_TRUE(got.ok()) << scalar_name(t) << ": " << got.status();
    EXPECT_EQ(*got, want) << scalar_name(t);
  }
  for (Scalar t : {Scalar::Bool, Scalar::Int16, Scalar::UInt16, Scalar::Void}) {
    auto got = nccl_datatype(t);
    ASSERT_FALSE(got.ok()) << scalar_name(t);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(got.status().message(), cat("NCCL cannot reduce ", scalar_name(t)))) << got.status();
  }
}

TEST(NcclMapping, Ops) {
  EXPECT_EQ(nccl_redop(ReduceOp::Add), nccl::kSum);
  EXPECT_EQ(nccl_redop(ReduceOp::Mul), nccl::kProd);
  EXPECT_EQ(nccl_redop(ReduceOp::Max), nccl::kMax);
  EXPECT_EQ(nccl_redop(ReduceOp::Min), nccl::kMin);
}

// ---- run_collective's checks for device buffers -------------------------------------------

CollectiveSpec spec(const std::string& transport, const std::string& dtype = "float32", int size = 1) {
  CollectiveSpec s;
  s.group = "nccl-check";
  s.rank = 0;
  s.size = size;
  s.op = "add";
  s.dtype = dtype;
  s.elements = 4;
  s.transport = transport;
  return s;
}

TEST(NcclDispatch, RefusesWhatIsNotItsToDo) {
  float host[4] = {};
  // Host memory cannot go to NCCL.
  absl::Status st = run_collective(spec("nccl"), host, sizeof host);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(contains(st.message(), "nccl reduces GPU memory")) << st;
  // Device memory cannot go to shm or gloo.
  DeviceBufferRef dev{nullptr, 0x1000, 16};
  st = run_collective(spec("shm"), dev);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(contains(st.message(), "this buffer is in GPU memory")) << st;
  // A dtype NCCL does not have, named.
  for (const char* t : {"bool", "int16", "uint16"}) {
    CollectiveSpec s = spec("nccl", t);
    s.op = "max";
    st = run_collective(s, dev);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(contains(st.message(), cat("NCCL cannot reduce ", t))) << st;
  }
  // The common checks still come first.
  CollectiveSpec small = spec("nccl");
  small.elements = 5;
  st = run_collective(small, dev);
  EXPECT_TRUE(contains(st.message(), "5 float32 elements need 20 bytes, the buffer has 16")) << st;
  // Several members need the rendezvous; a buffer needs its context.
  st = run_collective(spec("nccl", "float32", 2), dev);
  EXPECT_TRUE(contains(st.message(), "nccl needs the scheduler's rendezvous address")) << st;
  st = run_collective(spec("nccl"), dev);
  EXPECT_TRUE(contains(st.message(), "needs its CUDA context")) << st;
}

// ---- the protocol over a fake NCCL and a fake driver -----------------------------------

// Process-wide state of the fakes (each forked member has its own copy).
struct Fake {
  int init_polls = 0;          // GetAsyncError says InProgress this many times after init
  int stream_polls = 3;        // cuStreamQuery says not ready this many times
  bool stream_hangs = false;   // ... or forever
  nccl::Result init_result = nccl::kInProgress;
  nccl::Result fail_while_running = nccl::kSuccess;  // the async error once the kernels run
  // What the fakes saw.
  nccl::UniqueId id{};
  int nranks = 0, rank = -1, blocking = -2, aborted = 0, destroyed = 0, finalized = 0, streams = 0;
  size_t count = 0;
  nccl::DataType type = -1;
  nccl::RedOp op = -1;
  bool running = false;
};
Fake fake;
char fake_comm, fake_ctx, fake_stream;

nccl::Result f_version(int* v) { return *v = 22800, nccl::kSuccess; }
nccl::Result f_unique_id(nccl::UniqueId* id) {
  std::memset(id->internal, 0x5a, sizeof id->internal);
  int pid = getpid();
  std::memcpy(id->internal, &pid, sizeof pid);
  return nccl::kSuccess;
}
nccl::Result f_init(nccl::Comm* comm, int n, nccl::UniqueId id, int rank, nccl::ConfigPrefix* config) {
  fake.id = id;
  fake.nranks = n;
  fake.rank = rank;
  fake.blocking = config->blocking;
  *comm = reinterpret_cast<nccl::Comm>(&fake_comm);
  return fake.init_result;
}
nccl::Result f_async(nccl::Comm, nccl::Result* state) {
  if (fake.init_polls > 0) return --fake.init_polls, *state = nccl::kInProgress, nccl::kSuccess;
  *state = fake.running ? fake.fail_while_running : nccl::kSuccess;
  return nccl::kSuccess;
}
nccl::Result f_allreduce(const void* s, void* r, size_t count, nccl::DataType t, nccl::RedOp op, nccl::Comm, cu::Stream) {
  EXPECT_EQ(s, r);  // in place
  fake.count = count;
  fake.type = t;
  fake.op = op;
  fake.running = true;
  return nccl::kSuccess;
}
nccl::Result f_finalize(nccl::Comm) { return ++fake.finalized, nccl::kSuccess; }
nccl::Result f_destroy(nccl::Comm) { return ++fake.destroyed, nccl::kSuccess; }
nccl::Result f_abort(nccl::Comm) { return ++fake.aborted, nccl::kSuccess; }
const char* f_error_string(nccl::Result) { return "fake NCCL says so"; }

cu::Result c_ok0(unsigned) { return cu::kSuccess; }
cu::Result c_version(int* v) { return *v = 13000, cu::kSuccess; }
cu::Result c_count(int* n) { return *n = 1, cu::kSuccess; }
cu::Result c_get(cu::Device* d, int ordinal) { return *d = ordinal, cu::kSuccess; }
cu::Result c_retain(cu::Context* c, cu::Device) { return *c = reinterpret_cast<cu::Context>(&fake_ctx), cu::kSuccess; }
cu::Result c_release(cu::Device) { return cu::kSuccess; }
cu::Result c_set_current(cu::Context) { return cu::kSuccess; }
cu::Result c_stream_create(cu::Stream* s, unsigned) { return ++fake.streams, *s = reinterpret_cast<cu::Stream>(&fake_stream), cu::kSuccess; }
cu::Result c_stream_query(cu::Stream) {
  if (fake.stream_hangs) return cu::kErrorNotReady;
  if (fake.stream_polls > 0) return --fake.stream_polls, cu::kErrorNotReady;
  return cu::kSuccess;
}
cu::Result c_stream_destroy(cu::Stream) { return --fake.streams, cu::kSuccess; }

const NcclLibrary& fake_nccl() {
  static NcclLibrary* lib = [] {
    NcclApi a;
    a.ncclGetVersion = f_version;
    a.ncclGetUniqueId = f_unique_id;
    a.ncclCommInitRankConfig = f_init;
    a.ncclCommFinalize = f_finalize;
    a.ncclCommDestroy = f_destroy;
    a.ncclCommAbort = f_abort;
    a.ncclCommGetAsyncError = f_async;
    a.ncclAllReduce = f_allreduce;
    a.ncclGetErrorString = f_error_string;
    return new NcclLibrary(a, "(fake)");
  }();
  return *lib;
}

std::shared_ptr<const CudaContext> fake_context() {
  static CudaDriver* driver = [] {
    CudaApi a;
    a.cuInit = c_ok0;
    a.cuDriverGetVersion = c_version;
    a.cuDeviceGetCount = c_count;
    a.cuDeviceGet = c_get;
    a.cuDevicePrimaryCtxRetain = c_retain;
    a.cuDevicePrimaryCtxRelease = c_release;
    a.cuCtxSetCurrent = c_set_current;
    a.cuStreamCreate = c_stream_create;
    a.cuStreamQuery = c_stream_query;
    a.cuStreamDestroy = c_stream_destroy;
    return CudaDriver::from_table(a, "(fake driver)").value().release();
  }();
  return CudaContext::retain(driver, 0).value();
}

NcclOptions fake_options(const std::string& group, int rank = 0, int size = 1, milliseconds timeout = milliseconds(5000)) {
  NcclOptions o;
  o.group = group;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.context = fake_context();
  o.library = &fake_nccl();
  return o;
}

class FakeNcclTest : public ::testing::Test {
 protected:
  void SetUp() override { fake = Fake{}; }
};

TEST_F(FakeNcclTest, OneRankRunsNcclNonBlockingAndCleansUp) {
  fake.init_polls = 5;
  absl::Status st = nccl_allreduce(fake_options("one"), 0x1000, 10, ReduceOp::Max, Scalar::BFloat16);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(fake.nranks, 1);
  EXPECT_EQ(fake.rank, 0);
  EXPECT_EQ(fake.blocking, 0);  // non-blocking, so that every wait can be bounded
  EXPECT_EQ(fake.count, 10u);
  EXPECT_EQ(fake.type, nccl::kBfloat16);
  EXPECT_EQ(fake.op, nccl::kMax);
  EXPECT_EQ(fake.init_polls, 0);
  EXPECT_EQ(fake.stream_polls, 0);  // waited for the stream
  EXPECT_EQ(fake.finalized, 1);
  EXPECT_EQ(fake.destroyed, 1);
  EXPECT_EQ(fake.aborted, 0);
  EXPECT_EQ(fake.streams, 0);  // the stream made for it is gone
}

TEST_F(FakeNcclTest, NothingToReduceNeedsNoCommunicator) {
  ASSERT_TRUE(nccl_allreduce(fake_options("empty"), 0x1000, 0, ReduceOp::Add, Scalar::Float32).ok());
  EXPECT_EQ(fake.nranks, 0);
}

TEST_F(FakeNcclTest, AStreamThatNeverFinishesIsAbortedAtTheTimeout) {
  fake.stream_hangs = true;
  absl::Status st = nccl_allreduce(fake_options("hang", 0, 1, milliseconds(200)), 0x1000, 10, ReduceOp::Add, Scalar::Float32);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_TRUE(contains(st.message(), "nccl allreduce in group 'hang' (rank 0 of 1): the allreduce did not finish within 200 ms"))
      << st;
  EXPECT_EQ(fake.aborted, 1);
  EXPECT_EQ(fake.destroyed, 0);
  EXPECT_EQ(fake.streams, 0);
}

TEST_F(FakeNcclTest, AJoinThatNeverFinishesIsAbortedAtTheTimeout) {
  fake.init_polls = 1 << 30;
  absl::Status st = nccl_allreduce(fake_options("slowjoin", 0, 1, milliseconds(100)), 0x1000, 10, ReduceOp::Add, Scalar::Int32);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_TRUE(contains(st.message(), "joining the communicator did not finish within 100 ms")) << st;
  EXPECT_EQ(fake.aborted, 1);
}

TEST_F(FakeNcclTest, ACallerThatGoesAwayAbortsIt) {
  fake.stream_hangs = true;
  std::atomic<int> asked{0};
  NcclOptions o = fake_options("cancel");
  o.cancelled = [&] { return ++asked > 100; };
  absl::Status st = nccl_allreduce(o, 0x1000, 10, ReduceOp::Add, Scalar::Float32);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_TRUE(contains(st.message(), "cancelled by the caller during the allreduce")) << st;
  EXPECT_EQ(fake.aborted, 1);
}

TEST_F(FakeNcclTest, APeerThatFailsIsUnavailable) {
  fake.stream_hangs = true;
  fake.fail_while_running = nccl::kRemoteError;
  absl::Status st = nccl_allreduce(fake_options("remote"), 0x1000, 10, ReduceOp::Add, Scalar::Float32);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_TRUE(contains(st.message(), "ncclRemoteError (fake NCCL says so)")) << st;
  EXPECT_EQ(fake.aborted, 1);
}

TEST_F(FakeNcclTest, AnInitThatFailsAtOnce) {
  fake.init_result = nccl::kInvalidUsage;
  absl::Status st = nccl_allreduce(fake_options("badinit"), 0x1000, 10, ReduceOp::Add, Scalar::Float32);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(contains(st.message(), "ncclCommInitRankConfig: ncclInvalidUsage")) << st;
  EXPECT_EQ(fake.aborted, 1);
}

TEST_F(FakeNcclTest, NcclIsUnavailableWithoutTheLibrary) {
  // Only where there really is no libnccl.so.2: then a real call says so.
  if (NcclLibrary::load().ok()) GTEST_SKIP() << "libnccl.so.2 is here";
  NcclOptions o = fake_options("nolib");
  o.library = nullptr;
  absl::Status st = nccl_allreduce(o, 0x1000, 10, ReduceOp::Add, Scalar::Float32);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_TRUE(contains(st.message(), "no NCCL: dlopen libnccl.so.2: ")) << st;
}

RendezvousServer& server() {
  static RendezvousServer* s = new RendezvousServer();
  return *s;
}

std::string unique_group(const std::string& what) {
  static int counter = 0;
  return cat("nccl-test-", getpid(), "-", ++counter, "-", what);
}

TEST_F(FakeNcclTest, RankZerosUniqueIdReachesEveryMember) {
  ASSERT_TRUE(server().ok());
  constexpr int n = 3;
  SharedMemory ids(sizeof(nccl::UniqueId) * n);
  const std::string group = unique_group("id");
  auto reports = run_members(n, [&](int rank) {
    NcclOptions o = fake_options(group, rank, n);
    o.rendezvous = server().address();
    absl::Status st = nccl_allreduce(o, 0x1000, 7, ReduceOp::Mul, Scalar::Int64);
    std::memcpy(ids.data() + rank * sizeof(nccl::UniqueId), &fake.id, sizeof fake.id);
    if (st.ok() && (fake.nranks != n || fake.rank != rank || fake.count != 7 || fake.type != nccl::kInt64 ||
                    fake.op != nccl::kProd || fake.destroyed != 1))
      return absl::InternalError(cat("NCCL saw ", fake.nranks, " ranks, rank ", fake.rank, ", ", fake.count, " elements"));
    return st;
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(reports[r].status().ok()) << "rank " << r << ": " << reports[r].status();
  const uint8_t* first = ids.data();
  EXPECT_EQ(first[sizeof(int)], 0x5a);  // made by the fake's ncclGetUniqueId
  for (int r = 1; r < n; ++r) EXPECT_EQ(std::memcmp(first, ids.data() + r * sizeof(nccl::UniqueId), sizeof(nccl::UniqueId)), 0) << r;
}

TEST_F(FakeNcclTest, AMemberThatNeverJoinsIsNamed) {
  ASSERT_TRUE(server().ok());
  const std::string group = unique_group("absent");
  auto reports = run_members(2, [&](int rank) -> absl::Status {
    if (rank == 1) return absl::OkStatus();  // never comes
    NcclOptions o = fake_options(group, rank, 3, milliseconds(600));
    o.rendezvous = server().address();
    return nccl_allreduce(o, 0x1000, 7, ReduceOp::Add, Scalar::Float32);
  });
  absl::Status st = reports[0].status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_TRUE(contains(st.message(), "ranks 1, 2 never joined (nothing at the rendezvous within 600 ms)")) << st;
}

TEST_F(FakeNcclTest, MembersThatDisagreeAllSaySo) {
  ASSERT_TRUE(server().ok());
  const std::string group = unique_group("disagree");
  auto reports = run_members(2, [&](int rank) {
    NcclOptions o = fake_options(group, rank, 2);
    o.rendezvous = server().address();
    return nccl_allreduce(o, 0x1000, rank == 0 ? 8 : 9, ReduceOp::Add, Scalar::Float32);
  });
  for (int r = 0; r < 2; ++r) {
    absl::Status st = reports[r].status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(contains(st.message(), "the members disagree: rank 0 reduces 8 float32 (add) elements, rank 1 reduces 9 float32 (add) elements"))
        << st;
  }
}

TEST_F(FakeNcclTest, APeerThatDiesMidwayIsNamedBySurvivors) {
  ASSERT_TRUE(server().ok());
  const std::string group = unique_group("dies");
  auto reports = run_members(3, [&](int rank) -> absl::Status {
    NcclOptions o = fake_options(group, rank, 3, milliseconds(1500));
    o.rendezvous = server().address();
    fake.stream_hangs = true;
    if (rank == 2) o.cancelled = [] { if (fake.running) _exit(0); return false; };  // dies once the kernels run
    else fake.fail_while_running = nccl::kRemoteError;
    return nccl_allreduce(o, 0x1000, 7, ReduceOp::Add, Scalar::Float32);
  });
  for (int r = 0; r < 2; ++r) {
    absl::Status st = reports[r].status();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_TRUE(contains(st.message(), "rank 2 (pid ")) << st;
    EXPECT_TRUE(contains(st.message(), "stopped answering")) << st;
  }
}

// ---- on GPUs ---------------------------------------------------------------------------

// How many GPUs, asked in a child (the parent never starts CUDA); or why none.
std::pair<int, std::string> gpus() {
  static std::pair<int, std::string> answer = [] {
    SharedMemory out(sizeof(int) + 512);
    auto reports = run_members(1, [&](int) -> absl::Status {
      auto d = CudaDriver::load();
      int n = d.ok() ? (*d)->device_count() : 0;
      std::memcpy(out.data(), &n, sizeof n);
      return d.status();
    });
    int n = 0;
    std::memcpy(&n, out.data(), sizeof n);
    return std::pair<int, std::string>(n, std::string(reports[0].status().message()));
  }();
  return answer;
}

// Why the GPU tests cannot run here, or "" when they can.
std::string gpu_skip_reason() {
  auto lib = NcclLibrary::load();
  if (!lib.ok()) return std::string(lib.status().message());
  auto [n, why] = gpus();
  if (n < 1) return why.empty() ? "no GPU" : why;
  return "";
}

// Float MAX / MIN: NCCL's handling of NaN and of -0 vs +0 is its own (nccl_allreduce.h).
bool nccl_agrees(Scalar t, ReduceOp op, uint64_t got, uint64_t want) {
  if (!scalar_is_float(t) || (op != ReduceOp::Max && op != ReduceOp::Min)) return false;
  double g = bits_to_value(got, t).as_float(), w = bits_to_value(want, t).as_float();
  return std::isnan(w) || std::isnan(g) || (g == 0 && w == 0);
}

// One member's sweep: every (dtype, op) NCCL has at `elements`, each a collective of its own.
absl::Status gpu_member(int rank, int n, const std::string& group, const std::string& rendezvous,
                        const std::vector<SweepCase>& cases) {
  auto driver = CudaDriver::load();
  if (!driver.ok()) return driver.status();
  auto ctx = CudaContext::retain(*driver, rank);
  if (!ctx.ok()) return ctx.status();
  if (absl::Status st = (*ctx)->bind(); !st.ok()) return st;
  const CudaDriver& drv = **driver;
  int index = 0;
  for (const SweepCase& c : cases) {
    const std::string what = cat(reduce_op_wire_name(c.op), " on ", c.elements, " ", scalar_name(c.dtype));
    const uint64_t bytes = c.elements * scalar_bytes(c.dtype);
    std::vector<uint8_t> buf(bytes + 1);
    fill_input(c.dtype, c.op, rank, c.elements, buf.data());
    cu::DevicePtr dev = 0;
    if (absl::Status st = UOP_CU(drv, cuMemAlloc, &dev, bytes + 256); !st.ok()) return st;
    absl::Status st = UOP_CU(drv, cuMemcpyHtoD, dev, buf.data(), bytes);
    CollectiveSpec s;
    s.group = cat(group, "-", index++);
    s.rank = rank;
    s.size = n;
    s.op = std::string(reduce_op_wire_name(c.op));
    s.dtype = std::string(scalar_name(c.dtype));
    s.elements = c.elements;
    s.transport = "nccl";
    s.rendezvous = rendezvous;
    s.timeout_ms = 20000;
    if (st.ok()) st = run_collective(s, DeviceBufferRef{*ctx, dev, bytes});
    if (st.ok()) st = UOP_CU(drv, cuMemcpyDtoH, buf.data(), dev, bytes);
    (void)drv.api().cuMemFree(dev);
    if (!st.ok()) return absl::Status(st.code(), cat(what, ": ", st.message()));
    std::vector<uint8_t> want = ring_reference(c.dtype, c.op, n, c.elements);
    // Where NCCL may answer otherwise (NaN, signed zeros under MAX / MIN), take its answer.
    const int esize = scalar_bytes(c.dtype);
    for (uint64_t i = 0; i < c.elements; ++i)
      if (nccl_agrees(c.dtype, c.op, load_bits(buf.data(), c.dtype, i), load_bits(want.data(), c.dtype, i)))
        std::memcpy(want.data() + i * esize, buf.data() + i * esize, esize);
    // Float ADD / MUL: NCCL adds in its own order, a few ulps from the ring's.
    int64_t bad = first_mismatch(c.dtype, c.op, n, buf.data(), want, c.elements, /*tolerant=*/true);
    if (bad >= 0)
      return absl::InternalError(cat(what, ": element ", bad, " is ",
                                     bits_to_value(load_bits(buf.data(), c.dtype, bad), c.dtype).str(), ", eval_alu says ",
                                     bits_to_value(load_bits(want.data(), c.dtype, bad), c.dtype).str()));
  }
  return absl::OkStatus();
}

std::vector<SweepCase> nccl_cases(const std::vector<uint64_t>& sizes) {
  std::vector<Scalar> types;
  for (Scalar t : {Scalar::Int8, Scalar::UInt8, Scalar::Int32, Scalar::UInt32, Scalar::Int64, Scalar::UInt64,
                   Scalar::Float16, Scalar::BFloat16, Scalar::Float32, Scalar::Float64})
    types.push_back(t);
  return sweep_cases(types, sizes);
}

TEST(NcclGpu, EveryDtypeAndOpAcrossTheGpus) {
  if (std::string why = gpu_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int n = gpus().first;
  std::string rendezvous;
  if (n > 1) {
    ASSERT_TRUE(server().ok());
    rendezvous = server().address();
  }
  const std::vector<SweepCase> cases = nccl_cases({4099});
  const std::string group = unique_group("gpu-sweep");
  auto reports = run_members(n, [&](int rank) { return gpu_member(rank, n, group, rendezvous, cases); }, {},
                             std::chrono::seconds(40));
  for (int r = 0; r < n; ++r) EXPECT_TRUE(reports[r].status().ok()) << "rank " << r << " of " << n << ": " << reports[r].status();
}

TEST(NcclGpu, SizesAcrossTheGpus) {
  if (std::string why = gpu_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int n = gpus().first;
  std::string rendezvous;
  if (n > 1) {
    ASSERT_TRUE(server().ok());
    rendezvous = server().address();
  }
  std::vector<SweepCase> cases = {{Scalar::Float32, ReduceOp::Add, 0},
                                  {Scalar::Float32, ReduceOp::Add, 1},
                                  {Scalar::Int32, ReduceOp::Add, (uint64_t{1} << 22) + 3},
                                  {Scalar::Float32, ReduceOp::Max, (uint64_t{1} << 22) + 3}};
  const std::string group = unique_group("gpu-sizes");
  auto reports = run_members(n, [&](int rank) { return gpu_member(rank, n, group, rendezvous, cases); }, {},
                             std::chrono::seconds(40));
  for (int r = 0; r < n; ++r) EXPECT_TRUE(reports[r].status().ok()) << "rank " << r << " of " << n << ": " << reports[r].status();
}

// The worker's path: a CUDA buffer with transport nccl is reduced in place (no host copy).
TEST(NcclGpu, WorkerRuntimeReducesACudaBufferInPlace) {
  if (std::string why = gpu_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int n = gpus().first;
  std::string rendezvous;
  if (n > 1) {
    ASSERT_TRUE(server().ok());
    rendezvous = server().address();
  }
  const std::string group = unique_group("gpu-worker");
  auto reports = run_members(n, [&](int rank) -> absl::Status {
    auto driver = CudaDriver::load();
    if (!driver.ok()) return driver.status();
    CudaDeviceOptions dopts;
    dopts.ordinal = rank;
    auto device = CudaDevice::open(*driver, dopts);
    if (!device.ok()) return device.status();
    WorkerRuntimeOptions wopts;
    wopts.device = cat("CUDA:", rank);
    WorkerRuntime rt(wopts, *std::move(device));
    const uint64_t elements = 1000;
    std::vector<int64_t> in(elements);
    for (uint64_t i = 0; i < elements; ++i) in[i] = static_cast<int64_t>(i) * (rank + 1);
    if (absl::Status st = rt.alloc_buffer(7, elements * 8); !st.ok()) return st;
    if (absl::Status st = rt.write_buffer(7, 0, {reinterpret_cast<const char*>(in.data()), elements * 8}); !st.ok()) return st;
    CollectiveSpec s;
    s.group = group;
    s.rank = rank;
    s.size = n;
    s.op = "add";
    s.dtype = "int64";
    s.elements = elements;
    s.transport = "nccl";
    s.rendezvous = rendezvous;
    s.timeout_ms = 20000;
    auto ms = rt.collective(s, 7);
    if (!ms.ok()) return ms.status();
    auto out = rt.read_buffer(7, 0, 0);
    if (!out.ok()) return out.status();
    const int64_t factor = static_cast<int64_t>(n) * (n + 1) / 2;
    for (uint64_t i = 0; i < elements; ++i) {
      int64_t got = 0;
      std::memcpy(&got, out->data + i * 8, 8);
      if (got != static_cast<int64_t>(i) * factor)
        return absl::InternalError(cat("element ", i, " is ", got, ", want ", static_cast<int64_t>(i) * factor));
    }
    return absl::OkStatus();
  }, {}, std::chrono::seconds(40));
  for (int r = 0; r < n; ++r) EXPECT_TRUE(reports[r].status().ok()) << "rank " << r << " of " << n << ": " << reports[r].status();
}

}  // namespace
}  // namespace uop
