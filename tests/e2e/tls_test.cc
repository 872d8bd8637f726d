// TLS end to end (transport/tls.h): certificates made for the test with the openssl command,
// a real uopd serving its client API over TLS with client certificates required, and its
// workers (embedded, and one started apart that registers by address) spoken to over
// mutual TLS. Whoever lacks a certificate from the right CA gets nowhere: not the client
// API, not a worker's port, not the Registry on the internal listener. An embedded worker
// wants the secret its scheduler gave it on top of the certificate.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/ir/tensor_builder.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker.grpc.pb.h"

namespace uop {
namespace {

using client::Client;
using client::ClientOptions;
using client::EmbeddedServer;

bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A CA, a certificate it signs for 127.0.0.1 / localhost (used by uopd, its workers and
// the good client alike), and a rogue CA with a certificate of its own.
class Certs {
 public:
  Certs() {
    dir_ = (std::filesystem::temp_directory_path() / ("uopd-tls-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()))).string();
    std::filesystem::create_directories(dir_);
    ok_ = make_ca("ca") && make_cert("node", "ca") && make_ca("rogue-ca") && make_cert("rogue", "rogue-ca");
  }
  ~Certs() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  bool ok() const { return ok_; }
  std::string pem(const std::string& name) const { return dir_ + "/" + name + ".pem"; }
  std::string key(const std::string& name) const { return dir_ + "/" + name + ".key"; }
  const std::string& dir() const { return dir_; }

 private:
  bool make_ca(const std::string& name) {
    return sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=" + name +
              " -keyout " + key(name) + " -out " + pem(name));
  }
  bool make_cert(const std::string& name, const std::string& ca) {
    std::string ext = dir_ + "/" + name + ".ext";
    std::ofstream(ext) << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                       << "extendedKeyUsage=serverAuth,clientAuth\n";
    return sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost -keyout " +
              key(name) + " -out " + dir_ + "/" + name + ".csr") &&
           sh("openssl x509 -req -days 2 -in " + dir_ + "/" + name + ".csr -CA " + pem(ca) + " -CAkey " + key(ca) +
              " -CAcreateserial -extfile " + ext + " -out " + pem(name));
  }
  std::string dir_;
  bool ok_ = false;
};

struct Square {
  Graph g;
  const UOp* root;
  const UOp* x;
  Square() {
    TensorBuilder tb(g);
    const UOp* in = tb.input(Scalar::Float32, {32});
    x = tb.buffer_of(in);
    root = tb.sink({tb.alu(Op::MUL, {in, in})});
  }
};

// A run through `c`: OK with the right numbers, or the status.
absl::Status run_square(Client& c) {
  auto session = c.create_session();
  if (!session.ok()) return session.status();
  Square sq;
  HostTensor x = HostTensor::random(Scalar::Float32, {32}, 5);
  auto r = session->run(sq.root, {}, {{sq.x, x}});
  if (!r.ok()) return r.status();
  for (int64_t i = 0; i < 32; ++i)
    if (r->outputs[0].tensor.get(i).as_float() != static_cast<float>(x.get(i).as_float() * x.get(i).as_float()))
      return absl::DataLossError("wrong result");
  return absl::OkStatus();
}

// What a client with these options gets: the connect failure, or the first call's status.
absl::Status attempt(const ClientOptions& o) {
  ClientOptions quick = o;
  quick.connect_timeout = absl::Seconds(2);
  quick.deadline = absl::Seconds(10);
  auto c = Client::connect(quick);
  if (!c.ok()) return c.status();
  return (*c)->stats().status();
}

ClientOptions good_client(const Certs& certs, const std::string& address) {
  ClientOptions o;
  o.address = address;
  o.tls_ca = certs.pem("ca");
  o.tls_cert = certs.pem("node");
  o.tls_key = certs.key("node");
  return o;
}

std::vector<std::string> tls_flags(const Certs& c) {
  return {"--tls-cert=" + c.pem("node"),        "--tls-key=" + c.key("node"),        "--tls-client-ca=" + c.pem("ca"),
          "--worker-tls-cert=" + c.pem("node"), "--worker-tls-key=" + c.key("node"), "--worker-tls-ca=" + c.pem("ca")};
}

// The Info call of a worker's port with these credentials.
grpc::Status worker_info(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> creds) {
  auto stub = uopd::worker::v1::Worker::NewStub(grpc::CreateChannel(address, creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  uopd::worker::v1::InfoResponse resp;
  return stub->Info(&ctx, uopd::worker::v1::InfoRequest(), &resp);
}

std::shared_ptr<grpc::ChannelCredentials> ssl(const Certs& c, const std::string& cert) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = read(c.pem("ca"));
  if (!cert.empty()) {
    o.pem_cert_chain = read(c.pem(cert));
    o.pem_private_key = read(c.key(cert));
  }
  return grpc::SslCredentials(o);
}

TEST(Tls, ClientApiAndWorkersOnlyForCertificatesOfTheCa) {
  Certs certs;
  ASSERT_TRUE(certs.ok()) << "openssl could not make the test certificates";
  std::string tokens = certs.dir() + "/tokens";
  std::ofstream(tokens) << "alice alice-tls-token\n";
  std::vector<std::string> args = tls_flags(certs);
  args.push_back("--workers=1");
  args.push_back("--cache-dir=");
  args.push_back("--tokens-file=" + tokens);
  auto server = EmbeddedServer::start(UOPD_BINARY, args);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();

  // The right certificate and token: a run through the scheduler and its mTLS worker. The
  // token travels as gRPC call credentials over TLS.
  ClientOptions good = good_client(certs, address);
  good.bearer_token = "alice-tls-token";
  {
    auto c = Client::connect(good);
    ASSERT_TRUE(c.ok()) << c.status() << "\n" << (*server)->log_tail();
    absl::Status r = run_square(**c);
    EXPECT_TRUE(r.ok()) << r << "\n" << (*server)->log_tail();
  }
  // TLS right, token missing: the tenant check still applies.
  {
    ClientOptions no_token = good_client(certs, address);
    EXPECT_EQ(attempt(no_token).code(), absl::StatusCode::kUnauthenticated);
  }
  // Everyone else is refused at the connection.
  ClientOptions plaintext;
  plaintext.address = address;
  plaintext.bearer_token = "alice-tls-token";
  EXPECT_FALSE(attempt(plaintext).ok()) << "plaintext to a TLS port";
  ClientOptions no_cert = good;
  no_cert.tls_cert.clear();
  no_cert.tls_key.clear();
  EXPECT_FALSE(attempt(no_cert).ok()) << "no client certificate";
  ClientOptions rogue = good;
  rogue.tls_cert = certs.pem("rogue");
  rogue.tls_key = certs.key("rogue");
  EXPECT_FALSE(attempt(rogue).ok()) << "a client certificate of another CA";
  ClientOptions wrong_ca = good;
  wrong_ca.tls_ca = certs.pem("rogue-ca");
  EXPECT_FALSE(attempt(wrong_ca).ok()) << "a server certificate the client cannot check";

  // The workers' own ports (a tenant's Stats does not show them; uopd's log does): the
  // shared process of CPU:0 and Alice's own (tenant isolation). Mutual TLS with the CA's
  // certificates only, and then the secret only the scheduler has.
  const std::string log = (*server)->log_tail(1 << 20);
  std::vector<std::string> workers;
  for (size_t at = log.find(" is up at "); at != std::string::npos; at = log.find(" is up at ", at + 1))
    workers.push_back(log.substr(at + 10, log.find('\n', at) - at - 10));
  ASSERT_EQ(workers.size(), 2u) << log;
  for (const std::string& worker : workers) {
    EXPECT_FALSE(worker_info(worker, grpc::InsecureChannelCredentials()).ok()) << "plaintext to the worker";
    EXPECT_FALSE(worker_info(worker, ssl(certs, "")).ok()) << "TLS without a client certificate";
    EXPECT_FALSE(worker_info(worker, ssl(certs, "rogue")).ok()) << "a rogue certificate";
    grpc::Status no_secret = worker_info(worker, ssl(certs, "node"));
    EXPECT_EQ(no_secret.error_code(), grpc::StatusCode::UNAUTHENTICATED) << no_secret.error_message();
  }
  ASSERT_TRUE((*server)->stop().ok()) << (*server)->log_tail();
}

// uop-worker started apart, registering with the scheduler over TLS; its log goes to `log`.
class RemoteWorker {
 public:
  RemoteWorker(std::vector<std::string> args, const std::string& log) {
    args.insert(args.begin(), UOP_WORKER_BINARY);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~RemoteWorker() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_ = -1;
};

TEST(Tls, RemoteWorkersRegisterOverMutualTls) {
  Certs certs;
  ASSERT_TRUE(certs.ok());
  std::vector<std::string> args = tls_flags(certs);
  args.push_back("--workers=0");
  args.push_back("--cache-dir=");
  auto server = EmbeddedServer::start(UOPD_BINARY, args);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();

  // A worker with a certificate of another CA cannot register; one of the CA can.
  // Workers register at the internal listener, not the client port.
  const std::string internal = (*server)->internal_address();
  ASSERT_FALSE(internal.empty());
  RemoteWorker rogue({"--device=cpu:1", "--scheduler=" + internal, "--tls-cert=" + certs.pem("rogue"),
                "--tls-key=" + certs.key("rogue"), "--tls-ca=" + certs.pem("ca")},
               certs.dir() + "/rogue.log");
  RemoteWorker good({"--device=cpu:0", "--scheduler=" + internal, "--tls-cert=" + certs.pem("node"),
               "--tls-key=" + certs.key("node"), "--tls-ca=" + certs.pem("ca")},
              certs.dir() + "/good.log");
  auto c = Client::connect(good_client(certs, address));
  ASSERT_TRUE(c.ok()) << c.status();
  bool up = false;
  for (int i = 0; i < 300 && !up; ++i) {  // bounded: 30 s
    auto s = (*c)->stats();
    ASSERT_TRUE(s.ok()) << s.status();
    for (auto& w : s->workers) up |= w.device == "CPU:0" && w.state == "up";
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(up) << read(certs.dir() + "/good.log") << (*server)->log_tail();
  absl::Status r = run_square(**c);
  EXPECT_TRUE(r.ok()) << r;
  // A remote worker with certificates and no secret: the CA's certificate is what it asks.
  std::string remote;
  auto listed = (*c)->stats();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (auto& w : listed->workers)
    if (w.device == "CPU:0") remote = w.address;
  EXPECT_FALSE(worker_info(remote, grpc::InsecureChannelCredentials()).ok()) << "plaintext to the worker";
  EXPECT_FALSE(worker_info(remote, ssl(certs, "rogue")).ok()) << "a rogue certificate";
  grpc::Status cert_ok = worker_info(remote, ssl(certs, "node"));
  EXPECT_TRUE(cert_ok.ok()) << cert_ok.error_message();
  // The rogue worker tries (and keeps trying) and fails: wait, bounded, until its log says
  // so; it never appears among the workers.
  std::string rogue_log;
  for (int i = 0; i < 300 && rogue_log.find("cannot register") == std::string::npos; ++i) {  // bounded: 30 s
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rogue_log = read(certs.dir() + "/rogue.log");
  }
  EXPECT_NE(rogue_log.find("cannot register"), std::string::npos) << rogue_log;
  auto s = (*c)->stats();
  ASSERT_TRUE(s.ok());
  for (auto& w : s->workers) EXPECT_NE(w.device, "CPU:1") << "a worker without the CA's certificate registered";
}

TEST(Tls, BadCertificateFilesStopTheServerWithAClearMessage) {
  Certs certs;
  ASSERT_TRUE(certs.ok());
  auto missing = EmbeddedServer::start(UOPD_BINARY, {"--tls-cert=/nonexistent.pem", "--tls-key=" + certs.key("node"), "--workers=0",
                                                      "--insecure-internal", "--cache-dir="},
                                       absl::Seconds(20));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("/nonexistent.pem"), std::string::npos) << missing.status();
  auto half = EmbeddedServer::start(UOPD_BINARY, {"--worker-tls-cert=" + certs.pem("node"), "--workers=0", "--cache-dir="},
                                    absl::Seconds(20));
  ASSERT_FALSE(half.ok());
  EXPECT_NE(std::string(half.status().message()).find("--worker-tls-ca"), std::string::npos) << half.status();
}

}  // namespace
}  // namespace uop
