"""One trainer process of overlapped_save_test.py (docs/design/overlapped-save.md).

  overlapped_save_rank.py kill --agent SOCK --step N   save N overlapped, then SIGKILL itself
  overlapped_save_rank.py exit --agent SOCK --step N   save N overlapped, return unfenced
  overlapped_save_rank.py fsdp --agent SOCK --rdzv FILE --step N [--keep_unsharded]
  overlapped_save_rank.py tp   --agent SOCK --rdzv FILE --step N

kill / exit: a 4 MiB tensor, saved with overlap=True; "saved N overlapped" is printed once
  save() returned, then the process dies by SIGKILL before any fence, or returns from main
  (the client's destructor runs unfenced).
fsdp: FSDP2 over the layout's dp_shard on gloo (reshard_after_forward on, or off with
  --keep_unsharded), AdamW, gradient accumulation and clipping; steps N..N+3 each saved
  overlapped, every rank's local shards copied at each save(); then steps N+1 and N+3 are
  loaded into a fresh model and optimizer, which must hold those copies bitwise; then a write
  into a DTensor parameter before the fence must be caught and its step not committed.
  Prints "ok: rank R ..." lines on success.
tp: the same with tensor parallelism over the layout's tp (ColwiseParallel, RowwiseParallel).
"""

import argparse
import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import tessera
from tessera.torch import Checkpointer

DIM = 8


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def trainer_gone(args):
    client = tessera.Client(args.agent, connect_timeout=30)
    state = {"w": torch.arange(1 << 20, dtype=torch.float32) + args.step}
    client.save(args.step, state, overlap=True)
    say("saved %d overlapped" % args.step)
    if args.mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    # "exit": returns; the client (and its pending save) is destroyed, never fenced.


def local(t):
    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def local_state(model, optimizer):
    params = {k: local(v) for k, v in model.named_parameters()}
    optim = {(i, k): local(v) for i, (p, s) in enumerate(optimizer.state.items())
             for k, v in sorted(s.items()) if torch.is_tensor(v)}
    return params, optim


def build(seed, world, mode, reshard):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.ReLU(), torch.nn.Linear(16, DIM))
    if mode == "tp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def sharded(args):
    client = tessera.Client(args.agent, connect_timeout=30)
    rank = client.identity["rank"]
    world = client.identity["layout"]["tp" if args.mode == "tp" else "dp_shard"]
    dist.init_process_group("gloo", init_method="file://" + args.rdzv, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    reshard = not args.keep_unsharded
    model, optimizer = build(0, world, args.mode, reshard)
    # TP ranks take the same batch (replicated input); FSDP ranks each their own.
    batch_seed = 0 if args.mode == "tp" else 100 * rank
    ckpt = Checkpointer(model, optimizer, client=client, rng=False)
    expected = {}
    for step in range(args.step, args.step + 4):
        for micro in range(2):  # gradient accumulation: the save's copy runs during these
            g = torch.Generator().manual_seed(step * 10 + micro + batch_seed)
            loss = model(torch.randn(4, DIM, generator=g)).pow(2).mean() / 2
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()  # fences the previous step's save (the Checkpointer's pre-hook)
        optimizer.zero_grad()
        expected[step] = local_state(model, optimizer)
        ckpt.save(step, overlap=True)
    ckpt.wait()
    if ckpt.last_save_error is not None:
        raise SystemExit("FAIL: %s" % ckpt.last_save_error)
    # A write into a DTensor parameter before the fence: caught (the DTensor's own version
    # counter), and that step withdrawn on every rank.
    ckpt.save(args.step + 4, overlap=True)
    with torch.no_grad():
        model[0].weight.mul_(2)
    if ckpt.fence() or getattr(ckpt.last_save_error, "code", None) != "STATE_CHANGED":
        raise SystemExit("FAIL: rank %d: the write before the fence was not caught (%r)"
                         % (rank, ckpt.last_save_error))
    if "'0.weight'" not in str(ckpt.last_save_error):
        raise SystemExit("FAIL: rank %d: %s" % (rank, ckpt.last_save_error))
    try:
        client.wait(args.step + 4, timeout=60)
        raise SystemExit("FAIL: rank %d: step %d committed" % (rank, args.step + 4))
    except tessera.AbortedError:
        pass
    say("ok: rank %d: a write into a DTensor before the fence caught, step %d not committed"
        % (rank, args.step + 4))
    for step in (args.step + 1, args.step + 3):
        fresh, fresh_optimizer = build(7, world, args.mode, reshard)
        loader = Checkpointer(fresh, fresh_optimizer, client=client, rng=False)
        if loader.load(step) != step:
            raise SystemExit("FAIL: load(%d) loaded another step" % step)
        params, optim = local_state(fresh, fresh_optimizer)
        want_params, want_optim = expected[step]
        for k, v in want_params.items():
            if not torch.equal(params[k], v):
                raise SystemExit("FAIL: rank %d step %d: parameter %s differs" % (rank, step, k))
        if sorted(optim) != sorted(want_optim) or any(
                not torch.equal(optim[k], v) for k, v in want_optim.items()):
            raise SystemExit("FAIL: rank %d step %d: optimizer state differs" % (rank, step))
    ckpt.close()
    say("ok: rank %d %s: steps %d and %d bitwise the state at save()"
        % (rank, "tp" if args.mode == "tp" else "reshard_after_forward=%s" % reshard,
           args.step + 1, args.step + 3))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown can abort (tests/seeds/fsdp2_rank.py)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["kill", "exit", "fsdp", "tp"])
    ap.add_argument("--agent", required=True)
    ap.add_argument("--step", type=int, required=True)
    ap.add_argument("--rdzv", default="")
    ap.add_argument("--keep_unsharded", action="store_true")
    args = ap.parse_args()
    signal.alarm(240)  # never hangs: the default SIGALRM action ends the process
    torch.set_num_threads(1)
    if args.mode in ("fsdp", "tp"):
        sharded(args)
    else:
        trainer_gone(args)


if __name__ == "__main__":
    main()
