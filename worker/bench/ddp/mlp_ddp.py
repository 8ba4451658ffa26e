"""PyTorch DDP (gloo, CPU) on the model `rdujob bench examples/mlp-bench.yaml` trains, for the
comparison DESIGN section 8 asks for: the 784-512-512-10 MLP with ReLU, SGD with momentum 0.9,
learning rate 0.01, batch 64 per rank, one thread per rank, 59,400 generated MNIST-shaped
training samples split over the ranks, one epoch. Prints one JSON line per world size, with the
samples/s of the training loop (after 5 warm-up steps) and the scaling efficiency against the
1-rank run of the same invocation:

    python3 worker/bench/ddp/mlp_ddp.py --ranks 1,2

Needs `torch` (pip install torch); not part of the tests.
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

TRAIN_SAMPLES = 59_400
WARMUP_STEPS = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model():
    return nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )


def rank_main(rank, world, port, batch, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(11)
    net = model()
    ddp = nn.parallel.DistributedDataParallel(net) if world > 1 else net
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(100 + rank)
    per_rank = TRAIN_SAMPLES // world
    x = torch.rand(per_rank, 784, generator=g)
    y = torch.randint(0, 10, (per_rank,), generator=g)
    steps = per_rank // batch
    started = None
    for step in range(steps):
        if step == WARMUP_STEPS:
            if world > 1:
                dist.barrier()
            started = time.perf_counter()
        xb = x[step * batch:(step + 1) * batch]
        yb = y[step * batch:(step + 1) * batch]
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(xb), yb).backward()
        opt.step()
    if world > 1:
        dist.barrier()
    seconds = time.perf_counter() - started
    if rank == 0:
        out.put((steps - WARMUP_STEPS) * batch * world / seconds)
    dist.destroy_process_group()


def measure(world, batch):
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, batch, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"rank exited with {p.exitcode}")
    return out.get()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2", help="world sizes, comma-separated")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--repeat", type=int, default=1, help="runs per world size; the best is kept")
    args = parser.parse_args()
    sizes = [1] + [int(r) for r in args.ranks.split(",") if int(r) != 1]
    base = None
    for world in sizes:
        sps = max(measure(world, args.batch) for _ in range(args.repeat))
        base = base or sps
        print(json.dumps({
            "bench": "ddp_train", "ranks": world, "batch": args.batch, "torch": torch.__version__,
            "samples_per_sec": round(sps, 1), "scaling_efficiency": round(sps / (world * base), 3),
        }), flush=True)


if __name__ == "__main__":
    main()
