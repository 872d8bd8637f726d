// TensorProto decoding. A tensor's values live in exactly one place: raw_data (little-
// endian bytes, the layout HostTensor keeps) or the typed repeated field the ONNX spec
// assigns to its element type (int32_data also carries the 8/16-bit ints, bool and the
// 16-bit floats' bit patterns; uint64_data carries uint32 and uint64). The element count
// must match the dims exactly; a file is never trusted to be consistent.
#include "compiler/onnx/tensor_proto.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "compiler/onnx/tensor_proto_internal.h"
#include "compiler/support/strings.h"

namespace uop::onnx_import {

std::optional<Scalar> scalar_from_onnx(int elem_type) {
  using T = onnx::TensorProto;
  switch (elem_type) {
    case T::FLOAT: return Scalar::Float32;
    case T::UINT8: return Scalar::UInt8;
    case T::INT8: return Scalar::Int8;
    case T::UINT16: return Scalar::UInt16;
    case T::INT16: return Scalar::Int16;
    case T::INT32: return Scalar::Int32;
    case T::INT64: return Scalar::Int64;
    case T::BOOL: return Scalar::Bool;
    case T::FLOAT16: return Scalar::Float16;
    case T::DOUBLE: return Scalar::Float64;
    case T::UINT32: return Scalar::UInt32;
    case T::UINT64: return Scalar::UInt64;
    case T::BFLOAT16: return Scalar::BFloat16;
    default: return std::nullopt;
  }
}

std::string onnx_type_name(int elem_type) {
  if (onnx::TensorProto::DataType_IsValid(elem_type))
    return onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(elem_type));
  return cat("type ", elem_type);
}

namespace {

// Copies a typed repeated field into `out`, element by element through HostTensor::set_bits
// (the field holds each value widened; set_bits keeps the low bytes).
template <typename Field>
void copy_bits(const Field& field, HostTensor& out) {
  for (int i = 0; i < field.size(); ++i) out.set_bits(i, static_cast<uint64_t>(field.Get(i)));
}

}  // namespace

absl::StatusOr<HostTensor> tensor_from_proto(const onnx::TensorProto& t, std::string_view what) {
  if (t.data_location() == onnx::TensorProto::EXTERNAL)
    return absl::UnimplementedError(cat(what, ": data stored outside the model file is not supported"));
  std::optional<Scalar> s = scalar_from_onnx(t.data_type());
  if (!s) return absl::UnimplementedError(cat(what, ": element type ", onnx_type_name(t.data_type()), " is not supported"));
  std::vector<int64_t> shape(t.dims().begin(), t.dims().end());
  std::optional<int64_t> n = checked_numel(shape);
  if (!n || *n > (int64_t{1} << 34)) return absl::InvalidArgumentError(cat(what, ": invalid dims ", shape_str(shape)));
  const int64_t bytes = *n * scalar_bytes(*s);

  using T = onnx::TensorProto;
  int64_t have = -1;  // elements present in the field that holds the data
  if (t.has_raw_data()) {
    have = static_cast<int64_t>(t.raw_data().size()) / scalar_bytes(*s);
    if (static_cast<int64_t>(t.raw_data().size()) != bytes)
      return absl::InvalidArgumentError(cat(what, ": raw_data holds ", t.raw_data().size(), " bytes, dims ",
                                            shape_str(shape), " of ", scalar_name(*s), " need ", bytes));
  } else {
    switch (t.data_type()) {
      case T::FLOAT: have = t.float_data_size(); break;
      case T::DOUBLE: have = t.double_data_size(); break;
      case T::INT64: have = t.int64_data_size(); break;
      case T::UINT32: case T::UINT64: have = t.uint64_data_size(); break;
      default: have = t.int32_data_size(); break;
    }
    if (have != *n)
      return absl::InvalidArgumentError(cat(what, ": holds ", have, " values, dims ", shape_str(shape), " need ", *n));
  }

  HostTensor out = HostTensor::zeros(*s, shape);
  if (t.has_raw_data()) {
    std::memcpy(out.data.data(), t.raw_data().data(), static_cast<size_t>(bytes));
  } else {
    switch (t.data_type()) {
      case T::FLOAT:
        for (int i = 0; i < t.float_data_size(); ++i) {
          float f = t.float_data(i);
          std::memcpy(out.data.data() + 4 * i, &f, 4);
        }
        break;
      case T::DOUBLE:
        for (int i = 0; i < t.double_data_size(); ++i) {
          double d = t.double_data(i);
          std::memcpy(out.data.data() + 8 * i, &d, 8);
        }
        break;
      case T::INT64: copy_bits(t.int64_data(), out); break;
      case T::UINT32: case T::UINT64: copy_bits(t.uint64_data(), out); break;
      default: copy_bits(t.int32_data(), out); break;
    }
  }
  // A bool byte other than 0 / 1 would not be a value of the type.
  if (*s == Scalar::Bool)
    for (char& c : out.data) c = c != 0;
  return out;
}

absl::StatusOr<NamedTensor> parse_tensor_proto(std::string_view bytes, std::string_view what) {
  onnx::TensorProto t;
  if (!t.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return absl::InvalidArgumentError(cat(what, ": not a TensorProto"));
  auto ht = tensor_from_proto(t, what);
  if (!ht.ok()) return ht.status();
  return NamedTensor{t.name(), std::move(*ht)};
}

absl::StatusOr<NamedTensor> read_tensor_proto(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(cat("cannot read ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_tensor_proto(ss.str(), path);
}

}  // namespace uop::onnx_import
