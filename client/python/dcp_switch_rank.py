"""One rank of dcp_switch_test.sh: the same training script checkpointed through PyTorch DCP
or through tessera.dcp, chosen by one import (--api). FSDP2 over gloo on the CPU.

  dcp_switch_rank.py save   --api dcp|tessera --rank R --world N --rdzv FILE --ckpt DIR
  dcp_switch_rank.py resume --api dcp|tessera --rank R --world N --rdzv FILE --ckpt DIR

save: trains 3 steps from seed 0 and saves {"model", "optim", "sched" (a Stateful: the LR
  scheduler), "meta" (non-tensor values)} as checkpoint_id=DIR/step-3.
resume: a model of other values loads that checkpoint in place, checks the non-tensor values
  and the scheduler came back, trains 3 more steps and prints "final <sha256>" of every
  parameter and optimizer tensor gathered whole (rank 0).
"""

import argparse
import datetime
import hashlib
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

DIM, HIDDEN = 8, 12


def build(seed, world):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, DIM))
    fully_shard(model, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, steps):
    for step in steps:
        x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(step))
        (model(x) - x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()


def state(model, optimizer, scheduler, meta):
    return {"model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer),
            "sched": scheduler, "meta": meta}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "resume"])
    ap.add_argument("--api", choices=["dcp", "tessera"], required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--rdzv", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--agent", default="")
    ap.add_argument("--async_save", action="store_true",
                    help="save with async_save and wait on its future (tessera.dcp's run)")
    args = ap.parse_args()
    signal.alarm(180)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if args.api == "dcp":
        import torch.distributed.checkpoint as dcp
    else:
        os.environ["TESSERA_AGENT"] = args.agent
        import tessera.dcp as dcp
    dist.init_process_group("gloo", init_method="file://" + args.rdzv, rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=60))
    checkpoint_id = os.path.join(args.ckpt, "step-3")
    if args.mode == "save":
        model, optimizer, scheduler = build(0, args.world)
        train(model, optimizer, scheduler, range(1, 4))
        sd = state(model, optimizer, scheduler, {"step": 3, "tag": "run-a"})
        if args.async_save:
            # async_save returns once copied; its future resolves when the step is durable.
            where = dcp.async_save(sd, checkpoint_id=checkpoint_id).result(timeout=120)
            print("async_save committed", where, flush=True)
        else:
            dcp.save(sd, checkpoint_id=checkpoint_id)
        print("saved step 3", flush=True)
    else:
        model, optimizer, scheduler = build(1, args.world)
        sd = state(model, optimizer, scheduler, {"step": 0, "tag": ""})
        dcp.load(sd, checkpoint_id=checkpoint_id)
        set_model_state_dict(model, sd["model"])
        set_optimizer_state_dict(model, optimizer, sd["optim"])
        if sd["meta"] != {"step": 3, "tag": "run-a"} or scheduler.last_epoch != 3:
            raise SystemExit("FAIL: meta %r, scheduler at %d" % (sd["meta"], scheduler.last_epoch))
        train(model, optimizer, scheduler, range(4, 7))
        full = {"model." + k: v for k, v in get_model_state_dict(model).items()}
        for fqn, s in get_optimizer_state_dict(model, optimizer)["state"].items():
            full.update({"optim.%s.%s" % (fqn, k): v for k, v in s.items()})
        h = hashlib.sha256()
        for k in sorted(full):
            t = full[k].full_tensor() if isinstance(full[k], DTensor) else full[k]
            h.update(k.encode())
            h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        print("resumed step 3: meta and scheduler restored; final", h.hexdigest(), flush=True)
    dist.barrier()
    os._exit(0)  # see tests/seeds/fsdp2_rank.py exit_after_checks: gloo's teardown can abort


if __name__ == "__main__":
    main()
