"""Models held by uopd: an ONNX model loaded once into a session (its weights stay there
as buffers) and called as often as wanted, sending only its inputs; and PyTorch modules
exported to ONNX in memory (from_torch; torch is optional)."""
from __future__ import annotations

import inspect
import io
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from uopd import calls, errors, results


class Model:
    """A model of a session (Session.load_model): ``model(x=array)`` runs it and answers
    its outputs by name. ``inputs`` / ``outputs`` list names, dtypes and shapes as uopd
    imported them; the weights are ``weight_buffers`` buffers (``weight_bytes``) of the
    session, freed with it."""

    def __init__(self, session: Any, resp: Any):
        self.session = session
        self.id: str = resp.model_id
        self.inputs: List[results.TensorInfo] = results.tensor_infos(resp.inputs)
        self.outputs: List[results.TensorInfo] = results.tensor_infos(resp.outputs)
        self.weight_buffers: int = resp.weight_buffers
        self.weight_bytes: int = resp.weight_bytes
        self.import_ms: float = resp.import_ms

    def _flow(self, args: Sequence[Any], named: Dict[str, Any], keep_outputs: bool, profile: bool) -> calls.Flow:
        s = self.session
        inputs = calls.model_inputs(self.inputs, args, named)
        flow = calls.run_model(s.id, self.id, inputs, keep_outputs, profile, s._chunk_bytes, s._make_buffer)
        return calls.then(flow, self._named)

    def _named(self, r: results.RunResult) -> results.RunResult:
        """uopd names a model's outputs out0, out1, ... in the model's order: here they get
        the model's names and declared shapes, as `uop run MODEL.onnx` gives them."""
        named: Dict[str, Any] = {}
        for i, (key, value) in enumerate(r.outputs.items()):
            if i >= len(self.outputs):
                named[key] = value
                continue
            info = self.outputs[i]
            if isinstance(value, np.ndarray) and value.size == int(np.prod(info.shape, dtype=np.int64)):
                value = value.reshape(info.shape)
            elif isinstance(value, calls.BufferRef) and hasattr(value, "shape"):
                value.shape = info.shape
            named[info.name] = value
        r.outputs = named
        return r

    def __call__(self, *args: Any, **named: Any) -> Dict[str, np.ndarray]:
        """Runs the model: inputs positionally in ``inputs`` order, by name, or as one dict;
        arrays or Buffers of the session. Its outputs by name, as arrays."""
        return self.session._drive(calls.then(self._flow(args, named, False, False), lambda r: r.outputs))

    def execute(self, *args: Any, keep_outputs: bool = False, profile: bool = False, **named: Any) -> results.RunResult:
        """As calling it, with the whole answer (see Session.execute)."""
        return self.session._drive(self._flow(args, named, keep_outputs, profile))

    def profile(self, *args: Any, **named: Any) -> List[results.KernelProfile]:
        """Runs it with every launch timed: one row per kernel, slowest first."""
        return self.session._drive(calls.then(self._flow(args, named, False, True), lambda r: r.profile))

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.inputs)
        outs = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.outputs)
        return f"uopd.Model({self.id[:12]}, ({ins}) -> ({outs}))"


def torch_onnx(module: Any, example_inputs: Sequence[Any], input_names: Optional[Sequence[str]] = None,
               output_names: Optional[Sequence[str]] = None, opset: Optional[int] = None) -> bytes:
    """`module` exported by torch.onnx.export into memory, for the example inputs (whose
    shapes the model is imported for). Input names default to the parameters of its
    forward(), output names to output0, output1, ..."""
    try:
        import torch
    except ImportError:
        raise ImportError("uopd.from_torch needs PyTorch (`import torch` failed); install it, "
                          "e.g. deploy/setup.sh --bench (python3-torch)") from None
    if not example_inputs:
        raise errors.InvalidArgument("from_torch needs example inputs (the shapes the model is imported for)")
    if input_names is None:
        params = list(inspect.signature(module.forward).parameters)
        input_names = params[:len(example_inputs)] if len(params) >= len(example_inputs) else None
        if input_names is None:
            input_names = [f"input{i}" for i in range(len(example_inputs))]
    buf = io.BytesIO()
    was_training = getattr(module, "training", False)
    module.eval()
    try:
        with torch.no_grad():
            kwargs: Dict[str, Any] = {"input_names": list(input_names), "do_constant_folding": True}
            if output_names is None:
                out = module(*example_inputs)
                output_names = [f"output{i}" for i in range(len(out) if isinstance(out, (tuple, list)) else 1)]
            kwargs["output_names"] = list(output_names)
            if opset is not None:
                kwargs["opset_version"] = opset
            torch.onnx.export(module, tuple(example_inputs), buf, **kwargs)
    finally:
        module.train(was_training)
    return buf.getvalue()


def from_torch(module: Any, *example_inputs: Any, session: Any, input_names: Optional[Sequence[str]] = None,
               output_names: Optional[Sequence[str]] = None, opset: Optional[int] = None) -> Any:
    """A PyTorch module as a model held by uopd: exported to ONNX in memory (torch_onnx),
    then session.load_model. With a uopd.aio session, await the answer."""
    onnx = torch_onnx(module, example_inputs, input_names, output_names, opset)
    return session.load_model(onnx)
