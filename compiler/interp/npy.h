// NumPy .npy files <-> HostTensor: how `uopc run` takes inputs and gives outputs, and how
// tests exchange data with NumPy. Format versions 1.0, 2.0 and 3.0 are read; 1.0 is
// written (2.0 when the header would not fit in 1.0's 16-bit length).
//
// Files are untrusted: every malformed header, unsupported dtype or order, overflowing
// shape, or data shorter or longer than the header says is an InvalidArgumentError
// "NAME: problem". Nothing is allocated before the header has been checked against the
// bytes actually present.
//
// dtypes: bool '|b1'; int8..int64 '|i1' '<i2' '<i4' '<i8'; uint8..uint64 '|u1' '<u2'
// '<u4' '<u8'; float16 / float32 / float64 '<f2' '<f4' '<f8'. NumPy has no bfloat16;
// ml_dtypes' bfloat16 arrays are saved by np.save with descr '<V2', so bfloat16 is written
// as '<V2' and '<V2' / '|V2' are read as bfloat16 (the only two-byte opaque type we know).
// The interpreter's `index` dtype is written as '<i8' (and reads back as int64).
// Big-endian data and Fortran order (for rank >= 2; rank 0 and 1 are the same bytes in
// both orders) are refused rather than converted.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/interp/host_tensor.h"

namespace uop {

struct NpyLimits {
  int64_t max_header_bytes = 1 << 16;  // NumPy itself refuses headers over 10000 bytes
  int max_rank = 64;                   // NumPy's own limit
};

// `name` is what error messages call the input (a path, or "<memory>").
absl::StatusOr<HostTensor> parse_npy(std::string_view bytes, std::string_view name = "<memory>",
                                     const NpyLimits& limits = {});
std::string serialize_npy(const HostTensor& t);

absl::StatusOr<HostTensor> read_npy(const std::string& path, const NpyLimits& limits = {});
absl::Status write_npy(const std::string& path, const HostTensor& t);

// The descr a tensor of this dtype is written with ("<f4"); nullopt for void.
std::optional<std::string> npy_descr(Scalar s);
// The dtype a descr reads as; nullopt when unsupported (big-endian included).
std::optional<Scalar> scalar_from_npy_descr(std::string_view descr);

}  // namespace uop
