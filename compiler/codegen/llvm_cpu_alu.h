// Private to the LLVM CPU backend (llvm_cpu_render.cc): the lowering of values, i.e. dtypes,
// constants, ALU ops, CAST, BITCAST and vector ops, to LLVM IR with ir/eval.h's exact semantics.
// LLVM types are only forward-declared here, so this header stays LLVM-free.
#pragma once

#include <span>

#include "compiler/ir/arg.h"
#include "compiler/ir/dtype.h"
#include "compiler/ir/uop.h"

namespace llvm {
class Constant;
class IRBuilderBase;
class Type;
class Value;
}  // namespace llvm

namespace uop::llvm_cpu {

// The type a value of dtype `d` has in registers: bool is i1, index i64, bfloat16 its
// 16 bits as an i16 (all its arithmetic goes through float, see llvm_cpu_alu.cc), a
// vector an LLVM vector. nullptr for void, pointers and empty vectors.
llvm::Type* value_type(llvm::IRBuilderBase& b, DType d);
// The type in memory: as value_type, but bool is a byte.
llvm::Type* memory_type(llvm::IRBuilderBase& b, DType d);
llvm::Value* to_memory(llvm::IRBuilderBase& b, llvm::Value* v, DType d);
llvm::Value* from_memory(llvm::IRBuilderBase& b, llvm::Value* v, DType d);

// A constant of dtype `d`: one value (splat over a vector) or one per lane, each
// converted to the dtype with CAST semantics.
llvm::Constant* constant(llvm::IRBuilderBase& b, DType d, std::span<const ConstValue> lanes);

// One ALU op, CAST or BITCAST whose sources are already lowered to `srcs` (register
// form), on dtypes the verifier allows (it refuses those eval.h does not define); nullptr
// only if the lowering lacks a case the verifier allows, a bug.
llvm::Value* lower_alu(llvm::IRBuilderBase& b, const UOp* u, std::span<llvm::Value* const> srcs);

// VECTORIZE, CAT (lanes of the sources, in order) and GEP (lanes picked by the arg), as
// the verifier checked them.
llvm::Value* lower_vector(llvm::IRBuilderBase& b, const UOp* u, std::span<llvm::Value* const> srcs);

}  // namespace uop::llvm_cpu
