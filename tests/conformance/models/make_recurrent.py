#!/usr/bin/python3
"""Recurrent models as PyTorch exports them, for tests/conformance (onnx_recurrent).

Writes one case per model under recurrent/ beside this script, in the layout of the ONNX
backend node tests that `uop onnx-test` reads: NAME/model.onnx and
NAME/test_data_set_0/{input,output}_K.pb, the outputs being what torch computes. The
models are nn.LSTM and nn.GRU with and without batch_first, one and two layers, one and
two directions, small (hidden size 8) with torch's random initialization under a fixed
seed, exported by torch.onnx.export as it is (the Shape / Gather / Expand of the initial
state, the weight reordering, the Squeeze / Transpose around the recurrence).

Needs PyTorch and the onnx package (deploy/setup.sh --bench). Run it again after changing
the list; the files are checked in, so the tests never need torch.
"""
import os
import shutil
import warnings

import torch
from onnx import numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recurrent")
SEQ, BATCH, INPUT, HIDDEN = 4, 2, 4, 8

# name, module, layers, batch_first, bidirectional, initial state given as an input[,
# sequence length (default SEQ)]
MODELS = [
    ("lstm", torch.nn.LSTM, 1, False, False, False),
    ("lstm_batch_first", torch.nn.LSTM, 1, True, False, False),
    ("lstm_two_layers", torch.nn.LSTM, 2, False, False, False),
    ("lstm_two_layers_batch_first", torch.nn.LSTM, 2, True, False, False),
    ("lstm_bidirectional", torch.nn.LSTM, 1, False, True, False),
    ("lstm_bidirectional_two_layers_batch_first", torch.nn.LSTM, 2, True, True, False),
    ("lstm_initial_state", torch.nn.LSTM, 1, False, False, True),
    ("gru", torch.nn.GRU, 1, False, False, False),
    ("gru_batch_first", torch.nn.GRU, 1, True, False, False),
    ("gru_two_layers", torch.nn.GRU, 2, False, False, False),
    ("gru_two_layers_batch_first", torch.nn.GRU, 2, True, False, False),
    ("gru_bidirectional", torch.nn.GRU, 1, False, True, False),
    ("gru_bidirectional_two_layers_batch_first", torch.nn.GRU, 2, True, True, False),
    ("gru_initial_state", torch.nn.GRU, 1, True, False, True),
    # A longer sequence, whose unrolled state must not end up in one kernel.
    ("lstm_long_sequence", torch.nn.LSTM, 1, True, False, False, 48),
    ("gru_long_sequence", torch.nn.GRU, 1, True, False, False, 48),
]


def write_tensor(path, name, t):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(t.detach().numpy(), name).SerializeToString())


def export(index, name, cls, layers, batch_first, bidirectional, with_state, seq=SEQ):
    torch.manual_seed(1000 + index)
    model = cls(INPUT, HIDDEN, num_layers=layers, batch_first=batch_first, bidirectional=bidirectional).eval()
    x = torch.randn(BATCH, seq, INPUT) if batch_first else torch.randn(seq, BATCH, INPUT)
    lstm = cls is torch.nn.LSTM
    state_shape = (layers * (2 if bidirectional else 1), BATCH, HIDDEN)
    inputs, input_names = [x], ["x"]
    if with_state:
        h0 = torch.randn(*state_shape)
        if lstm:
            c0 = torch.randn(*state_shape)
            inputs, input_names = [x, h0, c0], ["x", "h0", "c0"]
            args = (x, (h0, c0))
        else:
            inputs, input_names = [x, h0], ["x", "h0"]
            args = (x, h0)
    else:
        args = (x,)
    output_names = ["y", "h", "c"] if lstm else ["y", "h"]
    with torch.no_grad():
        y, state = model(*args)
    outputs = [y, *state] if lstm else [y, state]
    case = os.path.join(OUT, name)
    shutil.rmtree(case, ignore_errors=True)
    os.makedirs(os.path.join(case, "test_data_set_0"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on batch sizes and initial states
        torch.onnx.export(model, args, os.path.join(case, "model.onnx"), input_names=input_names,
                          output_names=output_names)
    for k, (n, t) in enumerate(zip(input_names, inputs)):
        write_tensor(os.path.join(case, "test_data_set_0", f"input_{k}.pb"), n, t)
    for k, (n, t) in enumerate(zip(output_names, outputs)):
        write_tensor(os.path.join(case, "test_data_set_0", f"output_{k}.pb"), n, t)
    print(f"{name}: {os.path.getsize(os.path.join(case, 'model.onnx'))} bytes")


def main():
    os.makedirs(OUT, exist_ok=True)
    for i, m in enumerate(MODELS):
        export(i, *m)


if __name__ == "__main__":
    main()
