#include "compiler/support/strings.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace uop::strings_internal {

void append(std::string& out, double d) {
  if (std::isnan(d)) { out.append("nan"); return; }
  if (std::isinf(d)) { out.append(d > 0 ? "inf" : "-inf"); return; }
  char buf[40];
  for (int prec = 6; prec <= 17; ++prec) {  // the shortest precision that round-trips
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  out.append(buf);
}

}  // namespace uop::strings_internal
