"""One trainer rank of the Tessera benchmark (tests/bench/run.sh starts one process per rank).

  bench_rank.py save --agent SOCK --rank R --world N --mib S --steps K --barrier DIR
                     --torch-dir DIR --out FILE.json
  bench_rank.py load --agent SOCK --rank R --world N' --saved-world N --mib S --barrier DIR
                     --out FILE.json                 (S: MiB per rank of the save)
  bench_rank.py gpu  --agent SOCK --rank 0 --world 1 --mib S --steps K --barrier DIR
                     --torch-dir DIR --out FILE.json (needs a CUDA device)
  bench_rank.py memcpy --rank R --world N --bytes B --barrier DIR --out FILE.json
                     (the memcpy baselines alone, for B bytes: another workload's ranks)

The state: this rank's row block of `S / tensor_mib` int32 tensors of tensor_mib MiB each (rows
of 1,024 elements; tensor i, global row g holds i * 2**20 + g), described as tessera.Shard with
no replication, so N ranks hold N distinct blocks (a tp=N layout) and every byte is written.

save, in order (ranks meet at a file barrier before each timed step, so no rank's time includes
waiting for a late one to start):
  1. memcpy baselines: every tensor copied into one pre-faulted buffer of the same size the
     way the client copies into staging (client/parallel_copy.h): the bytes, concatenated in
     tensor order, cut into T equal runs, each copied by its own thread with ctypes.memmove
     (libc memcpy; it releases the GIL, so the threads copy in parallel); best of 3. T = 1,
     the client's copy threads (ClientOptions.copy_threads' default capped at the CPUs this
     process may use), and every usable CPU. The buffer is freed afterwards.
  2. Tessera: client.reserve() of the tensors (the agent makes and the client maps the
     staging ahead, as a trainer does once; timed), then K saves of the same tensors (step 1
     plans from scratch; later steps reuse the plan). Per step: time blocked in client.save()
     (Python wall, and the client's own SaveResult stall), the time until client.wait()
     returned (COMMITTED), with wall-clock stamps so run.sh can take spans across ranks, and
     the session id. Afterwards, the threads the client's last copy used (its stats), which
     the stall row checks against the baseline's T.
  3. Peer: --torch-runs times torch.save of the same tensors (plain dict fqn -> tensor) into
     --torch-dir, then flush + os.fsync: blocked time (torch.save returned) and durable time
     (after fsync).
With --no-baselines, save skips step 1 (the S3 figure holds saves to the store's limit, not to a
memcpy). With TESSERA_BENCH_CPU_PIDS set ("name=pid+pid,...": run.sh's S3 figure names the
store's server and the agents), rank 0 records around each save and its load the CPU ticks of
those processes and of the whole machine (cpu_sample); every rank records its own CPU time
there ("cpu_self_s": the trainer and its client's threads).
memcpy: the baselines of step 1 alone, on B bytes in tensors of at most --tensor-mib (another
workload's ranks: run.sh's llama figure, whose trainer prints how many bytes each rank holds).
load: this rank's row block in the N'-rank layout (a different TP degree than the N of the
save: resharding), destinations pre-allocated and pre-faulted as a resumed model's are; one
timed client.load(), then every byte is checked. With --memcpy-baseline, first step 1's memcpy
baselines of the same tensors (a restore from memory's baseline, taken in the same minute).
gpu: the same tensors on the CUDA device. Baseline: device->host copy of every tensor into one
pinned host buffer (copy_(non_blocking=True) + synchronize; best of 3), i.e. D2H at the
pinned-memory bandwidth. Tessera: K saves of the CUDA tensors (blocked, and until COMMITTED).
Peer, where this PyTorch has it: torch.distributed.checkpoint.async_save of the same tensors
(a one-process gloo group): blocked = the async_save() call, durable = its future's result().

Writes one JSON object to --out.
"""

import argparse
import ctypes
import json
import os
import re
import sys
import threading
import time

import torch

import tessera

COLS = 1024  # int32 elements per row: 4 KiB rows
# ClientOptions.copy_threads' default (client/client.h); the client caps it at the usable CPUs.
# The save records the threads the client actually used, so a change of the default shows up
# as an unjudged stall row, not as a wrong baseline.
CLIENT_COPY_THREADS = 4


def layout(mib, tensor_mib):
    """[(tensor index, bytes per rank)] for `mib` MiB per rank in tensors of tensor_mib."""
    return layout_bytes(mib << 20, tensor_mib)


def layout_bytes(total, tensor_mib):
    """[(tensor index, bytes)] for `total` bytes in tensors of at most tensor_mib MiB."""
    step = tensor_mib << 20
    out = []
    i = 0
    while total > 0:
        n = min(step, total)
        out.append((i, n))
        total -= n
        i += 1
    return out


def fill(t, index, row0):
    rows = t.shape[0]
    col = torch.arange(row0, row0 + rows, dtype=torch.int32) + (index << 20)
    t.copy_(col.unsqueeze(1).expand(rows, COLS))


def make_state(rank, world, mib, tensor_mib, saved_world=None, values=True):
    """{fqn: tessera.Shard} of this rank's row blocks. With saved_world, the global shapes are
    those of the save (N ranks), split here across `world` ranks."""
    state = {}
    tensors = {}
    for index, nbytes in layout(mib, tensor_mib):
        rows_saved = nbytes // (4 * COLS)
        rows_global = rows_saved * (saved_world or world)
        if rows_global % world:
            raise SystemExit("%d rows of tensor %d do not split across %d ranks"
                             % (rows_global, index, world))
        rows = rows_global // world
        t = torch.empty((rows, COLS), dtype=torch.int32)
        if values:
            fill(t, index, rank * rows)
        else:
            t.fill_(-1)  # pre-fault, as a resumed model's freshly initialised tensors are
        fqn = "bench.w%03d" % index
        tensors[fqn] = t
        state[fqn] = tessera.Shard(t, (rows_global, COLS), offsets=(rank * rows, 0),
                                   replicated_over=[])
    return state, tensors


def barrier(directory, name, rank, world, ranks=None, timeout=600):
    """Waits until every rank of `ranks` (default: all of `world`) has arrived."""
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, "%s.%d" % (name, rank)), "w").close()
    deadline = time.monotonic() + timeout
    while True:
        if all(os.path.exists(os.path.join(directory, "%s.%d" % (name, r)))
               for r in (ranks if ranks is not None else range(world))):
            return
        if time.monotonic() > deadline:
            raise SystemExit("barrier %s: not every rank arrived in %d s" % (name, timeout))
        time.sleep(0.001)


# Rounds of the memcpy baseline's copy started together at a barrier, as a load's ranks start
# theirs, before a restore from memory (memcpy_baselines).
TOGETHER_ROUNDS = 3


def usable_cpus():
    return len(os.sched_getaffinity(0))


def baseline_threads():
    """{role: threads} of the memcpy baselines: one thread, the client's copy threads, every
    usable CPU."""
    cpus = usable_cpus()
    return {"one": 1, "client": min(CLIENT_COPY_THREADS, cpus), "all_cores": cpus}


def split_runs(items, threads):
    """[(dst, src, n)] cut as client/parallel_copy.cc cuts a copy: the bytes, concatenated in
    item order, cut into `threads` equal runs (items split where needed); a list per thread."""
    total = sum(n for _, _, n in items)
    bounds = [min(total, k * -(-total // threads)) for k in range(threads + 1)]
    runs = [[] for _ in range(threads)]
    pos = 0
    for dst, src, n in items:
        for k in range(threads):
            lo, hi = max(pos, bounds[k]), min(pos + n, bounds[k + 1])
            if lo < hi:
                runs[k].append((dst + lo - pos, src + lo - pos, hi - lo))
        pos += n
    return runs


def on_threads(runs, work):
    """work(run) for each run, one thread per run, the calling thread taking the first."""
    workers = [threading.Thread(target=work, args=(run,)) for run in runs[1:]]
    for w in workers:
        w.start()
    work(runs[0])
    for w in workers:
        w.join()


def parallel_memmove(items, threads):
    """Copies [(dst, src, n)] as client/parallel_copy.cc does (split_runs, one thread a run)."""
    def copy(run):
        for dst, src, n in run:
            ctypes.memmove(dst, src, n)

    on_threads(split_runs(items, threads), copy)


# The copy + hash baseline's piece: copied, then hashed while it is still in this core's L2 (2
# MiB a core on the machines measured), as client/verified_copy.h does with 64 KiB pieces; 512
# KiB keeps Python's two calls a piece (about 1.3 us each) near 1 % of the pass.
COPY_HASH_PIECE = 512 << 10
_xxh3 = None


def xxh3_64():
    """libxxhash's XXH3_64bits through ctypes (which releases the GIL for the call)."""
    global _xxh3
    if _xxh3 is None:
        f = ctypes.CDLL("libxxhash.so.0").XXH3_64bits
        f.restype = ctypes.c_uint64
        f.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _xxh3 = f
    return _xxh3


def parallel_copy_hash(items, threads):
    """parallel_memmove's runs on the same threads, each run copied and hashed (XXH3-64) in one
    pass: a piece copied, then the piece hashed — the least a restore that checks every byte
    it copies must do (DESIGN.md "Memory tier")."""
    xxh3 = xxh3_64()

    def copy_hash(run):
        for dst, src, n in run:
            for off in range(0, n, COPY_HASH_PIECE):
                k = min(COPY_HASH_PIECE, n - off)
                ctypes.memmove(dst + off, src + off, k)
                xxh3(src + off, k)

    on_threads(split_runs(items, threads), copy_hash)


def best_of_3(work):
    """The shortest of three timed calls of work(), in seconds."""
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        work()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best


def memcpy_baselines(tensors, total, barrier_dir, rank, world, ranks=None, together=None,
                     copy_hash=None):
    """{threads: best of 3 seconds} for each of baseline_threads(), every rank (of `ranks`,
    default all) copying at once as they do in a save (a barrier before each thread count).
    With `together` (a list), then `TOGETHER_ROUNDS` more copies with the client's threads,
    a barrier before each, as the ranks start a load: [wall start, wall end] of each appended
    to it (report.py's span of a round: the first start to the last end over the ranks). With
    `copy_hash` (a dict), then the same bytes copied and hashed in one pass on the client's
    threads (parallel_copy_hash), every rank at once, best of 3: its "seconds", "threads" and
    "piece" set in it."""
    dst = torch.empty(total, dtype=torch.uint8)
    dst.fill_(1)  # pre-fault every page
    items = []
    off = 0
    for t in tensors.values():
        n = t.numel() * t.element_size()
        items.append((dst.data_ptr() + off, t.data_ptr(), n))
        off += n
    out = {}
    for threads in sorted(set(baseline_threads().values())):
        barrier(barrier_dir, "memcpy-%d" % threads, rank, world, ranks)
        out[str(threads)] = best_of_3(lambda: parallel_memmove(items, threads))
    if together is not None:
        threads = baseline_threads()["client"]
        for i in range(TOGETHER_ROUNDS):
            barrier(barrier_dir, "memcpy-together-%d" % i, rank, world, ranks)
            t0 = time.time()
            parallel_memmove(items, threads)
            together.append([t0, time.time()])
    if copy_hash is not None:
        threads = baseline_threads()["client"]
        barrier(barrier_dir, "copy-hash", rank, world, ranks)
        copy_hash.update({"seconds": best_of_3(lambda: parallel_copy_hash(items, threads)),
                          "threads": threads, "piece": COPY_HASH_PIECE})
    del dst
    return out


def memcpy_report(tensors, a):
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    return {"rank": a.rank, "world": a.world, "bytes": total, "tensors": len(tensors),
            "memcpy_threads": baseline_threads(),
            "memcpy_s": memcpy_baselines(tensors, total, a.barrier, a.rank, a.world)}


def _ticks(pid):
    """utime + stime of process `pid` (/proc/PID/stat fields 14 and 15), or None."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def cpu_sample(rank):
    """On rank 0 with TESSERA_BENCH_CPU_PIDS: {"machine": [busy, all] ticks of /proc/stat's cpu
    line (busy: neither idle nor iowait), "cpus" it sums, "clk_tck", and per name its processes' ticks
    summed}; else None."""
    spec = os.environ.get("TESSERA_BENCH_CPU_PIDS", "")
    if rank != 0 or not spec:
        return None
    with open("/proc/stat") as f:
        lines = f.read().splitlines()
    values = [int(v) for v in lines[0].split()[1:]]
    out = {"machine": [sum(values) - values[3] - values[4], sum(values)],
           "cpus": sum(1 for line in lines if re.match(r"cpu\d", line)),
           "clk_tck": os.sysconf("SC_CLK_TCK")}
    for group in spec.split(","):
        name, _, pids = group.partition("=")
        ticks = [_ticks(p) for p in pids.split("+") if p]
        out[name] = None if None in ticks else sum(ticks)
    return out


def connect(agent):
    deadline = time.monotonic() + 60
    while True:
        try:
            return tessera.Client(agent=agent, prefetch_resident=os.environ.get(
                "TESSERA_BENCH_PREFETCH", "1") != "0")
        except tessera.UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def do_memcpy(a):
    tensors = {}
    for index, nbytes in layout_bytes(a.bytes, a.tensor_mib):
        t = torch.empty(nbytes, dtype=torch.uint8)
        t.fill_(index & 0xFF)
        tensors["bench.w%03d" % index] = t
    return memcpy_report(tensors, a)


def reserve(client, state):
    """client.reserve(state), as a trainer does before its first save (DESIGN.md "The first
    save"); returns the seconds it took."""
    t0 = time.perf_counter()
    client.reserve(state)
    return time.perf_counter() - t0


def do_save(a):
    state, tensors = make_state(a.rank, a.world, a.mib, a.tensor_mib)
    if a.no_baselines:
        report = {"rank": a.rank, "world": a.world, "bytes": sum(
            t.numel() * t.element_size() for t in tensors.values()), "tensors": len(tensors)}
    else:
        report = memcpy_report(tensors, a)

    client = connect(a.agent)
    report["reserve_s"] = reserve(client, state)
    saves = []
    for step in range(1, a.steps + 1):
        barrier(a.barrier, "save-%d" % step, a.rank, a.world)
        cpu0 = cpu_sample(a.rank)
        self0 = time.process_time()
        wall0 = time.time()
        t0 = time.perf_counter()
        result = client.save(step, state)
        t1 = time.perf_counter()
        client.wait(step, timeout=3600)
        t2 = time.perf_counter()
        self_cpu = time.process_time() - self0
        saves.append({"step": step, "start": wall0, "blocked_s": t1 - t0,
                      "stall_s": result.stall_seconds, "copy_s": result.copy_seconds,
                      "committed_s": t2 - t0,
                      "committed_at": wall0 + (t2 - t0), "plan_cached": result.plan_cached,
                      "session_id": result.session_id, "cpu_self_s": self_cpu})
        if cpu0:
            saves[-1]["cpu"] = [cpu0, cpu_sample(a.rank)]
    report["saves"] = saves
    report["client_copy_threads"] = client.stats()["last_copy_threads"]

    if a.torch_dir:
        os.makedirs(a.torch_dir, exist_ok=True)
        path = os.path.join(a.torch_dir, "rank-%d.pt" % a.rank)
        plain = dict(tensors)
        runs = []
        for run in range(1, a.torch_runs + 1):
            barrier(a.barrier, "torch-%d" % run, a.rank, a.world)
            wall0 = time.time()
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                torch.save(plain, f)
                f.flush()
                t1 = time.perf_counter()
                os.fsync(f.fileno())
            t2 = time.perf_counter()
            runs.append({"run": run, "start": wall0, "blocked_s": t1 - t0,
                         "durable_s": t2 - t0, "durable_at": wall0 + (t2 - t0),
                         "file_bytes": os.path.getsize(path)})
            os.unlink(path)
        report["torch"] = runs
    return report


def do_gpu(a):
    if not torch.cuda.is_available():
        return {"skipped": "torch.cuda.is_available() is False (torch %s)" % torch.__version__}
    state, tensors = make_state(0, 1, a.mib, a.tensor_mib)
    for fqn in list(tensors):
        t = tensors[fqn].cuda()
        tensors[fqn] = t
        state[fqn] = tessera.Shard(t, tuple(t.shape), offsets=(0, 0), replicated_over=[])
    torch.cuda.synchronize()
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    report = {"rank": 0, "world": 1, "bytes": total, "torch": torch.__version__,
              "device": torch.cuda.get_device_name(0)}
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    best = None
    for _ in range(3):
        off = 0
        t0 = time.perf_counter()
        for t in tensors.values():
            n = t.numel() * t.element_size()
            host[off:off + n].view(torch.int32).view(t.shape).copy_(t, non_blocking=True)
            off += n
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    del host
    report["d2h_s"] = best
    client = connect(a.agent)
    report["reserve_s"] = reserve(client, state)
    saves = []
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        result = client.save(step, state)
        t1 = time.perf_counter()
        client.wait(step, timeout=3600)
        t2 = time.perf_counter()
        saves.append({"step": step, "blocked_s": t1 - t0, "stall_s": result.stall_seconds,
                      "committed_s": t2 - t0, "plan_cached": result.plan_cached})
    report["saves"] = saves
    try:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        if not hasattr(dcp, "async_save"):
            raise ImportError("torch.distributed.checkpoint has no async_save")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
        runs = []
        for k in range(a.steps):
            path = os.path.join(a.torch_dir, "dcp-%d" % k)
            t0 = time.perf_counter()
            future = dcp.async_save(dict(tensors), checkpoint_id=path)
            t1 = time.perf_counter()
            future.result()
            t2 = time.perf_counter()
            runs.append({"blocked_s": t1 - t0, "durable_s": t2 - t0})
        dist.destroy_process_group()
        report["dcp"] = runs
    except Exception as e:  # reported, not fatal: the Tessera figures stand on their own
        report["dcp_error"] = "%s: %s" % (type(e).__name__, e)
    return report


def device_read_bytes():
    """Bytes the bench dir's block device has read since boot (from the stat file run.sh names
    in TESSERA_BENCH_DEV_STAT), or None where there is none."""
    try:
        with open(os.environ["TESSERA_BENCH_DEV_STAT"]) as f:
            return int(f.read().split()[2]) * 512
    except (KeyError, OSError, ValueError, IndexError):
        return None


def do_load(a):
    # As a restarted trainer: connect, then build the model. Where the agent holds a resident
    # checkpoint, the client maps it and faults its pages in meanwhile (DESIGN.md "Mapping the
    # resident copy ahead"); how long that took, and how much of it outlasted the build, is
    # reported beside the load.
    client = connect(a.agent)
    t0 = time.perf_counter()
    state, tensors = make_state(a.rank, a.world, a.mib, a.tensor_mib,
                                saved_world=a.saved_world, values=False)
    build_s = time.perf_counter() - t0
    if not client.await_prefetch(600):
        raise SystemExit("the resident copy's mapping did not end in 600 s")
    prefetch = {"build_s": build_s, "prefetch_wait_s": time.perf_counter() - t0 - build_s}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    baseline = {}
    if a.memcpy_baseline:
        # The same bytes copied right before the load, every rank at once: the baseline of a
        # restore from memory, taken in the same minute (the save's, taken before its steps,
        # drifts with this machine's memory bandwidth).
        together = []
        copy_hash = {}
        baseline = {"memcpy_threads": baseline_threads(),
                    "memcpy_s": memcpy_baselines(tensors, total, a.barrier, a.rank, a.world,
                                                 a.barrier_ranks, together, copy_hash),
                    "memcpy_together": together,
                    "copy_xxh3": copy_hash}
    barrier(a.barrier, "load", a.rank, a.world, a.barrier_ranks)
    # Read by the device from here to the load's end, every rank's window together: the load's
    # reads, not this process's start (Python and torch come from the disk after the page cache
    # was dropped).
    device0 = device_read_bytes()
    cpu0 = cpu_sample(a.rank)
    self0 = time.process_time()
    wall0 = time.time()
    t0 = time.perf_counter()
    step = client.load("latest", into=state)
    dt = time.perf_counter() - t0
    self_cpu = time.process_time() - self0
    cpu = [cpu0, cpu_sample(a.rank)] if cpu0 else None
    device1 = device_read_bytes()
    # Check every byte against what the save wrote.
    bad = []
    for index, _ in layout(a.mib, a.tensor_mib):
        fqn = "bench.w%03d" % index
        t = tensors[fqn]
        expected = torch.empty_like(t)
        fill(expected, index, a.rank * t.shape[0])
        if not torch.equal(t, expected):
            bad.append(fqn)
    return {"rank": a.rank, "world": a.world, "bytes": total, "step": step, "start": wall0,
            "load_s": dt, "end": wall0 + dt, "mismatched": bad, "sources": client.last_load,
            "device_read": [device0, device1], "client": client.stats(), **prefetch, **baseline,
            "cpu_self_s": self_cpu, **({"cpu": cpu} if cpu else {})}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["save", "load", "gpu", "memcpy"])
    p.add_argument("--agent", default="")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--saved-world", type=int, default=None)
    p.add_argument("--mib", type=int, default=0)
    p.add_argument("--bytes", type=int, default=0, help="memcpy: bytes of this rank")
    p.add_argument("--tensor-mib", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--barrier", required=True)
    p.add_argument("--memcpy-baseline", action="store_true",
                   help="load: first the memcpy baselines of the load's bytes, as save's step 1")
    p.add_argument("--barrier-ranks", default=None,
                   type=lambda v: [int(x) for x in v.split(",")],
                   help="load: the ranks that run and meet at the barrier (default: all)")
    p.add_argument("--no-baselines", action="store_true",
                   help="save: no memcpy baselines (step 1 of save)")
    p.add_argument("--torch-dir", default="")
    p.add_argument("--torch-runs", type=int, default=3)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.mode == "memcpy" and a.bytes <= 0:
        p.error("memcpy needs --bytes")
    if a.mode != "memcpy" and (not a.agent or a.mib <= 0):
        p.error("%s needs --agent and --mib" % a.mode)
    torch.set_num_threads(1)
    report = {"save": do_save, "load": do_load, "gpu": do_gpu, "memcpy": do_memcpy}[a.mode](a)
    with open(a.out, "w") as f:
        json.dump(report, f)
    if a.mode == "load" and report["mismatched"]:
        print("rank %d: loaded tensors differ: %s" % (a.rank, report["mismatched"]),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
