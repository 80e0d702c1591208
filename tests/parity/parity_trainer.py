"""One rank of the resume-parity training run (resume_parity_test.sh): a tiny MLP trained
with data parallelism over gloo on the CPU, saving through `tessera` every --save_every steps.

  parity_trainer.py --agent SOCK --rdzv FILE [--steps 20] [--save_every 5]
                    [--hang_at_step S --hang_ranks 0,1,2,3]

The rank and the DP degree come from the agent (client.identity). If the job has a committed
checkpoint, the run resumes from `latest` (model, AdamW state, LR scheduler, RNG states and
data position), otherwise it starts fresh. It prints, flushed, one line per event:

  rank R of W             resumed from step S | fresh start
  loss STEP HEX           (every step; HEX = float.hex of the float32 loss, exact bits)
  committed STEP DIR      (after each save; the run waits for the commit)
  hanging at step S       (--hang_at_step: this rank stops before computing step S and waits
                           to be killed)
  final STEP SHA256       (digest of every parameter and optimizer-state tensor at the end)

Why the losses cannot depend on the DP degree: every step consumes a global batch of
MICRO_BATCHES micro-batches of MICRO_BATCH samples, whatever the world size. Rank r of W
computes the loss and gradients of micro-batches [r*M/W, (r+1)*M/W) one at a time (each from
zeroed gradients, so a micro-batch's gradient is a pure function of the parameters and its
samples), packs each into one flat vector, and all-gathers them; every rank then sums the M
vectors sequentially in micro-batch index order and divides by M. The float additions are
therefore the same, in the same order, on 4 ranks, 2 ranks or 1. DDP's bucketed allreduce
is not used because its reduction order (ring/tree over ranks, bucket boundaries) changes
with the world size, so its sums differ in the last bits from one DP degree to another.
Every rank then runs the same AdamW step on the same full tensors, so parameters and
optimizer state are true replicas over dp (saved as such; the agents compare replica hashes).

Randomness that must survive a resume is replicated and checkpointed as objects (tessera's
tagged-JSON encoding, never pickle): the data loader's numpy RandomState (it draws each
epoch's permutation), its epoch / position / current permutation, and the dropout generator,
which draws one seed per micro-batch each step; the rank that computes micro-batch j seeds
torch's default generator with seed j, so dropout masks do not depend on which rank computes
them. torch's default generator state is saved per rank as well (it is reseeded per
micro-batch, so a resume on fewer ranks does not need the missing ranks' states).
"""

import argparse
import datetime
import hashlib
import os
import signal
import sys
import time

import numpy
import torch
import torch.distributed as dist

import tessera

SAMPLES = 96          # dataset size; a global batch of 20 crosses epochs mid-batch
FEATURES = 16
CLASSES = 4
MICRO_BATCHES = 4     # per step, for every DP degree (1, 2 or 4 ranks)
MICRO_BATCH = 5       # samples per micro-batch
MODEL_SEED = 0
DATA_SEED = 1234
LOADER_SEED = 4321
DROPOUT_SEED = 99


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, 32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.drop = torch.nn.Dropout(0.2)
        self.out = torch.nn.Linear(32, CLASSES)

    def forward(self, x):
        x = self.drop(torch.relu(self.fc1(x)))
        return self.out(torch.relu(self.fc2(x)))


def dataset():
    """The same samples on every rank: a fixed function of DATA_SEED, not training state."""
    g = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    return x, (x @ teacher).argmax(dim=1)


class Loader:
    """Epochs of shuffled sample indices; its whole state is checkpointable."""

    def __init__(self):
        self.rs = numpy.random.RandomState(LOADER_SEED)
        self.epoch = 0
        self.perm = self.rs.permutation(SAMPLES)
        self.pos = 0

    def next_indices(self, n):
        out = []
        while len(out) < n:
            if self.pos == SAMPLES:
                self.epoch += 1
                self.perm = self.rs.permutation(SAMPLES)
                self.pos = 0
            take = min(n - len(out), SAMPLES - self.pos)
            out.extend(int(i) for i in self.perm[self.pos:self.pos + take])
            self.pos += take
        return out

    def state(self):
        return {"epoch": self.epoch, "pos": self.pos, "perm": self.perm.copy(),
                "rng": self.rs.get_state()}

    def load(self, state):
        self.epoch = state["epoch"]
        self.pos = state["pos"]
        self.perm = state["perm"]
        self.rs.set_state(state["rng"])


def flat_grads(params):
    return torch.cat([p.grad.reshape(-1) for p in params])


def train_step(model, params, optimizer, scheduler, loader, dropout_gen, data, rank, world):
    """One optimizer step over MICRO_BATCHES micro-batches; returns the step's loss (0-d
    float32 tensor), identical on every rank."""
    x, y = data
    indices = loader.next_indices(MICRO_BATCHES * MICRO_BATCH)
    seeds = torch.randint(0, 2 ** 62, (MICRO_BATCHES,), generator=dropout_gen)
    per_rank = MICRO_BATCHES // world
    rows = []
    for j in range(rank * per_rank, (rank + 1) * per_rank):
        idx = torch.tensor(indices[j * MICRO_BATCH:(j + 1) * MICRO_BATCH])
        model.zero_grad(set_to_none=True)
        torch.manual_seed(int(seeds[j]))
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        rows.append(torch.cat([flat_grads(params), loss.detach().reshape(1)]))
    local = torch.stack(rows)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    by_micro_batch = torch.cat(gathered)  # rank order == micro-batch order
    total = by_micro_batch[0].clone()
    for j in range(1, MICRO_BATCHES):
        total += by_micro_batch[j]
    total /= MICRO_BATCHES
    offset = 0
    for p in params:
        p.grad = total[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    optimizer.step()
    scheduler.step()
    return total[-1]


def capture_objects(optimizer, scheduler, loader, dropout_gen, step, world):
    return {
        "param_groups": [{k: v for k, v in g.items() if k != "params"}
                         for g in optimizer.state_dict()["param_groups"]],
        "scheduler": scheduler.state_dict(),
        "rng": {"dropout": dropout_gen.get_state(), "torch": torch.get_rng_state()},
        "loader": loader.state(),
        "progress": {"step": step, "world": world},
    }


def replicated_digest(objs):
    """sha256 of the objects every rank must hold identically (all but the per-rank torch
    RNG and the saving world size)."""
    shared = {k: v for k, v in objs.items() if k not in ("rng", "progress")}
    shared["dropout"] = objs["rng"]["dropout"]
    return hashlib.sha256(tessera.objects.encode(shared)).digest()


def check_replicated(objs, world):
    """Every rank resumed from objects with the same replicated content."""
    mine = torch.tensor(list(replicated_digest(objs)), dtype=torch.uint8)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    if not all(torch.equal(mine, other) for other in everyone):
        raise RuntimeError("ranks resumed from different replicated objects")


def state_digest(state):
    h = hashlib.sha256()
    for key in sorted(state):
        value = state[key]
        tensor = value.tensor if isinstance(value, tessera.Shard) else value
        h.update(key.encode())
        h.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    ap.add_argument("--rdzv", required=True, help="file for torch.distributed's FileStore")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save_every", type=int, default=5)
    ap.add_argument("--hang_at_step", type=int, default=0)
    ap.add_argument("--hang_ranks", default="")
    ap.add_argument("--timeout", type=int, default=150, help="the process ends itself after this")
    args = ap.parse_args()
    signal.alarm(args.timeout)  # default SIGALRM action: the process dies; never hangs

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)

    client = tessera.Client(args.agent, connect_timeout=30)
    identity = client.identity
    rank, world = identity["rank"], identity["layout"]["dp"]
    if len(identity["layout"]) != 1 or MICRO_BATCHES % world:
        raise SystemExit("layout %s: this trainer needs a dp-only layout dividing %d"
                         % (identity["layout"], MICRO_BATCHES))
    dist.init_process_group("gloo", init_method="file://" + args.rdzv, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=30))
    say("rank", rank, "of", world)

    torch.manual_seed(MODEL_SEED)
    model = Mlp()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.5)
    loader = Loader()
    dropout_gen = torch.Generator().manual_seed(DROPOUT_SEED)
    data = dataset()

    start = 0
    if client.latest() is not None:
        tessera.init_optimizer_state(optimizer)
        state = tessera.flatten_state(model.state_dict(), optimizer)
        start, objs = client.load("latest", into=state, objects=True)
        if client.last_absent:
            raise RuntimeError("optimizer state absent after a load: %s" % client.last_absent)
        if objs["progress"]["step"] != start:
            raise RuntimeError("objects of step %s in checkpoint %d"
                               % (objs["progress"]["step"], start))
        for group, saved in zip(optimizer.param_groups, objs["param_groups"]):
            group.update(saved)
        scheduler.load_state_dict(objs["scheduler"])
        loader.load(objs["loader"])
        dropout_gen.set_state(objs["rng"]["dropout"])
        torch.set_rng_state(objs["rng"]["torch"])
        check_replicated(objs, world)
        say("resumed from step", start, "saved by", objs["progress"]["world"], "ranks")
    else:
        say("fresh start")

    hang_ranks = {int(r) for r in args.hang_ranks.split(",") if r}
    for step in range(start + 1, args.steps + 1):
        if step == args.hang_at_step and rank in hang_ranks:
            say("hanging at step", step)
            time.sleep(args.timeout)  # killed by the test long before; the alarm ends it
            raise SystemExit(3)
        loss = train_step(model, params, optimizer, scheduler, loader, dropout_gen, data,
                          rank, world)
        say("loss", step, float(loss).hex())
        if step % args.save_every == 0:
            state = tessera.flatten_state(model.state_dict(), optimizer)
            client.save(step, state, objects=capture_objects(optimizer, scheduler, loader,
                                                             dropout_gen, step, world))
            say("committed", step, client.wait(step, timeout=60))
    say("final", args.steps, state_digest(tessera.flatten_state(model.state_dict(), optimizer)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
