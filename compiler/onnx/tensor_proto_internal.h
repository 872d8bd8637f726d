// The TensorProto conversion for code that already holds a parsed proto (the importer's
// initializers, Constant nodes' tensor attributes). Includes ONNX's generated headers, so
// it is for compiler/onnx's own sources only.
#pragma once

#include <onnx/onnx_pb.h>

#include "absl/status/statusor.h"
#include "compiler/interp/host_tensor.h"

namespace uop::onnx_import {

// `what` names the tensor in messages ("initializer 'W'").
absl::StatusOr<HostTensor> tensor_from_proto(const onnx::TensorProto& t, std::string_view what);

}  // namespace uop::onnx_import
