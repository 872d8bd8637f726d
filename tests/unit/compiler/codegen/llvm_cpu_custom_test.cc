// CUSTOM on the CPU backend: `name({0}, {1}, ...)` calls the C function `name` of the
// process with the CUSTOM's sources, returning its dtype. Checked against the C library
// called directly; every other form of the arg, and types C cannot pass, are refused
// naming the node and the rule; a function nowhere in the process fails the load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "compiler/codegen/llvm_cpu.h"
#include "tests/unit/compiler/codegen/linear_builder.h"

namespace uop {
namespace {

using testing::LinearBuilder;

// out[r] = CUSTOM(text)(in[r]) over n elements.
const UOp* custom_map(LinearBuilder& lb, DType in_t, DType out_t, int64_t n, const std::string& text) {
  const UOp* out = lb.param(0, out_t, n);
  const UOp* in = lb.param(1, in_t, n);
  const UOp* r = lb.range(lb.idx(n), 0);
  const UOp* x = lb.load(in, lb.index(in, r));
  const UOp* y = lb.make(Op::CUSTOM, out_t, std::array{x}, StrArg{text});
  lb.end(lb.store(lb.index(out, r), y), r);
  return lb.linear();
}

TEST(LlvmCpuCustom, CallsACLibraryFunction) {
  LinearBuilder lb;
  auto prog = testing::build(custom_map(lb, dtypes::float32, dtypes::float32, 64, "sqrtf({0})"));
  ASSERT_TRUE(prog);
  std::vector<float> in(64), out(64, -1);
  for (int i = 0; i < 64; ++i) in[i] = static_cast<float>(i) * 1.75f;
  void* bufs[] = {out.data(), in.data()};
  ASSERT_TRUE(prog->run(bufs, {}, nullptr).ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], std::sqrt(in[i])) << i;
}

// Integers narrower than 32 bits are widened as C does: abs of a negative int8 is positive.
TEST(LlvmCpuCustom, NarrowIntegersTravelAsCPassesThem) {
  LinearBuilder lb;
  const UOp* out = lb.param(0, dtypes::int32, 4);
  const UOp* in = lb.param(1, dtypes::int8, 4);
  const UOp* r = lb.range(lb.idx(4), 0);
  const UOp* x = lb.cast(lb.load(in, lb.index(in, r)), dtypes::int32);
  const UOp* y = lb.make(Op::CUSTOM, dtypes::int32, std::array{x}, StrArg{"abs( {0} )"});
  lb.end(lb.store(lb.index(out, r), y), r);
  auto prog = testing::build(lb.linear());
  ASSERT_TRUE(prog);
  std::vector<int8_t> i8 = {-128, -5, 0, 77};
  std::vector<int32_t> o(4, 0);
  void* bufs[] = {o.data(), i8.data()};
  ASSERT_TRUE(prog->run(bufs, {}, nullptr).ok());
  EXPECT_EQ(o, (std::vector<int32_t>{128, 5, 0, 77}));
}

TEST(LlvmCpuCustom, OtherFormsAreRefusedNamingTheNode) {
  for (const char* text : {"sqrtf({1})", "sqrtf({0}", "sqrtf{0}", "(sqrtf)({0})", "sqrtf({0}) + 1", "sqrtf({0}, {0})",
                           "uop_kernel({0})", "__builtin_trap({0})", "", "1sqrtf({0})", "sqrtf({0});system(\"x\")"}) {
    LinearBuilder lb;
    auto art = compile_cpu(custom_map(lb, dtypes::float32, dtypes::float32, 4, text), CpuTarget::host());
    ASSERT_FALSE(art.ok()) << text;
    EXPECT_EQ(art.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(art.status().message().find("(CUSTOM)"), std::string::npos) << art.status();
    EXPECT_NE(art.status().message().find("[llvm_cpu.custom]"), std::string::npos) << art.status();
  }
  // Types C has no scalar for.
  for (DType t : {dtypes::bool_, dtypes::float16, dtypes::float32.vec(4)}) {
    LinearBuilder lb;
    auto art = compile_cpu(custom_map(lb, t, dtypes::float32, 4, "f({0})"), CpuTarget::host());
    EXPECT_EQ(art.status().code(), absl::StatusCode::kInvalidArgument) << t.str();
    EXPECT_NE(art.status().message().find("not a C scalar"), std::string::npos) << art.status();
  }
}

TEST(LlvmCpuCustom, AFunctionNowhereInTheProcessFailsTheLoad) {
  LinearBuilder lb;
  auto art = compile_cpu(custom_map(lb, dtypes::float32, dtypes::float32, 4, "no_such_function_anywhere({0})"),
                         CpuTarget::host());
  ASSERT_TRUE(art.ok()) << art.status();
  auto prog = CpuProgram::load(art->object, art->abi);
  EXPECT_EQ(prog.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(prog.status().message().find("no_such_function_anywhere"), std::string::npos) << prog.status();
}

}  // namespace
}  // namespace uop
