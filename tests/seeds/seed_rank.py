"""One trainer rank of the seed scenarios pp_stages_reuse_layer_names and
distributed_optimizer_absent_state (tests/seeds/*_test.sh): a separate process per rank,
talking to its agent through the `tessera` module with PyTorch (CPU) tensors. Its rank,
coordinates and mesh come from the agent (Client.identity). It prints "ok: ..." lines and
exits 0, or prints "FAIL: ..." and exits 1.

  seed_rank.py MODE --agent SOCK --out DIR --step N [--diverge FQN]

Modes (FSDP2 runs for real in fsdp2_rank.py):
  pp-save / pp-load      pipeline stages with stage-unique layer names x tp: TP-replicated
                         norm weights, a tied embedding on the first and last stage declared
                         replicated over pp.
  pp-diverge             like pp-save, but the last rank holding FQN perturbs its replica:
                         the save must fail with REPLICA_DIVERGED and nothing be committed.
  dopt-save / dopt-load  distributed-optimizer flat slices over dp, one frozen parameter whose
                         state is absent on every rank (declared tessera.Absent).
  dopt-mixed             one rank declares a parameter's state absent, the others hold it:
                         refused with OPTIMIZER_STATE_MISMATCH before anything is written.

A save writes what this rank saved (tessera.objects encoding, no pickle) to
DIR/saved-<rank>; a load assembles the full tensors from every DIR/saved-* (the ranks of the
save layout) and compares what it loaded byte for byte: its own pieces on the new layout,
and every tensor whole.
"""

import argparse
import glob
import math
import os
import sys

import torch

import tessera

torch.set_num_threads(1)

LR = 1e-2
TRAIN_STEPS = 2


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


# --- geometry -------------------------------------------------------------------------------

def chunk_spans(n, parts):
    """[(begin, length)] of torch.chunk(range(n), parts) padded to `parts` entries: FSDP2's
    dim-0 split (uneven; ranks past the last chunk get an empty span at the end)."""
    sizes = [len(c) for c in torch.chunk(torch.arange(n), parts)] if n else []
    sizes += [0] * (parts - len(sizes))
    spans, begin = [], 0
    for s in sizes:
        spans.append((begin, s))
        begin += s
    return spans


class Piece:
    """A box of a global tensor this rank holds, and the mesh dims it is a replica over."""

    def __init__(self, fqn, shape, offsets, lengths, replicated_over):
        self.fqn, self.shape = fqn, tuple(shape)
        self.offsets, self.lengths = tuple(offsets), tuple(lengths)
        self.replicated_over = list(replicated_over)

    def index(self):
        return tuple(slice(o, o + n) for o, n in zip(self.offsets, self.lengths))


def coord(identity, dim):
    return identity["coords"].get(dim, 0)


def degree(identity, dim):
    return identity["layout"].get(dim, 1)


PP_LAYERS = 4
PP_DIM = 8
PP_VOCAB = 16


def pp_pieces(identity):
    """Stage s holds layers [s*L/pp, (s+1)*L/pp) under their global (stage-unique) names. TP
    splits wq on dim 0 and wo on dim 1 and the embedding's vocab; norms are replicated over
    tp; the embedding is tied: the first and the last stage hold it, declared replicated over
    pp."""
    stage, npp = coord(identity, "pp"), degree(identity, "pp")
    tp, ntp = coord(identity, "tp"), degree(identity, "tp")
    check(PP_LAYERS % npp == 0, "pp must divide %d layers" % PP_LAYERS)

    def tp_split(fqn, shape, dim, replicated=()):
        offsets, lengths = [0] * len(shape), list(shape)
        offsets[dim], lengths[dim] = chunk_spans(shape[dim], ntp)[tp]
        return Piece(fqn, shape, offsets, lengths, replicated)

    def tp_replica(fqn, shape):
        return Piece(fqn, shape, [0] * len(shape), shape, ["tp"])

    pieces = []
    if stage in (0, npp - 1):
        pieces.append(tp_split("tok_embeddings.weight", (PP_VOCAB, PP_DIM), 0, ["pp"]))
    per_stage = PP_LAYERS // npp
    for layer in range(stage * per_stage, (stage + 1) * per_stage):
        p = "layers.%d." % layer
        pieces += [tp_replica(p + "attention_norm.weight", (PP_DIM,)),
                   tp_split(p + "attention.wq.weight", (PP_DIM, PP_DIM), 0),
                   tp_split(p + "attention.wo.weight", (PP_DIM, PP_DIM), 1),
                   tp_replica(p + "ffn_norm.weight", (PP_DIM,))]
    if stage == npp - 1:
        pieces.append(tp_replica("norm.weight", (PP_DIM,)))
    return pieces


# Distributed optimizer: parameters replicated over dp; AdamW moments sliced over dp as flat
# ranges of one buffer holding every trainable parameter in order (Megatron's layout), so a
# rank's slice of a parameter may be empty. "frozen.weight" never gets a gradient: its state
# is absent on every rank.
DOPT_PARAMS = [("embed.weight", (6, 5)), ("fc.weight", (3, 5)), ("fc.bias", (3,)),
               ("head.weight", (2, 3)), ("frozen.weight", (4, 2))]
DOPT_FROZEN = "frozen.weight"


def dopt_slices(identity):
    """{fqn: (begin, end)}: this rank's flat range of each trainable parameter's state."""
    dp, ndp = coord(identity, "dp"), degree(identity, "dp")
    sizes = [(fqn, math.prod(shape)) for fqn, shape in DOPT_PARAMS if fqn != DOPT_FROZEN]
    total = sum(n for _, n in sizes)
    begin, length = chunk_spans(total, ndp)[dp]
    lo, hi = begin, begin + length
    out, base = {}, 0
    for fqn, n in sizes:
        b, e = min(max(lo - base, 0), n), min(max(hi - base, 0), n)
        out[fqn] = (b, max(b, e))
        base += n
    return out


# --- values ----------------------------------------------------------------------------------

def full_value(fqn, shape, salt):
    """The global tensor `fqn` (salt 0: initial parameter, else the gradient of that step),
    the same in every process."""
    g = torch.Generator().manual_seed(hash_name(fqn) * 1000 + salt)
    return torch.randn(shape, generator=g, dtype=torch.float32)


def hash_name(name):
    h = 0
    for c in name.encode():
        h = (h * 131 + c) % 1000003
    return h


def train_local(pieces, frozen=()):
    """Local parameters (this rank's boxes) trained TRAIN_STEPS AdamW steps on the boxes of
    deterministic global gradients: what FSDP2 / TP ranks hold after training."""
    params = {}
    for p in pieces:
        params[p.fqn] = torch.nn.Parameter(full_value(p.fqn, p.shape, 0)[p.index()].clone(),
                                           requires_grad=p.fqn not in frozen)
    optimizer = torch.optim.AdamW(list(params.values()), lr=LR, weight_decay=0.1)
    for step in range(1, TRAIN_STEPS + 1):
        for p in pieces:
            if p.fqn not in frozen:
                params[p.fqn].grad = full_value(p.fqn, p.shape, step)[p.index()].clone()
        optimizer.step()
    return params, optimizer


def model_state(pieces, params):
    """model.state_dict()-like {fqn: tessera.Shard} of this rank's boxes."""
    return {p.fqn: tessera.Shard(params[p.fqn].data, p.shape, offsets=p.offsets,
                                 replicated_over=p.replicated_over) for p in pieces}


# --- saved record and assembly -----------------------------------------------------------

def describe(key, value):
    """(key, global shape, offsets, flat range, tensor copy) of one mapping entry."""
    if isinstance(value, tessera.Shard):
        return {"key": key, "shape": list(value.global_shape), "offsets": list(value.offsets),
                "lengths": list(value.local_shape),
                "flat": list(value.flat_range) if value.flat_range else None,
                "tensor": value.tensor.clone()}
    return {"key": key, "shape": list(value.shape), "offsets": [0] * value.dim(),
            "lengths": list(value.shape), "flat": None, "tensor": value.clone()}


def record_save(out, rank, state):
    saved = {"tensors": [describe(k, v) for k, v in sorted(state.items())
                         if not isinstance(v, tessera.Absent)],
             "absent": sorted(k for k, v in state.items() if isinstance(v, tessera.Absent))}
    with open(os.path.join(out, "saved-%d" % rank), "wb") as f:
        f.write(tessera.objects.encode(saved))


def assemble(out):
    """{key: full tensor} from every save rank's record; replicas must agree and the pieces
    cover each tensor. Also the keys saved absent."""
    full, seen, absent = {}, {}, set()
    files = sorted(glob.glob(os.path.join(out, "saved-*")))
    check(files, "no saved-* records in %s" % out)
    for path in files:
        with open(path, "rb") as f:
            saved = tessera.objects.decode(f.read())
        absent.update(saved["absent"])
        for d in saved["tensors"]:
            key, shape = d["key"], tuple(d["shape"])
            t = d["tensor"]
            if key not in full:
                full[key] = torch.full(shape, float("nan"), dtype=t.dtype)
                seen[key] = torch.zeros(shape, dtype=torch.bool)
            box = tuple(slice(o, o + n) for o, n in zip(d["offsets"], d["lengths"]))
            if d["flat"] is not None:
                check(list(d["lengths"]) == list(shape), "%s: flat range of a sub-box" % key)
                b, e = d["flat"]
                dst, mask = full[key].view(-1), seen[key].view(-1)
                part, m = dst[b:e], mask[b:e]
                src = t.reshape(-1)
            else:
                part, m, src = full[key][box], seen[key][box], t
            if bool(m.any()):
                check(bitwise_equal(part[m], src[m]), "%s: replicas differ in %s" % (key, path))
            part.copy_(src)
            m.fill_(True)
    for key, mask in seen.items():
        check(bool(mask.all()), "%s: the saved pieces do not cover the tensor" % key)
    return full, absent


def bitwise_equal(a, b):
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def expected_piece(full, key, value):
    d = describe(key, value)
    box = tuple(slice(o, o + n) for o, n in zip(d["offsets"], d["lengths"]))
    t = full[key][box]
    if d["flat"] is not None:
        t = t.reshape(-1)[d["flat"][0]:d["flat"][1]].reshape(d["tensor"].shape)
    return t


def poison(state):
    """Fills every destination with a value no checkpoint holds, so a load that skips a
    piece is caught."""
    for v in state.values():
        if isinstance(v, tessera.Absent):
            continue
        t = v.tensor if isinstance(v, tessera.Shard) else v
        t.fill_(-12345.0)


def compare_loaded(full, state, label):
    bad = []
    for key, value in sorted(state.items()):
        t = value.tensor if isinstance(value, tessera.Shard) else value
        if not bitwise_equal(t, expected_piece(full, key, value)):
            bad.append(key)
    check(not bad, "%s: loaded tensors differ from the saved ones: %s" % (label, bad))


def poison_model(params, optimizer):
    """Poisons the parameters and the optimizer's own state tensors (not a mapping of them)."""
    with torch.no_grad():
        for param in params.values():
            param.fill_(-12345.0)
    for st in optimizer.state.values():
        for v in st.values():
            v.fill_(-12345.0)


def compare_optimizer(full, pieces, params, optimizer, label):
    """Every parameter and its optimizer state, found by parameter object (not through
    flatten_state's naming), holds what was saved."""
    bad = []
    for p in pieces:
        param = params[p.fqn]
        if not bitwise_equal(param.data, full[p.fqn][p.index()]):
            bad.append(p.fqn)
        for key, t in sorted(optimizer.state[param].items()):
            expected = full[p.fqn + "#" + key]
            if not bitwise_equal(t, expected[p.index()] if t.dim() else expected):
                bad.append(p.fqn + "#" + key)
    check(not bad, "%s: differ from the saved ones: %s" % (label, bad))


def load_whole(client, step, full):
    """Loads every tensor whole (one box covering it) and compares with the assembly."""
    into = {k: torch.full(tuple(v.shape), -1.0, dtype=v.dtype) for k, v in full.items()}
    check(client.load(step, into=into) == step, "load of step %d returned another step" % step)
    bad = [k for k in sorted(into) if not bitwise_equal(into[k], full[k])]
    check(not bad, "whole tensors differ from the saved ones: %s" % bad)
    return len(into)


# --- scenarios ---------------------------------------------------------------------------

def save_and_wait(client, step, state, rank, out):
    client.save(step, state)
    directory = client.wait(step, timeout=90)
    record_save(out, rank, state)
    return directory


def layout_name(identity):
    return ",".join("%s=%d" % kv for kv in identity["layout"].items())


def run_pp_save(client, args, identity, diverge=None):
    pieces = pp_pieces(identity)
    params, optimizer = train_local(pieces)
    state = tessera.flatten_state(model_state(pieces, params), optimizer)
    rank = identity["rank"]
    if diverge is None:
        directory = save_and_wait(client, args.step, state, rank, args.out)
        print("ok: rank %d saved step %d on %s (%d keys) -> %s"
              % (rank, args.step, layout_name(identity), len(state), directory))
        return
    # The last rank holding `diverge` corrupts its replica by one ulp of one element.
    world = math.prod(identity["layout"].values())
    culprit = last_holder(world, identity, diverge)
    is_culprit = rank == culprit
    if is_culprit:
        t = params[diverge].data.view(-1)
        t[0] = torch.nextafter(t[0], torch.tensor(float("inf")))
    latest_before = client.latest()
    try:
        client.save(args.step, state)
        client.wait(args.step, timeout=90)
    except tessera.TesseraError as e:
        # The replicas' hashes are compared after staging: save() returned, wait() raises.
        check(isinstance(e, tessera.AbortedError) and e.code == "REPLICA_DIVERGED",
              "expected AbortedError REPLICA_DIVERGED, got %s %s: %s"
              % (type(e).__name__, e.code, e.message))
        check(diverge in e.message or diverge in (e.fqns or []),
              "the error does not name %s: %s" % (diverge, e.message))
        check(culprit in [r for r, _ in e.ranks],
              "the error does not name rank %d: ranks %s" % (culprit, e.ranks))
        latest = client.latest()
        check(latest == latest_before,
              "latest moved from %s to %s after the failed save" % (latest_before, latest))
        print("ok: rank %d: step %d refused with REPLICA_DIVERGED (%s) fqns=%s ranks=%s; "
              "latest still %s: %s" % (rank, args.step, "culprit" if is_culprit else "replica",
                                       e.fqns, e.ranks, latest, e.message))
        return
    raise Failure("a save with a diverged replica of %s committed" % diverge)


def last_holder(world, identity, fqn):
    """The highest rank whose pp_pieces include `fqn`."""
    layout = identity["layout"]
    dims = list(layout)
    for rank in reversed(range(world)):
        coords, r = {}, rank
        for d in reversed(dims):
            coords[d] = r % layout[d]
            r //= layout[d]
        if any(p.fqn == fqn for p in pp_pieces({"coords": coords, "layout": layout})):
            return rank
    return -1


def run_pp_load(client, args, identity):
    full, _ = assemble(args.out)
    pieces = pp_pieces(identity)
    params, optimizer = train_local(pieces)
    poison_model(params, optimizer)
    state = tessera.flatten_state(model_state(pieces, params), optimizer)
    step = client.load("latest", into=state)
    check(step == args.step, "latest is step %s, expected %d" % (step, args.step))
    compare_loaded(full, state, "own pieces")
    compare_optimizer(full, pieces, params, optimizer, "live model/optimizer")
    whole = load_whole(client, args.step, full)
    layers = sorted({p.fqn.split(".")[1] for p in pieces if p.fqn.startswith("layers.")})
    print("ok: rank %d loaded latest = step %d on %s: %d keys (layers %s) and %d whole tensors "
          "byte-identical" % (identity["rank"], step, layout_name(identity), len(state),
                              ",".join(layers), whole))


def dopt_state(identity, params, optimizer, mixed=False):
    """The distributed optimizer's mapping: parameters whole (replicated over dp), AdamW
    moments as this rank's flat slices, "step" whole; the frozen parameter's state Absent.
    mixed=True: rank 0 also declares fc.weight's state absent while the others hold it."""
    slices = dopt_slices(identity)
    state = {}
    for fqn, shape in DOPT_PARAMS:
        param = params[fqn].data
        state[fqn] = param
        opt = optimizer.state.get(params[fqn])
        if not opt or (mixed and fqn == "fc.weight" and coord(identity, "dp") == 0):
            state[fqn + "#"] = tessera.Absent.like(param)
            continue
        b, e = slices[fqn]
        for key in ("exp_avg", "exp_avg_sq"):
            flat = opt[key].reshape(-1)[b:e].clone()
            state[fqn + "#" + key] = tessera.Shard(flat, shape, flat_range=(b, e),
                                                   kind="optimizer")
        state[fqn + "#step"] = opt["step"]
    return state


def dopt_model():
    pieces = [Piece(fqn, shape, [0] * len(shape), shape, ["dp"]) for fqn, shape in DOPT_PARAMS]
    return train_local(pieces, frozen={DOPT_FROZEN})


def run_dopt_save(client, args, identity):
    params, optimizer = dopt_model()
    state = dopt_state(identity, params, optimizer)
    check(DOPT_FROZEN + "#" in state, "the frozen parameter has optimizer state")
    empty = sorted(k for k, v in state.items() if isinstance(v, tessera.Shard)
                   and v.flat_range and v.flat_range[0] == v.flat_range[1])
    directory = save_and_wait(client, args.step, state, identity["rank"], args.out)
    print("ok: rank %d saved step %d on %s (%d keys, absent: %s, empty slices: %s) -> %s"
          % (identity["rank"], args.step, layout_name(identity), len(state), DOPT_FROZEN,
             ",".join(empty) or "none", directory))


def run_dopt_load(client, args, identity):
    full, absent_saved = assemble(args.out)
    check(absent_saved == {DOPT_FROZEN + "#"}, "saved absent keys: %s" % absent_saved)
    params, optimizer = dopt_model()
    # What a resuming trainer asks for: every state key of every parameter, the frozen one's
    # included (it cannot know the checkpoint has none).
    slices = dopt_slices(identity)
    into = {}
    for fqn, shape in DOPT_PARAMS:
        into[fqn] = params[fqn].data
        b, e = slices.get(fqn, (0, math.prod(shape)))
        for key in ("exp_avg", "exp_avg_sq"):
            into[fqn + "#" + key] = tessera.Shard(torch.zeros(e - b), shape, flat_range=(b, e),
                                                  kind="optimizer")
        into[fqn + "#step"] = torch.zeros(())
    poison(into)
    check(client.load(args.step, into=into) == args.step, "wrong step loaded")
    absent = list(client.last_absent)
    frozen_state = sorted(k for k in into if k.startswith(DOPT_FROZEN + "#"))
    check(sorted(absent) == frozen_state,
          "last_absent is %s, expected %s" % (absent, frozen_state))
    for key in frozen_state:  # left untouched
        t = into[key].tensor if isinstance(into[key], tessera.Shard) else into[key]
        check(bool((t == -12345.0).all()), "the absent %s was written" % key)
    present = {k: v for k, v in into.items() if k not in frozen_state}
    compare_loaded(full, present, "own slices")
    whole = load_whole(client, args.step, full)
    empty = sorted(k for k, v in into.items() if isinstance(v, tessera.Shard)
                   and v.flat_range[0] == v.flat_range[1])
    print("ok: rank %d loaded step %d on %s: absent reported %s, %d keys byte-identical "
          "(empty slices: %s), %d whole tensors" % (
              identity["rank"], args.step, layout_name(identity), ",".join(absent),
              len(present), ",".join(empty) or "none", whole))


def run_dopt_mixed(client, args, identity):
    params, optimizer = dopt_model()
    state = dopt_state(identity, params, optimizer, mixed=True)
    latest_before = client.latest()
    try:
        client.save(args.step, state)
    except tessera.TesseraError as e:
        check(isinstance(e, tessera.InvalidArgumentError) and
              e.code == "OPTIMIZER_STATE_MISMATCH",
              "expected OPTIMIZER_STATE_MISMATCH, got %s %s: %s"
              % (type(e).__name__, e.code, e.message))
        check("fc.weight" in e.message, "the error does not name fc.weight: %s" % e.message)
        check(client.latest() == latest_before, "latest moved")
        print("ok: rank %d: step %d refused with OPTIMIZER_STATE_MISMATCH fqns=%s ranks=%s: %s"
              % (identity["rank"], args.step, e.fqns, e.ranks, e.message))
        return
    raise Failure("a save mixing absent and present state of fc.weight was accepted")


MODES = {
    "pp-save": run_pp_save, "pp-load": run_pp_load,
    "pp-diverge": lambda c, a, i: run_pp_save(c, a, i, diverge=a.diverge),
    "dopt-save": run_dopt_save, "dopt-load": run_dopt_load, "dopt-mixed": run_dopt_mixed,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=sorted(MODES))
    ap.add_argument("--agent", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--step", type=int, required=True)
    ap.add_argument("--diverge", default="")
    args = ap.parse_args()
    client = tessera.Client(args.agent, connect_timeout=30)
    identity = client.identity
    try:
        MODES[args.mode](client, args, identity)
    except (Failure, tessera.TesseraError) as e:
        print("FAIL: rank %d %s: %s: %s" % (identity["rank"], args.mode, type(e).__name__, e))
        sys.exit(1)


if __name__ == "__main__":
    main()
