// The `uop` verbs for ONNX models (uop_main.cc dispatches to them):
//   uop run MODEL.onnx --in NAME=FILE.npy ... [--out NAME=FILE.npy ...]
//   uop compile|explain MODEL.onnx [--in NAME=FILE.npy ...]  (imported here, see import_graph)
//   uop onnx-test CASE_DIR... [--cases-from LIST --root DIR] [--shard I/N] [--interp]
// Both talk to the uopd given by --server / UOPD_ADDRESS, or start one with --embedded;
// onnx-test --interp runs the reference interpreter in this process instead.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "client/cli.h"
#include "compiler/ir/codec.h"

namespace uop::onnx_import {

// True when the command is one of these verbs.
bool is_onnx_command(const cli::Args& a);
// Runs it; returns the exit code (0 ok, 1 failure, 2 usage). self_exe locates the uopd
// that --embedded starts.
int onnx_command(const cli::Args& a, const std::string& self_exe);

// `uop compile MODEL.onnx` and `uop explain MODEL.onnx`: the model imported here (its
// weights become BUFFERs like its inputs; nothing is uploaded, uopd sees the graph only),
// for the shapes --in fixes, as the graph those commands take. The path is the command's
// positional argument.
bool is_onnx_graph_command(const cli::Args& a);
absl::StatusOr<DecodedGraph> import_graph(const cli::Args& a);

}  // namespace uop::onnx_import
