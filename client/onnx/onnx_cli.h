// The `uop` verbs for ONNX models (uop_main.cc dispatches to them):
//   uop run MODEL.onnx --in NAME=FILE.npy ... [--out NAME=FILE.npy ...]
//   uop onnx-test CASE_DIR... [--cases-from LIST --root DIR] [--shard I/N] [--interp]
// Both talk to the uopd given by --server / UOPD_ADDRESS, or start one with --embedded;
// onnx-test --interp runs the reference interpreter in this process instead.
#pragma once

#include <string>

#include "client/cli.h"

namespace uop::onnx_import {

// True when the command is one of these verbs.
bool is_onnx_command(const cli::Args& a);
// Runs it; returns the exit code (0 ok, 1 failure, 2 usage). self_exe locates the uopd
// that --embedded starts.
int onnx_command(const cli::Args& a, const std::string& self_exe);

}  // namespace uop::onnx_import
