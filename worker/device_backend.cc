// The launch checks every device backend shares (see device_backend.h).
#include "worker/device_backend.h"

#include <algorithm>
#include <utility>

#include "compiler/support/strings.h"

namespace uop {

absl::Status check_launch_args(const KernelAbi& abi, std::span<const uintptr_t> addresses,
                               std::span<const int64_t> vars) {
  if (static_cast<int64_t>(addresses.size()) != abi.num_buffers())
    return absl::InvalidArgumentError(cat("kernel takes ", abi.num_buffers(), " buffers, got ", addresses.size()));
  if (vars.size() != abi.vars.size())
    return absl::InvalidArgumentError(cat("kernel takes ", abi.vars.size(), " variables, got ", vars.size()));
  for (size_t k = 0; k < vars.size(); ++k) {
    const KernelVar& v = abi.vars[k];
    // The bounds stage proved every index in range for variables inside these bounds.
    if (vars[k] < v.min || vars[k] > v.max)
      return absl::InvalidArgumentError(cat("variable '", v.name, "' = ", vars[k], " is outside [", v.min, ", ", v.max, "]"));
  }
  auto extent = [&](const KernelParam& p) {
    uintptr_t lo = addresses[p.slot];
    return std::pair<uintptr_t, uintptr_t>(lo, lo + static_cast<uintptr_t>(p.size * p.dtype.bytes()));
  };
  for (const KernelParam& p : abi.params) {
    if (p.size > 0 && !addresses[p.slot]) return absl::InvalidArgumentError(cat("buffer ", p.slot, " is null"));
    // The code assumes element alignment (and may use it for vector loads).
    if (addresses[p.slot] % std::max(1, p.dtype.itemsize()) != 0)
      return absl::InvalidArgumentError(cat("buffer ", p.slot, " is not aligned to its ", p.dtype.itemsize(), "-byte elements"));
    if (!p.written) continue;
    auto [lo, hi] = extent(p);
    for (const KernelParam& q : abi.params) {
      if (q.slot == p.slot) continue;
      auto [qlo, qhi] = extent(q);
      if (lo < qhi && qlo < hi)
        return absl::InvalidArgumentError(cat("buffer ", p.slot, " is written and overlaps buffer ", q.slot));
    }
  }
  return absl::OkStatus();
}

}  // namespace uop
