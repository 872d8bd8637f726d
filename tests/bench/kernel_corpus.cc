// The kernel corpus (kernel_corpus.h). Shapes are small: a compile's cost hardly depends
// on them, and a cache-hit run of every kernel stays in the microseconds.
#include "tests/bench/kernel_corpus.h"

namespace uop {
namespace {

// A float32 input of `shape`.
const UOp* f32(TensorBuilder& tb, std::vector<int64_t> shape) { return tb.input(Scalar::Float32, std::move(shape)); }
// A float32 scalar constant, broadcast by the op that uses it.
const UOp* scalar(TensorBuilder& tb, double v) { return tb.full(Scalar::Float32, v, {}); }

}  // namespace

const std::vector<CorpusGraph>& kernel_corpus() {
  static const std::vector<CorpusGraph> c = {
      // Elementwise chains.
      {"add", [](TensorBuilder& tb) { return tb.sink({tb.alu(Op::ADD, {f32(tb, {256, 256}), f32(tb, {256, 256})})}); }},
      {"axpy", [](TensorBuilder& tb) {
         return tb.sink({tb.alu(Op::ADD, {tb.alu(Op::MUL, {f32(tb, {4096}), scalar(tb, 2.5)}), f32(tb, {4096})})});
       }},
      {"bias_relu", [](TensorBuilder& tb) {
         return tb.sink({tb.alu(Op::MAX, {tb.alu(Op::ADD, {f32(tb, {128, 256}), f32(tb, {256})}), scalar(tb, 0)})});
       }},
      {"exp2_log2", [](TensorBuilder& tb) {
         return tb.sink({tb.alu(Op::LOG2, {tb.alu(Op::ADD, {tb.alu(Op::EXP2, {f32(tb, {64, 64})}), scalar(tb, 1)})})});
       }},
      {"rsqrt", [](TensorBuilder& tb) {
         const UOp* a = f32(tb, {1024});
         return tb.sink({tb.alu(Op::RECIPROCAL, {tb.alu(Op::SQRT, {tb.alu(Op::ADD, {tb.alu(Op::MUL, {a, a}), scalar(tb, 1e-6)})})})});
       }},
      {"where_min", [](TensorBuilder& tb) {
         const UOp *a = f32(tb, {64, 64}), *b = f32(tb, {64, 64});
         return tb.sink({tb.alu(Op::WHERE, {tb.alu(Op::CMPLT, {a, b}), a, tb.alu(Op::MUL, {b, scalar(tb, 0.5)})})});
       }},
      {"chain8", [](TensorBuilder& tb) {
         const UOp *x = f32(tb, {512, 64}), *y = f32(tb, {512, 64});
         for (int i = 0; i < 8; ++i) {
           const Op ops[] = {Op::MUL, Op::ADD, Op::MAX, Op::SUB};
           x = tb.alu(ops[i % 4], {x, i % 2 ? y : scalar(tb, 0.25 * (i + 1))});
         }
         return tb.sink({x});
       }},
      {"sin_pow", [](TensorBuilder& tb) { return tb.sink({tb.alu(Op::POW, {tb.alu(Op::SIN, {f32(tb, {2048})}), f32(tb, {2048})})}); }},
      {"cast_round_trip", [](TensorBuilder& tb) {
         const UOp* i = tb.cast(tb.alu(Op::MUL, {f32(tb, {32, 32}), scalar(tb, 100)}), Scalar::Int32);
         return tb.sink({tb.cast(i, Scalar::Float32)});
       }},
      {"outer_product", [](TensorBuilder& tb) { return tb.sink({tb.alu(Op::MUL, {f32(tb, {256, 1}), f32(tb, {1, 256})})}); }},
      {"two_outputs", [](TensorBuilder& tb) {
         const UOp *a = f32(tb, {1000}), *b = f32(tb, {1000});
         return tb.sink({tb.alu(Op::ADD, {a, b}), tb.alu(Op::SUB, {a, b})});
       }},
      // Reductions.
      {"sum_rows", [](TensorBuilder& tb) { return tb.sink({tb.reduce(f32(tb, {256, 256}), ReduceOp::Add, {1})}); }},
      {"sum_cols", [](TensorBuilder& tb) { return tb.sink({tb.reduce(f32(tb, {256, 256}), ReduceOp::Add, {0})}); }},
      {"max_rows", [](TensorBuilder& tb) { return tb.sink({tb.reduce(f32(tb, {64, 512}), ReduceOp::Max, {1})}); }},
      {"min_middle", [](TensorBuilder& tb) { return tb.sink({tb.reduce(f32(tb, {16, 32, 64}), ReduceOp::Min, {1})}); }},
      {"prod_rows", [](TensorBuilder& tb) { return tb.sink({tb.reduce(f32(tb, {64, 64}), ReduceOp::Mul, {1})}); }},
      {"sum_all", [](TensorBuilder& tb) { return tb.sink({tb.reduce(f32(tb, {256, 256}), ReduceOp::Add, {0, 1})}); }},
      {"row_norm", [](TensorBuilder& tb) {
         const UOp* a = f32(tb, {128, 128});
         return tb.sink({tb.alu(Op::SQRT, {tb.reduce(tb.alu(Op::MUL, {a, a}), ReduceOp::Add, {1})})});
       }},
      {"center_rows", [](TensorBuilder& tb) {
         const UOp* a = f32(tb, {128, 96});
         return tb.sink({tb.alu(Op::SUB, {a, tb.alu(Op::MUL, {tb.reduce(a, ReduceOp::Add, {1}), scalar(tb, 1.0 / 96)})})});
       }},
      {"softmax", [](TensorBuilder& tb) {
         const UOp* x = f32(tb, {32, 100});
         const UOp* e = tb.alu(Op::EXP2, {tb.alu(Op::SUB, {x, tb.reduce(x, ReduceOp::Max, {1})})});
         return tb.sink({tb.alu(Op::FDIV, {e, tb.reduce(e, ReduceOp::Add, {1})})});
       }},
      // Matmuls.
      {"matmul_32", [](TensorBuilder& tb) { return tb.sink({tb.matmul(f32(tb, {32, 32}), f32(tb, {32, 32}))}); }},
      {"matmul_64x128x32", [](TensorBuilder& tb) { return tb.sink({tb.matmul(f32(tb, {64, 128}), f32(tb, {128, 32}))}); }},
      {"batched_matmul", [](TensorBuilder& tb) { return tb.sink({tb.matmul(f32(tb, {4, 16, 32}), f32(tb, {4, 32, 16}))}); }},
      {"matvec", [](TensorBuilder& tb) { return tb.sink({tb.matmul(f32(tb, {256, 256}), f32(tb, {256, 1}))}); }},
      {"linear_relu", [](TensorBuilder& tb) {
         const UOp* y = tb.alu(Op::ADD, {tb.matmul(f32(tb, {64, 128}), f32(tb, {128, 64})), f32(tb, {64})});
         return tb.sink({tb.alu(Op::MAX, {y, scalar(tb, 0)})});
       }},
      // Movement ops.
      {"transpose", [](TensorBuilder& tb) { return tb.sink({tb.contiguous(tb.permute(f32(tb, {128, 256}), {1, 0}))}); }},
      {"permute3d_scale", [](TensorBuilder& tb) {
         return tb.sink({tb.alu(Op::MUL, {tb.permute(f32(tb, {8, 16, 32}), {2, 0, 1}), scalar(tb, 2)})});
       }},
      {"pad", [](TensorBuilder& tb) { return tb.sink({tb.alu(Op::ADD, {tb.pad(f32(tb, {64, 64}), {1, 2}, {3, 4}), scalar(tb, 1)})}); }},
      {"shrink", [](TensorBuilder& tb) {
         return tb.sink({tb.alu(Op::MUL, {tb.shrink(f32(tb, {64, 64}), {4, 8}, {60, 56}), scalar(tb, 3)})});
       }},
      {"flip_sub", [](TensorBuilder& tb) {
         const UOp* a = f32(tb, {64, 64});
         return tb.sink({tb.alu(Op::SUB, {tb.flip(a, {true, false}), a})});
       }},
      {"pad_shrink_flip", [](TensorBuilder& tb) {
         const UOp* y = tb.flip(tb.shrink(tb.pad(f32(tb, {20, 30}), {1, 0}, {0, 2}), {0, 1}, {21, 31}), {true, true});
         return tb.sink({tb.alu(Op::NEG, {y})});
       }},
      {"reshape_permute", [](TensorBuilder& tb) {
         const UOp* a = tb.reshape(tb.permute(tb.reshape(f32(tb, {64, 64}), {8, 8, 64}), {1, 0, 2}), {64, 64});
         return tb.sink({tb.alu(Op::ADD, {a, f32(tb, {64, 64})})});
       }},
      {"expand_add", [](TensorBuilder& tb) {
         return tb.sink({tb.alu(Op::ADD, {tb.expand(f32(tb, {1, 256}), {128, 256}), f32(tb, {128, 256})})});
       }},
      {"concat", [](TensorBuilder& tb) {
         const UOp *a = f32(tb, {32, 64}), *b = f32(tb, {32, 64});
         return tb.sink({tb.alu(Op::ADD, {tb.pad(a, {0, 0}, {32, 0}), tb.pad(b, {32, 0}, {0, 0})})});
       }},
  };
  return c;
}

}  // namespace uop
