// Singleflight<T>: concurrent callers asking for the same key share one execution of the
// work. The first caller (the leader) runs it; the others block until it finishes and get
// a copy of its result. Once the leader is done the key is forgotten, so a later call runs
// the work again: the caller is expected to have stored the result somewhere it looks
// first (the compile cache puts the artifact into its memory tier before finishing).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace uop {

template <typename T>
class Singleflight {
 public:
  // Returns fn's result and whether this caller was the leader that ran it.
  std::pair<T, bool> do_call(const std::string& key, std::function<T()> fn) {
    std::shared_ptr<Call> call;
    bool leader = false;
    {
      absl::MutexLock lock(&mu_);
      auto [it, inserted] = calls_.try_emplace(key);
      if (inserted) it->second = std::make_shared<Call>();
      call = it->second;
      leader = inserted;
    }
    if (!leader) {
      call->done.WaitForNotification();
      return {*call->result, false};
    }
    call->result.emplace(fn());
    {
      // Forget the key before waking the waiters: they already hold the Call, and a new
      // caller from here on must not join a call whose result it would not see as fresh.
      absl::MutexLock lock(&mu_);
      calls_.erase(key);
    }
    call->done.Notify();  // publishes `result` to every waiter (Notify happens-before Wait)
    return {*call->result, true};
  }

  // Keys with a call in flight (for tests and metrics).
  size_t in_flight() const {
    absl::MutexLock lock(&mu_);
    return calls_.size();
  }

 private:
  struct Call {
    absl::Notification done;
    std::optional<T> result;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace uop
