// The backends and the stage list (compiler/backend.h, pipeline.h): what each backend's
// pipeline traces is the planning table, its schedule, render and compile, in that order;
// every stage traced is listed by pipeline_stages() in the order it ran; every listed
// stage runs on some backend; and compiler/PIPELINE.md's table is that list. Also the
// registry's answers and the cache key's parts.
#include "compiler/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/explain.h"
#include "compiler/ir/tensor_builder.h"

namespace uop {
namespace {

std::vector<std::string> names_of(const std::vector<StageInfo>& stages) {
  std::vector<std::string> out;
  for (const StageInfo& s : stages) out.emplace_back(s.name);
  return out;
}

// sum(max(a, 0) * b, axis 1): one kernel, with a reduction, so that every stage has work.
const UOp* model(Graph& g) {
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Float32, {16, 32});
  const UOp* b = tb.input(Scalar::Float32, {16, 32});
  const UOp* r = tb.alu(Op::MAX, {a, tb.full(Scalar::Float32, 0.0, {16, 32})});
  return tb.sink({tb.reduce(tb.alu(Op::MUL, {r, b}), ReduceOp::Add, {1})});
}

// The stages one backend's explain traced, in order.
std::vector<std::string> traced(const Backend& backend) {
  Graph g;
  auto stages = explain(g, model(g), backend);
  EXPECT_TRUE(stages.ok()) << backend.name() << ": " << stages.status();
  std::vector<std::string> out;
  if (stages.ok())
    for (const ExplainedStage& s : *stages) out.push_back(s.name);
  return out;
}

// The names in the stage column of PIPELINE.md's table, in order.
std::vector<std::string> documented() {
  std::ifstream in(std::string(UOPD_SOURCE_DIR) + "/compiler/PIPELINE.md");
  EXPECT_TRUE(in.good()) << "compiler/PIPELINE.md";
  std::vector<std::string> out;
  const std::regex row(R"(^\|\s*\d+\s*\|\s*`([a-z_]+)`\s*\|)");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) out.push_back(m[1]);
  }
  return out;
}

TEST(Backend, EachBackendTracesItsTablesInOrder) {
  for (const BackendKind* kind : backend_kinds()) {
    auto backend = kind->make(kind->default_arch);
    ASSERT_TRUE(backend.ok()) << kind->name << ": " << backend.status();
    std::vector<std::string> want;
    for (const StageInfo& s : planning_stages()) want.emplace_back(s.name);
    for (const KernelStage& s : (*backend)->schedule()) want.emplace_back(s.name);
    want.insert(want.end(), {"render", "compile"});
    // One kernel: each per-kernel stage traces once per run of it.
    EXPECT_EQ(traced(**backend), want) << kind->name;
  }
}

TEST(Backend, TheStageListIsWhatRunsAndWhatThePipelineDocSays) {
  const std::vector<std::string> listed = names_of(pipeline_stages());
  std::vector<std::string> ran;  // every stage some backend traced
  for (const BackendKind* kind : backend_kinds()) {
    auto backend = kind->make(kind->default_arch);
    ASSERT_TRUE(backend.ok()) << backend.status();
    size_t last = 0;
    for (const std::string& name : traced(**backend)) {
      auto at = std::find(listed.begin(), listed.end(), name);
      ASSERT_NE(at, listed.end()) << kind->name << " traced stage " << name << ", which pipeline_stages() does not list";
      size_t pos = at - listed.begin();
      // A stage run again (symbolic) appears earlier in the list; the others in order.
      if (std::find(ran.begin(), ran.end(), name) == ran.end()) ran.push_back(name);
      if (pos >= last) last = pos;
      else EXPECT_EQ(name, "symbolic") << kind->name << " ran " << name << " out of the list's order";
    }
  }
  for (const std::string& name : listed)
    EXPECT_NE(std::find(ran.begin(), ran.end(), name), ran.end()) << "stage " << name << " is listed but no backend runs it";
  EXPECT_EQ(documented(), listed) << "compiler/PIPELINE.md's table and pipeline_stages() differ";
}

TEST(Backend, RegistryNamesTargetsAndDevices) {
  auto cpu = make_backend("", "");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->name(), "cpu");
  EXPECT_EQ(backend_for_device("CPU:1").name, "cpu");
  EXPECT_EQ(backend_for_device("CUDA:0").name, "cuda");
  EXPECT_EQ(backend_for_device("cuda:3").name, "cuda");
  EXPECT_EQ(backend_for_device("CUDA:0").device_collectives, "nccl");
  auto unknown = make_backend("tpu");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(unknown.status().message().find("'tpu'"), std::string_view::npos) << unknown.status();
  auto bad_arch = make_backend("cuda", "gfx90a");
  EXPECT_EQ(bad_arch.status().code(), absl::StatusCode::kInvalidArgument) << bad_arch.status();
  auto bad_cpu = make_backend("cpu", "riscv");
  EXPECT_EQ(bad_cpu.status().code(), absl::StatusCode::kInvalidArgument) << bad_cpu.status();
}

TEST(Backend, CacheKeysSeparateTargetsArchesSourceAndNamespaces) {
  Digest d = sha256("a kernel");
  auto cpu = make_backend("cpu");
  auto sm80 = make_backend("cuda", "sm_80");
  auto sm90 = make_backend("cuda", "sm_90");
  ASSERT_TRUE(cpu.ok() && sm80.ok() && sm90.ok());
  std::vector<std::string> keys = {(*cpu)->cache_key(d, false),  (*sm80)->cache_key(d, false),
                                   (*sm90)->cache_key(d, false), (*sm90)->cache_key(d, true),
                                   (*sm90)->cache_key(d, false, "tenant-a")};
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(keys[i].size(), 64u);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(keys[i], keys[j]) << i << " vs " << j;
  }
  EXPECT_EQ((*sm90)->cache_key(d, false), (*make_backend("cuda", "sm_90"))->cache_key(d, false));
}

TEST(Backend, ExplainPrintsLinearAsItsOpListAndRefusesUnknownStages) {
  Graph g;
  auto stages = explain(g, model(g), **make_backend("cpu"), {}, "linearize");
  ASSERT_TRUE(stages.ok()) << stages.status();
  ASSERT_EQ(stages->size(), 1u);
  EXPECT_EQ((*stages)[0].name, "linearize");
  EXPECT_EQ((*stages)[0].text.rfind("%0 = PARAM", 0), 0u) << (*stages)[0].text;
  Graph g2;
  auto bad = explain(g2, model(g2), **make_backend("cpu"), {}, "no_such_stage");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("linearize"), std::string_view::npos) << "lists the stages: " << bad.status();
}

}  // namespace
}  // namespace uop
