"""A model held by uopd: an ONNX file of the repository (a GRU as PyTorch exports it,
tests/conformance/models) loaded once and run several times with one upload of its
weights (Stats' model_weight_* counters), the same outputs as the C++ client's
`uop run MODEL.onnx` on the same server; profiles; a model's errors."""
import numpy as np
import pytest

import uopd
from uopd._stubs import pb
from conftest import REPO, rng_array, uop

MODEL = REPO / "tests/conformance/models/recurrent/gru/model.onnx"


def inputs_for(model, seed=0):
    return {t.name: rng_array(t.shape, np.dtype(t.dtype), seed + i) for i, t in enumerate(model.inputs)}


def test_model_loads_once_and_runs_many_times(client, session, server, uop_binary, tmp_path):
    before = client.stats()
    model = session.load_model(MODEL)
    loaded = client.stats()
    assert model.weight_buffers > 0 and model.weight_bytes > 0
    assert loaded.model_weight_buffers_written - before.model_weight_buffers_written == model.weight_buffers
    assert loaded.model_weight_bytes_written - before.model_weight_bytes_written == model.weight_bytes
    assert [t.dtype for t in model.inputs] == ["float32"] and model.outputs

    x = inputs_for(model)
    first = model(x)
    for i in range(3):
        again = model(**x)
        assert set(again) == {t.name for t in model.outputs}
        for name in first:
            np.testing.assert_array_equal(again[name], first[name])
    positional = model(*x.values())
    np.testing.assert_array_equal(positional[model.outputs[0].name], first[model.outputs[0].name])
    after = client.stats()
    assert after.model_weight_buffers_written == loaded.model_weight_buffers_written  # no upload per run
    assert after.model_weight_bytes_written == loaded.model_weight_bytes_written

    # The C++ client, given the same inputs, answers the same.
    args = ["run", str(MODEL), f"--server={server.address}"]
    for name, a in x.items():
        np.save(tmp_path / f"{name}.npy", a)
        args.append(f"--in={name}={tmp_path / f'{name}.npy'}")
    for t in model.outputs:
        args.append(f"--out={t.name}={tmp_path / f'out_{t.name}.npy'}")
    uop(uop_binary, *args)
    for t in model.outputs:
        want = np.load(tmp_path / f"out_{t.name}.npy")
        np.testing.assert_allclose(first[t.name].reshape(want.shape), want, rtol=1e-5, atol=1e-6, err_msg=t.name)


def test_model_from_bytes_profile_and_kept_outputs(session):
    model = session.load_model(MODEL.read_bytes())
    x = inputs_for(model, seed=3)
    prof = model.profile(x)
    assert prof and all(p.launches >= 1 for p in prof)
    r = model.execute(x, keep_outputs=True)
    name = model.outputs[0].name
    assert isinstance(r.outputs[name], uopd.Buffer)
    np.testing.assert_array_equal(r.outputs[name].numpy(), model(x)[name])
    # An input already in the session is bound without sending it again.
    buf = session.put(x[model.inputs[0].name])
    np.testing.assert_array_equal(model(buf)[name], model(x)[name])


def test_model_errors(session, client):
    with pytest.raises(uopd.InvalidArgument):
        session.load_model(b"this is not an ONNX model")
    model = session.load_model(MODEL)
    x = inputs_for(model)
    name = model.inputs[0].name
    with pytest.raises(uopd.InvalidArgument):
        model({name: x[name].astype(np.float64)})
    with pytest.raises(uopd.InvalidArgument, match="given twice"):
        model(x[name], **{name: x[name]})
    with client.session() as other:
        stolen = uopd.Model(other, pb.LoadModelResponse(model_id=model.id))  # another session's id
        with pytest.raises(uopd.NotFound):
            stolen(x)
