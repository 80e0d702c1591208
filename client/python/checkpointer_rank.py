"""One rank of checkpointer_test.sh: a training loop checkpointed by tessera.torch.Checkpointer
alone (no tessera call but the Checkpointer's), with FSDP2 over gloo on the CPU.

  checkpointer_rank.py train  --agent SOCK --rdzv FILE --dump DIR [--wrap W] [--optimizer O]
  checkpointer_rank.py resume --agent SOCK --rdzv FILE --dump DIR [--wrap W] [--optimizer O]

--wrap: fsdp (default; FSDP2 over the layout's dp_shard, gloo), ddp (DDP over its dp, gloo) or
plain (one process, no process group). --optimizer: adamw (default) or sgd (no momentum: an
optimizer that never has state). The model has a frozen parameter and a buffer; the
optimizer, StepLR, a data loader and a Stateful counter (extra_state) ride along.

train: saves step 0 before the first optimizer step (and checks the save left the optimizer
  without state), trains 4 steps saving step 2 on the way, saves step 4 (which must reuse step
  2's preparation: the resume checks it saved the live values), waits for its commit, then
  writes what the
  checkpoint must give back: DIR/full.safetensors (rank 0: every model and optimizer tensor
  gathered whole), DIR/job.json (rank 0: param groups, scheduler, counter) and
  DIR/rank-R.json (each rank: its loader position and the next draw of each RNG). Prints
  "hanging at step 5" and waits to be SIGKILLed.
resume: a fresh model with other values on this job's mesh; load() must return 4; every
  tensor, the job-wide state, and — on a rank that saved — the loader and the next RNG draws
  must equal what train wrote, bitwise; a rank that did not exist must report its RNG and
  loader as not restored (last_load_missing). Prints "ok: ..." lines.
"""

import argparse
import datetime
import json
import os
import random
import signal
import sys
import time

import numpy
import safetensors.torch
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import tessera
from tessera.torch import Checkpointer

DIM, HIDDEN, BATCH = 6, 10, 4


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(DIM, HIDDEN)
        self.frozen = torch.nn.Parameter(torch.randn(HIDDEN), requires_grad=False)
        self.out = torch.nn.Linear(HIDDEN, DIM)
        self.register_buffer("scale", torch.randn(DIM))

    def forward(self, x):
        return self.out(torch.relu(self.embed(x) + self.frozen)) * self.scale


class Loader:
    """A data loader with a position (the Stateful protocol torchdata's loaders follow)."""

    def __init__(self):
        self.epoch, self.batch = 0, 0

    def next(self):
        g = torch.Generator().manual_seed(self.epoch * 1000 + self.batch)
        self.batch += 1
        if self.batch == 3:
            self.epoch, self.batch = self.epoch + 1, 0
        return torch.randn(BATCH, DIM, generator=g)

    def state_dict(self):
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state):
        self.epoch, self.batch = state["epoch"], state["batch"]


class Counter:
    def __init__(self):
        self.tokens = 0

    def state_dict(self):
        return {"tokens": self.tokens}

    def load_state_dict(self, state):
        self.tokens = state["tokens"]


def build(seed, world, wrap, optimizer="adamw"):
    """The model — FSDP2 over a dp_shard mesh of `world`, DDP over `world` ranks, or a plain
    module — with its optimizer (AdamW, or SGD without momentum) and StepLR."""
    torch.manual_seed(seed)
    model = Model()
    if wrap == "fsdp":
        fully_shard(model, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",)))
    elif wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = (torch.optim.AdamW(trainable, lr=1e-2) if optimizer == "adamw"
                 else torch.optim.SGD(trainable, lr=1e-2))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def full_tensors(model, optimizer):
    """Every model and optimizer tensor, gathered whole (a collective), by a stable key."""
    out = {}
    sds = {"model": get_model_state_dict(model),
           "optim": get_optimizer_state_dict(model, optimizer)["state"]}
    for fqn, t in sds["model"].items():
        out["model." + fqn] = t
    for fqn, state in sds["optim"].items():
        for key, t in state.items():
            out["optim.%s.%s" % (fqn, key)] = t
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone().contiguous()
            for k, v in sorted(out.items())}


def rng_draws():
    """The next value of each RNG, without consuming it."""
    state = (torch.get_rng_state(), numpy.random.get_state(), random.getstate())
    draws = {"torch": torch.rand(3).tolist(), "numpy": numpy.random.rand(3).tolist(),
             "python": [random.random() for _ in range(3)]}
    torch.set_rng_state(state[0])
    numpy.random.set_state(state[1])
    random.setstate(state[2])
    return draws


def job_state(optimizer, scheduler, counter):
    return {"param_groups": [{k: v for k, v in g.items() if k != "params"}
                             for g in optimizer.param_groups],
            "scheduler": scheduler.state_dict(), "counter": counter.state_dict()}


def train(args, client, rank, world):
    model, optimizer, scheduler = build(0, world, args.wrap, args.optimizer)
    loader, counter = Loader(), Counter()
    ckpt = Checkpointer(model, optimizer, lr_scheduler=scheduler, dataloader=loader,
                        extra_state={"counter": counter}, client=client)
    if ckpt.load() is not None:
        raise SystemExit("FAIL: a fresh job found a checkpoint")
    ckpt.save(0)
    ckpt.wait()
    if optimizer.state:
        raise SystemExit("FAIL: saving before the first step gave the optimizer state")
    say("saved step 0 before the first optimizer step; the optimizer still has no state")
    torch.manual_seed(100 + rank)  # per-rank RNG streams, as dropout would use
    numpy.random.seed(200 + rank)
    random.seed(300 + rank)
    for step in range(1, 5):
        if step == 3:
            ckpt.save(2)  # step 4's save reuses this one's preparation (below)
        x = loader.next()
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        counter.tokens += BATCH
        torch.rand(1), numpy.random.rand(), random.random()  # the RNGs move on
    t0 = time.perf_counter()
    result = ckpt.save(4)
    blocked = time.perf_counter() - t0
    if not ckpt.last_save_reused_preparation:
        raise SystemExit("FAIL: step 4's save did not reuse step 2's preparation")
    say("committed 4", ckpt.wait(timeout=120), "save() blocked %.1f ms, reported stall %.1f ms"
        % (blocked * 1e3, result.stall_seconds * 1e3), "(preparation reused)")
    full = full_tensors(model, optimizer)
    if rank == 0:
        safetensors.torch.save_file(full, os.path.join(args.dump, "full.safetensors"))
        with open(os.path.join(args.dump, "job.json"), "w") as f:
            json.dump(job_state(optimizer, scheduler, counter), f, sort_keys=True)
    with open(os.path.join(args.dump, "rank-%d.json" % rank), "w") as f:
        json.dump({"loader": loader.state_dict(), "rng": rng_draws()}, f, sort_keys=True)
    say("hanging at step 5")
    time.sleep(3600)


def bitwise_equal(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def resume(args, client, rank, world):
    model, optimizer, scheduler = build(1, world, args.wrap, args.optimizer)  # other values than the saved run's
    loader, counter = Loader(), Counter()
    ckpt = Checkpointer(model, optimizer, lr_scheduler=scheduler, dataloader=loader,
                        extra_state={"counter": counter}, client=client)
    step = ckpt.load()
    if step != 4:
        raise SystemExit("FAIL: load() returned %r, not 4" % (step,))
    saved = safetensors.torch.load_file(os.path.join(args.dump, "full.safetensors"))
    now = full_tensors(model, optimizer)
    bad = sorted(set(saved) ^ set(now)) + [k for k in sorted(saved) if k in now and
                                           not bitwise_equal(saved[k], now[k])]
    if bad:
        raise SystemExit("FAIL: rank %d: tensors differ from the saved ones: %s" % (rank, bad))
    say("ok: rank %d of %s: %d model and optimizer tensors bitwise identical" % (
        rank, "%d (%s)" % (world, args.wrap) if world else "a plain module", len(saved)))
    with open(os.path.join(args.dump, "job.json")) as f:
        job = json.load(f)
    if json.loads(json.dumps(job_state(optimizer, scheduler, counter), sort_keys=True)) != job:
        raise SystemExit("FAIL: rank %d: job-wide state differs: %s vs %s" % (
            rank, job_state(optimizer, scheduler, counter), job))
    say("ok: rank %d: param groups (lr %g), scheduler and extra state restored" % (
        rank, optimizer.param_groups[0]["lr"]))
    path = os.path.join(args.dump, "rank-%d.json" % rank)
    if os.path.exists(path):
        with open(path) as f:
            mine = json.load(f)
        now = {"loader": loader.state_dict(), "rng": rng_draws()}
        if now != mine or ckpt.last_load_missing:
            raise SystemExit("FAIL: rank %d: per-rank state %s (missing %s), saved %s" % (
                rank, now, ckpt.last_load_missing, mine))
        say("ok: rank %d: loader position and the next RNG draws restored" % rank)
    else:
        if ckpt.last_load_missing != ["rng", "dataloader"]:
            raise SystemExit("FAIL: rank %d did not exist at the save, but last_load_missing "
                             "is %r" % (rank, ckpt.last_load_missing))
        say("ok: rank %d did not exist at the save: its RNG and loader are its own "
            "(last_load_missing %s)" % (rank, ckpt.last_load_missing))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "resume"])
    ap.add_argument("--agent", required=True)
    ap.add_argument("--rdzv", required=True)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--wrap", choices=["fsdp", "ddp", "plain"], default="fsdp",
                    help="FSDP2 over the layout's dp_shard, DDP over its dp, or a plain module")
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                    help="AdamW, or SGD without momentum (it never has state)")
    args = ap.parse_args()
    signal.alarm(240)  # never hangs: the default SIGALRM action ends the process
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    client = tessera.Client(args.agent, connect_timeout=30)
    identity = client.identity
    rank = identity["rank"]
    world = {"fsdp": identity["layout"].get("dp_shard"), "ddp": identity["layout"].get("dp"),
             "plain": None}[args.wrap]
    if world is not None:
        dist.init_process_group("gloo", init_method="file://" + args.rdzv, rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
    {"train": train, "resume": resume}[args.mode](args, client, rank, world)
    if world is not None:
        dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # see tests/seeds/fsdp2_rank.py exit_after_checks: gloo's teardown can abort


if __name__ == "__main__":
    main()
