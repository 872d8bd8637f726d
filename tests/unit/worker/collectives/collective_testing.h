// Shared by the collectives tests: members as forked processes (results and statuses
// come back through MAP_SHARED memory), deterministic inputs per (dtype, op, rank), and
// the reference result computed with eval_alu in the shm ring's order.
//
// The parent never initializes gRPC: a process forked from one that did cannot use gRPC
// safely, so a Gloo test forks its rendezvous server as one more child.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"
#include "worker/collectives/reduce.h"
#include "worker/collectives/shm_ring.h"

namespace uop::testing {

// A MAP_SHARED anonymous mapping: what children write, the parent reads after they exit.
class SharedMemory {
 public:
  explicit SharedMemory(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
    p_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p_ == MAP_FAILED) p_ = nullptr;
  }
  ~SharedMemory() {
    if (p_) munmap(p_, bytes_);
  }
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }

 private:
  size_t bytes_;
  void* p_;
};

inline double monotonic_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // one clock for every process of the machine
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// What a member reports: its status and when it returned.
struct MemberReport {
  int code = -1;  // -1: never reported (crashed or killed)
  double done_at = 0;
  char message[1000] = {};
  absl::Status status() const {
    if (code < 0) return absl::InternalError("the member never reported");
    return absl::Status(static_cast<absl::StatusCode>(code), message);
  }
};

struct Child {
  pid_t pid = -1;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// Forks a child that runs fn and exits (0), dying with the test if that dies first.
inline pid_t fork_child(const std::function<void()>& fn) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    fn();
    _exit(0);
  }
  return pid;
}

// Runs member(rank) in `n` forked processes and returns their reports (in rank order).
// `during`, if given, runs in the parent while they do, with their pids.
inline std::vector<MemberReport> run_members(int n, const std::function<absl::Status(int rank)>& member,
                                             const std::function<void(const std::vector<pid_t>&)>& during = {},
                                             std::chrono::seconds limit = std::chrono::seconds(240)) {
  SharedMemory reports(sizeof(MemberReport) * n);
  auto* rep = new (reports.data()) MemberReport[n];
  std::vector<Child> children(n);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    children[r].pid = fork_child([&, r] {
      absl::Status st = member(r);
      rep[r].done_at = monotonic_s();
      std::strncpy(rep[r].message, std::string(st.message()).c_str(), sizeof rep[r].message - 1);
      rep[r].code = static_cast<int>(st.code());
    });
    pids.push_back(children[r].pid);
  }
  if (during) during(pids);
  const double give_up = monotonic_s() + limit.count();
  for (Child& c : children) {
    int status = 0;
    while (waitpid(c.pid, &status, WNOHANG) == 0) {
      if (monotonic_s() > give_up) {
        ADD_FAILURE() << "a member hung; killed";
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    c.pid = -1;
  }
  return std::vector<MemberReport>(rep, rep + n);
}

// ---- inputs and the reference ----------------------------------------------------------

inline uint64_t mix(uint64_t x) {  // splitmix64: cheap, deterministic in every process
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Inputs repeat with this period (a prime, so it divides no part, slot or chunk size):
// a 64 MiB case then costs the reference kInputPeriod evaluations per part instead of
// one per element, while every element of the result is still compared, and an element
// that lands at the wrong place (by anything but a multiple of the period) still shows.
inline constexpr uint64_t kInputPeriod = 262139;

// Element i of rank r (i < kInputPeriod; see fill_input): full-range bits for integers; for floats values of moderate size
// (so products of a few stay finite), with NaN, +-0 and +-inf at fixed places.
inline ConstValue input_value(Scalar t, ReduceOp op, int rank, uint64_t i) {
  uint64_t h = mix(i * 131 + static_cast<uint64_t>(rank) * 0x1000193 + static_cast<uint64_t>(t) * 7919 + static_cast<uint64_t>(op));
  if (t == Scalar::Bool) return ConstValue::Bool(h & 1);
  if (!scalar_is_float(t)) return bits_to_value(h, t);
  switch (i % 97) {  // the same specials at the same places on every rank, sometimes
    case 3: return ConstValue::Float(std::nan(""));
    case 5: return ConstValue::Float(rank % 2 ? -0.0 : 0.0);
    case 7: return ConstValue::Float(-0.0);
    case 11: return ConstValue::Float(rank == 0 ? INFINITY : 1.0);
    default: break;
  }
  double u = static_cast<double>(h >> 11) / 9007199254740992.0;  // [0, 1)
  double v = op == ReduceOp::Mul ? (0.5 + 1.5 * u) * ((h & 1) ? -1 : 1) : (u - 0.5) * 200;
  return cast_value(ConstValue::Float(v), t);
}

inline void fill_input(Scalar t, ReduceOp op, int rank, uint64_t n, void* out) {
  const int esize = scalar_bytes(t);
  uint8_t* o = static_cast<uint8_t*>(out);
  for (uint64_t i = 0; i < std::min(n, kInputPeriod); ++i) {
    uint64_t bits = value_to_bits(input_value(t, op, rank, i), t);
    std::memcpy(o + i * esize, &bits, esize);  // little-endian
  }
  for (uint64_t i = kInputPeriod; i < n; i += kInputPeriod)
    std::memcpy(o + i * esize, o, std::min(kInputPeriod, n - i) * esize);
}

// The input element i of a rank holds (fill_input's period).
inline ConstValue input_at(Scalar t, ReduceOp op, int rank, uint64_t i) { return input_value(t, op, rank, i % kInputPeriod); }

inline uint64_t load_bits(const void* p, Scalar t, uint64_t i) {
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const uint8_t*>(p) + i * scalar_bytes(t), scalar_bytes(t));
  return bits;
}

// The allreduce of every member's input, folded with eval_alu in the shm ring's order:
// part j starts at rank j and each next rank combines its value with the running one.
inline std::vector<uint8_t> ring_reference(Scalar t, ReduceOp op, int n, uint64_t elements) {
  std::vector<uint8_t> out(elements * scalar_bytes(t));
  const Op alu = reduce_combine_op(op);
  for (int j = 0; j < n; ++j) {
    RingPart part = ring_part(elements, n, j);
    const uint64_t distinct = std::min(part.count, kInputPeriod);
    for (uint64_t i = part.offset; i < part.offset + distinct; ++i) {
      ConstValue acc = input_at(t, op, j, i);
      for (int s = 1; s < n; ++s) {
        ConstValue args[2] = {input_at(t, op, (j + s) % n, i), acc};
        acc = *eval_alu(alu, t, args);
      }
      uint64_t bits = value_to_bits(acc, t);
      std::memcpy(out.data() + i * scalar_bytes(t), &bits, scalar_bytes(t));
    }
    // Past one period, element i of the part folds the same values as element i - period.
    for (uint64_t i = part.offset + distinct; i < part.offset + part.count; ++i)
      std::memcpy(out.data() + i * scalar_bytes(t), out.data() + (i - kInputPeriod) * scalar_bytes(t), scalar_bytes(t));
  }
  return out;
}

inline bool is_nan_bits(Scalar t, uint64_t bits) {
  return scalar_is_float(t) && std::isnan(bits_to_value(bits, t).as_float());
}

// Bit-for-bit, except that any NaN matches any NaN. With `tolerant` (a reduction in
// another order: Gloo's float ADD / MUL), finite floats may differ by a few ulps of the
// sum of magnitudes. Returns the first mismatch, or -1.
inline int64_t first_mismatch(Scalar t, ReduceOp op, int n, const void* got, const std::vector<uint8_t>& want,
                              uint64_t elements, bool tolerant) {
  for (uint64_t i = 0; i < elements; ++i) {
    uint64_t g = load_bits(got, t, i), w = load_bits(want.data(), t, i);
    if (g == w || (is_nan_bits(t, g) && is_nan_bits(t, w))) continue;
    if (tolerant && scalar_is_float(t) && (op == ReduceOp::Add || op == ReduceOp::Mul)) {
      double gv = bits_to_value(g, t).as_float(), wv = bits_to_value(w, t).as_float();
      double scale = 0;
      for (int r = 0; r < n; ++r) scale += std::fabs(input_at(t, op, r, i).as_float());
      if (op == ReduceOp::Mul) scale = std::fabs(wv);
      double eps = t == Scalar::Float16 ? 0x1p-10 : t == Scalar::BFloat16 ? 0x1p-7 : t == Scalar::Float32 ? 0x1p-23 : 0x1p-52;
      if (std::isfinite(gv) && std::isfinite(wv) && std::fabs(gv - wv) <= 2 * n * eps * scale) continue;
    }
    return static_cast<int64_t>(i);
  }
  return -1;
}

// ---- many cases on one group ----------------------------------------------------------

// One allreduce of a sweep: every member fills its input for (dtype, op), reduces, and
// checks its own result.
struct SweepCase {
  Scalar dtype;
  ReduceOp op;
  uint64_t elements;
};

// Every op defined on each of `types` (combine_function refuses the others), at each size.
inline std::vector<SweepCase> sweep_cases(const std::vector<Scalar>& types, const std::vector<uint64_t>& sizes) {
  std::vector<SweepCase> out;
  for (Scalar t : types)
    for (ReduceOp op : {ReduceOp::Add, ReduceOp::Mul, ReduceOp::Max, ReduceOp::Min}) {
      if (!combine_function(op, t).ok()) continue;
      for (uint64_t n : sizes) out.push_back({t, op, n});
    }
  return out;
}

// Runs the sweep in one member of a group of `n` through `allreduce` (in place), one case
// after another on the same group, each result against ring_reference; the first wrong
// element or failed call comes back as an error naming the case.
inline absl::Status run_sweep(int rank, int n, const std::vector<SweepCase>& cases, bool tolerant,
                              const std::function<absl::Status(void*, uint64_t, ReduceOp, Scalar)>& allreduce) {
  for (const SweepCase& c : cases) {
    const std::string what = cat(reduce_op_wire_name(c.op), " on ", c.elements, " ", scalar_name(c.dtype));
    std::vector<uint8_t> buf(c.elements * scalar_bytes(c.dtype) + 1);
    fill_input(c.dtype, c.op, rank, c.elements, buf.data());
    if (absl::Status st = allreduce(buf.data(), c.elements, c.op, c.dtype); !st.ok())
      return absl::Status(st.code(), cat(what, ": ", st.message()));
    const std::vector<uint8_t> want = ring_reference(c.dtype, c.op, n, c.elements);
    int64_t bad = first_mismatch(c.dtype, c.op, n, buf.data(), want, c.elements, tolerant);
    if (bad >= 0)
      return absl::InternalError(cat(what, ": element ", bad, " is ",
                                     bits_to_value(load_bits(buf.data(), c.dtype, bad), c.dtype).str(), ", eval_alu says ",
                                     bits_to_value(load_bits(want.data(), c.dtype, bad), c.dtype).str()));
  }
  return absl::OkStatus();
}

}  // namespace uop::testing
