// How long something took, the way every report field (plan_ms, compile_ms, run_ms, ...)
// states it: milliseconds on the steady clock, as a double so short stages do not read 0.
#pragma once

#include <chrono>

namespace uop {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace uop
