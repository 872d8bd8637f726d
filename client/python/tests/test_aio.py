"""uopd.aio: the same surface awaited over grpc.aio, against the same server."""
import asyncio

import numpy as np
import pytest

import uopd
import uopd.aio
from conftest import REPO, rng_array


def test_aio_session_buffers_runs_and_models(server, examples):
    async def main():
        async with await uopd.aio.connect(server.address) as client:
            async with client.session() as s:
                a = rng_array((3, 4), seed=1)
                buf = await s.put(a)
                assert isinstance(buf, uopd.aio.Buffer)
                np.testing.assert_array_equal(await buf.numpy(), a)
                b = rng_array((12,), seed=2)
                out = (await s.run(examples / "elementwise.json", a=buf, b=b))["out"]
                np.testing.assert_allclose(out, np.maximum(a + b.reshape(3, 4) * 1.5, 0), rtol=1e-6)
                kept = (await s.run(examples / "elementwise.json", a=a, b=b, keep_outputs=True))["out"]
                np.testing.assert_array_equal(await kept.numpy(), out)
                big = rng_array((2 << 20,), seed=3)  # 8 MiB: uploaded and downloaded in chunks
                np.testing.assert_array_equal(await (await s.put(big)).numpy(), big)
                # Runs at once in one session, each with its own answer.
                xs = [rng_array((12,), seed=10 + i) for i in range(4)]
                outs = await asyncio.gather(*[s.run(examples / "elementwise.json", a=x, b=b) for x in xs])
                for x, o in zip(xs, outs):
                    np.testing.assert_allclose(o["out"], np.maximum(x.reshape(3, 4) + b.reshape(3, 4) * 1.5, 0),
                                               rtol=1e-6)
                model = await s.load_model(REPO / "tests/conformance/models/recurrent/gru/model.onnx")
                x = {t.name: rng_array(t.shape, seed=4) for t in model.inputs}
                y1 = await model(x)
                y2 = await model(**x)
                assert set(y1) == {t.name for t in model.outputs}
                for name in y1:
                    np.testing.assert_array_equal(y1[name], y2[name])
                assert "=== " in await s.explain(examples / "matmul.json")
                assert (await client.stats()).sessions >= 1
                with pytest.raises(uopd.InvalidArgument):
                    await s.run(examples / "elementwise.json", a=np.zeros(12, np.int32), b=b)
                await buf.free()
                with pytest.raises(uopd.NotFound):
                    await buf.numpy()
            s2 = await client.session()
            await s2.close()
            with pytest.raises(uopd.NotFound):
                await s2.put(a)

    asyncio.run(main())


def test_aio_unreachable_is_unavailable():
    async def main():
        with pytest.raises(uopd.Unavailable):
            await uopd.aio.connect("127.0.0.1:1", connect_timeout=0.3)

    asyncio.run(main())
