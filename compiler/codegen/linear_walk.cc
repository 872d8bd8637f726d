#include "compiler/codegen/linear_walk.h"

#include "compiler/ir/verifier.h"

namespace uop {

namespace linear_walk_internal {

std::string number(const NodeIndex& ix, const UOp* u) {
  auto it = ix.find(u);
  return it == ix.end() ? std::string("?") : std::to_string(it->second);
}

absl::Status refuse(const NodeIndex& ix, const UOp* u, std::string_view why) {
  return absl::InvalidArgumentError(cat("node ", number(ix, u), " (", op_name(u->op()), "): ", why));
}

absl::Status broken(const NodeIndex& ix, const UOp* u, std::string_view what) {
  return absl::InternalError(cat("node ", number(ix, u), " (", op_name(u->op()), ") ", what,
                                 " although the LINEAR verified: a bug in the renderer or the verifier"));
}

}  // namespace linear_walk_internal

absl::Status verify_for_rendering(const UOp* linear, std::string_view who) {
  if (!linear || !linear->is(Op::LINEAR)) return absl::InvalidArgumentError(cat(who, " needs a LINEAR"));
  return verify_linear(linear, {.allow_custom = true});
}

}  // namespace uop
