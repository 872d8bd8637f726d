#!/usr/bin/python3
"""The peer of bench_train: torch DistributedDataParallel over Gloo, on one host.

`world` processes (torch.distributed with a FileStore), each with its shard of the
batch, train the MLP bench_train trains through uopd: in-features -> hidden -> hidden ->
classes, tanh between the layers, softmax cross entropy against one-hot labels, plain
SGD. A step is forward, backward (DDP's bucketed allreduce of the gradients, overlapped
with the backward pass), the SGD update and the loss read back as a Python float (uopd's
step downloads its loss too). Rank 0 times every step and prints one JSON line:
{"p50_ms": ..., "mean_ms": ..., "steps": N}. Needs python3-torch (deploy/setup.sh --bench).

  torch_ddp_step.py --inputs 2 --hidden 32 --classes 2 --batch 256 --steps 200 [--warmup 20]
                    [--world 2] [--threads 1] [--lr 0.5] [--bucket-cap-mb 25]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def member(rank, args, store_path, out_path):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(args.threads)
    store = dist.FileStore(store_path, args.world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=args.world)
    torch.manual_seed(1)  # the same parameters everywhere (DDP broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(args.inputs, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.hidden),
                          nn.Tanh(), nn.Linear(args.hidden, args.classes))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    shard = args.batch // args.world
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.rand(shard, args.inputs, generator=gen) * 2 - 1
    y = nn.functional.one_hot(torch.randint(0, args.classes, (shard,), generator=gen), args.classes).float()
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        loss.item()
        times.append((time.perf_counter() - t0) * 1e3)
    dist.barrier()
    if rank == 0:
        warm = times[args.warmup:]
        with open(out_path, "w") as f:
            json.dump({"p50_ms": statistics.median(warm), "mean_ms": statistics.fmean(warm), "steps": len(warm)}, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--inputs", type=int, default=2)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--classes", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    args = p.parse_args()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(member, args=(args, os.path.join(tmp, "store"), out), nprocs=args.world, join=True)
        with open(out) as f:
            sys.stdout.write(f.read() + "\n")


if __name__ == "__main__":
    main()
