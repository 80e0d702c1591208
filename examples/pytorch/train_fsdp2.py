"""Train a small transformer with FSDP2 and checkpoint it through Tessera — a script to copy.

Run one process per rank with torchrun, one Tessera agent beside each rank (README.md,
"PyTorch example", shows it on loopback):

    torchrun --standalone --nproc_per_node=2 examples/pytorch/train_fsdp2.py \\
        --agent='/tmp/tessera/agent-{rank}.sock' --steps=20 --save-every=5

What it does with Tessera, in three calls of ``tessera.torch.Checkpointer``:

* ``Checkpointer(model, optimizer, lr_scheduler=scheduler, agent=...)``: connects to this
  rank's agent. The agents were started with ``--layout=dp_shard=<world size>``: the name of
  the DeviceMesh dim below, so tessera maps every DTensor's placements to the job's layout
  without being told.
* ``ckpt.load()``: resumes from the latest checkpoint, if there is one — model, optimizer,
  scheduler and RNGs, on whatever number of ranks this run has (the checkpoint reshards).
* ``ckpt.save(step)``: returns as soon as this rank's shards are copied into the agent's
  shared memory; the agents write, verify and commit in the background. ``ckpt.wait()``
  before exiting, so the last save is durable.

Works on CPU (gloo) and on GPUs (NCCL for training; the agent copies CUDA tensors with
cudaMemcpyAsync). Needs PyTorch >= 2.6 (fully_shard in torch.distributed.fsdp); tested with
2.11.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from tessera.torch import Checkpointer

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 64, 32, 4, 2, 16, 8


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = torch.nn.RMSNorm(DIM)
        self.attention = torch.nn.MultiheadAttention(DIM, HEADS, bias=False, batch_first=True)
        self.ffn_norm = torch.nn.RMSNorm(DIM)
        self.w1 = torch.nn.Linear(DIM, 4 * DIM, bias=False)
        self.w2 = torch.nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x, mask):
        h = self.attention_norm(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.w2(torch.nn.functional.silu(self.w1(self.ffn_norm(x))))


class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = torch.nn.RMSNorm(DIM)
        self.output = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1],
                                                                   device=tokens.device)
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, mask)
        return self.output(self.norm(h))


def batch(step, rank, world, device):
    """This rank's share of step `step`'s global batch: a pure function of the step (four
    batches in turn, so the loss falls), so the data position needs no state of its own."""
    g = torch.Generator().manual_seed(1000 + step % 4)
    tokens = torch.randint(0, VOCAB, (BATCH * world, SEQ + 1), generator=g)
    mine = tokens[rank * BATCH:(rank + 1) * BATCH].to(device)
    return mine[:, :-1], mine[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", default=os.environ.get("TESSERA_AGENT", ""),
                    help="this rank's agent socket; {rank} is replaced by the rank "
                         "(default: $TESSERA_AGENT)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-every", type=int, default=5)
    args = ap.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp_shard",))
    model = Transformer().to(device)
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)

    ckpt = Checkpointer(model, optimizer, lr_scheduler=scheduler,
                        agent=args.agent.replace("{rank}", str(rank)))
    start = ckpt.load() or 0
    if start and rank == 0:
        print("resumed from step %d" % start, flush=True)

    for step in range(start + 1, args.steps + 1):
        inputs, targets = batch(step, rank, world, device)
        loss = torch.nn.functional.cross_entropy(model(inputs).reshape(-1, VOCAB),
                                                 targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if rank == 0:
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
        if step % args.save_every == 0 or step == args.steps:
            result = ckpt.save(step)
            if rank == 0:
                print("step %d saved: training blocked %.1f ms" % (step, result.stall_seconds * 1e3),
                      flush=True)
    if args.steps > start:
        directory = ckpt.wait(timeout=600)
        if rank == 0:
            print("step %d committed: %s" % (args.steps, directory), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
