// Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (log_softmax over the
// class axis, then the same picking), with class weights, ignore_index and the reductions
// none / sum / mean (mean divides by the total weight picked, as the ONNX spec says).
#include "compiler/onnx/op_helpers.h"

namespace uop::onnx_import {

namespace {

// input [N, C, d...] (log-probabilities), target [N, d...] of ints.
absl::StatusOr<const UOp*> nll(NodeContext& c, const UOp* input, const UOp* target, const UOp* weight) {
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims is = c.shape_of(input), ts = c.shape_of(target);
  if (is.size() < 2 || ts.size() != is.size() - 1 || ts[0] != is[0] || !target->dtype().is_int())
    return c.invalid("input must be [N, C, d...] and target [N, d...] of integers");
  for (size_t i = 1; i < ts.size(); ++i)
    if (ts[i] != is[i + 1]) return c.invalid("target's dims do not match input's");
  const int64_t C = is[1];
  std::string reduction = c.attr_string("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean") return c.invalid(cat("reduction '", reduction, "'"));
  Dims tr = ts;
  tr.insert(tr.begin() + 1, 1);
  Dims cr(is.size(), 1);
  cr[1] = C;
  const UOp* t = tb.broadcast_to(tb.reshape(target, tr), is);
  const UOp* hit = tb.alu(Op::CMPEQ, {t, tb.broadcast_to(iota(c, C, c.dtype_of(target), cr), is)});
  if (c.has_attr("ignore_index"))
    hit = m.and_(hit, m.ne(t, m.k(t, static_cast<double>(c.attr_int("ignore_index", 0)))));
  const UOp* picked = tb.reshape(tb.reduce(m.where(hit, input, m.k(input, 0)), ReduceOp::Add, {1}), ts);
  const UOp* w = weight ? tb.broadcast_to(tb.reshape(weight, cr), is) : tb.full(c.dtype_of(input), 1.0, is);
  const UOp* wsel = tb.reshape(tb.reduce(m.where(hit, w, m.k(input, 0)), ReduceOp::Add, {1}), ts);
  const UOp* loss = m.neg(m.mul(picked, wsel));
  if (reduction == "none") return loss;
  std::vector<int64_t> all;
  for (size_t i = 0; i < ts.size(); ++i) all.push_back(static_cast<int64_t>(i));
  const UOp* total = tb.reshape(tb.reduce(loss, ReduceOp::Add, all), {});
  if (reduction == "sum") return total;
  return m.div(total, tb.reshape(tb.reduce(wsel, ReduceOp::Add, all), {}));
}

absl::Status nll_op(NodeContext& c) {
  ONNX_ASSIGN(const UOp* input, c.in(0));
  ONNX_ASSIGN(const UOp* target, c.in(1));
  const UOp* weight = nullptr;
  if (c.has(2)) {
    ONNX_ASSIGN(weight, c.in(2));
  }
  ONNX_ASSIGN(const UOp* y, nll(c, input, target, weight));
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status sce_op(NodeContext& c) {
  ONNX_ASSIGN(const UOp* scores, c.in(0));
  ONNX_ASSIGN(const UOp* labels, c.in(1));
  const UOp* weight = nullptr;
  if (c.has(2)) {
    ONNX_ASSIGN(weight, c.in(2));
  }
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims s = c.shape_of(scores);
  if (s.size() < 2) return c.invalid("scores must be [N, C, d...]");
  const UOp* shifted = m.sub(scores, tb.broadcast_to(m.reduce(scores, ReduceOp::Max, {1}), s));
  const UOp* lp = m.sub(shifted, tb.broadcast_to(m.log(m.reduce(m.exp(shifted), ReduceOp::Add, {1})), s));
  ONNX_ASSIGN(const UOp* y, nll(c, lp, labels, weight));
  c.out(0, y);
  c.out(1, lp);
  return absl::OkStatus();
}

}  // namespace

void register_losses(Registry& r) {
  r["NegativeLogLikelihoodLoss"] = {nll_op, {"ignore_index", "reduction"}};
  r["SoftmaxCrossEntropyLoss"] = {sce_op, {"ignore_index", "reduction"}};
}

}  // namespace uop::onnx_import
