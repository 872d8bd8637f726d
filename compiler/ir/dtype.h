// DType: the element type of a UOp. A scalar kind, a vector width, and for pointers the
// address space and the number of elements behind the pointer. `index` is the type of
// loop counters and addresses: a signed integer as wide as the target needs (64 bits on
// CPU); the interpreter evaluates it as int64.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace uop {

enum class Scalar : uint8_t {
  Void, Bool,
  Int8, Int16, Int32, Int64,
  UInt8, UInt16, UInt32, UInt64,
  Float16, BFloat16, Float32, Float64,
  Index,
};
inline constexpr int kNumScalars = static_cast<int>(Scalar::Index) + 1;

enum class AddrSpace : uint8_t { Global, Local, Reg };

std::string_view scalar_name(Scalar s);
std::optional<Scalar> scalar_from_name(std::string_view name);
std::string_view addrspace_name(AddrSpace a);

// Size in bytes of one scalar of this kind (bool is 1, index is 8, void is 0).
int scalar_bytes(Scalar s);
bool scalar_is_float(Scalar s);
bool scalar_is_signed_int(Scalar s);    // int8..int64 and index
bool scalar_is_unsigned_int(Scalar s);  // uint8..uint64
inline bool scalar_is_int(Scalar s) { return scalar_is_signed_int(s) || scalar_is_unsigned_int(s); }
// Bits of the integer or float kind; bool is 1, index is 64.
int scalar_bits(Scalar s);

struct DType {
  Scalar scalar = Scalar::Void;
  uint32_t count = 1;        // vector width; 1 for scalars
  bool ptr = false;          // a pointer to `count` x `scalar`
  AddrSpace addrspace = AddrSpace::Global;  // pointers only
  int64_t size = -1;         // pointers only: elements behind the pointer, -1 unknown

  constexpr DType() = default;
  constexpr explicit DType(Scalar s, uint32_t c = 1) : scalar(s), count(c) {}

  // addrspace and size only mean something for pointers, so only pointers compare them
  // (the digest encodes them only for pointers too).
  bool operator==(const DType& o) const {
    return scalar == o.scalar && count == o.count && ptr == o.ptr &&
           (!ptr || (addrspace == o.addrspace && size == o.size));
  }

  DType vec(uint32_t n) const { DType d = *this; d.count = n; return d; }
  // The scalar element type: vector width 1, not a pointer.
  DType element() const { return DType(scalar); }
  DType ptr_to(AddrSpace as = AddrSpace::Global, int64_t elements = -1) const {
    DType d = *this; d.ptr = true; d.addrspace = as; d.size = elements; return d;
  }
  // What a pointer points at (the value type).
  DType pointee() const { DType d(scalar, count); return d; }

  bool is_void() const { return scalar == Scalar::Void && !ptr; }
  bool is_bool() const { return !ptr && scalar == Scalar::Bool; }
  bool is_float() const { return !ptr && scalar_is_float(scalar); }
  bool is_int() const { return !ptr && scalar_is_int(scalar); }
  bool is_signed() const { return !ptr && scalar_is_signed_int(scalar); }
  bool is_unsigned() const { return !ptr && scalar_is_unsigned_int(scalar); }
  bool is_index() const { return !ptr && scalar == Scalar::Index; }
  bool is_vector() const { return count != 1; }
  int itemsize() const { return scalar_bytes(scalar); }  // bytes of one scalar
  int64_t bytes() const { return int64_t(itemsize()) * count; }

  // float32, <4 x float32>, ptr<float32, global, 1024>
  std::string str() const;

  template <typename H>
  friend H AbslHashValue(H h, const DType& d) {
    if (!d.ptr) return H::combine(std::move(h), d.scalar, d.count, d.ptr);
    return H::combine(std::move(h), d.scalar, d.count, d.ptr, d.addrspace, d.size);
  }
};

namespace dtypes {
inline constexpr DType void_{Scalar::Void};
inline constexpr DType bool_{Scalar::Bool};
inline constexpr DType int8{Scalar::Int8};
inline constexpr DType int16{Scalar::Int16};
inline constexpr DType int32{Scalar::Int32};
inline constexpr DType int64{Scalar::Int64};
inline constexpr DType uint8{Scalar::UInt8};
inline constexpr DType uint16{Scalar::UInt16};
inline constexpr DType uint32{Scalar::UInt32};
inline constexpr DType uint64{Scalar::UInt64};
inline constexpr DType float16{Scalar::Float16};
inline constexpr DType bfloat16{Scalar::BFloat16};
inline constexpr DType float32{Scalar::Float32};
inline constexpr DType float64{Scalar::Float64};
inline constexpr DType index{Scalar::Index};
}  // namespace dtypes

}  // namespace uop
