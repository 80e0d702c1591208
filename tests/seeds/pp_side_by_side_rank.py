"""One pipeline stage of seed scenario pp_half_saved_side_by_side (pp_half_saved_test.sh): the
torchtitan report, replayed with torch 2.11's own pipelining and DCP next to tessera.

  pp_side_by_side_rank.py --agent SOCK --rdzv FILE --dcp DIR

Two processes (the agents' layout pp=2) split a llama-like model into two stages the way
torchtitan's first pipeline split did: a copy of the model whose nn.ModuleList keeps only this
stage's blocks — so both stages name their blocks layers.0 and layers.1. They train two steps
with torch.distributed.pipelining (PipelineStage, ScheduleGPipe, over gloo) and AdamW, then
save what get_model_state_dict / get_optimizer_state_dict return:

1. with DCP (torch.distributed.checkpoint.save) into DIR/reused, then reload it with
   dcp.load into a fresh stage and compare every tensor with what each stage saved;
2. the same with stage-unique names (torchtitan's fix: blocks keep their global index,
   layers.2 and layers.3 on stage 1) into DIR/unique, as a control;
3. with tessera, the reused names (step 1: must be refused), then the unique ones (step 2).

Prints one JSON line: {"rank", "dcp": {"reused": REPORT, "unique": REPORT}, "tessera":
{"reused": {...}, "unique": {...}}} where a DCP REPORT is {"save": type of what dcp.save
returned or the exception, "load_error": exception or null, "tensors": {key: "own" | "other"
| "same" | "neither"}} — after reloading, does each tensor hold what this stage saved, what
the other stage saved under that name, the value both saved alike, or something else.
"""

import argparse
import datetime
import json
import signal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import tessera

VOCAB, DIM, LAYERS, SEQ, BATCH = 11, 8, 4, 6, 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(DIM)
        self.w1 = torch.nn.Linear(DIM, 2 * DIM, bias=False)
        self.w2 = torch.nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x):
        return x + self.w2(torch.nn.functional.silu(self.w1(self.norm(x))))


class Stage(torch.nn.Module):
    """Model blocks [first, last) of a llama-like model; the first stage embeds, the last
    projects to the vocabulary. `unique_names`: blocks keep their global index (a
    ModuleDict); otherwise an nn.ModuleList re-indexes them from 0 on every stage."""

    def __init__(self, stage, stages, unique_names):
        super().__init__()
        torch.manual_seed(0)
        blocks = [Block() for _ in range(LAYERS)]  # the whole model's, then this stage's
        per = LAYERS // stages
        mine = range(stage * per, (stage + 1) * per)
        self.layers = (torch.nn.ModuleDict({str(i): blocks[i] for i in mine}) if unique_names
                       else torch.nn.ModuleList([blocks[i] for i in mine]))
        self.tok_embeddings = torch.nn.Embedding(VOCAB, DIM) if stage == 0 else None
        self.norm = torch.nn.RMSNorm(DIM) if stage == stages - 1 else None
        self.output = torch.nn.Linear(DIM, VOCAB, bias=False) if stage == stages - 1 else None

    def forward(self, x):
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for block in (self.layers.values() if isinstance(self.layers, torch.nn.ModuleDict)
                      else self.layers):
            h = block(h)
        return self.output(self.norm(h)) if self.output is not None else h


def trained_stage(rank, world, unique_names):
    """This stage after two pipeline-parallel training steps, and its optimizer."""
    model = Stage(rank, world, unique_names)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = ScheduleGPipe(PipelineStage(model, rank, world, torch.device("cpu")),
                             n_microbatches=2, loss_fn=lambda out, target: torch.nn.functional.
                             cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1)))
    g = torch.Generator().manual_seed(7)
    for _ in range(2):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        if rank == 0:
            schedule.step(tokens[:, :-1].contiguous())
        else:
            schedule.step(target=tokens[:, 1:].contiguous())
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def flat_tensors(sd, prefix=""):
    """{dotted key: tensor} of a nested state dict."""
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update(flat_tensors(v, prefix + str(k) + "."))
        elif isinstance(v, torch.Tensor):
            out[prefix + str(k)] = v
    return out


def dcp_side(rank, world, unique_names, directory):
    model, optimizer = trained_stage(rank, world, unique_names)
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    mine = {k: v.detach().clone() for k, v in flat_tensors(sd).items()}
    theirs = [None] * world
    dist.all_gather_object(theirs, mine)
    other = theirs[1 - rank]
    report = {"tensors": {}, "load_error": None}
    try:
        report["save"] = type(dcp.save(sd, checkpoint_id=directory)).__name__
    except Exception as e:  # what DCP does is the finding; recorded, not hidden
        report["save"] = "%s: %s" % (type(e).__name__, e)
        return report
    fresh = Stage(rank, world, unique_names)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    sd2 = {"model": get_model_state_dict(fresh),
           "optim": get_optimizer_state_dict(fresh, fresh_optimizer)}
    with torch.no_grad():
        for t in flat_tensors(sd2).values():
            t.fill_(-12345.0)
    try:
        dcp.load(sd2, checkpoint_id=directory)
        set_model_state_dict(fresh, sd2["model"])
        set_optimizer_state_dict(fresh, fresh_optimizer, sd2["optim"])
    except Exception as e:
        report["load_error"] = "%s: %s" % (type(e).__name__, e)
    for key, t in sorted(flat_tensors(sd2).items()):
        if key in other and torch.equal(mine[key], other[key]):
            # Both stages saved the same values (a step count): which copy came back cannot
            # be told, and does not matter.
            report["tensors"][key] = "same" if torch.equal(t, mine[key]) else "neither"
        elif torch.equal(t, mine[key]):
            report["tensors"][key] = "own"
        elif key in other and torch.equal(t, other[key]):
            report["tensors"][key] = "other"
        else:
            report["tensors"][key] = "neither"
    return report


def tessera_side(client, rank, world, unique_names, step):
    model, optimizer = trained_stage(rank, world, unique_names)
    state = tessera.flatten_state(get_model_state_dict(model),
                                  get_optimizer_state_dict(model, optimizer))
    out = {"latest_before": client.latest(), "keys": len(state)}
    try:
        client.save(step, state)
    except tessera.TesseraError as e:
        out.update(raised_by="save", error=type(e).__name__, code=e.code, message=e.message,
                   fqns=e.fqns, ranks=[[r, c] for r, c in e.ranks])
    else:
        try:
            out["committed"] = client.wait(step, timeout=120)
        except tessera.TesseraError as e:
            out.update(raised_by="wait", error=type(e).__name__, code=e.code, message=e.message)
    out["latest_after"] = client.latest()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    ap.add_argument("--rdzv", required=True)
    ap.add_argument("--dcp", required=True)
    ap.add_argument("--timeout", type=int, default=240)
    args = ap.parse_args()
    signal.alarm(args.timeout)  # the process ends itself; never hangs
    torch.set_num_threads(1)
    client = tessera.Client(args.agent, connect_timeout=30)
    identity = client.identity
    rank, world = identity["rank"], identity["layout"]["pp"]
    dist.init_process_group("gloo", init_method="file://" + args.rdzv, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    report = {"rank": rank, "coords": identity["coords"],
              "dcp": {"reused": dcp_side(rank, world, False, args.dcp + "/reused"),
                      "unique": dcp_side(rank, world, True, args.dcp + "/unique")},
              "tessera": {"reused": tessera_side(client, rank, world, False, 1),
                          "unique": tessera_side(client, rank, world, True, 2)},
              "torch": torch.__version__}
    dist.destroy_process_group()
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
