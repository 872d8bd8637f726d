// The internal services are internal, against real uopd and uop-worker processes on
// 127.0.0.1 with ephemeral ports: the Registry and the Rendezvous are on a listener of
// their own, never on the client port, and take no call without the cluster secret; a
// worker that does not have it cannot register, not even for a device whose worker just
// died, and the real worker started again gets its device back; a worker's port answers
// no caller but its scheduler; tenants' Stats name no worker addresses; reflection on the
// client port lists the client services only; and remote workers with no credential
// stop uopd (or the worker) at start.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/support/strings.h"
#include "proto/worker.grpc.pb.h"
#include "tests/e2e/scheduler_proc.h"
#include "tests/e2e/softmax_model.h"
#include "tests/e2e/worker_proc.h"
#include "transport/cluster_auth.h"

namespace uop {
namespace {

namespace wv1 = uopd::worker::v1;
using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;
using testing::ClusterSecret;
using testing::wait_until;
using Proc = testing::WorkerProc;

constexpr const char* kUopd = UOPD_BINARY;
constexpr const char* kWorker = UOP_WORKER_BINARY;

std::string scratch(const std::string& tag) { return testing::scratch_dir("internal-" + tag); }

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using Scheduler = testing::SchedulerProc;

grpc::Status register_at(const std::string& registry, const cluster_auth::Dialer& dial, const std::string& worker,
                         const std::string& device) {
  auto stub = wv1::Registry::NewStub(dial.channel(registry));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  wv1::RegisterRequest req;
  req.set_address(worker);
  req.set_device(device);
  wv1::RegisterResponse resp;
  return stub->Register(&ctx, req, &resp);
}

cluster_auth::Dialer with(const std::string& secret) {
  cluster_auth::Dialer d;
  d.secret = secret;
  return d;
}

// A worker that lost its device to nobody: without the cluster secret (or with another
// one) no process registers, neither by calling the Registry itself nor as a uop-worker
// doing what the real one does; when the real worker comes back, it serves its device.
TEST(InternalServices, AWorkerWithoutTheSecretCannotRegisterOrTakeOverADevice) {
  ClusterSecret secret, other;
  Scheduler s = Scheduler::start(kUopd, {"--workers=0", "--cache-dir=", secret.flag()});
  ASSERT_TRUE(s.client);
  const std::string internal = s.proc->internal_address();
  ASSERT_FALSE(internal.empty()) << "uopd printed no INTERNAL line";
  ASSERT_NE(internal, s.proc->address());
  // The client port serves no Registry, whatever the caller brings.
  EXPECT_EQ(register_at(s.proc->address(), secret.dialer(), "127.0.0.1:1", "CPU:0").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  const std::vector<std::string> real_flags = {"--device=cpu:0", "--threads=1", "--scheduler=" + internal,
                                               "--heartbeat-seconds=1", secret.flag()};
  Proc real;
  ASSERT_NO_FATAL_FAILURE(testing::spawn_worker(kWorker, real_flags, &real));
  ASSERT_TRUE(wait_until([&] { return s.worker("CPU:0").state == "up"; })) << s.proc->log_tail();
  ASSERT_TRUE(testing::run_softmax(*s.client, "CPU:0", 1).ok());

  // An impostor: a uop-worker anyone can run, answering anyone. Registering it straight
  // at the Registry: refused, with no secret and with the wrong one.
  Proc impostor;
  ASSERT_NO_FATAL_FAILURE(testing::spawn_worker(kWorker, {"--device=cpu:0", "--threads=1", "--insecure"}, &impostor));
  for (const cluster_auth::Dialer& d : {cluster_auth::Dialer{}, other.dialer()}) {
    grpc::Status st = register_at(internal, d, impostor.address, "CPU:0");
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    EXPECT_EQ(st.error_message().find(secret.value()), std::string::npos);
  }

  // The real worker dies; the run that finds out fails, and the device is down.
  real.kill_now();
  EXPECT_FALSE(testing::run_softmax(*s.client, "CPU:0", 2).ok());
  ASSERT_TRUE(wait_until([&] { return s.worker("CPU:0").state != "up"; }));
  // The moment the old main handed the device to whoever asked: still refused.
  for (const cluster_auth::Dialer& d : {cluster_auth::Dialer{}, other.dialer()}) {
    grpc::Status st = register_at(internal, d, impostor.address, "CPU:0");
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  }
  // A uop-worker with the wrong secret, registering as the real one does: its log says it
  // was refused (its first attempt is over once the line is there).
  const std::string dir = scratch("rogue");
  Proc rogue;
  ASSERT_NO_FATAL_FAILURE(testing::spawn_worker(
      kWorker, {"--device=cpu:0", "--threads=1", "--scheduler=" + internal, "--heartbeat-seconds=1", other.flag()}, &rogue,
      dir + "/rogue.log"));
  ASSERT_TRUE(wait_until([&] { return slurp(dir + "/rogue.log").find("cannot register") != std::string::npos; }))
      << slurp(dir + "/rogue.log");
  EXPECT_NE(slurp(dir + "/rogue.log").find("cluster secret"), std::string::npos) << slurp(dir + "/rogue.log");
  client::WorkerStatus w = s.worker("CPU:0");
  EXPECT_NE(w.state, "up");
  EXPECT_NE(w.address, impostor.address);
  EXPECT_NE(w.address, rogue.address);

  // The real worker, started again, serves its device again: it, not anyone else.
  Proc back;
  ASSERT_NO_FATAL_FAILURE(testing::spawn_worker(kWorker, real_flags, &back));
  absl::Status served;
  ASSERT_TRUE(wait_until([&] { return (served = testing::run_softmax(*s.client, "CPU:0", 3)).ok(); })) << served;
  w = s.worker("CPU:0");
  EXPECT_EQ(w.state, "up");
  EXPECT_EQ(w.address, back.address);
  EXPECT_EQ(w.pid, back.pid);
  std::filesystem::remove_all(dir);
}

grpc::Status rendezvous_set(const std::string& address, const cluster_auth::Dialer& d, const std::string& key) {
  auto stub = wv1::Rendezvous::NewStub(d.channel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  wv1::RendezvousSetRequest req;
  req.set_key(key);
  req.set_value(std::string(4096, 'j'));
  wv1::RendezvousSetResponse resp;
  return stub->Set(&ctx, req, &resp);
}

grpc::Status rendezvous_get(const std::string& address, const cluster_auth::Dialer& d, const std::string& key) {
  auto stub = wv1::Rendezvous::NewStub(d.channel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  wv1::RendezvousGetRequest req;
  req.add_keys(key);
  req.set_timeout_ms(5000);
  wv1::RendezvousGetResponse resp;
  return stub->Get(&ctx, req, &resp);
}

// The scheduler's Rendezvous: nothing without the secret; with it, nothing outside a
// group the scheduler opened, the names a counter would have given included.
TEST(InternalServices, TheRendezvousTakesNoKeyOutsideAnOpenGroup) {
  ClusterSecret secret;
  Scheduler s = Scheduler::start(kUopd, {"--workers=1", "--cache-dir=", secret.flag()});
  ASSERT_TRUE(s.client);
  const std::string internal = s.proc->internal_address();
  for (const std::string& key : {std::string("uopd-1-0-ar0/0"), cat("uopd-", s.proc->pid(), "-0-ar0/rank_0")}) {
    EXPECT_EQ(rendezvous_set(internal, {}, key).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(rendezvous_get(internal, {}, key).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(rendezvous_set(internal, with("a-guess-at-the-cluster-secret"), key).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(rendezvous_set(internal, secret.dialer(), key).error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(rendezvous_get(internal, secret.dialer(), key).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // The client port serves no Rendezvous.
  EXPECT_EQ(rendezvous_set(s.proc->address(), secret.dialer(), "g/0").error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

// Stats' address of the one worker (anonymous: the operator's view).
std::string worker_address(Scheduler& s) {
  client::WorkerStatus w = s.worker("CPU:0");
  return w.address;
}

// Calls to an embedded worker's port from anyone but its scheduler: every method is
// refused before it runs, with no secret, with the cluster's secret (not the worker's),
// and the buffer a tenant put there is as it was. The health check is open.
TEST(InternalServices, AWorkersPortAnswersOnlyItsScheduler) {
  ClusterSecret secret;
  Scheduler s = Scheduler::start(kUopd, {"--workers=1", "--cache-dir=", "--exec-lane=grpc", secret.flag()});
  ASSERT_TRUE(s.client);
  const std::string worker = worker_address(s);
  ASSERT_EQ(worker.rfind("127.0.0.1:", 0), 0u) << "an embedded worker listens on loopback: " << worker;
  auto session = s.client->create_session({"CPU:0"});
  ASSERT_TRUE(session.ok()) << session.status();
  HostTensor t = HostTensor::random(Scalar::Float32, {1024}, 7);
  auto buffer = session->upload_tensor(t);
  ASSERT_TRUE(buffer.ok()) << buffer.status();

  for (const cluster_auth::Dialer& d : {cluster_auth::Dialer{}, secret.dialer()}) {
    auto stub = wv1::Worker::NewStub(d.channel(worker));
    auto ctx = [] {
      auto c = std::make_unique<grpc::ClientContext>();
      c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      return c;
    };
    const auto refused = grpc::StatusCode::UNAUTHENTICATED;
    wv1::InfoResponse info;
    EXPECT_EQ(stub->Info(ctx().get(), wv1::InfoRequest(), &info).error_code(), refused);
    // Ids a counter would have handed out, and a guess at the rest of the space.
    for (uint64_t id : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{0x8000000000000000}}) {
      wv1::ReadBufferRequest rr;
      rr.set_buffer_id(id);
      auto c = ctx();
      auto reader = stub->ReadBuffer(c.get(), rr);
      wv1::ReadChunk chunk;
      EXPECT_FALSE(reader->Read(&chunk)) << "read " << chunk.data().size() << " bytes of buffer " << id;
      EXPECT_EQ(reader->Finish().error_code(), refused);
      auto wc = ctx();
      wv1::WriteBufferResponse wr;
      auto writer = stub->WriteBuffer(wc.get(), &wr);
      wv1::WriteChunk junk;
      junk.set_buffer_id(id);
      junk.set_data(std::string(4096, 'X'));
      writer->Write(junk);
      writer->WritesDone();
      EXPECT_EQ(writer->Finish().error_code(), refused);
    }
    wv1::LoadProgramRequest lp;
    lp.set_key("mine");
    lp.set_object(std::string("\x7f" "ELF", 4) + std::string(1024, '\0'));
    wv1::LoadProgramResponse lr;
    EXPECT_EQ(stub->LoadProgram(ctx().get(), lp, &lr).error_code(), refused);
    wv1::ExecuteRequest ex;
    ex.add_launches()->set_key("mine");
    ex.add_read_back(1);
    wv1::ExecuteResponse er;
    EXPECT_EQ(stub->Execute(ctx().get(), ex, &er).error_code(), refused);
    wv1::AllocBufferRequest ar;
    ar.set_buffer_id(42);
    ar.set_bytes(1 << 20);
    wv1::AllocBufferResponse aresp;
    EXPECT_EQ(stub->AllocBuffer(ctx().get(), ar, &aresp).error_code(), refused);
    wv1::FreeBuffersRequest fr;
    for (uint64_t id = 1; id <= 64; ++id) fr.add_buffer_ids(id);
    wv1::FreeBuffersResponse fresp;
    EXPECT_EQ(stub->FreeBuffers(ctx().get(), fr, &fresp).error_code(), refused);
    wv1::CollectiveRequest cr;
    cr.set_group("g");
    cr.set_size(1);
    cr.set_buffer_id(1);
    wv1::CollectiveResponse cresp;
    EXPECT_EQ(stub->Collective(ctx().get(), cr, &cresp).error_code(), refused);
  }
  auto back = session->download(*buffer);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, t.data) << "someone else's calls changed the tenant's buffer";

  auto [rc, out] = testing::run_command(kWorker, "--health-check=" + worker);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
}

// With tenants, Stats says what each device is doing and nothing about where its worker
// runs; the operator's own uopd (no tokens file) still shows it.
TEST(InternalServices, TenantsSeeNoWorkerAddresses) {
  ClusterSecret secret;
  const std::string dir = scratch("tokens");
  std::ofstream(dir + "/tokens") << "alice alice-token-0123456789\n";
  Scheduler s = Scheduler::start(kUopd, {"--workers=2", "--cache-dir=", secret.flag(), "--tokens-file=" + dir + "/tokens"},
                                 "alice-token-0123456789");
  ASSERT_TRUE(s.client);
  ASSERT_TRUE(testing::run_softmax(*s.client, "CPU:1", 4).ok());
  auto st = s.client->stats();
  ASSERT_TRUE(st.ok()) << st.status();
  // CPU:0 and CPU:1, and the process of CPU:1 that serves Alice alone (tenant isolation).
  ASSERT_GE(st->workers.size(), 2u);
  for (const auto& w : st->workers) {
    EXPECT_FALSE(w.device.empty());
    EXPECT_EQ(w.state, "up");
    EXPECT_TRUE(w.address.empty()) << w.device << " at " << w.address;
    EXPECT_EQ(w.pid, 0) << w.device;
    EXPECT_TRUE(w.last_error.empty()) << w.last_error;
  }
  // The Registry takes no registration without the secret, tokens or not.
  EXPECT_EQ(register_at(s.proc->internal_address(), {}, "127.0.0.1:1", "CPU:0").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  Scheduler own = Scheduler::start(kUopd, {"--workers=1", "--cache-dir="});
  ASSERT_TRUE(own.client);
  client::WorkerStatus w = own.worker("CPU:0");
  EXPECT_EQ(w.address.rfind("127.0.0.1:", 0), 0u) << w.address;
  EXPECT_GT(w.pid, 0);
  std::filesystem::remove_all(dir);
}

// grpc.reflection.v1alpha ListServices, spoken with a generic stub: the request is field
// 7 (list_services) of ServerReflectionRequest; the answer's field 6 holds one field 1
// per service, whose field 1 is the name.
absl::StatusOr<std::vector<std::string>> list_services(const std::string& address, const cluster_auth::Dialer& d) {
  grpc::GenericStub stub(d.channel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&](auto op) {
    void* tag = nullptr;
    bool ok = false;
    op(reinterpret_cast<void*>(1));
    return cq.Next(&tag, &ok) && ok;
  };
  std::string request("\x3a\x00", 2);
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1), in;
  bool ok = step([&](void* t) { call->StartCall(t); }) && step([&](void* t) { call->Write(out, t); }) &&
            step([&](void* t) { call->Read(&in, t); });
  step([&](void* t) { call->WritesDone(t); });
  grpc::Status status;
  step([&](void* t) { call->Finish(&status, t); });
  cq.Shutdown();
  void* tag;
  bool more;
  while (cq.Next(&tag, &more)) {
  }
  if (!status.ok()) return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  if (!ok) return absl::UnknownError("the reflection stream ended without an answer");
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (in.Dump(&slices).ok())
    for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  google::protobuf::UnknownFieldSet response;
  if (!response.ParseFromString(bytes)) return absl::DataLossError("the answer does not parse");
  std::vector<std::string> names;
  for (int i = 0; i < response.field_count(); ++i) {
    if (response.field(i).number() != 6) continue;
    google::protobuf::UnknownFieldSet list;
    list.ParseFromString(response.field(i).length_delimited());
    for (int j = 0; j < list.field_count(); ++j) {
      google::protobuf::UnknownFieldSet service;
      service.ParseFromString(list.field(j).length_delimited());
      for (int k = 0; k < service.field_count(); ++k)
        if (service.field(k).number() == 1) names.push_back(service.field(k).length_delimited());
    }
  }
  return names;
}

TEST(InternalServices, ReflectionListsTheClientServicesOnly) {
  ClusterSecret secret;
  Scheduler s = Scheduler::start(kUopd, {"--workers=1", "--cache-dir=", secret.flag()});
  ASSERT_TRUE(s.client);
  auto names = list_services(s.proc->address(), {});
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_NE(std::find(names->begin(), names->end(), "uopd.v1.Uopd"), names->end()) << join(*names, ", ");
  for (const std::string& n : *names) EXPECT_EQ(n.rfind("uopd.worker.v1", 0), std::string::npos) << n;
  // The internal listener has no reflection at all, and says nothing to a stranger.
  EXPECT_EQ(list_services(s.proc->internal_address(), {}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(list_services(s.proc->internal_address(), secret.dialer()).status().code(), absl::StatusCode::kUnimplemented);
}

using testing::run_command;

// Remote workers with nothing to authenticate them: uopd does not start (unless told to
// trust anyone), nor does a uop-worker with no credential; a secret file others can read
// is refused, and the messages never show a secret.
TEST(InternalServices, NoCredentialForRemoteWorkersStopsTheStart) {
  auto [rc, out] = run_command(kUopd, "--workers=0 --listen=127.0.0.1:0 --metrics-listen= --cache-dir=");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--cluster-secret-file"), std::string::npos) << out;
  auto [rc2, out2] = run_command(kUopd, "--workers=1 --internal-listen=0.0.0.0:0 --listen=127.0.0.1:0 --metrics-listen= --cache-dir=");
  EXPECT_EQ(rc2, 2) << out2;
  EXPECT_NE(out2.find("off loopback"), std::string::npos) << out2;

  ClusterSecret secret;
  std::filesystem::permissions(secret.path(), std::filesystem::perms::others_read, std::filesystem::perm_options::add);
  auto [rc3, out3] = run_command(kUopd, cat("--workers=0 --listen=127.0.0.1:0 --metrics-listen= --cache-dir= ", secret.flag()));
  EXPECT_EQ(rc3, 1) << out3;
  EXPECT_NE(out3.find("chmod 600"), std::string::npos) << out3;
  EXPECT_EQ(out3.find(secret.value()), std::string::npos) << out3;
  auto [rc4, out4] = run_command(kWorker, cat("--listen=127.0.0.1:0 ", secret.flag()));
  EXPECT_EQ(rc4, 1) << out4;
  EXPECT_EQ(out4.find(secret.value()), std::string::npos) << out4;

  auto [rc5, out5] = run_command(kWorker, "--listen=127.0.0.1:0");
  EXPECT_EQ(rc5, 2) << out5;
  EXPECT_NE(out5.find("--insecure"), std::string::npos) << out5;
  auto [rc6, out6] = run_command(kUopd, "--workers=0 --insecure-internal --cluster-secret-file=/x --listen=127.0.0.1:0 --metrics-listen=");
  EXPECT_EQ(rc6, 2) << out6;

  // Told to trust anyone, it starts, and says so.
  auto open = EmbeddedServer::start(kUopd, {"--workers=0", "--cache-dir=", "--insecure-internal"});
  ASSERT_TRUE(open.ok()) << open.status();
  // (The line comes to stderr just after LISTENING to stdout.)
  ASSERT_TRUE(wait_until([&] { return (*open)->log_tail().find("uopd: serving") != std::string::npos; }))
      << (*open)->log_tail();
  EXPECT_NE((*open)->log_tail().find("unauthenticated: --insecure-internal"), std::string::npos) << (*open)->log_tail();
}

}  // namespace
}  // namespace uop
