"""uopd.from_torch: PyTorch modules exported to ONNX in memory, held by uopd, against
torch's own outputs. Skipped (saying why) where torch is not installed."""
import numpy as np
import pytest

import uopd

torch = pytest.importorskip("torch", reason="PyTorch is not installed (deploy/setup.sh --bench adds python3-torch)")
nn = torch.nn


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, image):
        h = self.pool(torch.relu(self.conv1(image)))
        h = torch.relu(self.conv2(h))
        return self.fc(torch.flatten(h, 1))


class Block(nn.Module):
    """A pre-norm transformer block: multi-head self-attention and a GELU MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.d, self.heads = d, heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, tokens):
        b, t, d = tokens.shape[0], tokens.shape[1], self.d
        q, k, v = self.qkv(self.ln1(tokens)).split(d, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        h = tokens + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.ln2(h))


@pytest.mark.parametrize("make,shape", [(SmallCNN, (2, 3, 16, 16)), (Block, (2, 8, 32))], ids=["cnn", "transformer"])
def test_from_torch_matches_torch(session, make, shape):
    torch.manual_seed(0)
    module = make().eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        want = module(x).numpy()
    model = uopd.from_torch(module, x, session=session)
    assert [t.shape for t in model.inputs] == [tuple(shape)]
    name = model.outputs[0].name
    got = model(x.numpy())[name]
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)
    # Again, with other values: the same model, nothing loaded again.
    x2 = torch.randn(*shape)
    with torch.no_grad():
        want2 = module(x2).numpy()
    np.testing.assert_allclose(model(x2.numpy())[name].reshape(want2.shape), want2, rtol=1e-4, atol=1e-5)
