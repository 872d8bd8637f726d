#include "compiler/ir/dtype.h"

#include <array>

namespace uop {
namespace {
constexpr std::array<std::string_view, kNumScalars> kScalarNames = {
    "void", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "index"};
constexpr std::array<int, kNumScalars> kScalarBytes = {0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 8};
constexpr std::array<int, kNumScalars> kScalarBits = {0, 1, 8, 16, 32, 64, 8, 16, 32, 64, 16, 16, 32, 64, 64};
}  // namespace

std::string_view scalar_name(Scalar s) { return kScalarNames[static_cast<int>(s)]; }

std::optional<Scalar> scalar_from_name(std::string_view name) {
  for (int i = 0; i < kNumScalars; ++i)
    if (kScalarNames[i] == name) return static_cast<Scalar>(i);
  return std::nullopt;
}

std::string_view addrspace_name(AddrSpace a) {
  switch (a) {
    case AddrSpace::Global: return "global";
    case AddrSpace::Local: return "local";
    case AddrSpace::Reg: return "reg";
  }
  return "?";
}

int scalar_bytes(Scalar s) { return kScalarBytes[static_cast<int>(s)]; }
int scalar_bits(Scalar s) { return kScalarBits[static_cast<int>(s)]; }

bool scalar_is_float(Scalar s) {
  return s == Scalar::Float16 || s == Scalar::BFloat16 || s == Scalar::Float32 || s == Scalar::Float64;
}
bool scalar_is_signed_int(Scalar s) {
  return s == Scalar::Int8 || s == Scalar::Int16 || s == Scalar::Int32 || s == Scalar::Int64 ||
         s == Scalar::Index;
}
bool scalar_is_unsigned_int(Scalar s) {
  return s == Scalar::UInt8 || s == Scalar::UInt16 || s == Scalar::UInt32 || s == Scalar::UInt64;
}

std::string DType::str() const {
  std::string base(scalar_name(scalar));
  if (count != 1) base = "<" + std::to_string(count) + " x " + base + ">";
  if (!ptr) return base;
  std::string out = "ptr<" + base + ", " + std::string(addrspace_name(addrspace));
  if (size >= 0) out += ", " + std::to_string(size);
  return out + ">";
}

}  // namespace uop
