// ONNX TensorProto <-> HostTensor: how initializers, Constant nodes and the backend tests'
// input_*.pb / output_*.pb files become tensors. ONNX element types map one to one onto
// Scalar; strings, complex numbers and data stored outside the file have no Scalar and are
// refused with UNIMPLEMENTED naming the type, so callers can report them as unsupported.
//
// The protobuf types stay out of this header (only importer internals include
// <onnx/onnx_pb.h>): tensors come in as serialized bytes or through the internal
// overload in onnx_proto_internal.h.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "compiler/interp/host_tensor.h"

namespace uop::onnx_import {

// ONNX TensorProto.DataType -> Scalar; nullopt for STRING, COMPLEX*, UNDEFINED and
// anything unknown.
std::optional<Scalar> scalar_from_onnx(int elem_type);
// The ONNX name of an element type ("FLOAT", "STRING"), for messages.
std::string onnx_type_name(int elem_type);

// A serialized TensorProto (a .pb file of the backend tests) -> its name and tensor.
struct NamedTensor {
  std::string name;
  HostTensor tensor;
};
absl::StatusOr<NamedTensor> parse_tensor_proto(std::string_view bytes, std::string_view what = "<memory>");
absl::StatusOr<NamedTensor> read_tensor_proto(const std::string& path);

}  // namespace uop::onnx_import
