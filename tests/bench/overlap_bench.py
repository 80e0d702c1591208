"""Figure 9 of tests/bench/run.sh: overlapped saves (docs/design/overlapped-save.md) on the CPU,
one rank through its agent (job of layout dp=1), every save memory-only (nothing here is about
the disk).

  overlap_bench.py --agent SOCK --sizes 256,1024 --steps 6 --train-mib 48 --train-steps 12 \
      --out overlap.json

For each size (MiB, in 4 MiB tensors):
  blocking   Client.save(step, state) — the stall of a blocking save and the part of it that
             copied into staging (SaveResult.copy_seconds: the client's copy threads, the
             limit a blocking save cannot beat), medians of the steady steps (>= 2);
  overlap    Client.save(step, state, overlap=True): the host time save() blocked (target
             <= 5 ms at any size), median and max of the steady steps; then fence() at once,
             which waits for what is left of the copy (with nothing to overlap, its whole time).
Then a small training loop (an MLP with AdamW, about --train-mib of model and optimizer
state): the median step time with no save, with an overlapped save every step (the
Checkpointer, fenced by the optimizer's step pre-hook) and with a blocking save every step.
Two shared cores are not where the overlap is judged: the copy threads take the cores the
training uses (the GPU figures judge it). Writes one JSON object to --out.
"""

import argparse
import json
import os
import statistics
import time

import torch

import tessera
from tessera.torch import Checkpointer

TENSOR_MIB = 4


def state_of(mib):
    n = max(1, mib // TENSOR_MIB)
    return {"layers.%d.weight" % i: torch.full((TENSOR_MIB << 18,), float(i)) for i in range(n)}


def steady(xs):
    return xs[1:] if len(xs) > 1 else xs


def bench_size(client, mib, steps, step0):
    state = state_of(mib)
    out = {"mib": mib}
    blocking, copies = [], []
    for i in range(steps):
        result = client.save(step0 + i, state, memory_only=True)
        blocking.append(result.stall_seconds)
        copies.append(result.copy_seconds)
        client.wait(step0 + i)
    step0 += steps
    saved, fenced = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        client.save(step0 + i, state, memory_only=True, overlap=True)
        t1 = time.perf_counter()
        client.fence()
        t2 = time.perf_counter()
        saved.append(t1 - t0)
        fenced.append(t2 - t1)
        client.wait(step0 + i)
    out["blocking_stall_s"] = statistics.median(steady(blocking))
    out["blocking_copy_s"] = statistics.median(steady(copies))
    out["overlap_save_s"] = statistics.median(steady(saved))
    out["overlap_save_max_s"] = max(steady(saved))
    out["overlap_fence_s"] = statistics.median(steady(fenced))
    return out, step0 + steps


def bench_training(client, train_mib, steps, step0):
    # Parameters of about train_mib / 3 (AdamW keeps two more of each).
    width = int(((train_mib / 3) * (1 << 20) / 4 / 2) ** 0.5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ckpt = Checkpointer(model, optimizer, client=client, rng=False)
    x = torch.randn(64, width)

    def step():
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()  # the optimizer's state exists from here on
    times = {}
    for mode in ("none", "overlap", "blocking"):
        ts = []
        for i in range(steps):
            t0 = time.perf_counter()
            step()
            if mode == "overlap":
                ckpt.save(step0, overlap=True, memory_only=True)
            elif mode == "blocking":
                ckpt.save(step0, memory_only=True)
            ts.append(time.perf_counter() - t0)
            step0 += 1
        ckpt.wait() if mode != "none" else None
        times[mode] = statistics.median(steady(ts))
    ckpt.close()
    state_mib = sum(p.numel() for p in model.parameters()) * 4 * 3 / (1 << 20)
    return {"state_mib": state_mib, "step_s": times}, step0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", required=True)
    p.add_argument("--sizes", default="256,1024")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--train-mib", type=int, default=48)
    p.add_argument("--train-steps", type=int, default=12)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    client = tessera.Client(a.agent, connect_timeout=30)
    report = {"sizes": [], "threads": torch.get_num_threads(),
              "load_before": os.getloadavg()[0]}
    step0 = 1
    for mib in [int(s) for s in a.sizes.split(",") if s]:
        row, step0 = bench_size(client, mib, a.steps, step0)
        report["sizes"].append(row)
    report["training"], step0 = bench_training(client, a.train_mib, a.train_steps, step0)
    report["load_after"] = os.getloadavg()[0]
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
