"""The peer of the GPU benchmark: PyTorch DCP async_save of the same bytes Tessera saves.

  dcp_peer.py --mib S --steps K --dir DIR --out FILE.json [--device cuda|cpu]

Runs under the GPU machine's own python3 and PyTorch (tests/gpu/on_device.sh); standard library
and torch only. The state: S MiB of int32 tensors of 64 MiB (16,384 rows of 1,024), random
values (never zeros), on --device, in a one-process gloo group, as tessera-gpu-bench's
1-rank configurations hold them.

Each variant saves K times into a fresh checkpoint directory (removed after each run, outside
the timing); the first run is reported apart from the steady state:
  default               dcp.async_save(state, checkpoint_id=...): blocked = the call (it stages
                        the tensors to host memory before returning); durable = its future's
                        result() (FileSystemWriter fsyncs).
  pinned_async_staging  where this PyTorch has DefaultStager: pinned staging memory with
                        asynchronous staging. The trainer may not change its tensors until
                        staging completes, so blocked = the call + staging_completion; durable
                        = upload_completion. A new DefaultStager per save: PyTorch 2.11's cannot
                        be reused across async_save calls (KeyError: <class 'type'> from its
                        second save, pytorch/pytorch#183413), so its pinned memory is allocated
                        again each time, as 2.11's users get it.
A variant this PyTorch lacks is reported with the error, not run. Writes one JSON object.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback


def make_state(torch, mib, device):
    state = {}
    left = mib << 20
    i = 0
    while left > 0:
        n = min(64 << 20, left)
        rows = n // 4096
        g = torch.Generator(device=device)
        g.manual_seed(1000 + i)
        state["gpubench.w%03d" % i] = torch.randint(
            -2**31, 2**31 - 1, (rows, 1024), dtype=torch.int32, device=device, generator=g)
        left -= n
        i += 1
    return state


def wait_done(x):
    return x.result() if hasattr(x, "result") else x


def run_variant(torch, dcp, state, root, steps, make_stager):
    runs = []
    for k in range(steps):
        stager = make_stager()
        path = os.path.join(root, "run-%d" % k)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if stager is None:
            response = dcp.async_save(state, checkpoint_id=path)
        else:
            response = dcp.async_save(state, checkpoint_id=path, async_stager=stager)
        if hasattr(response, "staging_completion"):
            wait_done(response.staging_completion)
            t1 = time.perf_counter()
            wait_done(response.upload_completion)
        else:
            t1 = time.perf_counter()
            wait_done(response)
        t2 = time.perf_counter()
        runs.append({"blocked_s": t1 - t0, "durable_s": t2 - t0})
        if stager is not None and hasattr(stager, "close"):
            stager.close()
        shutil.rmtree(path, ignore_errors=True)
    return runs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = p.parse_args()
    report = {"mib": a.mib, "steps": a.steps, "device": a.device, "variants": {}}
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        report["torch"] = torch.__version__
        if not hasattr(dcp, "async_save"):
            raise RuntimeError("torch %s has no torch.distributed.checkpoint.async_save"
                               % torch.__version__)
        if a.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        if a.device == "cuda":
            report["gpu"] = torch.cuda.get_device_name(0)
        os.makedirs(a.dir, exist_ok=True)
        store = tempfile.mkdtemp(prefix="dcp-store-")
        dist.init_process_group("gloo", init_method="file://" + os.path.join(store, "pg"),
                                rank=0, world_size=1)
        state = make_state(torch, a.mib, a.device)
        report["bytes"] = sum(t.numel() * t.element_size() for t in state.values())
        report["tensors"] = len(state)
        variants = [("default", lambda: None)]

        def pinned_stager():
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            return DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                                use_async_staging=True,
                                                use_non_blocking_copy=True))
        variants.append(("pinned_async_staging", pinned_stager))
        for name, make_stager in variants:
            try:
                report["variants"][name] = {
                    "runs": run_variant(torch, dcp, state, os.path.join(a.dir, name), a.steps,
                                        make_stager)}
            except Exception as e:  # a variant this PyTorch lacks: reported, not fatal
                report["variants"][name] = {"error": "%s: %s" % (type(e).__name__, e)}
                traceback.print_exc()
        dist.destroy_process_group()
        shutil.rmtree(store, ignore_errors=True)
    except Exception as e:
        report["error"] = "%s: %s" % (type(e).__name__, e)
        traceback.print_exc()
    with open(a.out, "w") as f:
        json.dump(report, f)
    ok = any("runs" in v for v in report["variants"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
