// The Op enum and its static facts, all generated from ops.def.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace uop {

enum class OpCategory : uint8_t {
  Loop, Reduce, Memory, Kernel, Vector, Expand, Hardware, Control, Define, Movement, Misc,
  Unary, Binary, Ternary, Cast,
};

// Which alternative of `Arg` (arg.h) an op carries. The order is the order of Arg's
// alternatives; arg.h checks that at compile time.
enum class ArgKind : uint8_t {
  None, Const, VConst, Int, Ints, Bools, Range, ReduceAxis, ReduceOp, Buffer, BufferView,
  Bufferize, Param, DefineVar, DefineReg, Str, Bytes, AxisFactors, Wmma, CallInfo, KernelInfo,
  Device, CustomFunction,
};
inline constexpr int kNumArgKinds = static_cast<int>(ArgKind::CustomFunction) + 1;

enum class Op : uint8_t {
#define UOP_OP(name, cat, arg, range_start, min_src, max_src) name,
#include "compiler/ir/ops.def"
#undef UOP_OP
};

inline constexpr int kNumOps = 0
#define UOP_OP(name, cat, arg, range_start, min_src, max_src) +1
#include "compiler/ir/ops.def"
#undef UOP_OP
    ;

struct OpInfo {
  std::string_view name;
  OpCategory category;
  ArgKind arg;
  int range_start;  // first source index closed as a RANGE, -1 if none
  int min_src;
  int max_src;      // -1: unbounded
};

const OpInfo& op_info(Op op);
inline std::string_view op_name(Op op) { return op_info(op).name; }
std::optional<Op> op_from_name(std::string_view name);
std::string_view category_name(OpCategory c);
std::string_view arg_kind_name(ArgKind k);

inline bool is_alu(Op op) {
  auto c = op_info(op).category;
  return c == OpCategory::Unary || c == OpCategory::Binary || c == OpCategory::Ternary;
}
inline bool is_movement(Op op) { return op_info(op).category == OpCategory::Movement; }
// Binary ops whose operands may be swapped.
bool is_commutative(Op op);
// Ops whose result is bool whatever the operand type.
inline bool is_comparison(Op op) { return op == Op::CMPLT || op == Op::CMPNE || op == Op::CMPEQ; }

}  // namespace uop
