// What the tensor-level and kernel-level interpreters share: naming a node in an error,
// and evaluating one scalar op (ALU, CAST, BITCAST) through ir/eval.h after checking the
// dtype rules that make eval_alu's answer meaningful. Private to compiler/interp and the
// GPU emulator (compiler/gpu_emu), which evaluates each lane of a vector op with it so
// that it computes what the interpreter computes.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/uop.h"
#include "compiler/support/strings.h"

namespace uop::interp_internal {


inline bool is_scalar_value(const DType& d) { return !d.ptr && d.count == 1 && d.scalar != Scalar::Void; }
inline bool is_scalar_op(Op op) { return is_alu(op) || op == Op::CAST || op == Op::BITCAST; }

// "node N (OP)" for messages, numbered by toposort of the root (README, Errors).
class Namer {
 public:
  explicit Namer(const UOp* root) : root_(root) {}
  absl::Status error(const UOp* u, std::string_view what,
                     absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    if (!index_) index_ = index_by_toposort(root_);
    auto it = index_->find(u);
    std::string where = it != index_->end() ? std::to_string(it->second) : "?";
    return absl::Status(code, cat("node ", where, " (", op_name(u->op()), "): ", what));
  }
  const NodeIndex& index() {
    if (!index_) index_ = index_by_toposort(root_);
    return *index_;
  }

 private:
  const UOp* root_;
  std::optional<NodeIndex> index_;
};

// The dtype rules a scalar op (ALU, CAST, BITCAST) needs before eval_alu can be trusted
// with its operands; "" when they hold. The verifier checks the same, but the oracle must
// not compute nonsense from a graph nobody verified.
inline std::string check_scalar_op(const UOp* u) {
  const OpInfo& info = op_info(u->op());
  if (static_cast<int>(u->num_src()) != info.min_src) return cat("has ", u->num_src(), " sources");
  if (!is_scalar_value(u->dtype())) return cat("the interpreter evaluates scalar dtypes, not ", u->dtype().str());
  for (const UOp* s : u->src())
    if (!is_scalar_value(s->dtype())) return cat("operand of dtype ", s->dtype().str(), " is not a scalar value");
  const Scalar out = u->dtype().scalar, in = u->src(0)->dtype().scalar;
  if (u->is(Op::CAST)) return "";
  if (u->is(Op::BITCAST)) {
    if (scalar_bits(in) != scalar_bits(out) || in == Scalar::Bool || out == Scalar::Bool)
      return cat("cannot bitcast ", scalar_name(in), " to ", scalar_name(out));
    return "";
  }
  const bool where = u->is(Op::WHERE);
  const Scalar t = where ? u->src(1)->dtype().scalar : in;
  if (where && in != Scalar::Bool) return cat("the condition is ", scalar_name(in), ", not bool");
  for (size_t i = where ? 1 : 0; i < u->num_src(); ++i)
    if (u->src(i)->dtype().scalar != t)
      return cat("operands have different dtypes ", scalar_name(t), " and ", scalar_name(u->src(i)->dtype().scalar));
  const Scalar want = is_comparison(u->op()) ? Scalar::Bool : t;
  if (out != want) return cat("result dtype is ", scalar_name(out), ", expected ", scalar_name(want));
  return "";
}

// One scalar op on values of its operands' dtypes (check_scalar_op has passed).
inline std::optional<ConstValue> apply_scalar_op(const UOp* u, std::span<const ConstValue> args) {
  if (u->is(Op::CAST)) return cast_value(args[0], u->dtype().scalar);
  if (u->is(Op::BITCAST)) return bitcast_value(args[0], u->src(0)->dtype().scalar, u->dtype().scalar);
  Scalar t = (u->is(Op::WHERE) ? u->src(1) : u->src(0))->dtype().scalar;
  return eval_alu(u->op(), t, args);
}

// A CONST's value as a value of its dtype (a wire graph may spell 2.0 as the int 2).
inline ConstValue const_of(const UOp* u) {
  ConstValue v = *u->const_value();
  return is_value_of(v, u->dtype().scalar) ? v : cast_value(v, u->dtype().scalar);
}

}  // namespace uop::interp_internal
