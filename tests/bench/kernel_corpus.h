// The corpus of small kernels bench_cpu compiles cold and loads from cache: tensor graphs
// of the kinds real models are made of (elementwise chains, reductions, matmuls, movement
// ops), each built with TensorBuilder into a fresh Graph by the caller. Kept apart so a
// compile-time benchmark and whoever profiles the compile path use the same kernels.
#pragma once

#include <vector>

#include "compiler/ir/tensor_builder.h"

namespace uop {

struct CorpusGraph {
  const char* name;
  // Builds the graph's SINK; every input is float32, made with TensorBuilder::input.
  const UOp* (*build)(TensorBuilder& tb);
};

// 34 graphs that plan into 38 distinct kernels (softmax and center_rows plan into more
// than one kernel, and two_outputs into two).
const std::vector<CorpusGraph>& kernel_corpus();

}  // namespace uop
