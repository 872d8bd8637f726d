#!/usr/bin/python3
"""ConvTranspose as PyTorch exports it, read by a following Conv, for tests/conformance
(onnx_conv_transpose).

Writes one case per model under conv_transpose/ beside this script, in the layout `uop
onnx-test` reads (see make_recurrent.py, whose writer it uses), the outputs being what
torch computes. The U-Net pattern: an up-sampling ConvTranspose (kernel 2, stride 2) whose
output a 3x3 Conv reads, alone and concatenated with a skip connection; the Conv's
windows over an unrealized ConvTranspose once made one kernel past --max-kernel-ops.

Needs PyTorch and the onnx package (deploy/setup.sh --bench). The files are checked in.
"""
import os
import shutil
import warnings

import torch

from make_recurrent import write_tensor

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv_transpose")


class UpThenConv(torch.nn.Module):
    def __init__(self, skip):
        super().__init__()
        self.skip = skip
        self.up = torch.nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.conv = torch.nn.Conv2d(16 if skip else 8, 8, 3, padding=1)

    def forward(self, x, *skip):
        y = self.up(x)
        return self.conv(torch.cat([y, skip[0]], 1) if self.skip else y)


# name, a skip connection concatenated after the ConvTranspose
MODELS = [("up_then_conv", False), ("up_concat_skip_then_conv", True)]


def export(index, name, skip):
    torch.manual_seed(2000 + index)
    model = UpThenConv(skip).eval()
    inputs = [torch.randn(1, 16, 16, 16)] + ([torch.randn(1, 8, 32, 32)] if skip else [])
    input_names = ["x", "skip"][:len(inputs)]
    with torch.no_grad():
        y = model(*inputs)
    case = os.path.join(OUT, name)
    shutil.rmtree(case, ignore_errors=True)
    os.makedirs(os.path.join(case, "test_data_set_0"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(inputs), os.path.join(case, "model.onnx"), input_names=input_names,
                          output_names=["y"])
    for k, (n, t) in enumerate(zip(input_names, inputs)):
        write_tensor(os.path.join(case, "test_data_set_0", f"input_{k}.pb"), n, t)
    write_tensor(os.path.join(case, "test_data_set_0", "output_0.pb"), "y", y)
    print(f"{name}: {os.path.getsize(os.path.join(case, 'model.onnx'))} bytes")


def main():
    os.makedirs(OUT, exist_ok=True)
    for i, m in enumerate(MODELS):
        export(i, *m)


if __name__ == "__main__":
    main()
