"""The GPU rows of overlapped saves (docs/design/overlapped-save.md), one rank on one GPU,
against its Tessera agent (a job of layout dp=1, memory tier on), in one command:

  tests/gpu/overlap.sh [--gib=1,8] [--steps=12]      (starts a coordinator and an agent)

or, with an agent already running:

  python3 -P tests/gpu/overlap_gpu.py --agent SOCK [--gib 1,8] [--steps 12] [--out FILE]

Per size (GiB of CUDA tensors, 256 MiB each, bf16):
  d2h        the pinned cudaMemcpy device->host time of the same bytes (copy_ into pinned host
             tensors, non_blocking, synchronised): the limit of a blocking save
  step       a training step stand-in on the compute stream: forward/backward reads of the
             state (bf16 matmuls of 8192 x 8192 blocks, --flops_per_step of them) and an
             optimizer update writing every state tensor in place (add_), timed from the host
             with torch.cuda.synchronize at the step's end
  none       the median step time without saves
  overlap    a save(overlap=True, memory_only=True) right after each update, fenced before
             the next update (what tessera.torch.Checkpointer's step pre-hook does): host time
             blocked in save() (target <= 5 ms), GPU time lost per step = median step time -
             none's (target <= 5 % of d2h), throughput none / overlap (target >= 0.97)
  dcp        torch.distributed.checkpoint.async_save with pinned async staging
             (DefaultStager, where this PyTorch has it) every step, to --dcp_dir: the same
             three figures
Writes one JSON object (and prints it); report rows are the page's "GPU" table.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

import tessera

TENSOR_MIB = 256


def make_state(gib):
    n = max(1, gib * 1024 // TENSOR_MIB)
    numel = TENSOR_MIB << 19  # bf16
    return {"w.%d" % i: torch.full((numel,), 0.001 * i, dtype=torch.bfloat16, device="cuda")
            for i in range(n)}


def d2h_seconds(state, runs=3):
    host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}
    best = float("inf")
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k, v in state.items():
            host[k].copy_(v, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


class Step:
    """A training step stand-in: reads of the state as forward/backward would, then an update."""

    def __init__(self, state, matmuls):
        self.state = state
        self.a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
        self.b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
        self.matmuls = matmuls

    def compute(self):
        acc = None
        for i in range(self.matmuls):
            c = self.a @ self.b
            acc = c if acc is None else acc + c
        for v in self.state.values():  # every tensor read, as forward and backward do
            acc[0, 0] += v[:1].float().sum()
        return acc

    def update(self):
        for v in self.state.values():
            v.add_(1e-3)


def run(step, steps, before_update=None, after_update=None):
    times, blocked = [], []
    for k in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step.compute()
        if before_update is not None:
            before_update()
        step.update()
        if after_update is not None:
            b0 = time.perf_counter()
            after_update(k)
            blocked.append(time.perf_counter() - b0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    steady = times[2:] if len(times) > 3 else times
    return statistics.median(steady), (statistics.median(blocked[2:] or blocked) if blocked
                                       else 0.0), (max(blocked[2:] or blocked) if blocked else 0.0)


def figures(name, none_s, d2h_s, step_s, blocked_s, blocked_max_s):
    lost = max(0.0, step_s - none_s)
    return {"variant": name, "step_s": step_s, "blocked_s": blocked_s,
            "blocked_max_s": blocked_max_s, "lost_s": lost, "lost_vs_d2h": lost / d2h_s,
            "throughput_vs_none": none_s / step_s}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", required=True)
    p.add_argument("--gib", default="1,8")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--matmuls", type=int, default=200, help="8192^3 bf16 matmuls per step")
    p.add_argument("--dcp_dir", default="")
    p.add_argument("--out", default="")
    a = p.parse_args()
    client = tessera.Client(a.agent, connect_timeout=30)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "sizes": []}
    next_step = [1]
    for gib in [int(g) for g in a.gib.split(",") if g]:
        state = make_state(gib)
        step = Step(state, a.matmuls)
        row = {"gib": gib, "d2h_s": d2h_seconds(state)}
        none_s, _, _ = run(step, a.steps)
        row["none_step_s"] = none_s

        def save(k):
            client.save(next_step[0], state, memory_only=True, overlap=True)
            next_step[0] += 1
        s, b, bmax = run(step, a.steps, before_update=client.fence, after_update=save)
        client.fence()
        client.wait(next_step[0] - 1)
        row["variants"] = [figures("tessera overlap", none_s, row["d2h_s"], s, b, bmax)]
        try:
            import torch.distributed as dist
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            if not dist.is_initialized():
                store = tempfile.mkdtemp()
                dist.init_process_group("gloo", init_method="file://" + os.path.join(store, "pg"),
                                        rank=0, world_size=1)
            root = a.dcp_dir or tempfile.mkdtemp()
            pending = []

            def dcp_save(k):
                if pending:
                    pending.pop().upload_completion.result()
                stager = DefaultStager(StagingOptions(use_pinned_memory=True,
                                                      use_shared_memory=False,
                                                      use_async_staging=True,
                                                      use_non_blocking_copy=True))
                pending.append(dcp.async_save(state, checkpoint_id=os.path.join(root, str(k)),
                                              async_stager=stager))

            def dcp_fence():
                if pending:
                    pending[0].staging_completion.result()
            s, b, bmax = run(step, a.steps, before_update=dcp_fence, after_update=dcp_save)
            if pending:
                pending.pop().upload_completion.result()
            row["variants"].append(figures("DCP async_save, pinned staging", none_s,
                                           row["d2h_s"], s, b, bmax))
        except Exception as e:  # a PyTorch without it: reported, not fatal
            row["variants"].append({"variant": "DCP async_save, pinned staging",
                                    "error": "%s: %s" % (type(e).__name__, e)})
        report["sizes"].append(row)
        del state, step
        torch.cuda.empty_cache()
    client.fence()
    text = json.dumps(report, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
