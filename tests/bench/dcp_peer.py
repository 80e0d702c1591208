"""One rank of the benchmark's PyTorch DCP peer (tests/bench/run.sh starts one process per
rank, after Tessera's saves of the same configuration): torch.distributed.checkpoint saving
and loading the same state as bench_rank.py, as DTensors.

  dcp_peer.py save --rank R --world N --mib S --steps K --barrier DIR --dir DIR --rdzv FILE
                   --out FILE.json
  dcp_peer.py load --rank R --world N' --saved-world N --mib S --barrier DIR --dir DIR
                   --rdzv FILE --out FILE.json
  ... --s3 s3://BUCKET/PREFIX   the same on an object store, through s3torchconnector's
                   S3StorageWriter and S3StorageReader (run.sh's S3 figure; --dir is unused)

The state: bench_rank.make_state's row blocks (rank r of N holds rows [r*rows, (r+1)*rows) of
every tensor), each wrapped as a DTensor with Shard(0) on a 1-D mesh of the N ranks
(DTensor.from_local: no copy), so DCP sees one global tensor per name, written once, exactly
the bytes Tessera writes. Ranks form a gloo group through a FileStore (--rdzv).

save: for each variant of VARIANTS, K saves of the same state into DIR/<variant>-<step>
(each removed once the next is durable; the last `save` checkpoint is kept for the load).
Ranks meet at a file barrier before each timed save. Per save and rank: "call_s" (the call
returned), "staged_s" (the state may be modified again: the call for save and the blocking
stagers, staging_completion for an AsyncSaveResponse), "durable_s" (save returned / the
upload future resolved: files written and fsynced — FileSystemWriter's sync_files — and
.metadata committed), with wall-clock stamps so run.sh can take spans across ranks. A variant
this machine cannot run (pinned memory without CUDA) is recorded with its error.
With --s3, the checkpoints are s3://BUCKET/PREFIX/<variant>-<step>, written by s3torchconnector's
S3StorageWriter (one file per rank, as DCP's default thread_count of 1 writes; its CRT client's
default part size) and read by its S3StorageReader (its default, DCP-optimized ranged reader);
the store is the environment's (AWS_ENDPOINT_URL, AWS_REGION, credentials), addressed
path-style. Only the synchronous dcp.save runs: durable = save returned (the uploads completed,
.metadata written). Nothing is removed between steps: run.sh clears the prefix afterwards.
load: this rank's row block in the N'-rank layout (another world size than the save's:
resharding), destinations pre-allocated and pre-faulted, one timed dcp.load() of the kept
checkpoint, then every byte is checked.

Writes one JSON object to --out.
"""

import argparse
import datetime
import json
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import staging
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from bench_rank import COLS, barrier, fill, layout, make_state


def _stager_cached_pinned():
    # DCP's cached staging: pinned host copies kept across saves (pins memory: needs CUDA).
    return staging.BlockingAsyncStager(cache_staged_state_dict=True)


def _stager_async_pinned():
    # DCP's zero-overhead staging: pinned, shared, copied in a background thread.
    return staging.DefaultStager(staging.StagingOptions())


# name -> (call, stager factory or None). "save" is the synchronous dcp.save.
VARIANTS = [
    ("save", "save", None),
    ("async_save", "async", None),
    ("async_save cached pinned staging", "async", _stager_cached_pinned),
    ("async_save async pinned staging", "async", _stager_async_pinned),
]


def dtensor_state(rank, world, mib, tensor_mib, saved_world=None, values=True):
    """{fqn: DTensor} over the row blocks of bench_rank.make_state, and their local tensors."""
    mesh = init_device_mesh("cpu", (world,))
    _, tensors = make_state(rank, world, mib, tensor_mib, saved_world=saved_world, values=values)
    state = {}
    for fqn, t in tensors.items():
        rows_global = t.shape[0] * world
        state[fqn] = DTensor.from_local(t, mesh, [Shard(0)], shape=(rows_global, COLS),
                                        stride=(COLS, 1), run_check=False)
    return state, tensors


# --s3: dcp.save through s3torchconnector.
S3_VARIANTS = [("save", "save", None)]


def s3_config():
    from s3torchconnector import S3ClientConfig
    return S3ClientConfig(force_path_style=True)


def s3_writer(path):
    from s3torchconnector.dcp import S3StorageWriter
    return S3StorageWriter(os.environ.get("AWS_REGION", "us-east-1"), path,
                           s3client_config=s3_config())


def s3_reader(path):
    from s3torchconnector.dcp import S3StorageReader
    return S3StorageReader(os.environ.get("AWS_REGION", "us-east-1"), path,
                           s3client_config=s3_config())


def one_save(kind, stager, state, path, s3=False):
    """(call_s, staged_s, durable_s) of one save into `path` (an s3:// URL with `s3`)."""
    t0 = time.perf_counter()
    if kind == "save":
        if s3:
            dcp.save(state, storage_writer=s3_writer(path))
        else:
            dcp.save(state, checkpoint_id=path)
        t = time.perf_counter() - t0
        return t, t, t
    kwargs = {"async_stager": stager} if stager is not None else {}
    response = dcp.async_save(state, checkpoint_id=path, **kwargs)
    call = time.perf_counter() - t0
    if hasattr(response, "upload_completion"):  # AsyncSaveResponse: staging is asynchronous
        response.staging_completion.result()
        staged = time.perf_counter() - t0
        response.upload_completion.result()
    else:
        staged = call
        response.result()
    return call, staged, time.perf_counter() - t0


def checkpoint_path(a, name):
    return "%s/%s" % (a.s3.rstrip("/"), name) if a.s3 else os.path.join(a.dir, name)


def do_save(a):
    state, tensors = dtensor_state(a.rank, a.world, a.mib, a.tensor_mib)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    report = {"rank": a.rank, "world": a.world, "bytes": total, "torch": torch.__version__,
              "variants": {}}
    if a.s3:
        from importlib.metadata import version
        report["s3torchconnector"] = version("s3torchconnector")
    for name, kind, make_stager in S3_VARIANTS if a.s3 else VARIANTS:
        runs, previous = [], None
        slug = name.replace(" ", "-")
        try:
            stager = make_stager() if make_stager else None
            for step in range(1, a.steps + 1):
                path = checkpoint_path(a, "%s-%d" % (slug, step))
                barrier(a.barrier, "%s-%d" % (slug, step), a.rank, a.world)
                wall0 = time.time()
                call, staged, durable = one_save(kind, stager, state, path, bool(a.s3))
                runs.append({"step": step, "start": wall0, "call_s": call, "staged_s": staged,
                             "durable_s": durable, "durable_at": wall0 + durable})
                dist.barrier()
                if previous and a.rank == 0 and not a.s3:
                    shutil.rmtree(previous, ignore_errors=True)
                previous = path
            if stager is not None:
                stager.close()
            report["variants"][name] = {"runs": runs}
        except Exception as e:  # the variant is not available here; the others still run
            report["variants"][name] = {"runs": runs, "error": "%s: %s" % (type(e).__name__, e)}
            dist.barrier()
        if previous and a.rank == 0 and name != "save" and not a.s3:
            shutil.rmtree(previous, ignore_errors=True)
        if name == "save" and previous:
            report["kept"] = previous
    return report


def do_load(a):
    state, tensors = dtensor_state(a.rank, a.world, a.mib, a.tensor_mib,
                                   saved_world=a.saved_world, values=False)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    path = checkpoint_path(a, "save-%d" % a.steps)
    barrier(a.barrier, "dcp-load", a.rank, a.world)
    wall0 = time.time()
    t0 = time.perf_counter()
    if a.s3:
        dcp.load(state, storage_reader=s3_reader(path))
    else:
        dcp.load(state, checkpoint_id=path)
    dt = time.perf_counter() - t0
    bad = []
    for index, _ in layout(a.mib, a.tensor_mib):
        fqn = "bench.w%03d" % index
        expected = torch.empty_like(tensors[fqn])
        fill(expected, index, a.rank * expected.shape[0])
        if not torch.equal(tensors[fqn], expected):
            bad.append(fqn)
    return {"rank": a.rank, "world": a.world, "bytes": total, "start": wall0, "load_s": dt,
            "end": wall0 + dt, "mismatched": bad}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["save", "load"])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--saved-world", type=int, default=None)
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--tensor-mib", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--barrier", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--rdzv", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--s3", default="", help="s3://BUCKET/PREFIX: through s3torchconnector")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + a.rdzv, rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=3600))
    report = {"save": do_save, "load": do_load}[a.mode](a)
    dist.destroy_process_group()
    with open(a.out, "w") as f:
        json.dump(report, f)
    if a.mode == "load" and report["mismatched"]:
        print("rank %d: loaded tensors differ: %s" % (a.rank, report["mismatched"]),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
