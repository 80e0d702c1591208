"""A small PyTorch trainer rank for tessera_e2e_test.py: one process per rank, talking to its
agent through `tessera`. Prints one JSON line (its report) on stdout as its last line.

  trainer.py save --agent SOCK --out DIR --steps 1,2 [--frozen]   train and save each step
  trainer.py load --agent SOCK --out DIR [--frozen]   fresh model + optimizer; load, compare
  trainer.py dup  --agent SOCK                        saves a tensor every rank names alike
  trainer.py memsave --agent SOCK                     saves step 10: one tensor of its own
  trainer.py memload --agent SOCK                     loads it back (a restarted trainer)

Step 0 is saved before any optimizer step (all optimizer state absent); --frozen adds a
frozen layer whose optimizer state stays absent.

Every rank builds the same model from the same seed and trains on the same batch, so the
parameters and optimizer state are true replicas over dp (the agents verify this by hash).
Expected values are written with tessera.objects.encode (no pickle) to DIR/expected-<rank>-<step>.
"""

import argparse
import json
import os
import random
import sys

import numpy
import torch

import tessera

torch.set_num_threads(1)


class Net(torch.nn.Module):
    def __init__(self, frozen):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 6)
        self.fc1 = torch.nn.Linear(6, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 3)
        if frozen:
            self.frozen = torch.nn.Linear(3, 3)  # never gets a gradient: state stays absent
            self.frozen.requires_grad_(False)

    def forward(self, ids):
        return self.fc2(torch.relu(self.norm(self.fc1(self.embed(ids)))))


def build(seed, frozen):
    torch.manual_seed(seed)
    model = Net(frozen)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler):
    ids = torch.arange(8) % 10
    target = torch.arange(8) % 3
    loss = torch.nn.functional.cross_entropy(model(ids), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def capture_objects(optimizer, scheduler, rank, batch):
    return {
        "param_groups": optimizer.state_dict()["param_groups"],
        "scheduler": scheduler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": numpy.random.get_state(),
                "python": random.getstate()},
        "loader": {"epoch": 0, "batch": batch, "rank": rank, "seen": [rank, batch, None, 1.5],
                   "blob": bytes([rank, 0, 255])},
    }


def draws():
    """Random numbers from every generator: equal iff the RNG states were restored."""
    return {"torch": torch.rand(4), "numpy": numpy.random.rand(3), "python": random.random()}


def expected_path(out, rank, step):
    return os.path.join(out, "expected-%d-%d" % (rank, step))


def do_save(client, out, steps, frozen):
    rank = client.identity["rank"]
    model, optimizer, scheduler = build(seed=0, frozen=frozen)
    random.seed(1000 + rank)
    numpy.random.seed(2000 + rank)
    torch.manual_seed(3000 + rank)  # per-rank RNG; the model was built from seed 0 above
    report = {"rank": rank, "identity": client.identity, "saves": []}
    for step in steps:
        if step > 0:
            train_step(model, optimizer, scheduler)
        state = tessera.flatten_state(model.state_dict(), optimizer)
        objs = capture_objects(optimizer, scheduler, rank, batch=step)
        if not report["saves"]:  # staging made and mapped before the first save
            client.reserve(state, objects=objs)
            report["maps_after_reserve"] = client.stats()["staging_maps"]
        result = client.save(step, state, objects=objs)
        directory = client.wait(step, timeout=60)
        expected = {"tensors": {k: (v.tensor if isinstance(v, tessera.Shard) else v).clone()
                                for k, v in state.items() if not isinstance(v, tessera.Absent)},
                    "absent": sorted(k for k, v in state.items() if isinstance(v, tessera.Absent)),
                    "objects": objs, "draws": draws()}
        with open(expected_path(out, rank, step), "wb") as f:
            f.write(tessera.objects.encode(expected))
        report["saves"].append({"step": step, "plan_cached": result.plan_cached,
                                "session_id": result.session_id, "dir": directory,
                                "stall_seconds": result.stall_seconds})
    report["latest"] = client.latest()
    report["staging_maps"] = client.stats()["staging_maps"]
    return report


def bitwise_equal(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def compare_tensors(state, expected, mismatches, label):
    keys = {k for k, v in state.items() if not isinstance(v, tessera.Absent)}
    if keys != set(expected):
        mismatches.append("%s: keys differ: %s" % (label, sorted(keys ^ set(expected))))
    for key in sorted(keys & set(expected)):
        value = state[key]
        tensor = value.tensor if isinstance(value, tessera.Shard) else value
        if not bitwise_equal(tensor, expected[key]):
            mismatches.append("%s: tensor %s differs" % (label, key))


def same(a, b):
    """Deep equality where tensors/arrays compare bitwise."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and bitwise_equal(a, b))
    if isinstance(a, numpy.ndarray) or isinstance(b, numpy.ndarray):
        return (isinstance(a, numpy.ndarray) and isinstance(b, numpy.ndarray)
                and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    return type(a) is type(b) and a == b


def read_expected(out, rank, step):
    with open(expected_path(out, rank, step), "rb") as f:
        return tessera.objects.decode(f.read())


def do_load(client, out, frozen):
    rank = client.identity["rank"]
    mismatches = []
    report = {"rank": rank, "mismatches": mismatches}

    # Latest, with objects, into a fresh model/optimizer whose values all differ.
    model, optimizer, scheduler = build(seed=77, frozen=frozen)
    tessera.init_optimizer_state(optimizer)
    state = tessera.flatten_state(model.state_dict(), optimizer)
    absent = sorted(k for k, v in state.items() if isinstance(v, tessera.Absent))
    into = state
    for key in absent:
        del into[key]  # frozen parameters: no state to load into (the package's example)
    step, objs = client.load("latest", into=into, objects=True)
    report["step"] = step
    expected = read_expected(out, rank, step)
    if absent != expected["absent"]:
        mismatches.append("absent markers %s != saved %s" % (absent, expected["absent"]))
    compare_tensors(into, expected["tensors"], mismatches, "latest")
    # The optimizer itself (not just the mapping) holds the loaded state.
    live = tessera.flatten_state(model.state_dict(), optimizer)
    compare_tensors({k: v for k, v in live.items() if k in expected["tensors"]},
                    expected["tensors"], mismatches, "live optimizer")
    for name in expected["objects"]:
        if not same(objs.get(name), expected["objects"][name]):
            mismatches.append("object %s differs" % name)
    if set(objs) != set(expected["objects"]):
        mismatches.append("object names %s" % sorted(objs))
    scheduler.load_state_dict(objs["scheduler"])
    torch.set_rng_state(objs["rng"]["torch"])
    numpy.random.set_state(objs["rng"]["numpy"])
    random.setstate(objs["rng"]["python"])
    if not same(draws(), expected["draws"]):
        mismatches.append("random draws after restoring the RNG states differ")

    # An explicit older step, parameters only.
    model1, _, _ = build(seed=78, frozen=frozen)
    params = tessera.flatten_state(model1.state_dict())
    report["step1"] = client.load(1, into=params)
    expected1 = read_expected(out, rank, 1)["tensors"]
    compare_tensors(params, {k: v for k, v in expected1.items() if "#" not in k}, mismatches,
                    "step 1")
    if os.path.exists(expected_path(out, rank, 0)):
        load_step0(client, out, rank, frozen, report)
    report["latest"] = client.latest()
    return report


def load_step0(client, out, rank, frozen, report):
    """Step 0, saved before the first optimizer step (every parameter's state absent), into a
    fresh optimizer whose state init_optimizer_state made up (step=1, zero moments): the load
    leaves no parameter with that state, and marks each absent in the mapping as saved."""
    mismatches = report["mismatches"]
    model, optimizer, _ = build(seed=79, frozen=frozen)
    tessera.init_optimizer_state(optimizer)
    state = tessera.flatten_state(model.state_dict(), optimizer)
    frozen_keys = [k for k, v in state.items() if isinstance(v, tessera.Absent)]
    for key in frozen_keys:
        del state[key]
    report["step0"] = client.load(0, into=state)
    kept = sorted(n for n, p in model.named_parameters() if optimizer.state.get(p))
    if kept:
        mismatches.append("step 0: optimizer state kept for %s, saved absent" % kept)
    marked = sorted(frozen_keys + [k for k, v in state.items() if isinstance(v, tessera.Absent)])
    saved = read_expected(out, rank, 0)["absent"]
    if marked != saved:
        mismatches.append("step 0: absent markers %s != saved %s" % (marked, saved))


def stage_tensor(rank):
    """Rank `rank`'s one tensor of the memory-tier cases: 1 MiB whose values no other rank has
    (the test finds it in the agent's memory by its first 16 values, k * 7919)."""
    return torch.arange(1 << 17, dtype=torch.int64) * 7919 + rank * (1 << 40)


def do_memsave(client):
    rank = client.identity["rank"]
    client.save(10, {"stage%d.w" % rank: stage_tensor(rank)})
    client.wait(10, timeout=60)
    return {"rank": rank}


def do_memload(client):
    rank = client.identity["rank"]
    into = torch.zeros(1 << 17, dtype=torch.int64)
    prefetch_ended = client.await_prefetch(60)
    step = client.load(10, into={"stage%d.w" % rank: into})
    return {"rank": rank, "step": step, "prefetch_ended": prefetch_ended, "equal": bool(torch.equal(into, stage_tensor(rank))),
            "sources": client.last_load, "stats": client.stats()}


def do_dup(client):
    # Every pp stage names its layer "layers.0.weight": the torchtitan bug.
    try:
        client.save(5, {"layers.0.weight": torch.full((2, 2), float(client.identity["rank"]))})
    except tessera.TesseraError as e:
        return {"raised": type(e).__name__, "code": e.code, "fqns": e.fqns,
                "is_invalid_argument": isinstance(e, tessera.InvalidArgumentError),
                "message": e.message, "latest": client.latest()}
    return {"raised": None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "load", "dup", "memsave", "memload"])
    ap.add_argument("--agent", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--steps", default="1,2")
    ap.add_argument("--frozen", action="store_true")
    args = ap.parse_args()
    client = tessera.Client(args.agent, connect_timeout=30)
    if args.mode == "save":
        report = do_save(client, args.out, [int(s) for s in args.steps.split(",")],
                         args.frozen)
    elif args.mode == "load":
        report = do_load(client, args.out, args.frozen)
    elif args.mode == "memsave":
        report = do_memsave(client)
    elif args.mode == "memload":
        report = do_memload(client)
    else:
        report = do_dup(client)
    sys.stdout.write(json.dumps(report, default=str) + "\n")


if __name__ == "__main__":
    main()
