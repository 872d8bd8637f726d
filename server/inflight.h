// The scheduler's budget for bytes in flight: what requests hold in uopd's own memory at
// once (request bodies as received and as parsed, decoded graphs, inline inputs, outputs
// waiting to be sent). A request reserves before it spends; a reservation that does not
// fit is RESOURCE_EXHAUSTED naming the limit (--max-inflight-bytes, or the one request's
// own --max-request-memory), never an allocation that fails. Reservations are estimates
// made from sizes the server has checked, so they hold before the memory is touched.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace uop::server {

// Physical memory this process may use: the machine's, or its cgroup's limit when lower
// (a container's).
uint64_t usable_memory_bytes();

class ByteBudget {
 public:
  explicit ByteBudget(uint64_t limit) : limit_(limit) {}

  // What one request holds of the budget; it gives everything back when it goes.
  // Movable, not copyable; one thread at a time.
  class Hold {
   public:
    Hold() = default;
    Hold(ByteBudget* budget, uint64_t cap) : budget_(budget), cap_(cap) {}
    Hold(Hold&& o) noexcept : budget_(o.budget_), cap_(o.cap_), held_(o.held_) { o.held_ = 0; }
    Hold& operator=(Hold&& o) noexcept;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { shrink(held_); }

    // Takes `n` more bytes for `what` ("parsing the request"): RESOURCE_EXHAUSTED naming
    // the request's cap or the server's budget when either would be passed.
    absl::Status grow(uint64_t n, std::string_view what);
    // Gives back `n` of what it holds (all of it at most).
    void shrink(uint64_t n);
    uint64_t held() const { return held_; }

   private:
    ByteBudget* budget_ = nullptr;
    uint64_t cap_ = 0;
    uint64_t held_ = 0;
  };

  // A hold for one request, which may take at most `cap` bytes at once.
  Hold hold(uint64_t cap) { return Hold(this, cap); }

  uint64_t limit() const { return limit_; }
  uint64_t in_use() const { return used_.load(); }
  // Reservations refused since the start.
  uint64_t refusals() const { return refusals_.load(); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
  std::atomic<uint64_t> refusals_{0};
};

}  // namespace uop::server
