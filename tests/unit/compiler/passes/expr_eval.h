// A test-only scalar evaluator: the value of an expression of CONST, DEFINE_VAR / RANGE /
// SPECIAL (values from an environment), BIND, ALU, CAST and BITCAST, through eval.h. It is
// the oracle the symbolic tests check simplified expressions against.
#pragma once

#include <cmath>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/uop.h"

namespace uop::testing {

// Values of the leaves that are not constants: DEFINE_VAR, RANGE, SPECIAL.
using Env = absl::flat_hash_map<const UOp*, ConstValue>;

// nullopt if the expression holds an op this evaluator does not know, a leaf missing from
// `env`, or an op eval.h leaves undefined on its dtype.
inline std::optional<ConstValue> eval_expr(const UOp* root, const Env& env) {
  absl::flat_hash_map<const UOp*, ConstValue> val;
  for (const UOp* u : toposort(root)) {
    std::optional<ConstValue> v;
    Op op = u->op();
    if (op == Op::CONST) {
      v = *u->const_value();
    } else if (op == Op::DEFINE_VAR || op == Op::RANGE || op == Op::SPECIAL) {
      if (auto it = env.find(u); it != env.end()) v = it->second;
    } else if (op == Op::BIND) {
      v = val.at(u->src(1));
    } else if (op == Op::CAST) {
      v = cast_value(val.at(u->src(0)), u->dtype().scalar);
    } else if (op == Op::BITCAST) {
      v = bitcast_value(val.at(u->src(0)), u->src(0)->dtype().scalar, u->dtype().scalar);
    } else if (is_alu(op)) {
      std::vector<ConstValue> args;
      for (const UOp* s : u->src()) args.push_back(val.at(s));
      v = eval_alu(op, u->src(op == Op::WHERE ? 1 : 0)->dtype().scalar, args);
    }
    if (!v) return std::nullopt;
    val.emplace(u, *v);
  }
  return val.at(root);
}

// Bit-exact equality, except that any NaN equals any NaN.
inline bool same_value(const ConstValue& a, const ConstValue& b) {
  if (a.kind() == ConstValue::Kind::Float && b.kind() == ConstValue::Kind::Float &&
      std::isnan(a.as_float()) && std::isnan(b.as_float()))
    return true;
  return a == b;
}

}  // namespace uop::testing
