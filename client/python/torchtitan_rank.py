"""One rank of torchtitan_test.sh: tessera.torchtitan's manager driven as torchtitan's trainer
drives it (build from its Config, load, save every step, close), with torchtitan's own
OptimizersContainer, LRSchedulersContainer and ParallelAwareDataloader and an FSDP2 model on
a mesh dim named "fsdp" (as torchtitan names it), over gloo on the CPU.

  torchtitan_rank.py train  --rdzv FILE --dump DIR
  torchtitan_rank.py resume --rdzv FILE --dump DIR [--load-step N] [--exclude KEY,...]
                            [--steps N]

train: a fresh job, whose load() takes the model's weights from initial_load_path (a DCP
  checkpoint of a model with other values) through torchtitan's own manager; 4 steps with
  interval 2 and async_mode "async" (steps 2 and 4 saved), waits for step 4's commit (maybe_wait_for_saving), writes what the
  checkpoint must give back — DIR/full.safetensors (rank 0: every model and optimizer tensor
  whole), DIR/job.json (rank 0: scheduler, train state, lr) and DIR/rank-R.json (each rank:
  the next batch its loader gives) — prints "hanging at step 5" and waits to be SIGKILLed.
resume: another model (other values) on this job's mesh; load(step=--load-step, else -1 for
  the latest) must restore every tensor and the job-wide state bitwise, and the loader's next
  batch unless "dataloader" is excluded (then it must be the fresh loader's). With --steps N
  it trains on to step N, the last step: saved whole, and the model exported by rank 0 to
  DIR/checkpoint/step-N/model.safetensors, which must equal the gathered model.
"""

import argparse
import datetime
import json
import os
import signal
import sys
import time

import safetensors.torch
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer
from torchtitan.components.optimizer.optimizer import default_adamw

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpointer_more_rank import DIM, MLP, differing  # noqa: E402
from checkpointer_rank import full_tensors, say  # noqa: E402

from tessera.torchtitan import TesseraCheckpointManager  # noqa: E402

BATCH, STEPS_SAVED = 2, 4


class Samples(IterableDataset):
    """An endless stream of this dp rank's samples; sample i is a function of (rank, i)."""

    def __init__(self, dp_rank):
        self.dp_rank = dp_rank

    def __iter__(self):
        i = 0
        while True:
            seed = self.dp_rank * 10**6 + i
            yield torch.randn(DIM, generator=torch.Generator().manual_seed(seed))
            i += 1


class TrainState:
    """The trainer's train_state (torchtitan's Trainer.state_dict: step, tokens seen)."""

    def __init__(self):
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state):
        self.step, self.ntokens_seen = state["step"], state["ntokens_seen"]


def sharded_model(seed, world):
    torch.manual_seed(seed)
    model = MLP()
    fully_shard(model, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",)))
    return model


def build(seed, rank, world, args, dump, initial_load_path=None):
    model = sharded_model(seed, world)
    optimizers = default_adamw(lr=1e-2)
    optimizers.implementation = "for-loop"
    optimizers = optimizers.build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers,
                                                                   training_steps=6)
    loader = ParallelAwareDataloader(Samples(rank), dp_rank=rank, dp_world_size=world,
                                     batch_size=BATCH)
    state = TrainState()
    config = TesseraCheckpointManager.Config(
        enable=True, interval=2, async_mode="async", keep_latest_k=0,
        load_step=args.load_step, exclude_from_loading=args.exclude,
        initial_load_path=initial_load_path)
    manager = config.build(dataloader=loader, model_parts=[model], optimizers=optimizers,
                           lr_schedulers=schedulers, states={"train_state": state},
                           sd_adapter=None, base_folder=dump)
    return model, optimizers, schedulers, loader, state, manager


def train_step(model, optimizers, schedulers, batches, state):
    x = next(batches)
    loss = (model(x) - x).pow(2).mean()
    loss.backward()
    optimizers.step()
    optimizers.zero_grad()
    schedulers.step()
    state.step += 1
    state.ntokens_seen += x.numel()


def gathered(model, optimizers):
    """Every model and optimizer tensor, whole (a collective), by a stable key."""
    return full_tensors(model, optimizers.optimizers[0])


def job_state(optimizers, schedulers, state):
    return {"lr": optimizers.optimizers[0].param_groups[0]["lr"],
            "scheduler": schedulers.state_dict(), "train_state": state.state_dict()}


def train(args, rank, world):
    # A fresh job's weights from elsewhere: a DCP checkpoint of a model with other values.
    initial = sharded_model(2, world)
    seed_dir = os.path.join(args.dump, "initial-dcp")
    dcp.save(initial.state_dict(), checkpoint_id=seed_dir)
    model, optimizers, schedulers, loader, state, manager = build(0, rank, world, args, args.dump,
                                                                  initial_load_path=seed_dir)
    if not manager.load(step=-1):
        raise SystemExit("FAIL: a fresh job with initial_load_path loaded nothing")
    bad = differing({k: v.full_tensor() for k, v in initial.state_dict().items()},
                    {k: v.full_tensor() for k, v in model.state_dict().items()})
    if bad:
        raise SystemExit("FAIL: initial_load_path did not give the model its weights: %s" % bad)
    say("a fresh job: the model's weights from initial_load_path (a DCP checkpoint)")
    batches = iter(loader)
    saved = []
    for step in range(1, STEPS_SAVED + 1):
        train_step(model, optimizers, schedulers, batches, state)
        if manager.save(step, last_step=False):
            saved.append(step)
    if saved != [2, 4] or manager.save_future is None:
        raise SystemExit("FAIL: saved steps %s (interval 2: [2, 4]), save_future %r"
                         % (saved, manager.save_future))
    manager.maybe_wait_for_saving()
    say("committed steps %s (async: save() returned before each commit)" % saved)
    full = gathered(model, optimizers)
    if rank == 0:
        safetensors.torch.save_file(full, os.path.join(args.dump, "full.safetensors"))
        with open(os.path.join(args.dump, "job.json"), "w") as f:
            json.dump(job_state(optimizers, schedulers, state), f, sort_keys=True)
    # The loader's next batch: a fresh iterator of a loader restored from its state.
    with open(os.path.join(args.dump, "rank-%d.json" % rank), "w") as f:
        json.dump({"next": next(batches).tolist()}, f)
    say("hanging at step 5")
    time.sleep(3600)


def resume(args, rank, world):
    model, optimizers, schedulers, loader, state, manager = build(1, rank, world, args, args.dump)
    if not manager.load(step=args.load_step):
        raise SystemExit("FAIL: load() found no checkpoint")
    bad = differing(safetensors.torch.load_file(os.path.join(args.dump, "full.safetensors")),
                    gathered(model, optimizers))
    if bad:
        raise SystemExit("FAIL: rank %d: tensors differ from the saved ones: %s" % (rank, bad))
    with open(os.path.join(args.dump, "job.json")) as f:
        job = json.load(f)
    if job_state(optimizers, schedulers, state) != job:
        raise SystemExit("FAIL: rank %d: job state %s, saved %s"
                         % (rank, job_state(optimizers, schedulers, state), job))
    say("ok: rank %d of %d: model and optimizer bitwise, scheduler and train state (step %d) "
        "restored" % (rank, world, state.step))
    batches = iter(loader)
    first = next(batches)
    path = os.path.join(args.dump, "rank-%d.json" % rank)
    if "dataloader" in args.exclude:
        fresh = iter(Samples(rank))
        if not torch.equal(first, torch.stack([next(fresh) for _ in range(BATCH)])):
            raise SystemExit("FAIL: rank %d: the loader moved though it was excluded" % rank)
        say("ok: rank %d: the loader, excluded from loading, starts afresh" % rank)
    else:
        with open(path) as f:
            if first.tolist() != json.load(f)["next"]:
                raise SystemExit("FAIL: rank %d: the loader's next batch differs" % rank)
        say("ok: rank %d: the loader's next batch is the saved run's" % rank)
    if args.steps:
        for step in range(state.step + 1, args.steps + 1):
            train_step(model, optimizers, schedulers, batches, state)
            manager.save(step, last_step=step == args.steps)
        model_now = {k[len("model."):]: v for k, v in gathered(model, optimizers).items()
                     if k.startswith("model.")}
        if rank == 0:
            exported = safetensors.torch.load_file(manager.last_export)
            bad = differing(model_now, exported)
            if bad or manager.last_export != os.path.join(
                    args.dump, "checkpoint", "step-%d" % args.steps, "model.safetensors"):
                raise SystemExit("FAIL: export %s differs from the model: %s"
                                 % (manager.last_export, bad))
            say("ok: last step %d saved and its model exported (%d tensors, bitwise)"
                % (args.steps, len(exported)))
    manager.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "resume"])
    ap.add_argument("--agent", required=True)
    ap.add_argument("--rdzv", required=True)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--load-step", type=int, default=-1)
    ap.add_argument("--exclude", type=lambda s: s.split(",") if s else [], default=[])
    ap.add_argument("--steps", type=int, default=0)
    args = ap.parse_args()
    signal.alarm(240)  # never hangs: the default SIGALRM action ends the process
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.environ["TESSERA_AGENT"] = args.agent
    import tessera
    identity = tessera.Client(args.agent, connect_timeout=30, prefetch_resident=False).identity
    rank, world = identity["rank"], identity["layout"]["fsdp"]
    dist.init_process_group("gloo", init_method="file://" + args.rdzv, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    {"train": train, "resume": resume}[args.mode](args, rank, world)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # see tests/seeds/fsdp2_rank.py exit_after_checks: gloo's teardown can abort


if __name__ == "__main__":
    main()
