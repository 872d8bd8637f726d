// Arg: the typed payload of a UOp besides its sources and dtype. Each op carries exactly
// one kind (ops.def, column ARG); the variant's alternative order is ArgKind's order.
// All alternatives compare by value and hash with absl, which is what hash consing needs.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "compiler/ir/dtype.h"
#include "compiler/ir/op.h"

namespace uop {

// A compile-time scalar. The kind follows the dtype it belongs to: bool -> Bool,
// signed ints and index -> Int, unsigned ints -> UInt, floats -> Float (held as a double;
// every float16 / bfloat16 / float32 value is exact in a double). Equality is bitwise, so
// 0.0 != -0.0 and a NaN equals the same NaN.
class ConstValue {
 public:
  enum class Kind : uint8_t { Bool, Int, UInt, Float };

  constexpr ConstValue() = default;
  static constexpr ConstValue Bool(bool v) { return ConstValue(Kind::Bool, v ? 1 : 0); }
  static constexpr ConstValue Int(int64_t v) { return ConstValue(Kind::Int, static_cast<uint64_t>(v)); }
  static constexpr ConstValue UInt(uint64_t v) { return ConstValue(Kind::UInt, v); }
  static ConstValue Float(double v) { return ConstValue(Kind::Float, std::bit_cast<uint64_t>(v)); }
  // The kind a value of this scalar type has.
  static Kind kind_of(Scalar s);

  Kind kind() const { return kind_; }
  uint64_t bits() const { return bits_; }
  bool as_bool() const { return bits_ != 0; }
  int64_t as_int() const { return static_cast<int64_t>(bits_); }
  uint64_t as_uint() const { return bits_; }
  double as_float() const { return std::bit_cast<double>(bits_); }
  // The value as a double / int64 whatever its kind (a plain C conversion).
  double to_double() const;
  int64_t to_int() const;

  std::string str() const;

  bool operator==(const ConstValue&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const ConstValue& c) { return H::combine(std::move(h), c.kind_, c.bits_); }

 private:
  constexpr ConstValue(Kind k, uint64_t b) : kind_(k), bits_(b) {}
  Kind kind_ = Kind::Int;
  uint64_t bits_ = 0;
};

enum class AxisType : uint8_t {
  Placeholder, Loop, Global, Thread, Warp, Local, GroupReduce, Upcast, Reduce, Unroll,
};
std::string_view axis_type_name(AxisType t);
// Nesting priority from the Bestiary: smaller is outer.
int axis_type_priority(AxisType t);

enum class ReduceOp : uint8_t { Add, Mul, Max, Min };
std::string_view reduce_op_name(ReduceOp r);

enum class CustomFunctionKind : uint8_t { EncDec, Graph };

#define UOP_ARG_EQ(T)                             \
  bool operator==(const T&) const = default;       \
  template <typename H>                             \
  friend H AbslHashValue(H h, const T& a) { return H::combine(std::move(h), a.tie()); }

struct NoArg {
  bool operator==(const NoArg&) const = default;
  template <typename H> friend H AbslHashValue(H h, const NoArg&) { return h; }
};
struct VConstArg {
  std::vector<ConstValue> values;
  auto tie() const { return std::tie(values); }
  UOP_ARG_EQ(VConstArg)
};
struct IntArg {
  int64_t value = 0;
  auto tie() const { return std::tie(value); }
  UOP_ARG_EQ(IntArg)
};
struct IntsArg {
  std::vector<int64_t> values;
  auto tie() const { return std::tie(values); }
  UOP_ARG_EQ(IntsArg)
};
struct BoolsArg {
  std::vector<bool> values;
  auto tie() const { return std::tie(values); }
  UOP_ARG_EQ(BoolsArg)
};
// RANGE: axis id (unrenumbered before kernel splitting, renumbered after) and axis type.
struct RangeArg {
  int64_t axis_id = 0;
  AxisType type = AxisType::Loop;
  bool renumbered = false;
  auto tie() const { return std::tie(axis_id, type, renumbered); }
  UOP_ARG_EQ(RangeArg)
};
struct ReduceAxisArg {
  ReduceOp op = ReduceOp::Add;
  std::vector<int64_t> axes;
  auto tie() const { return std::tie(op, axes); }
  UOP_ARG_EQ(ReduceAxisArg)
};
struct ReduceOpArg {
  ReduceOp op = ReduceOp::Add;
  auto tie() const { return std::tie(op); }
  UOP_ARG_EQ(ReduceOpArg)
};
struct BufferArg {
  int64_t size = 0;  // elements
  auto tie() const { return std::tie(size); }
  UOP_ARG_EQ(BufferArg)
};
struct BufferViewArg {
  int64_t size = 0;    // elements
  int64_t offset = 0;  // elements
  auto tie() const { return std::tie(size, offset); }
  UOP_ARG_EQ(BufferViewArg)
};
struct BufferizeArg {
  std::string device;  // empty: the device of the computation
  AddrSpace addrspace = AddrSpace::Global;
  bool removable = true;
  auto tie() const { return std::tie(device, addrspace, removable); }
  UOP_ARG_EQ(BufferizeArg)
};
// PARAM: position in the kernel's argument list and element count.
struct ParamArg {
  int64_t slot = 0;
  int64_t size = 0;
  auto tie() const { return std::tie(slot, size); }
  UOP_ARG_EQ(ParamArg)
};
struct DefineVarArg {
  std::string name;
  int64_t min = 0;
  int64_t max = 0;
  auto tie() const { return std::tie(name, min, max); }
  UOP_ARG_EQ(DefineVarArg)
};
struct DefineRegArg {
  int64_t size = 0;
  int64_t id = 0;
  auto tie() const { return std::tie(size, id); }
  UOP_ARG_EQ(DefineRegArg)
};
struct StrArg {
  std::string value;
  auto tie() const { return std::tie(value); }
  UOP_ARG_EQ(StrArg)
};
struct BytesArg {
  std::string value;
  auto tie() const { return std::tie(value); }
  UOP_ARG_EQ(BytesArg)
};
// UNROLL / CONTRACT: (axis index, factor) pairs.
struct AxisFactorsArg {
  std::vector<std::pair<int64_t, int64_t>> factors;
  auto tie() const { return std::tie(factors); }
  UOP_ARG_EQ(AxisFactorsArg)
};
// WMMA metadata, field for field the Bestiary's WmmaMetadata.
struct WmmaArg {
  std::string name;  // instruction name
  int64_t n = 0, m = 0, k = 0;
  Scalar dtype_in = Scalar::Float16;
  Scalar dtype_out = Scalar::Float32;
  std::string device;  // renderer / tensor-core backend that produced it
  int64_t threads = 32;
  std::vector<std::pair<int64_t, int64_t>> upcast_a, upcast_b, upcast_c;
  std::vector<std::pair<int64_t, int64_t>> reduce_axes;
  int64_t tile_grid_x = 1, tile_grid_y = 1;
  auto tie() const {
    return std::tie(name, n, m, k, dtype_in, dtype_out, device, threads, upcast_a, upcast_b,
                    upcast_c, reduce_axes, tile_grid_x, tile_grid_y);
  }
  UOP_ARG_EQ(WmmaArg)
};
struct CallInfoArg {
  std::string name;
  std::string grad_tag;
  std::vector<std::string> metadata;
  bool precompile = false;
  bool precompile_backward = false;
  auto tie() const { return std::tie(name, grad_tag, metadata, precompile, precompile_backward); }
  UOP_ARG_EQ(CallInfoArg)
};
// SINK: marks a kernel AST apart from a plain SINK with the same sources.
struct KernelInfoArg {
  bool kernel = false;
  std::string name;
  auto tie() const { return std::tie(kernel, name); }
  UOP_ARG_EQ(KernelInfoArg)
};
// DEVICE: one device ("CPU:0", "CUDA:1") or several for multi-device tensors.
struct DeviceArg {
  std::vector<std::string> devices;
  auto tie() const { return std::tie(devices); }
  UOP_ARG_EQ(DeviceArg)
};
struct CustomFunctionArg {
  CustomFunctionKind kind = CustomFunctionKind::EncDec;
  std::string name;
  auto tie() const { return std::tie(kind, name); }
  UOP_ARG_EQ(CustomFunctionArg)
};
#undef UOP_ARG_EQ

using Arg = std::variant<NoArg, ConstValue, VConstArg, IntArg, IntsArg, BoolsArg, RangeArg,
                         ReduceAxisArg, ReduceOpArg, BufferArg, BufferViewArg, BufferizeArg,
                         ParamArg, DefineVarArg, DefineRegArg, StrArg, BytesArg, AxisFactorsArg,
                         WmmaArg, CallInfoArg, KernelInfoArg, DeviceArg, CustomFunctionArg>;
static_assert(std::variant_size_v<Arg> == kNumArgKinds, "Arg alternatives follow ArgKind");
static_assert(std::is_same_v<std::variant_alternative_t<static_cast<int>(ArgKind::CustomFunction), Arg>,
                             CustomFunctionArg>);
static_assert(std::is_same_v<std::variant_alternative_t<static_cast<int>(ArgKind::Range), Arg>, RangeArg>);

inline ArgKind arg_kind(const Arg& a) { return static_cast<ArgKind>(a.index()); }
// The default value of an arg kind (what Graph::make uses when none is given).
Arg default_arg(ArgKind k);
// A hash of the alternative and its value (absl::Hash takes only absl::variant here).
size_t hash_arg(const Arg& a);
// A short human form for the printer: "Add, axes=[1]", "3.5", "R0 Global".
std::string arg_str(const Arg& a);

}  // namespace uop
