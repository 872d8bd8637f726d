// The CUDA backend through the service, with real uopd, uop-worker and uop
// processes on 127.0.0.1. Everywhere NVRTC loads (no GPU needed): Compile with target
// cuda:sm_90 answers cubins (ELF for EM_CUDA, built for sm_90), a second Compile is a
// cache hit, another arch is another key, Explain lowers for the GPU and renders CUDA C,
// and `uop compile --target=cuda:sm_90 --binary-out=DIR` writes .cubin files. Without a
// GPU, a session or run on CUDA:0 is UNAVAILABLE naming CUDA:0. With one (skipped
// otherwise): uopd --cuda-workers=1 runs graphs on CUDA:0, compiled for the GPU's own
// arch, and matches the interpreter.
//
// The binaries come from the build (UOPD_BINARY, UOP_BINARY), or from the environment
// variables of the same names, and UOP_WORKER_BINARY (tests/gpu/run.sh runs this test
// from a carried folder).
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/e2e/softmax_model.h"

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/codegen/cuda.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"
#include "worker/cuda/cuda_device.h"
#include "worker/cuda/cuda_driver.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;

std::string binary(const char* env, const char* built) {
  const char* e = std::getenv(env);
  return e && *e ? e : built;
}
std::string uopd_binary() { return binary("UOPD_BINARY", UOPD_BINARY); }
std::string uop_binary() { return binary("UOP_BINARY", UOP_BINARY); }

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

std::string scratch(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() /
             cat("uopd-cuda-e2e-", tag, "-", ::getpid(), "-", std::rand());
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The GPUs this machine's driver sees; 0 without a driver.
int gpus() {
  auto d = CudaDriver::load();
  return d.ok() ? (*d)->device_count() : 0;
}

struct Uopd {
  std::unique_ptr<EmbeddedServer> proc;
  std::unique_ptr<Client> client;

  static Uopd start(std::vector<std::string> args) {
    Uopd u;
    args.push_back("--metrics-listen=");
    // A carried uop-worker (tests/gpu/run.sh) is not where uopd looks for its own.
    if (const char* w = std::getenv("UOP_WORKER_BINARY"); w && *w) args.push_back(cat("--worker-binary=", w));
    auto p = EmbeddedServer::start(uopd_binary(), args);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return u;
    u.proc = std::move(*p);
    ClientOptions o;
    o.address = u.proc->address();
    auto c = Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) u.client = std::move(*c);
    return u;
  }
};

using Model = testing::SoftmaxModel;

// A plain matmul, big enough to be tiled over many blocks.
struct Matmul {
  Graph g;
  const UOp* root = nullptr;
  Names names;
  absl::flat_hash_map<const UOp*, HostTensor> inputs;
  std::vector<client::Input> bindings;

  Matmul(int64_t n, int64_t k, int64_t m, uint64_t seed) {
    TensorBuilder tb(g);
    const UOp* a = tb.input(Scalar::Float32, {n, k});
    const UOp* b = tb.input(Scalar::Float32, {k, m});
    const UOp* c = tb.matmul(a, b);
    root = tb.sink({c});
    names = {{"a", tb.buffer_of(a)}, {"b", tb.buffer_of(b)}, {"c", c}};
    for (const UOp* buf : {tb.buffer_of(a), tb.buffer_of(b)}) {
      HostTensor t = HostTensor::random(Scalar::Float32, {buf->arg_as<BufferArg>().size}, seed++);
      inputs[buf] = t;
      bindings.push_back({buf == tb.buffer_of(a) ? std::string("a") : std::string("b"), t});
    }
  }
};

// ELF, 64-bit, e_machine EM_CUDA (190).
void expect_cubin(const std::string& bytes, int sm, const std::string& what) {
  ASSERT_GE(bytes.size(), 64u) << what;
  EXPECT_EQ(bytes.substr(0, 4), "\x7f" "ELF") << what;
  EXPECT_EQ(bytes[4], 2) << what << ": not ELFCLASS64";
  uint16_t machine = static_cast<uint8_t>(bytes[18]) | (static_cast<uint8_t>(bytes[19]) << 8);
  EXPECT_EQ(machine, 190) << what;
  auto info = inspect_cubin(bytes);
  ASSERT_TRUE(info.ok()) << what << ": " << info.status();
  EXPECT_EQ(info->sm, sm) << what;
  EXPECT_NE(std::find(info->kernels.begin(), info->kernels.end(), "uop_kernel"), info->kernels.end()) << what;
}

// Runs a command through the shell, with stdout and stderr together.
struct Ran {
  int status = -1;
  std::string out;
};
Ran shell(const std::string& cmd) {
  Ran r;
  FILE* p = popen(cat(cmd, " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

#define SKIP_WITHOUT_NVRTC()                                                        \
  do {                                                                              \
    if (absl::Status nv = nvrtc_status(); !nv.ok()) GTEST_SKIP() << "no NVRTC: " << nv; \
  } while (0)

TEST(CudaCompileE2e, CompileAnswersCubinsAndCachesThem) {
  SKIP_WITHOUT_NVRTC();
  Uopd u = Uopd::start({"--workers=1", "--cache-dir=" + scratch("compile")});
  ASSERT_TRUE(u.client);
  Model m(1);
  client::Target sm90{"cuda", "sm_90"};
  auto first = u.client->compile(m.root, m.names, sm90, /*include_binary=*/true, /*include_source=*/true);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_GE(first->kernels.size(), 2u);
  for (const client::Kernel& k : first->kernels) {
    EXPECT_EQ(k.status, client::CacheStatus::Miss) << k.name;
    expect_cubin(k.binary, 90, k.name);
    EXPECT_TRUE(contains(k.source, "extern \"C\" __global__")) << k.source;
    auto abi = parse_abi(k.abi);
    ASSERT_TRUE(abi.ok()) << abi.status();
    EXPECT_TRUE(abi->gpu.has_value()) << k.name << ": no launch dims in\n" << k.abi;
  }

  // The same graph again: every kernel from the memory cache, the same keys.
  auto second = u.client->compile(m.root, m.names, sm90, true);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->kernels.size(), first->kernels.size());
  EXPECT_TRUE(second->plan_cached);
  for (size_t i = 0; i < second->kernels.size(); ++i) {
    EXPECT_EQ(second->kernels[i].status, client::CacheStatus::Hit) << second->kernels[i].name;
    EXPECT_EQ(second->kernels[i].tier, "memory");
    EXPECT_EQ(second->kernels[i].cache_key, first->kernels[i].cache_key);
    EXPECT_EQ(second->kernels[i].binary, first->kernels[i].binary);
  }

  // No arch: the server's --cuda-arch (sm_90 by default), so the same entries.
  auto defaulted = u.client->compile(m.root, m.names, client::Target{"cuda", ""});
  ASSERT_TRUE(defaulted.ok()) << defaulted.status();
  for (size_t i = 0; i < defaulted->kernels.size(); ++i) {
    EXPECT_EQ(defaulted->kernels[i].cache_key, first->kernels[i].cache_key);
    EXPECT_EQ(defaulted->kernels[i].status, client::CacheStatus::Hit);
  }

  // Another arch and the CPU are other keys, compiled afresh.
  auto sm80 = u.client->compile(m.root, m.names, client::Target{"cuda", "sm_80"}, true);
  ASSERT_TRUE(sm80.ok()) << sm80.status();
  auto cpu = u.client->compile(m.root, m.names, client::Target{"cpu", ""});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  for (size_t i = 0; i < sm80->kernels.size(); ++i) {
    EXPECT_EQ(sm80->kernels[i].status, client::CacheStatus::Miss);
    EXPECT_NE(sm80->kernels[i].cache_key, first->kernels[i].cache_key);
    EXPECT_NE(cpu->kernels[i].cache_key, first->kernels[i].cache_key);
    expect_cubin(sm80->kernels[i].binary, 80, sm80->kernels[i].name);
  }

  // A bad arch is the client's error.
  auto bad = u.client->compile(m.root, m.names, client::Target{"cuda", "sm_1"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

TEST(CudaCompileE2e, CompileSurvivesARestartThroughTheDiskCache) {
  SKIP_WITHOUT_NVRTC();
  std::string dir = scratch("disk");
  Model m(3);
  std::vector<std::string> keys;
  {
    Uopd u = Uopd::start({"--workers=1", "--cache-dir=" + dir});
    ASSERT_TRUE(u.client);
    auto r = u.client->compile(m.root, m.names, client::Target{"cuda", "sm_90"});
    ASSERT_TRUE(r.ok()) << r.status();
    for (auto& k : r->kernels) keys.push_back(k.cache_key);
  }
  Uopd u = Uopd::start({"--workers=1", "--cache-dir=" + dir});
  ASSERT_TRUE(u.client);
  auto r = u.client->compile(m.root, m.names, client::Target{"cuda", "sm_90"}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->kernels.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(r->kernels[i].cache_key, keys[i]);
    EXPECT_EQ(r->kernels[i].status, client::CacheStatus::Hit);
    EXPECT_EQ(r->kernels[i].tier, "disk");
    expect_cubin(r->kernels[i].binary, 90, r->kernels[i].name);
  }
}

TEST(CudaCompileE2e, ExplainLowersForTheGpu) {
  Uopd u = Uopd::start({"--workers=1", "--cache-dir="});
  ASSERT_TRUE(u.client);
  Model m(5);
  auto stages = u.client->explain(m.root, m.names, "", client::Target{"cuda", "sm_90"});
  ASSERT_TRUE(stages.ok()) << stages.status();
  bool gpu_dims = false, render = false, compile = false;
  for (const client::ExplainStage& s : *stages) {
    if (s.name == "gpu_dims") gpu_dims |= contains(s.text, "SPECIAL");
    if (s.name == "render") {
      render = true;
      EXPECT_TRUE(contains(s.text, "__global__")) << s.text;
      EXPECT_TRUE(contains(s.text, "uop_kernel")) << s.text;
    }
    if (s.name == "compile") {
      compile = true;
      if (nvrtc_status().ok())
        EXPECT_TRUE(contains(s.text, "bytes of cubin for sm_90")) << s.text;
      else
        EXPECT_TRUE(contains(s.text, "no cubin")) << s.text;
    }
  }
  EXPECT_TRUE(gpu_dims && render && compile);
  auto only = u.client->explain(m.root, m.names, "render", client::Target{"cuda", ""});
  ASSERT_TRUE(only.ok()) << only.status();
  ASSERT_FALSE(only->empty());
  for (auto& s : *only) EXPECT_EQ(s.name, "render");
  auto bad = u.client->explain(m.root, m.names, "", client::Target{"cuda", "gfx90a"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

TEST(CudaCompileE2e, UopCompileWritesCubins) {
  SKIP_WITHOUT_NVRTC();
  Uopd u = Uopd::start({"--workers=1", "--cache-dir="});
  ASSERT_TRUE(u.client);
  Model m(7);
  std::string dir = scratch("cli");
  std::string graph = cat(dir, "/model.uopb");
  ASSERT_TRUE(write_graph_file(graph, m.root, m.names).ok());
  std::string out = cat(dir, "/bin");
  std::filesystem::create_directories(out);
  Ran r = shell(cat(uop_binary(), " compile --server=", u.proc->address(), " --target=cuda:sm_90 ", graph,
                    " --binary-out=", out));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "target cuda:sm_90")) << r.out;
  int cubins = 0;
  for (auto& e : std::filesystem::directory_iterator(out)) {
    EXPECT_EQ(e.path().extension(), ".cubin") << e.path();
    expect_cubin(slurp(e.path()), 90, e.path().string());
    ++cubins;
  }
  EXPECT_GE(cubins, 2);
  // A second time every kernel is a hit.
  Ran again = shell(cat(uop_binary(), " compile --server=", u.proc->address(), " --target=cuda:sm_90 ", graph));
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "hit (memory)")) << again.out;
  EXPECT_FALSE(contains(again.out, "miss")) << again.out;
}

TEST(CudaCompileE2e, WithoutAGpuCuda0IsUnavailable) {
  if (gpus() > 0) GTEST_SKIP() << "this machine has a GPU";
  Uopd u = Uopd::start({"--workers=1", "--cuda-workers=1", "--cache-dir="});
  ASSERT_TRUE(u.client);
  auto s = u.client->create_session({"CUDA:0"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_TRUE(contains(std::string(s.status().message()), "CUDA:0")) << s.status();
  // The CPU worker serves meanwhile.
  auto cpu = u.client->create_session();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  Model m(9);
  auto ran = cpu->run(m.root, m.names, m.bindings);
  ASSERT_TRUE(ran.ok()) << ran.status();
  // `uop run --device=CUDA:0` says so too, and fails.
  std::string dir = scratch("run");
  std::string graph = cat(dir, "/model.uopb");
  ASSERT_TRUE(write_graph_file(graph, m.root, m.names).ok());
  Ran r = shell(cat(uop_binary(), " run --server=", u.proc->address(), " --device=CUDA:0 --random 1 ", graph));
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "CUDA:0")) << r.out;
  EXPECT_TRUE(contains(r.out, "UNAVAILABLE") || contains(r.out, "unavailable")) << r.out;
  // No CUDA workers at all: the device is unknown, also UNAVAILABLE.
  Uopd none = Uopd::start({"--workers=1", "--cache-dir="});
  ASSERT_TRUE(none.client);
  auto s2 = none.client->create_session({"CUDA:0"});
  EXPECT_EQ(s2.status().code(), absl::StatusCode::kUnavailable) << s2.status();
  EXPECT_TRUE(contains(std::string(s2.status().message()), "CUDA:0")) << s2.status();
}

void expect_matches(const std::vector<HostTensor>& want, const client::RunResult& got) {
  ASSERT_EQ(want.size(), got.outputs.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CompareResult c = compare(want[i], got.outputs[i].tensor);
    EXPECT_TRUE(c.ok) << got.outputs[i].name << ": " << c.message;
  }
}

TEST(CudaRunE2e, RunsOnCuda0AndMatchesTheInterpreter) {
  if (gpus() == 0) GTEST_SKIP() << "no GPU: " << (CudaDriver::load().ok() ? "the driver sees none" : std::string(CudaDriver::load().status().message()));
  SKIP_WITHOUT_NVRTC();
  Uopd u = Uopd::start({"--workers=1", "--cuda-workers=1", "--cache-dir="});
  ASSERT_TRUE(u.client);
  auto stats = u.client->stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  bool up = false;
  for (auto& w : stats->workers) up |= w.device == "CUDA:0" && w.state == "up";
  ASSERT_TRUE(up) << "CUDA:0 is not up";
  auto session = u.client->create_session({"CUDA:0"});
  ASSERT_TRUE(session.ok()) << session.status();
  for (uint64_t seed : {11, 12}) {
    Model m(seed);
    auto got = session->run(m.root, m.names, m.bindings);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->device, "CUDA:0");
    expect_matches(m.expected(), *got);
    for (auto& k : got->kernels)
      EXPECT_EQ(k.status, seed == 11 ? client::CacheStatus::Miss : client::CacheStatus::Hit) << k.name;
  }
  // The run compiled for the GPU's own arch (the worker's Info): a Compile for that arch
  // hits the same entries.
  {
    auto drv = CudaDriver::load();
    ASSERT_TRUE(drv.ok()) << drv.status();
    auto dev = CudaDevice::open(*drv, {});
    ASSERT_TRUE(dev.ok()) << dev.status();
    const std::string arch = (*dev)->arch();
    Model m(11);
    auto got = session->run(m.root, m.names, m.bindings);
    ASSERT_TRUE(got.ok()) << got.status();
    auto c = u.client->compile(m.root, m.names, client::Target{"cuda", arch});
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_EQ(c->kernels.size(), got->kernels.size());
    for (size_t i = 0; i < c->kernels.size(); ++i) {
      EXPECT_EQ(c->kernels[i].cache_key, got->kernels[i].cache_key) << arch;
      EXPECT_EQ(c->kernels[i].status, client::CacheStatus::Hit) << arch;
    }
  }
  // A bigger matmul, tiled over many blocks, through uploaded buffers and kept outputs.
  Matmul mm(256, 192, 320, 21);
  std::vector<client::Input> via_buffers;
  for (auto& in : mm.bindings) {
    auto id = session->upload_tensor(std::get<HostTensor>(in.value));
    ASSERT_TRUE(id.ok()) << id.status();
    via_buffers.push_back({in.node, *id});
  }
  auto got = session->run(mm.root, mm.names, via_buffers, /*keep_outputs=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->outputs.size(), 1u);
  auto data = session->download_tensor(got->outputs[0]);
  ASSERT_TRUE(data.ok()) << data.status();
  auto want = interpret(mm.g, mm.root, mm.inputs);
  ASSERT_TRUE(want.ok()) << want.status();
  // The GPU sums each dot product of 192 terms in another order than the interpreter:
  // float32's bound for a reassociated sum, 2 (k - 1) u sum|a b|, with |a|, |b| <= 2
  // (HostTensor::random).
  Tolerance tol = Tolerance::for_dtype(Scalar::Float32);
  const double k = 192, unit = std::ldexp(1.0, -24);
  tol.atol = 2 * (k - 1) * unit * (4 * k);
  CompareResult c = compare((*want)[0], *data, tol);
  EXPECT_TRUE(c.ok) << c.message;
}

}  // namespace
}  // namespace uop
