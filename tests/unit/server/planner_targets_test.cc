// The planner through the backend interface (server/planner.h, compiler/backend.h): a
// target the server was not built with, registered by the one line below, is planned,
// compiled once per cache key and explained like the built-in ones, following its own
// schedule; its keys are not the CPU's.
#include "server/planner.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "compiler/ir/tensor_builder.h"
#include "server/cache/memory_tier.h"
#include "tests/unit/compiler/backends/listing/listing_backend.h"

namespace uop::server {
namespace {

const bool registered = (register_backend(uop::testing::listing_backend_kind()), true);

bool contains(std::string_view text, std::string_view what) { return text.find(what) != std::string_view::npos; }

// out = sum(a * b, axis 1), as the wire would bring it.
std::shared_ptr<const DecodedGraph> graph() {
  Graph g;
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Float32, {8, 16});
  const UOp* b = tb.input(Scalar::Float32, {8, 16});
  auto decoded = decode_binary(encode_binary(tb.sink({tb.reduce(tb.alu(Op::MUL, {a, b}), ReduceOp::Add, {1})})));
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  return std::make_shared<const DecodedGraph>(std::move(*decoded));
}

struct Fixture {
  Fixture() : cache([] {
      std::vector<std::unique_ptr<CacheTier>> tiers;
      tiers.push_back(std::make_unique<MemoryTier>(int64_t{1} << 24));
      return tiers;
    }()),
    planner(PlannerOptions{}, &cache, CpuTarget::host()) {}
  CompileCache cache;
  Planner planner;
};

TEST(Planner, CompilesForARegisteredTargetOncePerKey) {
  ASSERT_TRUE(registered);
  Fixture f;
  auto g = graph();
  bool cached = true;
  auto plan = f.planner.plan(g, &cached);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(cached);
  ASSERT_EQ((*plan)->kernels.size(), 1u);

  auto listing = f.planner.backend("listing");
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ((*listing)->name(), "listing");
  EXPECT_EQ(f.planner.backend("listing", "binary").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.planner.backend("tpu").status().code(), absl::StatusCode::kUnimplemented);

  auto first = f.planner.compile(**plan, *listing);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 1u);
  const CompiledKernel& k = (*first)[0];
  EXPECT_EQ(k.outcome, CacheOutcome::Miss);
  // The "object" is the kernel's LINEAR: its loop over the 8 outputs, the accumulator, the store.
  EXPECT_TRUE(contains(*k.object, "RANGE")) << *k.object;
  EXPECT_TRUE(contains(*k.object, "DEFINE_REG")) << *k.object;
  EXPECT_TRUE(contains(*k.object, "STORE")) << *k.object;
  ASSERT_EQ(k.abi.params.size(), 3u);
  EXPECT_TRUE(k.abi.params[0].written);
  EXPECT_EQ(k.key, f.planner.cache_key(k.digest, **listing));

  auto again = f.planner.compile(**plan, *listing);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[0].outcome, CacheOutcome::Hit);
  EXPECT_EQ(*(*again)[0].object, *k.object);

  // The same kernel for the CPU is another artifact under another key.
  auto cpu = f.planner.compile(**plan, f.planner.host());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_NE((*cpu)[0].key, k.key);
  EXPECT_EQ((*cpu)[0].outcome, CacheOutcome::Miss);
  EXPECT_EQ((*cpu)[0].object->substr(0, 4), "\x7f" "ELF");
}

// The memory tier, counting what is asked of it.
class CountingTier : public CacheTier {
 public:
  std::string_view name() const override { return inner_.name(); }
  absl::StatusOr<std::optional<std::string>> get(std::string_view key) override {
    ++gets;
    return inner_.get(key);
  }
  absl::Status put(std::string_view key, std::string_view value) override { return inner_.put(key, value); }
  absl::Status remove(std::string_view key) override { return inner_.remove(key); }
  bool in_process() const override { return true; }
  int gets = 0;

 private:
  MemoryTier inner_{int64_t{1} << 24};
};

// A planner over one memory tier that counts its reads.
std::vector<std::unique_ptr<CacheTier>> one_tier(CacheTier* t) {
  std::vector<std::unique_ptr<CacheTier>> tiers;
  tiers.emplace_back(t);
  return tiers;
}
struct CountedPlanner {
  CountingTier* tier = new CountingTier;  // owned by cache
  CompileCache cache{one_tier(tier)};
  Planner planner{PlannerOptions{}, &cache, CpuTarget::host()};
};

// A warm Run resolves each kernel from what an earlier compile made of its cache entry
// (parsed and checked once): no tier is read again, the hit still counts as the memory
// tier's, and the kernel keeps the name this plan gives it.
TEST(Planner, AKernelResolvedOnceIsAnsweredWithoutReadingTheTiers) {
  ASSERT_TRUE(registered);
  CountedPlanner f;
  CountingTier* tier = f.tier;
  CompileCache& cache = f.cache;
  Planner& planner = f.planner;
  bool cached = false;
  auto plan = planner.plan(graph(), &cached);
  ASSERT_TRUE(plan.ok()) << plan.status();

  auto first = planner.compile(**plan, planner.host());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ((*first)[0].outcome, CacheOutcome::Miss);
  const int gets = tier->gets;
  const uint64_t hits = cache.stats()[0].second.hits;

  Plan renamed = **plan;
  renamed.kernels[0].name = "a_name_of_the_clients";
  for (int i = 0; i < 3; ++i) {
    auto again = planner.compile(renamed, planner.host());
    ASSERT_TRUE(again.ok()) << again.status();
    const CompiledKernel& k = (*again)[0];
    EXPECT_EQ(k.outcome, CacheOutcome::Hit);
    EXPECT_EQ(k.tier, "memory");
    EXPECT_EQ(k.name, "a_name_of_the_clients");
    EXPECT_EQ(k.key, (*first)[0].key);
    EXPECT_EQ(k.object, (*first)[0].object) << "the object is shared, not copied";
    EXPECT_EQ(k.abi_text, (*first)[0].abi_text);
  }
  EXPECT_EQ(tier->gets, gets);
  EXPECT_EQ(cache.stats()[0].second.hits, hits + 3);

  // Another schedule is another key: resolved through the tiers (and compiled) once.
  auto other = planner.compile(**plan, planner.host(), {}, {}, {{(*plan)->kernels[0].digest.hex(), "split(0,2,upcast)"}});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*other)[0].outcome, CacheOutcome::Miss);
  EXPECT_NE((*other)[0].key, (*first)[0].key);
  EXPECT_GT(tier->gets, gets);
}

// A warm Run's kernels come from one vector kept for the plan (compile_shared): the same
// vector again, its hits counted, no tier read, as long as nothing that makes the keys has
// changed. Other names (a client's), or a tuning record that changes a schedule, are
// answered anew.
TEST(Planner, AWarmPlansKernelsAreOneSharedVector) {
  ASSERT_TRUE(registered);
  CountedPlanner f;
  CountingTier* tier = f.tier;
  CompileCache& cache = f.cache;
  Planner& planner = f.planner;
  std::string recorded;  // the schedule a tuning record gives
  planner.set_schedule_source([&](const PlannedKernel&, const Backend&, std::string_view) { return recorded; });
  bool cached = false;
  auto plan = planner.plan(graph(), &cached);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<std::shared_ptr<const Backend>> cpu((*plan)->kernels.size(), planner.host());

  auto first = planner.compile_shared(**plan, cpu);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((**first)[0].outcome, CacheOutcome::Miss);
  auto second = planner.compile_shared(**plan, cpu);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->get(), first->get()) << "a compile is never kept";
  EXPECT_EQ((**second)[0].outcome, CacheOutcome::Hit);
  const int gets = tier->gets;
  const uint64_t hits = cache.stats()[0].second.hits;
  for (int i = 0; i < 3; ++i) {
    auto again = planner.compile_shared(**plan, cpu);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->get(), second->get()) << "the kept vector, not a copy";
  }
  EXPECT_EQ(tier->gets, gets);
  EXPECT_EQ(cache.stats()[0].second.hits, hits + 3 * (*plan)->kernels.size());

  Plan renamed = **plan;
  renamed.kernels[0].name = "a_name_of_the_clients";
  auto other_names = planner.compile_shared(renamed, cpu);
  ASSERT_TRUE(other_names.ok()) << other_names.status();
  EXPECT_EQ((**other_names)[0].name, "a_name_of_the_clients");
  EXPECT_EQ((**other_names)[0].key, (**second)[0].key);

  recorded = "split(0,2,upcast)";
  auto tuned = planner.compile_shared(**plan, cpu);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_NE((**tuned)[0].key, (**second)[0].key) << "the record's schedule is part of the key";
  EXPECT_EQ((**tuned)[0].outcome, CacheOutcome::Miss);
}

TEST(Planner, ExplainFollowsTheTargetsSchedule) {
  ASSERT_TRUE(registered);
  Fixture f;
  auto listing = f.planner.backend("listing");
  ASSERT_TRUE(listing.ok()) << listing.status();
  auto stages = f.planner.explain(graph(), ExplainOptions{.only = "", .backend = *listing});
  ASSERT_TRUE(stages.ok()) << stages.status();
  std::vector<std::string> lowering;
  std::string linearized, rendered, compiled;
  bool planning = true;
  for (const ExplainedStage& s : *stages) {
    if (s.name == "normalize") {
      planning = false;
      continue;
    }
    if (planning) continue;
    lowering.push_back(s.name);
    if (s.name == "linearize") linearized = s.text;
    if (s.name == "render") rendered = s.text;
    if (s.name == "compile") compiled = s.text;
  }
  // No optimize: the listing target's schedule has none.
  EXPECT_EQ(lowering, (std::vector<std::string>{"expand", "lower_reduce", "symbolic", "bounds", "linearize", "render", "compile"}));
  EXPECT_EQ(rendered, linearized);
  EXPECT_TRUE(contains(compiled, "bytes of listing for text")) << compiled;
  EXPECT_TRUE(contains(compiled, "slot 0: float32[8] written")) << compiled;

  // The CPU's explain of the same graph optimizes first.
  auto cpu = f.planner.explain(graph(), ExplainOptions{.only = "optimize", .backend = nullptr});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->size(), 1u);
}

}  // namespace
}  // namespace uop::server
