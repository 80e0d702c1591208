"""One rank of checkpointer_more_test.sh: tessera.torch.Checkpointer with tensor parallelism
(ColwiseParallel / RowwiseParallel DTensors on a mesh dim "tp"), torchdata's
StatefulDataLoader (a shuffled map-style dataset) and a save that fails, over gloo on the CPU.

  checkpointer_more_rank.py train  --agent SOCK --rdzv FILE --dump DIR
  checkpointer_more_rank.py resume --agent SOCK --rdzv FILE --dump DIR

train: step 1's save carries a job-wide value that differs between the ranks, which the
  coordinator refuses (REPLICA_DIVERGED); step 2's save must warn of it, keep it in
  last_save_error and commit. Trains to step 3, saves it, waits for the commit, writes what
  it must give back (DIR/full.safetensors: rank 0, every tensor whole; DIR/rank-R.json: the
  loader's next batch), prints "hanging at step 4" and waits to be SIGKILLed.
resume: another model (other values); load() must return 3, every tensor bitwise, and the
  loader's next batch the saved run's.
"""

import argparse
import datetime
import json
import os
import signal
import sys
import time
import warnings

import safetensors.torch
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)
from torchdata.stateful_dataloader import StatefulDataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpointer_rank import Counter, bitwise_equal, full_tensors, say  # noqa: E402

import tessera  # noqa: E402
from tessera.torch import Checkpointer  # noqa: E402

DIM, HIDDEN, SAMPLES, BATCH = 4, 8, 32, 4


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Linear(DIM, HIDDEN)
        self.w2 = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


def differing(saved, now):
    """Keys of two {key: tensor} mappings whose tensors are not bitwise equal, or in one only."""
    return sorted(set(saved) ^ set(now)) + [k for k in sorted(saved)
                                            if k in now and not bitwise_equal(saved[k], now[k])]


def build(seed, world):
    torch.manual_seed(seed)
    model = parallelize_module(MLP(), init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)),
                               {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    if not isinstance(model.w1.weight, DTensor):
        raise SystemExit("FAIL: parallelize_module made no DTensors")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # Every tp rank reads the same batches: the same shuffle.
    data = torch.randn(SAMPLES, DIM, generator=torch.Generator().manual_seed(7))
    loader = StatefulDataLoader(data, batch_size=BATCH, shuffle=True,
                                generator=torch.Generator().manual_seed(11))
    return model, optimizer, loader


def train(args, client, rank, world):
    model, optimizer, loader = build(0, world)
    counter = Counter()
    ckpt = Checkpointer(model, optimizer, dataloader=loader, extra_state={"counter": counter},
                        client=client)
    batches = iter(loader)
    for step in range(1, 4):
        x = next(batches)
        (model(x) - x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        counter.tokens = rank if step == 1 else 100 * step  # step 1: the ranks disagree
        if step == 3:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ckpt.save(step)
        if step == 2:
            error = ckpt.last_save_error
            if error is None or "REPLICA_DIVERGED" not in str(error) or not any(
                    "checkpoint step 1 was not committed" in str(w.message) for w in caught):
                raise SystemExit("FAIL: step 1's refused save: last_save_error %r, warnings %s"
                                 % (error, [str(w.message) for w in caught]))
            say("step 1's save refused (%s), warned, kept in last_save_error"
                % error.code if hasattr(error, "code") else error)
            ckpt.wait()
            say("step 2 committed after the failed save")
    ckpt.save(3)
    say("committed 3", ckpt.wait(timeout=120))
    full = full_tensors(model, optimizer)
    if rank == 0:
        safetensors.torch.save_file(full, os.path.join(args.dump, "full.safetensors"))
    with open(os.path.join(args.dump, "rank-%d.json" % rank), "w") as f:
        json.dump({"next": next(batches).tolist()}, f)
    say("hanging at step 4")
    time.sleep(3600)


def resume(args, client, rank, world):
    model, optimizer, loader = build(1, world)
    ckpt = Checkpointer(model, optimizer, dataloader=loader, extra_state={"counter": Counter()},
                        client=client)
    step = ckpt.load()
    if step != 3:
        raise SystemExit("FAIL: load() returned %r, not 3" % (step,))
    saved = safetensors.torch.load_file(os.path.join(args.dump, "full.safetensors"))
    now = full_tensors(model, optimizer)
    bad = differing(saved, now)
    if bad:
        raise SystemExit("FAIL: rank %d: tensors differ from the saved ones: %s" % (rank, bad))
    say("ok: rank %d of tp=%d: %d model and optimizer tensors (ColwiseParallel, RowwiseParallel) "
        "bitwise identical" % (rank, world, len(saved)))
    with open(os.path.join(args.dump, "rank-%d.json" % rank)) as f:
        if next(iter(loader)).tolist() != json.load(f)["next"]:
            raise SystemExit("FAIL: rank %d: the StatefulDataLoader's next batch differs" % rank)
    say("ok: rank %d: the StatefulDataLoader's next batch is the saved run's" % rank)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "resume"])
    ap.add_argument("--agent", required=True)
    ap.add_argument("--rdzv", required=True)
    ap.add_argument("--dump", required=True)
    args = ap.parse_args()
    signal.alarm(240)  # never hangs: the default SIGALRM action ends the process
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    client = tessera.Client(args.agent, connect_timeout=30)
    rank, world = client.identity["rank"], client.identity["layout"]["tp"]
    dist.init_process_group("gloo", init_method="file://" + args.rdzv, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    {"train": train, "resume": resume}[args.mode](args, client, rank, world)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # see tests/seeds/fsdp2_rank.py exit_after_checks: gloo's teardown can abort


if __name__ == "__main__":
    main()
