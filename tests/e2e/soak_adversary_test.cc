// The soak with an adversary in it: one real uopd (a worker per tenant, a disk cache, a
// real Redis, tenants from a tokens file, its limits set low), three honest clients and
// one hostile one, all at once. Alice and Bob are tenants of their own; the third honest
// client shares its tenant, and so its worker process, with Mallory.
//
// Mallory goes over a fixed list of attacks, twice: kernels whose gates hold only through
// wrapping arithmetic, or not at all, to read and write far outside her buffers; reads,
// writes, frees and Runs on buffer and session ids she does not own (Alice's, leaked to
// her, and guessed ones), and reads and writes on the workers' own ports; sizes that do
// not add up (a byte size that wraps, offsets past a buffer's end, buffers and inline
// data smaller than the inputs they are bound to); at once, a request over the size
// limit, floods of nodes and of values inside one node and an output far over the inline
// limit; sessions until the server's limit; sessions closed under their own Runs; a
// compile bomb and a kernel that never ends, each with a short deadline. Before all
// that, as someone who can write the cache directory and reach Redis, she forges the
// entries of kernels the honest clients are about to need (the previous checksummed
// format around another kernel's code, a key of her own, a FIFO).
//
// What must hold: each attack gets the status it must (the bounds refusal, NOT_FOUND,
// UNAUTHENTICATED on a worker's port, the limit named; a large output left in the
// session; DEADLINE_EXCEEDED for the bombs); every honest operation succeeds, every
// result equals the reference interpreter's, the honest clients' buffers are what they
// uploaded, byte for byte, all along and at the end; each forged entry was a miss,
// counted, and replaced by the server's own; uopd is alive and healthy, its compile pool
// drained, no worker still burning a core, no session or buffer of anyone left behind and
// every worker's buffer budget whole again. Figures (each attack and the statuses it got,
// honest operations, peak memory, the honest latency while bombs ran) are printed, not
// asserted.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/codec.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"
#include "grpcpp/grpcpp.h"
#include "proto/uopd.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "server/cache/cache_entry.h"
#include "tests/e2e/forged_cache.h"
#include "tests/e2e/hostile_graphs.h"
#include "tests/e2e/proc_status.h"
#include "tests/e2e/raw_requests.h"
#include "tests/e2e/softmax_model.h"
#include "tests/unit/compiler/bomb_graphs.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

namespace pb = ::uopd::v1;
using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;
using testing::from_grpc;
using testing::SoftmaxModel;
using Clock = std::chrono::steady_clock;

constexpr int kRounds = 2;             // Mallory's passes over her attacks
constexpr int kMinHonestOps = 24;      // per honest client; then on until Mallory is done
constexpr int kMaxHonestOps = 2000;    // a bound on the loop, far above what it takes
constexpr int kUnavailableRetries = 5; // per honest operation
constexpr int kMaxSessions = 16;
constexpr int kCloseRaces = 4;          // per round
constexpr uint64_t kWorkerBufferBytes = 128 << 20;  // each worker's budget for buffers
constexpr uint64_t kSessionBytes = kWorkerBufferBytes / 4;  // uopd's default session quota

constexpr char kAlice[] = "alice-soak-token-0001";
constexpr char kBob[] = "bob-soak-token-0002";
constexpr char kMallory[] = "mallory-soak-token-0003";

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
bool contains(const absl::Status& s, std::string_view what) {
  return std::string_view(s.message().data(), s.message().size()).find(what) != std::string_view::npos;
}

// A model the honest clients run, with the interpreter's answer computed once.
struct Model {
  std::string name;
  SoftmaxModel m;
  std::vector<HostTensor> want;
  Model(std::string name, uint64_t seed, int64_t n, int64_t k, int64_t o)
      : name(std::move(name)), m(seed, n, k, o), want(m.expected()) {}
};

// The honest workload: models used from the start, and the victims, whose cache entries
// Mallory forges before anyone compiled them (so nobody uses them before she is done).
struct Workload {
  std::vector<std::unique_ptr<Model>> plain, victims;
  std::atomic<bool> forged{false};
  std::atomic<bool> adversary_done{false};
  Workload() {
    for (int v = 0; v < 4; ++v) plain.push_back(std::make_unique<Model>(cat("model ", v), 100 + v, 8 + 4 * v, 8 + 2 * v, 8));
    for (int v = 0; v < 3; ++v)
      victims.push_back(std::make_unique<Model>(cat("victim ", v), 200 + v, 40 + 4 * v, 12 + 2 * v, 4));
  }
};

bool same(const std::vector<HostTensor>& want, const std::vector<client::RunOutput>& got) {
  if (want.size() != got.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (!compare(want[i], got[i].tensor).ok) return false;
  return true;
}

// When the bombs ran, and each honest operation: for the latency while they did.
struct Timeline {
  std::mutex mu;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> bombs, honest;
  void bomb(Clock::time_point a, Clock::time_point b) {
    std::lock_guard<std::mutex> l(mu);
    bombs.emplace_back(a, b);
  }
  void op(Clock::time_point a, Clock::time_point b) {
    std::lock_guard<std::mutex> l(mu);
    honest.emplace_back(a, b);
  }
};

// One honest client: a session it keeps for the whole run, with two buffers it checks,
// and a loop of Compiles and Runs, each checked against the interpreter.
class Honest {
 public:
  Honest(std::string name, int id, std::string token, Workload* w, Timeline* t)
      : name_(std::move(name)), id_(id), token_(std::move(token)), w_(w), t_(t) {}

  // Before Mallory starts (the session counts toward --max-sessions).
  absl::Status setup(const std::string& address) {
    ClientOptions o;
    o.address = address;
    o.deadline = absl::Seconds(60);
    o.bearer_token = token_;
    auto c = Client::connect(o);
    if (!c.ok()) return c.status();
    client_ = std::move(*c);
    auto s = client_->create_session();
    if (!s.ok()) return s.status();
    session_.emplace(std::move(*s));
    HostTensor floats = HostTensor::random(Scalar::Float32, {4096}, 17 + id_);
    auto f = session_->upload_tensor(floats);
    if (!f.ok()) return f.status();
    kept_.push_back({*f, floats.data});
    std::string bytes(1 << 16, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + 7 * id_ + 1);
    auto b = session_->create_buffer(Scalar::UInt8, bytes.size());
    if (!b.ok()) return b.status();
    if (absl::Status u = session_->upload(*b, bytes); !u.ok()) return u;
    kept_.push_back({*b, bytes});
    return check_buffers();
  }

  void run() {
    std::vector<bool> victim_used(w_->victims.size(), false);
    auto all_victims_used = [&] { return std::all_of(victim_used.begin(), victim_used.end(), [](bool b) { return b; }); };
    for (int i = 0; i < kMaxHonestOps && (i < kMinHonestOps || !w_->adversary_done.load() || !all_victims_used()); ++i) {
      // Every other operation, once the victims are forged, uses one of them in turn.
      const bool victim = w_->forged.load() && i % 2 == 0;
      const size_t which = victim ? (i / 2 + id_) % w_->victims.size() : (i + id_) % w_->plain.size();
      Model& m = victim ? *w_->victims[which] : *w_->plain[which];
      const int kind = (i / 2 + id_) % 4;
      absl::Status s;
      for (int attempt = 0; attempt <= kUnavailableRetries; ++attempt) {
        Clock::time_point start = Clock::now();
        s = once(m, kind);
        if (s.ok()) t_->op(start, Clock::now());
        if (s.code() != absl::StatusCode::kUnavailable) break;
        ++retries;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // backoff, not a wait for anything
      }
      ++ops;
      if (!s.ok() && failures.size() < 20) failures.push_back(cat(name_, " op ", i, " (kind ", kind, "): ", s.ToString()));
      if (s.ok() && victim && kind != 3) victim_used[which] = true;
    }
    if (absl::Status s = check_buffers(); !s.ok()) failures.push_back(cat(name_, " at the end: ", s.ToString()));
  }

  // The buffers it uploaded, byte for byte.
  absl::Status check_buffers() {
    for (const auto& [id, bytes] : kept_) {
      auto back = session_->download(id);
      if (!back.ok()) return back.status();
      ++buffer_checks;
      if (*back != bytes) return absl::DataLossError(cat(name_, ": buffer ", id, " is not what was uploaded"));
    }
    return absl::OkStatus();
  }

  absl::Status close() {
    for (const auto& [id, bytes] : kept_)
      if (absl::Status s = session_->free_buffer(id); !s.ok()) return s;
    return session_->close();
  }

  const std::string& session_id() const { return session_->id(); }
  const std::string& buffer_id() const { return kept_[0].first; }
  Client& client() { return *client_; }

  uint64_t ops = 0, retries = 0, wrong = 0, buffer_checks = 0;
  std::vector<std::string> failures;

 private:
  absl::Status once(Model& m, int kind) {
    if (kind == 0) return client_->compile(m.m.root, m.m.names).status();
    if (kind == 3) return check_buffers();
    std::vector<client::Input> bindings;
    std::vector<std::string> temps;
    if (kind == 1) {
      bindings = m.m.bindings;
    } else {
      for (const client::Input& in : m.m.bindings) {
        auto id = session_->upload_tensor(std::get<HostTensor>(in.value));
        if (!id.ok()) return id.status();
        temps.push_back(*id);
        bindings.push_back({in.node, *id});
      }
    }
    auto r = session_->run(m.m.root, m.m.names, bindings, /*keep_outputs=*/kind == 2);
    if (!r.ok()) return r.status();
    std::vector<client::RunOutput> got = r->outputs;
    for (client::RunOutput& o : got) {
      if (!o.kept()) continue;
      auto t = session_->download_tensor(o);
      if (!t.ok()) return t.status();
      temps.push_back(o.buffer_id);
      o.tensor = *t;
    }
    for (const std::string& b : temps)
      if (absl::Status s = session_->free_buffer(b); !s.ok()) return s;
    if (!same(m.want, got)) {
      ++wrong;
      return absl::DataLossError(cat("a result of ", m.name, " differs from the interpreter's"));
    }
    return absl::OkStatus();
  }

  std::string name_;
  int id_;
  std::string token_;
  Workload* w_;
  Timeline* t_;
  std::unique_ptr<Client> client_;
  std::optional<client::Session> session_;
  std::vector<std::pair<std::string, std::string>> kept_;  // buffer id, its bytes
};

// A server stream read to its end: its status, or an error when any byte came back.
template <typename Chunk, typename Reader>
absl::Status nothing_read(Reader& reader, const std::string& what) {
  Chunk chunk;
  size_t bytes = 0;
  while (reader.Read(&chunk)) bytes += chunk.data().size();
  absl::Status s = from_grpc(reader.Finish());
  return bytes > 0 ? absl::InternalError(cat(bytes, " bytes came back from ", what)) : s;
}

// What each attack got, and those that got a status they must not.
struct Tally {
  std::mutex mu;  // the floods come at once
  std::map<std::string, std::map<std::string, int>> seen;  // attack -> status code -> count
  std::vector<std::string> wrong;

  void note(const std::string& attack, const absl::Status& s, bool expected) {
    std::lock_guard<std::mutex> l(mu);
    ++seen[attack][s.ok() ? "OK" : absl::StatusCodeToString(s.code())];
    if (!expected && wrong.size() < 40) wrong.push_back(cat(attack, ": ", s.ToString()));
  }
  void refused(const std::string& attack, const absl::Status& s, absl::StatusCode code, std::string_view naming) {
    note(attack, s, s.code() == code && contains(s, naming));
  }
  void not_yours(const std::string& attack, const absl::Status& s) {
    note(attack, s, s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kPermissionDenied);
  }
  int count(const std::string& attack) const {
    auto it = seen.find(attack);
    int n = 0;
    if (it != seen.end())
      for (auto& [code, k] : it->second) n += k;
    return n;
  }
};

// The kernels of the victims and of a donor, compiled by a scheduler of the test's own on
// a cache directory of its own: the cache keys (the same on every scheduler of this
// build and machine) and the artifacts, which a forger of the real cache would have.
struct Scouted {
  std::vector<std::vector<client::Kernel>> victims;
  std::vector<std::vector<uopd::v1::Artifact>> artifacts;
  uopd::v1::Artifact donor;
};

// A regular file holding an authenticated entry (the server's own) at `key`'s path.
bool authentic_at(const std::string& dir, const std::string& key) {
  const std::string path = testing::entry_path(dir, key);
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && testing::slurp(path).starts_with(cache_entry::kMagic);
}

// The artifact a scheduler stored for `key` in its disk tier at `dir`: that tier is
// written after the client has its answer, so this waits (bounded) for the entry.
uopd::v1::Artifact stored_artifact(const std::string& dir, const std::string& key) {
  EXPECT_TRUE(testing::wait_until([&] { return authentic_at(dir, key); })) << "no entry for " << key << " in " << dir;
  return testing::artifact_at(testing::entry_path(dir, key));
}

Scouted scout(const std::string& dir, Workload& w) {
  Scouted out;
  auto p = EmbeddedServer::start(UOPD_BINARY, {"--listen=127.0.0.1:0", "--cache-dir=" + dir, "--workers=1", "--metrics-listen="});
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return out;
  ClientOptions o;
  o.address = (*p)->address();
  auto c = Client::connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return out;
  for (auto& v : w.victims) {
    auto r = (*c)->compile(v->m.root, v->m.names);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return out;
    out.victims.push_back(r->kernels);
    out.artifacts.emplace_back();
    for (const auto& k : r->kernels) out.artifacts.back().push_back(stored_artifact(dir, k.cache_key));
  }
  SoftmaxModel donor(300, 32, 8, 6);
  auto d = (*c)->compile(donor.root, donor.names);
  EXPECT_TRUE(d.ok()) << d.status();
  if (d.ok() && !d->kernels.empty()) out.donor = stored_artifact(dir, d->kernels[0].cache_key);
  EXPECT_TRUE((*p)->stop().ok()) << (*p)->log_tail();
  return out;
}

// Mallory: her client and session, and her stub for calls the client library would not
// make (other sessions' ids, hand-made bytes, deadlines of 1 s).
class Mallory {
 public:
  Mallory(const std::string& address, Tally* tally, Timeline* t) : address_(address), tally_(tally), t_(t) {
    ClientOptions o;
    o.address = address;
    o.deadline = absl::Seconds(60);
    o.bearer_token = kMallory;
    auto c = Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) client_ = std::move(*c);
    stub_ = pb::Uopd::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  bool ready() {
    if (!client_) return false;
    auto s = client_->create_session();
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return false;
    session_.emplace(std::move(*s));
    return true;
  }

  // As someone who can write the cache directory and reach Redis: each victim's entries
  // forged before anyone compiled them, in a different way for each victim.
  void forge(const Scouted& s, const std::string& cache_dir, testing::RedisServer& redis) {
    const ClusterKey own = testing::cluster_key("mallory's own");
    for (size_t v = 0; v < s.victims.size(); ++v) {
      for (size_t i = 0; i < s.victims[v].size(); ++i) {
        const client::Kernel& k = s.victims[v][i];
        const std::string forged = testing::forged_entry(k, s.artifacts[v][i], s.donor);
        const std::string path = testing::entry_path(cache_dir, k.cache_key);
        std::error_code ec;
        std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
        if (v == 0) {
          testing::overwrite(path, forged);  // the old format: checksummed, not authenticated
          on_disk.push_back({k, forged});
        } else if (v == 1 && i == 0) {
          EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;  // a lookup that opened it would block
          on_disk.push_back({k, ""});
        } else if (v == 1) {
          uopd::v1::Artifact a = s.artifacts[v][i];
          a.set_object(s.donor.object());
          // The current format, under a key of her own.
          const std::string mine = cache_entry::encode(own, k.cache_key, a.SerializeAsString());
          testing::overwrite(path, mine);
          on_disk.push_back({k, mine});
        } else {
          EXPECT_EQ(redis.raw({"SET", "uopd:cache:v2:" + k.cache_key, forged}), "OK");
          in_redis.push_back(k);
        }
        ++forgeries;
      }
    }
  }

  void attack(int round, Honest& alice, int64_t uopd_pid) {
    out_of_bounds(round);
    foreign_ids(alice);
    malformed();
    worker_ports(uopd_pid);
    floods(round);
    close_while_running();
    bombs(round);
  }

  absl::Status close() { return session_->close(); }
  Client& client() { return *client_; }

  std::vector<std::pair<client::Kernel, std::string>> on_disk;  // forged files ("" for the FIFO)
  std::vector<client::Kernel> in_redis;
  int forgeries = 0;
  int closes_during_runs = 0;  // sessions closed while their Run held its reservation
  int close_races = 0;         // races made (a Run the probe kept from its quota is none)

 private:
  // Gathers through gates that hold for wild indices: refused naming the bounds proof,
  // before anything runs. The same gather under a sound gate runs, and matches the
  // interpreter (indices outside are gated off).
  void out_of_bounds(int round) {
    HostTensor near_min = testing::gather_indices({INT32_MIN, INT32_MIN + 1, INT32_MIN + 2, INT32_MIN + 3});
    HostTensor even = testing::gather_indices({2000000000, -2000000000, 1 << 30, 65536, 2});
    HostTensor wild = testing::gather_indices({1 << 30, -(1 << 30), INT32_MAX - 1, 123456789, -5, 16});
    auto open_gate = [](Graph& g, const UOp* v) { return testing::between(g, INT32_MIN, v, INT32_MAX); };
    struct Try {
      const char* what;
      bool write;
      const UOp* (*gate)(Graph&, const UOp*);
      const HostTensor* idx;
    };
    for (const Try& t : {Try{"oob read, gate idx + INT32_MIN", false, testing::wrapping_add_gate, &near_min},
                         Try{"oob write, gate idx + INT32_MIN", true, testing::wrapping_add_gate, &near_min},
                         Try{"oob read, gate idx * INT32_MIN", false, testing::wrapping_mul_gate, &even},
                         Try{"oob write, gate idx * INT32_MIN", true, testing::wrapping_mul_gate, &even},
                         Try{"oob read, wild indices", false, +open_gate, &wild},
                         Try{"oob write, wild indices", true, +open_gate, &wild}}) {
      testing::Gathered k(t.write, t.gate);
      auto r = session_->run(k.root, k.names, {{"out", HostTensor::random(Scalar::Float32, {testing::kGatherSize}, 40 + round)},
                                               {"data", HostTensor::random(Scalar::Float32, {testing::kGatherSize}, 3)},
                                               {"idx", *t.idx}});
      tally_->refused(t.what, r.status(), absl::StatusCode::kInvalidArgument, "bounds");
    }
    testing::Gathered sound(false, testing::sound_gate);
    HostTensor data = HostTensor::random(Scalar::Float32, {testing::kGatherSize}, 50 + round);
    auto got = session_->run(sound.root, sound.names,
                             {{"out", HostTensor::zeros(Scalar::Float32, {testing::kGatherSize})}, {"data", data}, {"idx", wild}});
    HostTensor want_out = HostTensor::zeros(Scalar::Float32, {testing::kGatherSize}), want_data = data, want_idx = wild;
    std::vector<HostTensor*> params{&want_out, &want_data, &want_idx};
    absl::Status ran = got.status();
    if (absl::Status want = interpret_kernel(sound.root, params, {}); ran.ok() && !want.ok()) ran = want;
    if (ran.ok() && (got->outputs.empty() || !compare(want_out, got->outputs[0].tensor).ok))
      ran = absl::DataLossError("the soundly gated gather differs from the interpreter's");
    tally_->note("wild indices under a sound gate (runs)", ran, ran.ok());
  }

  // A Run of `root` in her session (or `session`), whose one input `in` is the float32
  // scalar `x`.
  pb::RunRequest run_request(const UOp* root, const UOp* in, double x) { return run_request(session_->id(), root, in, x, false); }
  pb::RunRequest run_request(const std::string& session, const UOp* root, const UOp* in, double x, bool keep_outputs) {
    pb::RunRequest req;
    req.set_session_id(session);
    req.set_keep_outputs(keep_outputs);
    encode_proto(root, {{"in", in}}, req.mutable_graph());
    pb::Binding* b = req.add_inputs();
    b->set_name("in");
    b->mutable_tensor()->set_dtype(::uop::v1::DType::FLOAT32);
    b->mutable_tensor()->add_shape(1);
    b->mutable_tensor()->set_data(HostTensor::of(Scalar::Float32, {1}, {x}).data);
    return req;
  }

  std::unique_ptr<grpc::ClientContext> ctx(std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + deadline);
    c->AddMetadata("authorization", std::string("Bearer ") + kMallory);
    return c;
  }

  // Alice's ids (leaked to Mallory) and guessed ones: nothing read, written, freed or run.
  void foreign_ids(Honest& alice) {
    const std::string guessed_session = "0123456789abcdef0123456789abcdef";
    const std::string guessed_buffer = "fedcba9876543210fedcba9876543210";
    for (const std::string& id : {alice.buffer_id(), guessed_buffer}) {
      tally_->not_yours("download another's buffer id in her session", session_->download(id).status());
      tally_->not_yours("upload into another's buffer id in her session", session_->upload(id, std::string(256, 'M')));
      tally_->not_yours("free another's buffer id in her session", session_->free_buffer(id));
    }
    for (const std::string& sid : {alice.session_id(), guessed_session}) {
      {
        pb::DownloadRequest req;
        req.set_session_id(sid);
        req.set_buffer_id(alice.buffer_id());
        auto c = ctx();
        auto reader = stub_->Download(c.get(), req);
        tally_->not_yours("download from another's session", nothing_read<pb::DownloadChunk>(*reader, "another's session"));
      }
      {
        pb::UploadChunk chunk;
        chunk.set_session_id(sid);
        chunk.set_buffer_id(alice.buffer_id());
        chunk.set_data(std::string(4096, '\0'));  // would zero Alice's data
        pb::UploadResponse resp;
        auto c = ctx();
        auto w = stub_->Upload(c.get(), &resp);
        w->Write(chunk);
        w->WritesDone();
        tally_->not_yours("upload into another's session", from_grpc(w->Finish()));
      }
      {
        pb::FreeBufferRequest req;
        req.set_session_id(sid);
        req.set_buffer_id(alice.buffer_id());
        pb::FreeBufferResponse resp;
        tally_->not_yours("free in another's session", from_grpc(stub_->FreeBuffer(ctx().get(), req, &resp)));
      }
      {
        SoftmaxModel m(7);
        pb::RunRequest req;
        req.set_session_id(sid);
        encode_proto(m.root, m.names, req.mutable_graph());
        pb::RunResponse resp;
        tally_->not_yours("run in another's session", from_grpc(stub_->Run(ctx().get(), req, &resp)));
      }
      {
        pb::CloseSessionRequest req;
        req.set_session_id(sid);
        pb::CloseSessionResponse resp;
        tally_->not_yours("close another's session", from_grpc(stub_->CloseSession(ctx().get(), req, &resp)));
      }
    }
  }

  // Sizes that do not add up, where a server that trusted them would read or write past a
  // buffer: a buffer whose byte size wraps, writes and reads past a buffer's end (offsets
  // that wrap too), a Run binding a buffer smaller than its input (tensor level, and at
  // kernel level where the bounds proof counts on the PARAM's size), inline data shorter
  // than its shape, a shape whose element count wraps. Each refused naming the sizes.
  void malformed() {
    // Refused (INVALID_ARGUMENT, OUT_OF_RANGE), naming what does not fit.
    auto not_ok = [&](const std::string& what, const absl::Status& s, std::string_view naming) {
      tally_->note(what, s, (s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kOutOfRange) &&
                                contains(s, naming));
    };
    {
      pb::CreateBufferRequest req;
      req.set_session_id(session_->id());
      req.set_dtype(::uop::v1::DType::FLOAT32);
      req.set_elements((uint64_t{1} << 62) + 1);  // 4 bytes, once times 4 wraps
      pb::CreateBufferResponse resp;
      not_ok("a buffer whose byte size wraps", from_grpc(stub_->CreateBuffer(ctx().get(), req, &resp)), "too large");
      if (!resp.buffer_id().empty()) (void)session_->free_buffer(resp.buffer_id());
    }
    auto small = session_->create_buffer(Scalar::Float32, 4);
    if (!small.ok()) {
      tally_->note("a small buffer of her own", small.status(), false);
      return;
    }
    not_ok("upload past a buffer's end", session_->upload(*small, std::string(4096, 'M')), "does not fit");
    not_ok("upload at an offset that wraps", session_->upload(*small, std::string(16, 'M'), UINT64_MAX - 7), "overflows");
    not_ok("download at an offset that wraps", session_->download(*small, UINT64_MAX - 7, 16).status(), "past the end");
    auto run = [&](const std::string& what, const UOp* root, const Names& names, std::vector<pb::Binding> bindings) {
      pb::RunRequest req;
      req.set_session_id(session_->id());
      encode_proto(root, names, req.mutable_graph());
      for (pb::Binding& b : bindings) *req.add_inputs() = std::move(b);
      pb::RunResponse resp;
      not_ok(what, from_grpc(stub_->Run(ctx().get(), req, &resp)), "the graph wants");
    };
    auto by_id = [](const std::string& name, const std::string& id) {
      pb::Binding b;
      b.set_name(name);
      b.set_buffer_id(id);
      return b;
    };
    auto inline_f32 = [](const std::string& name, std::vector<int64_t> shape, std::string data) {
      pb::Binding b;
      b.set_name(name);
      b.mutable_tensor()->set_dtype(::uop::v1::DType::FLOAT32);
      for (int64_t d : shape) b.mutable_tensor()->add_shape(d);
      b.mutable_tensor()->set_data(std::move(data));
      return b;
    };
    SoftmaxModel m(9);  // x: 24 x 16 floats
    std::vector<pb::Binding> rest;
    for (const client::Input& in : m.bindings) {
      const std::string& name = std::get<std::string>(in.node);
      if (name == "x") continue;
      const HostTensor& t = std::get<HostTensor>(in.value);
      rest.push_back(inline_f32(name, t.shape, t.data));
    }
    auto with = [&](pb::Binding x) {
      std::vector<pb::Binding> all = rest;
      all.push_back(std::move(x));
      return all;
    };
    run("a Run binding a buffer smaller than its input", m.root, m.names, with(by_id("x", *small)));
    run("inline data shorter than its shape", m.root, m.names, with(inline_f32("x", {24, 16}, std::string(16, '\0'))));
    run("an inline shape whose element count wraps", m.root, m.names,
        with(inline_f32("x", {int64_t{1} << 32, int64_t{1} << 32}, std::string(16, '\0'))));
    testing::Gathered k(false, testing::sound_gate);  // reads data[idx] for idx < 16
    HostTensor idx = testing::gather_indices({15, 14, 13, 12});
    pb::Binding out = inline_f32("out", {testing::kGatherSize}, HostTensor::zeros(Scalar::Float32, {testing::kGatherSize}).data);
    pb::Binding index;
    index.set_name("idx");
    index.mutable_tensor()->set_dtype(::uop::v1::DType::INT32);
    index.mutable_tensor()->add_shape(testing::kGatherSize);
    index.mutable_tensor()->set_data(idx.data);
    run("a kernel's PARAM bound to a smaller buffer", k.root, k.names, {out, by_id("data", *small), index});
    (void)session_->free_buffer(*small);
  }

  // The workers' own ports, found as any local user could (uopd's children's listening
  // sockets), called directly with ids a counter would have handed out and a guess at the
  // rest: refused before anything is read or written, for want of the scheduler's secret.
  void worker_ports(int64_t uopd_pid) {
    namespace wv1 = ::uopd::worker::v1;
    for (int64_t pid : testing::child_pids(uopd_pid))
      for (int port : testing::listening_ports(pid)) {
        auto stub = wv1::Worker::NewStub(
            grpc::CreateChannel(cat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
        for (uint64_t id : {uint64_t{1}, uint64_t{2}, uint64_t{0x8000000000000000}}) {
          wv1::ReadBufferRequest rr;
          rr.set_buffer_id(id);
          auto c = ctx();
          auto reader = stub->ReadBuffer(c.get(), rr);
          absl::Status s = nothing_read<wv1::ReadChunk>(*reader, cat("a worker's buffer ", id));
          tally_->note("ReadBuffer on a worker's port", s, s.code() == absl::StatusCode::kUnauthenticated);
          wv1::WriteChunk junk;
          junk.set_buffer_id(id);
          junk.set_data(std::string(4096, 'M'));
          wv1::WriteBufferResponse wr;
          auto wc = ctx();
          auto writer = stub->WriteBuffer(wc.get(), &wr);
          writer->Write(junk);
          writer->WritesDone();
          absl::Status w = from_grpc(writer->Finish());
          tally_->note("WriteBuffer on a worker's port", w, w.code() == absl::StatusCode::kUnauthenticated);
        }
      }
  }

  // The floods, all at once: one request over --max-request-bytes (refused by gRPC before
  // uopd sees it), floods of nodes and of values inside a node (counted before they are
  // parsed), an output far over the inline limit; then sessions up to the server's limit.
  void floods(int round) {
    std::vector<std::thread> burst;
    burst.emplace_back([&] {
      std::string big;
      testing::put_field(big, 1, std::string((17 << 20) + round, 'M'));
      tally_->refused("request over --max-request-bytes", testing::raw_unary(address_, "/uopd.v1.Uopd/Run", big, kMallory),
                      absl::StatusCode::kResourceExhausted, "");
    });
    // 4M empty nodes (8 MB on the wire, under the size limit; ~50 times that once parsed).
    burst.emplace_back([&] {
      std::string graph = "\x08\x01";
      graph += testing::empty_fields(2, 4'000'000);
      std::string req;
      testing::put_field(req, 1, session_->id());
      testing::put_field(req, 2, graph);
      tally_->refused("node flood", testing::raw_unary(address_, "/uopd.v1.Uopd/Run", req, kMallory),
                      absl::StatusCode::kInvalidArgument, "max_nodes");
    });
    // 4M empty VCONST values in one node: over what one request may hold once parsed.
    burst.emplace_back([&] {
      std::string node = "\x08\x1a";  // op: VCONST
      testing::put_field(node, 11, testing::empty_fields(1, 4'000'000));
      std::string graph = "\x08\x01";
      testing::put_field(graph, 2, node);
      std::string req;
      testing::put_field(req, 1, graph);
      tally_->refused("value flood inside a node", testing::raw_unary(address_, "/uopd.v1.Uopd/Compile", req, kMallory),
                      absl::StatusCode::kResourceExhausted, "--max-request-memory");
    });
    // A 16 MiB output, 16 times --max-inline-output-bytes: left in the session, not inline.
    burst.emplace_back([&] {
      testing::BigOutput big(22);
      pb::RunRequest req = run_request(big.root, big.x, 1.5);
      pb::RunResponse resp;
      absl::Status s = from_grpc(stub_->Run(ctx().get(), req, &resp));
      if (s.ok() && (resp.outputs_size() != 1 || resp.outputs(0).value_case() != pb::Output::kBufferId))
        s = absl::InternalError("a 16 MiB output came back inline");
      if (s.ok()) {
        auto tail = session_->download(resp.outputs(0).buffer_id(), (16 << 20) - 4096, 4096);
        std::vector<float> threes(1024, 3.0f);
        if (!tail.ok()) s = tail.status();
        else if (tail->size() != 4096 || std::memcmp(tail->data(), threes.data(), 4096) != 0)
          s = absl::DataLossError("the kept output's last 4 KiB are not x + x");
        if (absl::Status f = session_->free_buffer(resp.outputs(0).buffer_id()); s.ok()) s = f;
      }
      tally_->note("output over --max-inline-output-bytes (kept in the session)", s, s.ok());
    });
    for (std::thread& t : burst) t.join();

    std::vector<client::Session> flood;
    absl::Status last;
    for (int i = 0; i <= kMaxSessions; ++i) {
      auto s = client_->create_session();
      if (!s.ok()) {
        last = s.status();
        break;
      }
      flood.push_back(std::move(*s));
    }
    tally_->refused("sessions over --max-sessions", last, absl::StatusCode::kResourceExhausted, "--max-sessions");
    for (client::Session& s : flood)
      if (absl::Status c = s.close(); !c.ok()) tally_->note("closing a flood session", c, false);
  }

  // A session closed while a Run in it is under way, its 16 MiB output to be kept there:
  // whichever comes first, the Run ends with a clear status and nothing of the session is
  // left on the worker (its buffer budget is small enough that leaks would soon refuse
  // the honest colleague's uploads, and the end of the test asks for all of it).
  void close_while_running() {
    Graph g;
    TensorBuilder tb(g);
    const UOp* in = tb.input(Scalar::Float32, {1});
    const UOp* wide = tb.expand(tb.reshape(in, {1, 1}), {int64_t{1} << 22, 64});
    const UOp* root = tb.sink({tb.reduce(wide, ReduceOp::Add, {1})});  // 2^28 additions, 16 MiB out
    // A Run the test's own probe kept from its reservation (RESOURCE_EXHAUSTED naming the
    // session's quota) is no race: it is made again, a bounded number of times.
    int made = 0;
    for (int attempt = 0; made < kCloseRaces && attempt < 8 * kCloseRaces; ++attempt) {
      auto s = client_->create_session();
      if (!s.ok()) {
        tally_->note("a session to close under a Run", s.status(), false);
        continue;
      }
      pb::RunRequest req = run_request(s->id(), root, tb.buffer_of(in), 0.5, /*keep_outputs=*/true);
      absl::Status ran;
      std::atomic<bool> done{false};
      std::thread run([&] {
        pb::RunResponse resp;
        ran = from_grpc(stub_->Run(ctx().get(), req, &resp));
        done = true;
      });
      // The close comes once the Run holds its reservation (until it answers): a buffer
      // that fits the session's quota beside the Run's 16 MiB, and not with them, is
      // refused. One that fits is freed again.
      bool during = false;
      testing::wait_until([&] {
        auto probe = s->create_buffer(Scalar::UInt8, kSessionBytes - (12 << 20));
        if (probe.ok()) (void)s->free_buffer(*probe);
        during = probe.status().code() == absl::StatusCode::kResourceExhausted;
        return during || done.load();
      });
      absl::Status closed = s->close();
      run.join();
      if (ran.code() == absl::StatusCode::kResourceExhausted && contains(ran, "--session-bytes")) continue;
      ++made;
      ++close_races;
      closes_during_runs += during;
      tally_->note("Run racing its session's close", ran, ran.ok() || ran.code() == absl::StatusCode::kNotFound);
      tally_->note("close racing a Run in the session", closed, closed.ok());
    }
  }

  // A compile bomb and an endless kernel, each with a 1 s deadline: DEADLINE_EXCEEDED; the
  // compile pool drops the bomb's queued kernels, the worker stops the kernel.
  void bombs(int round) {
    Graph g;
    TensorBuilder tb(g);
    pb::CompileRequest compile;
    encode_proto(testing::sums_of_leaves(tb, 48, 600, 1000.0 * (round + 1)), {}, compile.mutable_graph());
    pb::CompileResponse compiled;
    bomb("compile bomb, 1 s deadline", [&](grpc::ClientContext* c) { return stub_->Compile(c, compile, &compiled); });
    testing::EndlessKernel k;
    pb::RunRequest run = run_request(k.root, k.in, 1.0);
    pb::RunResponse ran;
    bomb("endless kernel, 1 s deadline", [&](grpc::ClientContext* c) { return stub_->Run(c, run, &ran); });
  }

  // `call` with a 1 s deadline, its time kept for the honest latency while bombs ran.
  void bomb(const std::string& what, const std::function<grpc::Status(grpc::ClientContext*)>& call) {
    Clock::time_point a = Clock::now();
    absl::Status s = from_grpc(call(ctx(std::chrono::seconds(1)).get()));
    t_->bomb(a, Clock::now());
    tally_->note(what, s, s.code() == absl::StatusCode::kDeadlineExceeded);
  }

  std::string address_;
  Tally* tally_;
  Timeline* t_;
  std::unique_ptr<Client> client_;
  std::optional<client::Session> session_;
  std::unique_ptr<pb::Uopd::Stub> stub_;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

TEST(Soak, AnAdversaryInTheLoadGetsNothingAndHonestClientsLoseNothing) {
  if (!testing::RedisServer::installed()) GTEST_SKIP() << "redis-server is not installed";
  testing::ScratchDir scratch;
  const std::string cache_dir = scratch.path() + "/cache";
  Workload work;
  for (auto* set : {&work.plain, &work.victims})
    for (auto& m : *set) ASSERT_FALSE(m->want.empty());
  Scouted scouted = scout(scratch.path() + "/scout", work);
  ASSERT_EQ(scouted.victims.size(), work.victims.size());
  ASSERT_FALSE(scouted.donor.object().empty());

  testing::RedisServer redis;
  ASSERT_TRUE(redis.start());
  const std::string tokens = scratch.path() + "/tokens";
  std::ofstream(tokens) << "alice " << kAlice << "\nbob " << kBob << "\nmallory " << kMallory << "\n";
  auto started = EmbeddedServer::start(
      UOPD_BINARY,
      {"--listen=127.0.0.1:0", "--metrics-listen=", "--cache-dir=" + cache_dir, "--workers=1", "--worker-threads=1",
       "--compile-threads=2", "--redis=127.0.0.1:" + std::to_string(redis.port()),
       "--cache-key-file=" + testing::write_cache_key_file(scratch.path() + "/cache.key"), "--tokens-file=" + tokens,
       "--max-request-bytes=16777216", "--max-nodes=200000", "--max-request-memory=67108864",
       "--max-inline-output-bytes=1048576", "--max-sessions=" + std::to_string(kMaxSessions),
       "--worker-max-buffer-bytes=" + std::to_string(kWorkerBufferBytes)});
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<EmbeddedServer> server = std::move(*started);
  const std::string address = server->address();

  Timeline timeline;
  Tally tally;
  std::vector<std::unique_ptr<Honest>> honest;
  honest.push_back(std::make_unique<Honest>("alice", 0, kAlice, &work, &timeline));
  honest.push_back(std::make_unique<Honest>("bob", 1, kBob, &work, &timeline));
  honest.push_back(std::make_unique<Honest>("mallory's honest colleague", 2, kMallory, &work, &timeline));
  for (auto& h : honest) ASSERT_TRUE(h->setup(address).ok());
  Mallory mallory(address, &tally, &timeline);
  ASSERT_TRUE(mallory.ready());

  Clock::time_point t0 = Clock::now();
  std::vector<std::thread> threads;
  for (auto& h : honest) threads.emplace_back([&h] { h->run(); });
  std::thread adversary([&] {
    mallory.forge(scouted, cache_dir, redis);
    work.forged = true;
    for (int round = 0; round < kRounds; ++round) mallory.attack(round, *honest[0], server->pid());
    work.adversary_done = true;
  });
  adversary.join();
  for (auto& t : threads) t.join();
  Clock::time_point t_end = Clock::now();

  // uopd is alive and healthy.
  ASSERT_EQ(::kill(server->pid(), 0), 0) << "uopd died\n" << server->log_tail();
  EXPECT_TRUE(testing::raw_unary(address, "/grpc.health.v1.Health/Check", "").ok());
  auto stats = honest[0]->client().stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  // The bombs left nothing queued or running, and no worker still runs the endless kernel.
  ASSERT_TRUE(testing::wait_until([&] {
    auto s = mallory.client().stats();
    return s.ok() && s->compile_queue_depth == 0 && s->compile_tasks_running == 0 && s->compiles_in_progress == 0;
  }, absl::Seconds(120))) << "the compile pool did not drain";
  const std::vector<int64_t> workers = testing::child_pids(server->pid());
  EXPECT_FALSE(workers.empty());
  for (int64_t pid : workers) EXPECT_TRUE(testing::stops_burning(pid)) << "worker " << pid << " keeps burning a core";

  // Each forged entry was a miss, counted, and replaced by the server's own.
  for (const auto& [k, forged] : mallory.on_disk) {
    const std::string path = testing::entry_path(cache_dir, k.cache_key);
    uopd::v1::Artifact a = stored_artifact(cache_dir, k.cache_key);
    EXPECT_NE(testing::slurp(path), forged) << path;
    EXPECT_EQ(a.kernel_digest(), k.digest) << path;
    EXPECT_NE(a.object(), scouted.donor.object()) << path;
  }
  for (const auto& k : mallory.in_redis) {
    const std::string redis_key = "uopd:cache:v2:" + k.cache_key;
    EXPECT_TRUE(testing::wait_until([&] { return redis.raw({"GET", redis_key}).starts_with(cache_entry::kMagic); }))
        << k.cache_key << " in Redis is not the server's own entry";
  }
  auto cache = mallory.client().stats();
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_GE(cache->cache_errors, static_cast<uint64_t>(mallory.forgeries)) << "each forged entry is a cache error";

  // Nothing of anyone's is left behind once they close.
  for (auto& h : honest) EXPECT_TRUE(h->close().ok()) << "closing an honest session";
  EXPECT_TRUE(mallory.close().ok());
  // And each tenant's worker has its whole buffer budget back (nearly all of it fits in
  // four sessions' quotas): nothing a closed session or a Run held was left allocated.
  for (const char* token : {kAlice, kBob, kMallory}) {
    ClientOptions o;
    o.address = address;
    o.bearer_token = token;
    auto c = Client::connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    auto s = (*c)->stats();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->sessions, 0u) << token;
    EXPECT_EQ(s->buffers, 0u) << token;
    std::vector<client::Session> quarters;
    for (int i = 0; i < 4; ++i) {
      auto q = (*c)->create_session();
      ASSERT_TRUE(q.ok()) << q.status();
      auto b = q->create_buffer(Scalar::UInt8, kSessionBytes - (2 << 20));
      EXPECT_TRUE(b.ok()) << token << ": " << b.status();
      quarters.push_back(std::move(*q));
    }
    for (client::Session& q : quarters) EXPECT_TRUE(q.close().ok());
  }
  auto [rss_kib, hwm_kib] = testing::memory_kib(server->pid());

  // Figures.
  std::vector<double> during, all;
  for (const auto& [a, b] : timeline.honest) {
    all.push_back(ms(b - a));
    for (const auto& [ba, bb] : timeline.bombs)
      if (a < bb && b > ba) {
        during.push_back(ms(b - a));
        break;
      }
  }
  uint64_t ops = 0, retries = 0, checks = 0;
  for (auto& h : honest) {
    ops += h->ops;
    retries += h->retries;
    checks += h->buffer_checks;
  }
  std::fprintf(stderr, "\nadversarial soak figures (wall %.1f s):\n", ms(t_end - t0) / 1000);
  std::fprintf(stderr, "  honest: %zu clients, %llu operations, %llu retries (UNAVAILABLE), %llu buffer checks\n", honest.size(),
               static_cast<unsigned long long>(ops), static_cast<unsigned long long>(retries),
               static_cast<unsigned long long>(checks));
  std::fprintf(stderr, "  honest latency: p50 %.1f ms, p99 %.1f ms (n=%zu); while bombs ran: p50 %.1f ms, p99 %.1f ms (n=%zu)\n",
               percentile(all, 0.5), percentile(all, 0.99), all.size(), percentile(during, 0.5), percentile(during, 0.99),
               during.size());
  std::fprintf(stderr, "  uopd memory: peak VmHWM %.1f MiB, VmRSS %.1f MiB at the end; %zu worker processes\n", hwm_kib / 1024.0,
               rss_kib / 1024.0, workers.size());
  std::fprintf(stderr, "  forged cache entries: %d; cache errors counted: %llu\n", mallory.forgeries,
               static_cast<unsigned long long>(cache->cache_errors));
  std::fprintf(stderr, "  sessions closed under a Run: %d of %d while it held its reservation\n", mallory.closes_during_runs,
               mallory.close_races);
  for (const auto& [attack, codes] : tally.seen) {
    std::string line;
    for (const auto& [code, n] : codes) line += cat(" ", code, " x", n);
    std::fprintf(stderr, "  attack %-62s%s\n", attack.c_str(), line.c_str());
  }

  // What must hold.
  for (auto& h : honest) {
    EXPECT_TRUE(h->failures.empty()) << h->failures.size() << " honest failures, first: " << h->failures[0];
    EXPECT_EQ(h->wrong, 0u);
    EXPECT_GE(h->ops, static_cast<uint64_t>(kMinHonestOps));
  }
  EXPECT_TRUE(tally.wrong.empty()) << tally.wrong.size() << " attacks got a status they must not, first: "
                                   << (tally.wrong.empty() ? "" : tally.wrong[0]);
  // Every attack was made, as many times as the rounds say (twice a round: one for a
  // leaked id, one for a guessed one).
  for (const auto& [attack, per_round] : std::vector<std::pair<std::string, int>>{
           {"oob read, gate idx + INT32_MIN", 1}, {"oob write, gate idx * INT32_MIN", 1}, {"oob write, wild indices", 1},
           {"wild indices under a sound gate (runs)", 1}, {"download another's buffer id in her session", 2},
           {"download from another's session", 2}, {"upload into another's session", 2}, {"run in another's session", 2},
           {"request over --max-request-bytes", 1}, {"node flood", 1}, {"value flood inside a node", 1},
           {"sessions over --max-sessions", 1}, {"output over --max-inline-output-bytes (kept in the session)", 1},
           {"compile bomb, 1 s deadline", 1}, {"endless kernel, 1 s deadline", 1},
           {"a buffer whose byte size wraps", 1}, {"upload at an offset that wraps", 1},
           {"a Run binding a buffer smaller than its input", 1}, {"a kernel's PARAM bound to a smaller buffer", 1},
           {"an inline shape whose element count wraps", 1}})
    EXPECT_EQ(tally.count(attack), per_round * kRounds) << attack;
  // A race whose Run the probe kept from its reservation is made again, a bounded number of
  // times: on a loaded machine some rounds make fewer than kCloseRaces, never none.
  EXPECT_GE(mallory.close_races, kRounds) << "no session was closed under its Run";
  EXPECT_EQ(tally.count("Run racing its session's close"), mallory.close_races);
  EXPECT_EQ(tally.count("close racing a Run in the session"), mallory.close_races);
  // Three ids on each port of each worker (the tenants' and the default one).
  EXPECT_GE(tally.count("ReadBuffer on a worker's port"), 3 * 4 * kRounds);
  EXPECT_EQ(tally.count("WriteBuffer on a worker's port"), tally.count("ReadBuffer on a worker's port"));
  EXPECT_EQ(mallory.forgeries, static_cast<int>(mallory.on_disk.size() + mallory.in_redis.size()));
  EXPECT_LT(hwm_kib, uint64_t{1} << 20) << "uopd stays under 1 GiB";
  EXPECT_TRUE(server->stop().ok()) << server->log_tail();
}

}  // namespace
}  // namespace uop
