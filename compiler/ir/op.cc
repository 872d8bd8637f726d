#include "compiler/ir/op.h"

#include <array>

namespace uop {
namespace {
constexpr std::array<OpInfo, kNumOps> kOpInfo = {{
#define UOP_OP(name, cat, arg, range_start, min_src, max_src) \
  {#name, OpCategory::cat, ArgKind::arg, range_start, min_src, max_src},
#include "compiler/ir/ops.def"
#undef UOP_OP
}};
}  // namespace

const OpInfo& op_info(Op op) { return kOpInfo[static_cast<int>(op)]; }

std::optional<Op> op_from_name(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (kOpInfo[i].name == name) return static_cast<Op>(i);
  return std::nullopt;
}

std::string_view category_name(OpCategory c) {
  static constexpr std::array<std::string_view, 15> kNames = {
      "loop", "reduce", "memory", "kernel", "vector", "expand", "hardware", "control",
      "define", "movement", "misc", "unary", "binary", "ternary", "cast"};
  return kNames[static_cast<int>(c)];
}

std::string_view arg_kind_name(ArgKind k) {
  static constexpr std::array<std::string_view, kNumArgKinds> kNames = {
      "none", "const", "vconst", "int", "ints", "bools", "range", "reduce_axis", "reduce_op",
      "buffer", "buffer_view", "bufferize", "param", "define_var", "define_reg", "str",
      "bytes", "axis_factors", "wmma", "call_info", "kernel_info", "device", "custom_function"};
  return kNames[static_cast<int>(k)];
}

bool is_commutative(Op op) {
  switch (op) {
    case Op::ADD: case Op::MUL: case Op::MAX: case Op::MIN: case Op::CMPNE: case Op::CMPEQ:
    case Op::AND: case Op::OR: case Op::XOR:
      return true;
    default:
      return false;
  }
}

}  // namespace uop
