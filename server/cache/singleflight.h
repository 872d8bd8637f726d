// Singleflight<T>: concurrent callers asking for the same key share one execution of the
// work. The first caller (the leader) starts it; the others join and get a copy of its
// result. Once the result is published the key is forgotten, so a later call runs the
// work again: the caller is expected to have stored the result somewhere it looks first
// (the compile cache puts the artifact into its memory tier before publishing).
//
// The work need not run on the leader's thread (the compile cache hands it to the compile
// pool), and callers need not wait for it to the end: each holds a Ticket, which counts as
// wanting the result until the caller's deadline passes or the ticket is dropped (the
// client went away). The work asks wanted() between its steps and gives up once nobody
// waits, while a call still wanted by one caller keeps going for that caller.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace uop {

template <typename T>
class Singleflight {
 public:
  // One execution, shared by the callers of its key.
  class Call {
   public:
    // Whether any caller still waits for the result: one holds a ticket and its deadline
    // has not passed.
    bool wanted(absl::Time now = absl::Now()) const {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, deadline] : waiters_)
        if (deadline > now) return true;
      return false;
    }
    // Callers holding a ticket, whatever their deadlines (for messages and tests).
    size_t waiters() const {
      absl::MutexLock lock(&mu_);
      return waiters_.size();
    }

   private:
    friend class Singleflight;
    std::string key_;
    absl::Notification done_;
    std::optional<T> result_;  // written once, before done_ is notified
    mutable absl::Mutex mu_;
    absl::flat_hash_map<uint64_t, absl::Time> waiters_ ABSL_GUARDED_BY(mu_);
    uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  };

  // A caller's place in a call. Movable; dropping it (or moving over it) leaves the call.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& o) noexcept { *this = std::move(o); }
    Ticket& operator=(Ticket&& o) noexcept {
      if (this != &o) {
        leave();
        call_ = std::move(o.call_);
        id_ = o.id_;
        leader_ = o.leader_;
        o.call_.reset();
      }
      return *this;
    }
    ~Ticket() { leave(); }

    bool leader() const { return leader_; }
    const std::shared_ptr<Call>& call() const { return call_; }

    // Blocks until the result is published, or until `deadline` passes or `gone()` says
    // the caller stopped waiting (polled every `poll`; gone may be empty): the result, or
    // nullopt when the caller stopped first. Either way the ticket has left the call.
    std::optional<T> wait(absl::Time deadline, const std::function<bool()>& gone,
                          absl::Duration poll = absl::Milliseconds(20)) {
      if (!call_) return std::nullopt;
      while (!call_->done_.WaitForNotificationWithTimeout(std::min(poll, deadline - absl::Now()))) {
        if (absl::Now() >= deadline || (gone && gone())) {
          leave();
          return std::nullopt;
        }
      }
      std::optional<T> out = *call_->result_;
      leave();
      return out;
    }

   private:
    friend class Singleflight;
    void leave() {
      if (!call_) return;
      {
        absl::MutexLock lock(&call_->mu_);
        call_->waiters_.erase(id_);
      }
      call_.reset();
    }
    std::shared_ptr<Call> call_;
    uint64_t id_ = 0;
    bool leader_ = false;
  };

  // Joins the call in flight for `key`, wanting its result until `deadline`, or starts
  // one: then `start(call)` runs on this thread, with no lock held, and must see to it
  // that publish(call, ...) happens exactly once, on any thread (it may do the work
  // itself, or hand it to a pool).
  Ticket join(const std::string& key, absl::Time deadline,
              const std::function<void(const std::shared_ptr<Call>&)>& start) {
    Ticket t;
    {
      absl::MutexLock lock(&mu_);
      auto [it, inserted] = calls_.try_emplace(key);
      if (inserted) {
        it->second = std::make_shared<Call>();
        it->second->key_ = key;
      }
      t.call_ = it->second;
      t.leader_ = inserted;
      absl::MutexLock call_lock(&t.call_->mu_);
      t.id_ = t.call_->next_id_++;
      t.call_->waiters_.emplace(t.id_, deadline);
    }
    if (t.leader_) start(t.call_);
    return t;
  }

  // The call's result, for every caller waiting and those that join before the key is
  // forgotten here; from now on a caller of the key starts a new call.
  void publish(const std::shared_ptr<Call>& call, T value) {
    call->result_.emplace(std::move(value));
    {
      // Forget the key before waking the waiters: they already hold the Call, and a new
      // caller from here on must not join a call whose result it would not see as fresh.
      absl::MutexLock lock(&mu_);
      auto it = calls_.find(call->key_);
      if (it != calls_.end() && it->second == call) calls_.erase(it);
    }
    call->done_.Notify();  // publishes `result_` to every waiter (Notify happens-before Wait)
  }

  // The whole of it on the caller's thread, waiting as long as it takes: fn's result and
  // whether this caller was the leader that ran it.
  std::pair<T, bool> do_call(const std::string& key, std::function<T()> fn) {
    Ticket t = join(key, absl::InfiniteFuture(), [&](const std::shared_ptr<Call>& call) { publish(call, fn()); });
    bool leader = t.leader();
    return {*t.wait(absl::InfiniteFuture(), nullptr), leader};
  }

  // Keys with a call in flight (for tests and metrics).
  size_t in_flight() const {
    absl::MutexLock lock(&mu_);
    return calls_.size();
  }
  // Callers holding a ticket for the call in flight for `key`, 0 when there is none (for
  // tests: a call can be held until every caller has joined it).
  size_t waiters(const std::string& key) const {
    std::shared_ptr<Call> call;
    {
      absl::MutexLock lock(&mu_);
      auto it = calls_.find(key);
      if (it == calls_.end()) return 0;
      call = it->second;
    }
    return call->waiters();
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace uop
