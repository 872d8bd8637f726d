// A worker's program budget end to end: a real uopd whose one uop-worker may hold almost
// nothing (--worker-max-program-bytes=1 keeps only the kernel loaded last). Runs that take
// turns still get right answers, each kernel loaded again when its Run comes back, and the
// metrics count the loads and the unloads; a Run whose kernels cannot be held at once is
// refused naming the budget, and the next Run works.
#include <filesystem>
#include <optional>

#include <gtest/gtest.h>

#include "client/client.h"
#include "client/embedded_server.h"
#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "tests/e2e/metrics_scrape.h"

namespace uop {
namespace {

using client::Client;
using client::EmbeddedServer;

TEST(ProgramBudget, KernelsTakingTurnsAreLoadedAgainAndStayRight) {
  auto dir = std::filesystem::temp_directory_path() / cat("uopd-program-budget-", ::getpid());
  auto p = EmbeddedServer::start(UOPD_BINARY, {"--workers=1", "--worker-max-program-bytes=1", "--metrics-listen=127.0.0.1:0",
                                               "--cache-dir=" + dir.string()});
  ASSERT_TRUE(p.ok()) << p.status();
  std::unique_ptr<EmbeddedServer> proc = std::move(*p);
  client::ClientOptions o;
  o.address = proc->address();
  auto c = Client::connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  std::unique_ptr<Client> client = std::move(*c);
  const std::string metrics = testing::metrics_address(*proc);
  ASSERT_FALSE(metrics.empty()) << proc->log_tail();
  auto s = client->create_session();
  ASSERT_TRUE(s.ok()) << s.status();
  client::Session session = std::move(*s);

  constexpr int64_t M = 1000;
  Graph g;
  TensorBuilder tb(g);
  const UOp* tx = tb.input(Scalar::Float32, {M});
  const UOp* ty = tb.input(Scalar::Float32, {M});
  const UOp* x = tb.buffer_of(tx);
  const UOp* y = tb.buffer_of(ty);
  const UOp* add = tb.sink({tb.alu(Op::ADD, {tx, ty})});
  const UOp* mul = tb.sink({tb.alu(Op::MUL, {tx, ty})});
  const UOp* both = tb.sink({tb.alu(Op::SUB, {tx, ty}), tb.alu(Op::MAX, {tx, ty})});
  const HostTensor hx = HostTensor::random(Scalar::Float32, {M}, 1);
  const HostTensor hy = HostTensor::random(Scalar::Float32, {M}, 2);

  auto run_and_check = [&](const UOp* root) {
    auto run = session.run(root, {}, {{x, hx}, {y, hy}});
    ASSERT_TRUE(run.ok()) << run.status();
    auto want = interpret(g, root, {{x, hx}, {y, hy}});
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(run->outputs.size(), want->size());
    for (size_t i = 0; i < want->size(); ++i) {
      CompareResult cmp = compare((*want)[i], run->outputs[i].tensor, Tolerance{0, 0});
      EXPECT_TRUE(cmp.ok) << cmp.message;
    }
  };
  auto counter = [&](const char* name) { return testing::gauge(testing::scrape(metrics), name); };

  for (const UOp* root : {add, mul, add, mul}) run_and_check(root);
  // Each Run found its kernel unloaded by the one before and loaded it again.
  EXPECT_EQ(counter("uopd_worker_program_loads_total"), 4);
  EXPECT_EQ(counter("uopd_worker_programs_unloaded_total"), 3);

  // Two kernels that one Execute launches cannot both be held: refused, saying so.
  auto compiled = client->compile(both, {});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ASSERT_EQ(compiled->kernels.size(), 2u);
  auto refused = session.run(both, {}, {{x, hx}, {y, hy}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("--max-program-bytes"), std::string::npos) << refused.status();
  // ... and the server goes on serving.
  run_and_check(add);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace uop
