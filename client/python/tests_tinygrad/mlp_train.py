"""A small tinygrad training loop: an MLP (16 -> 32 -> 1, ReLU) fit by plain SGD to a
target made from generated data. Prints one JSON line: the loss after each step.

    DEV=UOPD python3 -m uopd.tinygrad mlp_train.py [STEPS [SHARDS]]     (or DEV=CPU python3 ...)

An unmodified tinygrad program: nothing in it names uopd. The data and the initial
weights come from numpy's seeded generator, so every device starts from the same bits.
With SHARDS > 1 it is a data-parallel step over DEV, DEV:1, ...: the batch split along its
rows, the weights replicated, and each weight's gradient summed across the devices by
tinygrad's allreduce.
"""
import json
import sys

import numpy as np

from tinygrad import Context, Device, Tensor, nn


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    shards = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((64, 16)).astype(np.float32)
    y_np = np.sin(x_np[:, :1] * 2.0) + 0.5 * x_np[:, 1:2] ** 2  # a smooth nonlinear target
    x, y = Tensor(x_np), Tensor(y_np.astype(np.float32))
    w1 = Tensor((rng.standard_normal((16, 32)) * 0.25).astype(np.float32))
    b1 = Tensor(np.zeros(32, np.float32))
    w2 = Tensor((rng.standard_normal((32, 1)) * 0.25).astype(np.float32))
    b2 = Tensor(np.zeros(1, np.float32))
    if shards > 1:
        devices = tuple(f"{Device.DEFAULT}:{i}" for i in range(shards))
        x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)
        for t in (w1, b1, w2, b2):
            t.replace(t.shard(devices))
    opt = nn.optim.SGD([w1, b1, w2, b2], lr=0.05)
    losses = []
    with Context(TRAINING=1):
        for _ in range(steps):
            opt.zero_grad()
            loss = (((x @ w1 + b1).relu() @ w2 + b2 - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
    print(json.dumps({"losses": losses}))


if __name__ == "__main__":
    main()
