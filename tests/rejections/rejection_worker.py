"""One trainer rank for rejections_test.py: a long-lived process with one tessera.Client (as a
real trainer keeps), doing what the test asks. One JSON request per line on stdin, one JSON
reply per line on stdout:

  {"op": "save", "case": NAME, "step": N}  saves this rank's tensors of case NAME at step N,
      then waits for the commit; replies {"raised": exception class or None, "phase": "save"
      or "wait" (where it raised), "in_save" (raised by client.save, not by building the
      tensors: tessera.Shard checks its own arguments), "code", "status_code", "message",
      "fqns", "ranks", "state_key", "dir"}
  {"op": "check"}        {"latest": newest committed step, "equal": whether loading it gives
                          back the bytes saved at that step (into fresh zeroed tensors)}
  {"op": "valid", "step": N}   saves the valid state at step N and waits: {"dir"} or raised

  rejection_worker.py --agent SOCK

Tensors: job "rejdp" (dp=2) holds "emb.weight" (6x4, a DDP replica over dp) with AdamW-like
state "emb.weight#exp_avg", and "fsdp.w" (4x8) sharded by rows over dp (FSDP, rows [2r, 2r+2)
on rank r, replicated nowhere); job "rejpp" (pp=2) holds "layers.<stage>.weight" (4x4) per
stage and "norm.weight" replicated over pp. Values are a function of the step, so a load can
be checked bitwise.
"""

import argparse
import json
import sys
import traceback

import torch

import tessera

torch.set_num_threads(1)


def grid(shape, step, dtype=torch.float32):
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float32).reshape(shape) + 1000.0 * step).to(dtype)


def fsdp_rows(step, begin, end, cols=8, dtype=torch.float32, global_shape=(4, 8)):
    rows = grid((global_shape[0], cols), step, dtype)[begin:end].contiguous()
    return tessera.Shard(rows, global_shape, offsets=(begin, 0), replicated_over=[])


def valid_state(job, rank, step):
    if job == "rejpp":
        return {"layers.%d.weight" % rank: grid((4, 4), step + 10 * rank),
                "norm.weight": tessera.Shard(grid((4,), step), (4,), replicated_over=["pp"])}
    return {"emb.weight": grid((6, 4), step),
            "emb.weight#exp_avg": grid((6, 4), step + 0.5),
            "fsdp.w": fsdp_rows(step, 2 * rank, 2 * rank + 2)}


def case_state(case, job, rank, step):
    """This rank's tensors for `case`: the valid state with one thing wrong."""
    state = valid_state(job, rank, step)
    if case == "duplicate_fqn_pp_stages":
        # Every stage numbers its layers from 0: the torchtitan PP bug.
        return {"layers.0.weight": grid((4, 4), step + 10 * rank),
                "norm.weight": state["norm.weight"]}
    if case == "duplicate_fqn_dp_unreplicated":
        # Both dp ranks hold all of fsdp.w but declare it replicated nowhere.
        state["fsdp.w"] = fsdp_rows(step, 0, 4)
    elif case == "overlapping_shards":
        state["fsdp.w"] = fsdp_rows(step, 0, 3) if rank == 0 else fsdp_rows(step, 2, 4)
    elif case == "incomplete_coverage":
        state["fsdp.w"] = fsdp_rows(step, 0, 2) if rank == 0 else fsdp_rows(step, 3, 4)
    elif case == "shape_mismatch":
        if rank == 1:
            state["fsdp.w"] = fsdp_rows(step, 2, 4, cols=9, global_shape=(4, 9))
    elif case == "dtype_mismatch":
        if rank == 1:
            state["fsdp.w"] = fsdp_rows(step, 2, 4, dtype=torch.float16)
    elif case == "optimizer_state_keys_differ":
        if rank == 0:
            state["emb.weight#exp_avg_sq"] = grid((6, 4), step + 0.25)
    elif case == "optimizer_state_absent_and_present":
        if rank == 1:
            del state["emb.weight#exp_avg"]
            state["emb.weight#"] = tessera.Absent((6, 4), torch.float32)
    elif case == "optimizer_state_shape_differs":
        if rank == 1:
            state["emb.weight#exp_avg"] = grid((6, 5), step + 0.5)
    elif case == "replication_mismatch":
        if rank == 1:
            state["emb.weight"] = tessera.Shard(grid((6, 4), step), (6, 4), replicated_over=[])
    elif case == "replica_diverged":
        if rank == 1:
            state["emb.weight"] = grid((6, 4), step) + 1.0  # declared a dp replica; bytes differ
    # Malformed requests, refused by the client before any RPC (rank 0 only).
    elif case == "empty_fqn":
        state[""] = grid((2,), step)
    elif case == "non_utf8_fqn":
        state[b"layers.\xff.weight".decode("utf-8", "surrogateescape")] = grid((2,), step)
    elif case == "negative_dim":
        state["neg"] = tessera.Shard(grid((1, 1), step), (-4, 8), local_shape=(1, 1))
    elif case == "dim_over_int64":
        state["huge"] = tessera.Shard(grid((1,), step), (1 << 64,), local_shape=(1,))
    elif case == "volume_overflows_int64":
        state["huge"] = tessera.Shard(grid((1, 1), step), (1 << 40, 1 << 40))
    elif case == "too_many_axes":
        state["deep"] = tessera.Shard(grid((1,), step), (1,) * 65, flat_range=(0, 1))
    else:
        raise ValueError("unknown case %r" % case)
    return state


def error_reply(phase, e):
    if isinstance(e, tessera.TesseraError):
        return {"raised": type(e).__name__, "phase": phase, "code": e.code,
                "status_code": e.status_code, "message": e.message, "fqns": e.fqns,
                "ranks": e.ranks, "state_key": e.state_key}
    return {"raised": type(e).__name__, "phase": phase, "code": None, "message": str(e),
            "traceback": traceback.format_exc()}


def save_and_wait(client, step, build):
    try:
        tensors = build()
    except Exception as e:  # noqa: BLE001 - the tensors themselves refused (tessera.Shard)
        return dict(error_reply("save", e), in_save=False)
    try:
        client.save(step, tensors)
    except Exception as e:  # noqa: BLE001 - reported to the test, which judges it
        return dict(error_reply("save", e), in_save=True)
    try:
        directory = client.wait(step, timeout=60)
    except Exception as e:  # noqa: BLE001
        return error_reply("wait", e)
    return {"raised": None, "dir": directory}


def check_latest(client, job, rank):
    latest = client.latest()
    if latest is None:
        return {"latest": None, "equal": False}
    expected = valid_state(job, rank, latest)
    into = {}
    for key, value in expected.items():
        if isinstance(value, tessera.Shard):
            into[key] = tessera.Shard(torch.zeros_like(value.tensor), value.global_shape,
                                      offsets=value.offsets,
                                      replicated_over=value.replicated_over)
        else:
            into[key] = torch.zeros_like(value)
    loaded = client.load("latest", into=into)
    equal = all(torch.equal(
        (into[k].tensor if isinstance(into[k], tessera.Shard) else into[k]),
        (v.tensor if isinstance(v, tessera.Shard) else v)) for k, v in expected.items())
    return {"latest": latest, "loaded": loaded, "equal": equal}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    args = ap.parse_args()
    client = tessera.Client(args.agent, connect_timeout=30)
    job, rank = client.identity["job"], client.identity["rank"]
    sys.stdout.write(json.dumps({"ready": True, "job": job, "rank": rank}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "save":
            reply = save_and_wait(client, request["step"],
                                  lambda: case_state(request["case"], job, rank, request["step"]))
        elif op == "valid":
            reply = save_and_wait(client, request["step"],
                                  lambda: valid_state(job, rank, request["step"]))
        elif op == "check":
            try:
                reply = check_latest(client, job, rank)
            except Exception as e:  # noqa: BLE001
                reply = error_reply("check", e)
        else:
            reply = {"raised": "ValueError", "message": "unknown op %r" % op}
        sys.stdout.write(json.dumps(reply, default=str) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
