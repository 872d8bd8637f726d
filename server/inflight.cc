#include "server/inflight.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "compiler/support/strings.h"

namespace uop::server {

uint64_t usable_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : uint64_t{8} << 30;
  // cgroup v2 ("max" when unlimited), then v1.
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(path);
    std::string v;
    if (!(f >> v) || v.empty() || v.find_first_not_of("0123456789") != std::string::npos) continue;
    uint64_t limit = std::stoull(v);
    if (limit > 0) bytes = std::min(bytes, limit);
  }
  return bytes;
}

ByteBudget::Hold& ByteBudget::Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    shrink(held_);
    budget_ = o.budget_;
    cap_ = o.cap_;
    held_ = o.held_;
    o.held_ = 0;
  }
  return *this;
}

absl::Status ByteBudget::Hold::grow(uint64_t n, std::string_view what) {
  if (!budget_ || n == 0) return absl::OkStatus();
  if (n > cap_ || held_ > cap_ - n) {
    ++budget_->refusals_;
    return absl::ResourceExhaustedError(cat(what, ": ", n, " more bytes on top of the ", held_,
                                            " this request holds pass what one request may hold at once (",
                                            cap_, " bytes, --max-request-memory)"));
  }
  uint64_t used = budget_->used_.load();
  do {
    if (n > budget_->limit_ || used > budget_->limit_ - n) {
      ++budget_->refusals_;
      return absl::ResourceExhaustedError(cat(what, ": ", n, " bytes would pass the server's budget for bytes in flight (",
                                              used, " of ", budget_->limit_,
                                              " bytes in use by requests now, --max-inflight-bytes); retry later"));
    }
  } while (!budget_->used_.compare_exchange_weak(used, used + n));
  held_ += n;
  return absl::OkStatus();
}

void ByteBudget::Hold::shrink(uint64_t n) {
  n = std::min(n, held_);
  if (!budget_ || n == 0) return;
  held_ -= n;
  budget_->used_ -= n;
}

}  // namespace uop::server
