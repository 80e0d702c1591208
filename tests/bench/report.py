"""Turns tests/bench/run.sh's raw measurements (<results>/raw) into <results>/results.md and
<results>/chart.png.

  report.py RESULTS_DIR [--steps K]

Every row is figure, Tessera, baseline, ratio, target, met? (DESIGN.md "Performance targets",
issue 14). Every Tessera figure is the median of its runs with the p90 beside it (median_p90:
the steady-state saves, steps >= 2; the load runs; the torch.save runs); a baseline is the best
of its runs, the physical limit. A judged ratio prints with two decimals, or more where two
would read as the other judgment (ratio_figure). Definitions, as measured by bench_rank.py /
tessera-plan-load / tessera-llama-trainer:
  fio      the disk's limit: run.sh's sweep of bs x iodepth x numjobs (libaio, O_DIRECT where
           the file system takes it), each point's aggregate bandwidth (writes include their
           final fsync; reads follow dropping the page cache). The fastest point of each
           direction is the baseline of the persist and load rows; its row names it. If the
           page cache could not be dropped, the read limit and the rows held to it are not
           judged.
  stall    Tessera: the slowest rank's time blocked in client.save() (Python wall clock) per
           steady-state save. Baseline: the slowest rank's memcpy of the same tensors into a
           pre-faulted buffer with as many threads as the client copies with, split as the
           client splits them (bench_rank.py), all ranks copying at once as they do in a save;
           memcpy with every usable core is reported beside it. Ratio = Tessera / baseline,
           target <= 1.15; not judged if the client's last copy used another thread count
           than the baseline.
  first    the first save's stall (it plans from scratch and sizes staging; one sample per
           configuration) / the steady stall's median; target <= 3.
  persist  Tessera: all ranks' bytes / (first rank's save() call -> last rank's wait()
           returned COMMITTED) per steady-state save. Baseline: the fio write limit. Ratio =
           Tessera / fio, target >= 0.80. This is issue 7's definition: it includes the
           trainer's copy, which runs before any write.
  persist phase (2b): all ranks' bytes / (the first rank's write began -> the session
           COMMITTED) per steady-state save (tessera status --session: writes_began_unix_ms,
           on the agents' clocks, and the COMMITTED phase's entry, on the coordinator's; one
           host here): data files written, fsynced and reported, manifest committed —
           DESIGN.md's "persist" target, >= 0.90 of the fio write limit. Ranks told
           write_when_staged begin writing before the session is PERSISTING, so its
           PERSISTING + COMMITTING time would leave part of the writes out; a status without
           writes_began_unix_ms (an older coordinator) falls back to it.
  peer     torch.save per rank of the same tensors (a dict fqn -> tensor) + flush + fsync,
           run by run. blocked: the slowest rank's torch.save() call vs Tessera's stall
           (above); durable: first start -> last fsync returned vs Tessera's save() ->
           COMMITTED span. Ratio = torch.save / Tessera (how many times longer torch.save
           takes), medians of both.
  load     all loaders' bytes / (first load() call -> last load() returned) per run, loading
           the checkpoint onto another TP degree (rows resharded), destinations pre-faulted,
           page cache dropped before each run. Baseline: the fio read limit; target >= 0.90.
           Not judged if the cache was not dropped or bytes came from the agents' memory.
           Beside it: what the agents read from the checkpoint's files (whole checksum
           blocks) and what the block device read meanwhile (its own counter, from the
           first rank's load to the last one's end; for the llama model, the trainers' runs):
           less than the files where ranks share blocks through the page cache.
  memory   (4m) right after the saves, the same layout loads the last step from its agents'
           memory tier (DESIGN.md "Memory tier"): all loaders' bytes / (first load() call ->
           last returned); the row is the median of --memory-runs runs. Baseline: the
           loading ranks' memcpy of the same bytes with the client's threads right before
           (each rank's best of 3, the slowest rank's); ratio = memcpy time / restore time
           (target >= 0.80, issue 16); judged only if every byte came from memory. The agent
           hands over its resident region, whose blocks the restarted trainer mapped and
           checked while it built its model, and the load copies its tensors out of it: one
           pass over the bytes, so one memcpy is the physical limit it is held to. A second
           row holds the same restore to one pass of copy + XXH3-64 of the same bytes on the
           client's threads, every rank at once, right before (bench_rank.py
           parallel_copy_hash; the slowest rank's best of 3): what a restore that checks
           every byte needs at least (target >= 0.80, issue 51). Reported
           beside it, not judged: each rank's own copy time within its load, and the same
           memcpy started at a barrier by every rank and timed as the restore is (first
           start -> last end; median of 3 rounds) — what a restore that were only that copy
           would score.
           Buddy restore (2+ ranks): the odd ranks' agents are SIGKILLed once their buddies
           hold the last step, restart on a new node id and load it: bytes they read from
           their buddies' memory / (first of their load() calls -> last returned); the row
           says how much of it the trainers read from the buddies themselves (their load's
           bytes_fetched_by_client; the rest their agents read) and, per rank, how much of
           its load() the trainer spent fetching (fetch_seconds). Baseline: loopback TCP with
           as many parallel streams, from memory into memory (tessera-link-bw, best of 3:
           tests/bench/loopback_link.h). Reported beside it, not judged: the same sockets
           with the receivers hashing what arrives (--check) — how far any reader that
           checks every byte it receives gets on these cores, where the link is the CPUs'
           own copies.
  llama    (7) the quickstart's model through tessera-llama-trainer (C++ client), distributed
           optimizer. stall: the slowest rank's printed stall per steady save vs the slowest
           rank's memcpy of its printed bytes (bench_rank.py memcpy, every rank at once, the
           agents stopped), with the client's default copy threads (the trainer does not
           print the count: not checked); first: as above; persist: the checkpoint's bytes /
           (session opened -> COMMITTED, the coordinator's clock: the trainer prints no
           wall-clock stamps) and persist phase as 2b; load: all loaders' printed bytes / the
           slowest rank's printed load() time per run (the trainer prints durations only,
           so not first call -> last return), onto half the TP degree, page cache dropped.
           Same targets as the rows above.
  3c, 4b   PyTorch DCP on the same state and ranks: tests/bench/report_dcp.py.
  8 S3     checkpoints in an S3-compatible object store against the same server's raw limits,
           the part size x parts in flight sweep and DCP through s3torchconnector:
           tests/bench/report_s3.py.
  plan     through a real tessera-coordinator over gRPC with fake agents: first plan = start
           of the last SubmitLocalPlan -> last PIN received (validated, persisted to RocksDB,
           delivered); cached = the same for the next save with identical plans, which the
           agents submit as fingerprints and whose PINs leave the assignments out; RSS = the
           coordinator's VmHWM; manifest load = ReadManifest of the committed checkpoint;
           manifest write = WriteManifest of it as a commit writes it (manifest.pb and
           manifest.json, fsync, rename, directory fsync), into a directory beside it.
           Each configuration's figures are the median (and p90) of its runs. No baseline:
           the targets are absolute (issue 15); the sweep's rank counts are not judged.
"""

import argparse
import datetime
import glob
import json
import os
import re
import sys

import report_dcp  # figures 3c and 4b: PyTorch DCP beside Tessera
import report_s3  # figure 8: checkpoints in an object store


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_env(path):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    out[k] = v
    except OSError:
        pass
    return out


def mib(n):
    return n / 2**20


def fmt_s(seconds):
    if seconds is None:
        return "-"
    if seconds < 1:
        return "%.1f ms" % (seconds * 1000)
    return "%.2f s" % seconds


def fmt_bw(bps):
    return "-" if bps is None else "%.0f MiB/s" % mib(bps)


def fmt_size(m):
    return "%d GiB" % (m // 1024) if m >= 1024 and m % 1024 == 0 else "%d MiB" % m


# (target, higher is better, as the table writes it) per judged figure (issue 14).
TARGETS = {
    "stall": (1.15, False, "<= 1.15"),
    "first": (3.0, False, "<= 3"),
    "persist": (0.80, True, ">= 0.80"),
    "phase": (0.90, True, ">= 0.90"),
    "load": (0.90, True, ">= 0.90"),
    "s3 save": (0.90, True, ">= 0.90"),
    "s3 load": (0.90, True, ">= 0.90"),
}

FIO_POINT = re.compile(r"^(write|read)-bs(\w+)-qd(\d+)-j(\d+)\.json$")


def fio_points(raw):
    """{"write": [...], "read": [...]} of run.sh's sweep: each point {"bs", "iodepth",
    "numjobs", "bw" (bytes/s, all jobs), "cache" (reads: what dropping the cache did)}."""
    out = {"write": [], "read": []}
    directory = os.path.join(raw, "fio")
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        m = FIO_POINT.match(name)
        if not m:
            continue
        kind = m.group(1)
        data = load_json(os.path.join(directory, name))
        try:
            bw = float(data["jobs"][0][kind]["bw_bytes"])
        except (TypeError, KeyError, IndexError, ValueError):
            continue
        point = {"bs": m.group(2), "iodepth": int(m.group(3)), "numjobs": int(m.group(4)),
                 "bw": bw}
        if kind == "read":
            point["cache"] = read_text(os.path.join(directory, name[:-len(".json")] + ".cache"))
        out[kind].append(point)
    return out


def undropped(cache):
    """Why a read is not judged, from what run.sh's drop_caches said ("not dropped (why)")."""
    return "caches could not be dropped %s" % (
        cache[len("not dropped "):] if cache.startswith("not dropped ") else "(%s)" % cache)


def sweep_limit(points):
    """The fastest point, with why the limit may not be judged against: {"bw", "point" (text),
    "of" (points measured), "unjudged" (reason or None)}; None if nothing was measured."""
    if not points:
        return None
    best = max(points, key=lambda p: p["bw"])
    caches = [p["cache"] for p in points if "cache" in p and p["cache"] != "dropped"]
    return {"bw": best["bw"], "of": len(points),
            "point": "bs %s, iodepth %d, %d job%s" % (best["bs"], best["iodepth"],
                                                       best["numjobs"],
                                                       "s" if best["numjobs"] > 1 else ""),
            "unjudged": undropped(caches[0]) if caches else None}


def read_text(path, default="?"):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def device_read(windows):
    """Bytes the bench dir's block device read from the first window's start to the last
    one's end: `windows` [[before, after]] of its read counter, one per rank (bench_rank.py's
    "device_read") or one per run (run.sh's device_read_bytes, for the llama trainers). None
    if any counter is missing."""
    if not windows or any(len(w) != 2 or None in w for w in windows):
        return None
    return max(w[1] for w in windows) - min(w[0] for w in windows)


def counters_file(path):
    """[[before, after]] from the two counters run.sh's device_read_bytes wrote to `path`."""
    values = read_text(path, "").split()
    return [[int(v) for v in values]] if len(values) == 2 else []


def session_steps(directory):
    """{step: {"bytes", "span_s", "persist_s"}} of the committed checkpoints run.sh's
    save_sessions listed: span = the session opened -> it entered COMMITTED (the
    coordinator's clock) and persist = the first write began (the agents' clock) -> it
    entered COMMITTED, or without that its PERSISTING + COMMITTING durations (ms)."""
    listed = load_json(os.path.join(directory, "checkpoints.json")) or {}
    out = {}
    for c in listed.get("checkpoints", []):
        status = load_json(os.path.join(directory, "%s.json" % c["session_id"]))
        if not status:
            continue
        phases = {p["state"]: p for p in status.get("phases", [])}

        def ms(state, field):
            return int(phases.get("SESSION_STATE_" + state, {}).get(field, 0))
        committed = ms("COMMITTED", "entered_unix_ms")
        writes_began = int(status.get("writes_began_unix_ms", 0))
        persist_ms = (committed - writes_began if committed and writes_began else
                      ms("PERSISTING", "duration_ms") + ms("COMMITTING", "duration_ms"))
        out[int(c["step"])] = {
            "bytes": int(c["bytes"]),
            "span_s": (committed - int(status["started_unix_ms"])) / 1000 if committed else None,
            "persist_s": persist_ms / 1000 or None}
    return out


def median_p90(values):
    """(median, p90) of values: the middle element (the upper one of an even count) and the
    one 90 % of the way up. Every Tessera figure of the report goes through here."""
    xs = sorted(values)
    return xs[len(xs) // 2], xs[min(len(xs) - 1, (len(xs) * 9) // 10)]


def spread(values, fmt):
    """(median, "median (p90 X, N runs)") of values by median_p90."""
    med, p90 = median_p90(values)
    return med, "%s (p90 %s, %d run%s)" % (fmt(med), fmt(p90), len(values),
                                           "s" if len(values) > 1 else "")


def bw_spread(nbytes, seconds):
    """(median bandwidth, text) for the same bytes moved in each of `seconds`: the median
    time's bandwidth, and the p90 time's (the slow tail)."""
    med, p90 = median_p90(seconds)
    return nbytes / med if med > 0 else None, "%s (%s in %s; p90 %s = %s; %d run%s)" % (
        fmt_bw(nbytes / med if med > 0 else None), fmt_size(int(mib(nbytes))), fmt_s(med),
        fmt_s(p90), fmt_bw(nbytes / p90 if p90 > 0 else None), len(seconds),
        "s" if len(seconds) > 1 else "")


def judged_row(figure, key, label, tessera, baseline, ratio, unjudged=None):
    """A row held to TARGETS[key]; `unjudged` (a reason) leaves it unjudged and says why."""
    target, higher, text = TARGETS[key]
    met = None
    if ratio is not None and not unjudged:
        met = ratio >= target if higher else ratio <= target
    if unjudged:
        text += " (not judged: %s)" % unjudged
    return Row(figure, tessera, baseline, ratio, text, met,
               chart=(label, ratio, target, higher))


def memcpy_baselines(reports):
    """{role: (threads, slowest rank's seconds)} for "one", "client" and "all_cores" of
    bench_rank.py's memcpy baselines."""
    out = {}
    for role in ("one", "client", "all_cores"):
        threads = reports[0]["memcpy_threads"][role]
        out[role] = (threads, max(r["memcpy_s"][str(threads)] for r in reports))
    return out


def memcpy_text(baselines, per_rank_bytes):
    threads, seconds = baselines["client"]
    cores, every = baselines["all_cores"]
    return "memcpy with %d thread%s (the client's count) %s (%s per rank); every core (%d): %s" % (
        threads, "s" if threads > 1 else "", fmt_s(seconds),
        fmt_bw(per_rank_bytes / seconds if seconds > 0 else None), cores, fmt_s(every))


def fio_limit_rows(limits):
    rows = []
    for kind in ("write", "read"):
        limit = limits.get(kind)
        if limit is None:
            rows.append(Row("fio %s limit" % kind, "-", "not measured (see logs/fio.log)"))
            continue
        rows.append(Row("fio %s limit" % kind, "-", "%s at %s (fastest of %d points)" % (
            fmt_bw(limit["bw"]), limit["point"], limit["of"]),
            target="not judged: %s" % limit["unjudged"] if limit["unjudged"] else "-"))
    return rows


def fio_text(kind, limit):
    if not limit:
        return "fio %s limit: not measured in this run" % kind
    return "fio %s limit %s" % (kind, fmt_bw(limit["bw"]))


def fio_ratio(bw, limit):
    return bw / limit["bw"] if bw and limit else None


JUDGED_TARGET = re.compile(r"^(>=|<=|>|<) ?([\d.]+)")


def ratio_figure(ratio, target, met):
    """`ratio` as the table prints it: two decimals, or as many more (up to 4) as it takes for a
    judged ratio to read as its judgment — 0.798 against ">= 0.80" prints "0.798", not "0.80"
    beside a "no"."""
    bound = JUDGED_TARGET.match(target)
    text = "%.2f" % ratio
    for digits in (3, 4):
        if met is None or bound is None:
            break
        shown, limit = float(text), float(bound.group(2))
        reads = {">=": shown >= limit, "<=": shown <= limit, ">": shown > limit,
                 "<": shown < limit}[bound.group(1)]
        if reads == met:
            break
        text = "%.*f" % (digits, ratio)
    return text


class Row:
    def __init__(self, figure, tessera="-", baseline="-", ratio=None, target="-", met=None,
                 ratio_text=None, chart=None):
        self.figure, self.tessera, self.baseline = figure, tessera, baseline
        self.ratio, self.target, self.met = ratio, target, met
        self.ratio_text = ratio_text
        self.chart = chart  # (label, ratio, target, higher_is_better) for the chart

    def cells(self):
        ratio = self.ratio_text or ("-" if self.ratio is None else
                                    ratio_figure(self.ratio, self.target, self.met))
        met = {True: "yes", False: "**no**", None: "-"}[self.met]
        return [self.figure, self.tessera, self.baseline, ratio, self.target, met]


def saves_rows(figures, name, per_rank_bytes, stalls, baselines, unjudged_stall, phases,
               total, spans, fio_w, reserved=None):
    """The save rows both workloads share: stall, first-save stall, persist (if `spans`:
    {step: save -> COMMITTED seconds}) and persist phase (from `phases`, session_steps()).
    `stalls`: {step: the slowest rank's stall}; `figures`: the rows' labels, in that order;
    `reserved`: the slowest rank's client.reserve() before step 1 in seconds (None: none).
    Returns (rows, steady stall median, steady save -> COMMITTED median)."""
    rows = []
    f_stall, f_first, f_persist, f_phase = figures
    steps = sorted(stalls)
    steady = [st for st in steps if st >= 2]
    if not steady:
        return [Row("%s, %s" % (f_stall, name), "not judged: no steady-state save "
                    "(run more than one step)")], None, None
    stall, stall_text = spread([stalls[st] for st in steady], fmt_s)
    memcpy = baselines["client"][1]
    ratio = stall / memcpy if memcpy > 0 else None
    rows.append(judged_row("%s, %s" % (f_stall, name), "stall", "stall %s" % name,
                           stall_text, memcpy_text(baselines, per_rank_bytes), ratio,
                           unjudged_stall))
    first = stalls.get(1)
    if first is not None:
        rows.append(judged_row("%s, %s" % (f_first, name), "first",
                               "first save %s" % name,
                               "%s (step 1: plans from scratch; %s; one run)" % (
                                   fmt_s(first), "sizes staging" if reserved is None else
                                   "staging reserved before it in %s" % fmt_s(reserved)),
                               "steady stall %s (median)" % fmt_s(stall),
                               first / stall if stall > 0 else None))
    span = None
    steady_spans = [spans[st] for st in steady if spans.get(st)]
    if steady_spans:
        span = median_p90(steady_spans)[0]
        bw, text = bw_spread(total, steady_spans)
        rows.append(judged_row("%s, %s" % (f_persist, name), "persist",
                               "persist %s" % name, text, fio_text("write", fio_w),
                               fio_ratio(bw, fio_w)))
    persist = [phases[st]["persist_s"] for st in steady if phases.get(st, {}).get("persist_s")]
    if persist:
        bw, text = bw_spread(total, persist)
        rows.append(judged_row("%s, %s" % (f_phase, name), "phase",
                               "persist phase %s" % name,
                               "%s; first write began -> COMMITTED" % text, fio_text("write", fio_w),
                               fio_ratio(bw, fio_w)))
    else:
        rows.append(Row("%s, %s" % (f_phase, name),
                        "not measured: the coordinator's session phases were not read"))
    return rows, stall, span


BENCH_FIGURES = ("1 stall", "1f first-save stall", "2 persist (save -> COMMITTED)",
                 "2b persist phase")
LLAMA_FIGURES = ("7 llama stall", "7 llama first-save stall",
                 "7 llama persist (save -> COMMITTED)", "7 llama persist phase")


def load_row(figure, name, layouts, runs, fio_r, tag):
    """A load row: `runs` [{"bytes" (into the tensors), "seconds", "cache", "from_memory",
    "from_disk" (what the agents read from the files), "from_device" (what the block device
    read meanwhile, or None)}], one per run. The bandwidth is of the bytes loaded into the
    tensors (a replicated tensor counts once per rank that loads it). The files' bytes exceed
    the device's where ranks share blocks through the page cache (format/checkpoint_reader.h
    "Shared spans")."""
    if not runs:
        return Row("%s load %s, %s" % (figure, layouts, name), "failed (see logs/%s)" % tag)
    nbytes = runs[0]["bytes"]
    bw, text = bw_spread(nbytes, [r["seconds"] for r in runs])
    caches = [r["cache"] for r in runs if r["cache"] != "dropped"]
    memory = sum(r["from_memory"] for r in runs)
    unjudged = None
    if caches:
        unjudged = undropped(caches[0])
    elif fio_r and fio_r["unjudged"]:
        unjudged = "the fio read limit is not judged"
    elif memory:
        unjudged = "%s came from the agents' memory, not the disk" % fmt_size(int(mib(memory)))
    files = median_p90([r["from_disk"] for r in runs])[0]
    device = [r["from_device"] for r in runs if r.get("from_device") is not None]
    device_text = (" (%s from the disk)" % fmt_size(int(mib(median_p90(device)[0])))
                   if len(device) == len(runs) else "")
    return judged_row("%s load %s, %s" % (figure, layouts, name), "load", "load %s" % name,
                      "%s; %s read from the files per run%s%s" % (
                          text, fmt_size(int(mib(files))), device_text,
                          "" if caches else ", page cache dropped before each"),
                      fio_text("read", fio_r), fio_ratio(bw, fio_r), unjudged)


def config_rows(raw, mib_per_rank, ranks, fio_w, fio_r, notes):
    tag = "%dM-x%d" % (mib_per_rank, ranks)
    name = "%s x %d rank%s" % (fmt_size(mib_per_rank), ranks, "s" if ranks > 1 else "")
    saves = [load_json(p) for p in sorted(glob.glob(os.path.join(raw, "save-%s-*.json" % tag)))]
    saves = [s for s in saves if s]
    rows = []
    if len(saves) < ranks:
        rows.append(Row("1-3 stall/persist/peer, %s" % name,
                        tessera="failed: %d of %d ranks reported (see logs/%s)"
                        % (len(saves), ranks, tag)))
        return rows
    total = sum(s["bytes"] for s in saves)
    steps = sorted({x["step"] for s in saves for x in s["saves"]})

    def per_step(step):
        xs = [x for s in saves for x in s["saves"] if x["step"] == step]
        return {"blocked": max(x["blocked_s"] for x in xs),
                "stall": max(x["stall_s"] for x in xs),
                # The slowest rank's stall less its copy: plan, staging and acknowledgement.
                "not_copy": max(x["stall_s"] - x.get("copy_s", 0.0) for x in xs),
                "span": max(x["committed_at"] for x in xs) - min(x["start"] for x in xs),
                "cached": all(x["plan_cached"] for x in xs)}

    by_step = {st: per_step(st) for st in steps}
    baselines = memcpy_baselines(saves)
    copied = sorted({s.get("client_copy_threads") for s in saves}, key=str)
    unjudged = None
    if copied != [baselines["client"][0]]:
        unjudged = "the client copied with %s thread(s), the baseline with %d" % (
            "/".join(map(str, copied)), baselines["client"][0])
    notes.append("%s: %d tensor(s) of <= 64 MiB per rank; memcpy per rank (slowest): %s; per "
                 "step (slowest rank): %s" % (
                     name, saves[0]["tensors"],
                     ", ".join("%d thread%s %s" % (t, "s" if t > 1 else "", fmt_s(sec))
                               for t, sec in sorted(set(baselines.values()))),
                     "; ".join("step %d blocked %s (client stall %s, of which not copying "
                               "%s), save->COMMITTED %s%s" % (
                         st, fmt_s(v["blocked"]), fmt_s(v["stall"]), fmt_s(v["not_copy"]),
                         fmt_s(v["span"]),
                         ", plan cached" if v["cached"] else "")
                         for st, v in sorted(by_step.items()))))
    save_rows, blocked, span = saves_rows(
        BENCH_FIGURES, name, total / ranks, {st: v["blocked"] for st, v in by_step.items()}, baselines,
        unjudged, session_steps(os.path.join(raw, "sessions-%s" % tag)), total,
        {st: v["span"] for st, v in by_step.items()}, fio_w,
        max((s["reserve_s"] for s in saves if "reserve_s" in s), default=None))
    rows += save_rows
    torch = [s.get("torch") for s in saves]
    if blocked and span and all(torch):
        runs = sorted({x["run"] for t in torch for x in t})
        t_blocked = [max(x["blocked_s"] for t in torch for x in t if x["run"] == k) for k in runs]
        t_durable = [max(x["durable_at"] for t in torch for x in t if x["run"] == k) -
                     min(x["start"] for t in torch for x in t if x["run"] == k) for k in runs]
        b_med, b_text = spread(t_blocked, fmt_s)
        d_med, d_text = spread(t_durable, fmt_s)
        rb, rd = b_med / blocked, d_med / span
        rows.append(Row("3 peer blocked, %s" % name, "%s (median)" % fmt_s(blocked),
                        "torch.save %s" % b_text, rb,
                        "> 25x (torchsnapshot's claim)", rb > 25, ratio_text="%.1fx" % rb,
                        chart=("peer blocked %s" % name, rb, 25, True)))
        rows.append(Row("3 peer durable, %s" % name, "%s (median)" % fmt_s(span),
                        "torch.save+fsync %s" % d_text, rd, "> 1x (report)", rd > 1,
                        ratio_text="%.2fx" % rd))
    if blocked and span:
        rows += report_dcp.save_rows(Row, fmt_s, raw, tag, name, ranks, blocked, span)
    rows += memory_rows(raw, tag, name, ranks, baselines["client"])
    layout_file = os.path.join(raw, "load-layout-%s.txt" % tag)
    if os.path.exists(layout_file):
        saved_world, load_world = read_text(layout_file).split()
        runs, failed = [], []
        for cache_file in sorted(glob.glob(os.path.join(raw, "load-cache-%s-run*.txt" % tag))):
            run = cache_file[:-len(".txt")].rsplit("-run", 1)[1]
            loads = [load_json(p) for p in
                     glob.glob(os.path.join(raw, "load-%s-run%s-*.json" % (tag, run)))]
            loads = [x for x in loads if x]
            if len(loads) < int(load_world) or any(x["mismatched"] for x in loads):
                failed.append(run)
                continue
            runs.append({"bytes": sum(x["bytes"] for x in loads),
                         "seconds": max(x["end"] for x in loads) - min(x["start"] for x in loads),
                         "cache": read_text(cache_file),
                         "from_memory": sum(x["sources"]["bytes_from_memory"] for x in loads),
                         "from_disk": sum(x["sources"]["bytes_from_disk"] for x in loads),
                         "from_device": device_read(
                             [x.get("device_read") or [] for x in loads])})
        if failed:
            notes.append("%s: load runs %s failed (see logs/%s)" % (name, ", ".join(failed), tag))
        rows.append(load_row("4", name, "tp=%s -> tp=%s" % (saved_world, load_world), runs,
                             fio_r, tag))
        if runs:
            rows += report_dcp.load_rows(Row, fmt_s, fmt_bw, raw, tag, name, saved_world,
                                         load_world, median_p90([r["seconds"] for r in runs])[0])
    return rows


def load_runs(raw, prefix, tag):
    """[[rank's load JSON, ...] per run, in run order] of run.sh's `<prefix>-<tag>-run<i>-<rank>`
    files, or None if a run of the configuration's memory-runs-<tag>.txt count wrote nothing
    (every rank of it failed). [] if the configuration ran none."""
    runs = {}
    for path in glob.glob(os.path.join(raw, "%s-%s-run*-*.json" % (prefix, tag))):
        m = re.search(r"-run(\d+)-\d+\.json$", path)
        report = load_json(path)
        if m and report:
            runs.setdefault(int(m.group(1)), []).append(report)
    count = read_text(os.path.join(raw, "memory-runs-%s.txt" % tag), "").strip()
    expected = int(count) if count.isdigit() else max(runs, default=0)
    if any(k not in runs for k in range(1, expected + 1)):
        return None
    return [runs[k] for k in sorted(runs)]


def median_run(judged_runs):
    """(the run whose ratio is the median, "; median of N runs: a-b") of [(ratio, run)]; a run
    without a ratio (nothing measured) makes the whole None."""
    if any(r[0] is None for r in judged_runs):
        return None, ""
    ordered = sorted(judged_runs, key=lambda r: r[0])
    mid = ordered[(len(ordered) - 1) // 2]  # the lower middle of an even count
    if len(ordered) == 1:
        return mid, ""
    return mid, "; median of %d runs: %.2f-%.2f" % (len(ordered), ordered[0][0], ordered[-1][0])


def prefetch_text(loads):
    """"; <n> of <m> ranks read through the resident copy mapped at connect, in up to <t> beside
    a model build of <b> (<w> past it), <p> % of its bytes checked there" for bench_rank.py's
    load reports (DESIGN.md "Mapping and checking the resident copy ahead"); "" for reports
    that predate it."""
    if not all("client" in x and "build_s" in x for x in loads):
        return ""
    if not any(x["client"].get("prefetch_bytes", 0) > 0 for x in loads):
        return "; the resident copy was not mapped at connect"
    used = sum(1 for x in loads if x["client"].get("prefetched_loads", 0) > 0)
    mapped = max(x["client"].get("prefetch_s", 0.0) for x in loads)
    build = max(x["build_s"] for x in loads)
    past = max(x["prefetch_wait_s"] for x in loads)
    text = "; %d of %d ranks read through their agent's copy mapped at connect, in up to %s " \
        "beside a model build of %s (%s past it)" % (used, len(loads), fmt_s(mapped),
                                                     fmt_s(build), fmt_s(past))
    if any("prefetch_checked_bytes" in x["client"] for x in loads):
        checked = sum(x["client"]["prefetch_checked_bytes"] for x in loads)
        total = sum(x["client"]["prefetch_bytes"] for x in loads)
        text += ", %.0f %% of its bytes checked there" % (100.0 * checked / max(total, 1))
    return text


def copy_text(loads, key="copy_seconds", doing="copying"):
    """"; per rank, copying <a>-<b> of loads of <c>-<d>": how much of each rank's load() was
    its client's own mapping and copying after the agent's replies (last_load's
    copy_seconds) — or, with key="fetch_seconds", its fetching from another node; "" for
    reports that predate it."""
    if not all(key in x["sources"] for x in loads):
        return ""
    spent = [x["sources"][key] for x in loads]
    totals = [x["load_s"] for x in loads]
    return "; per rank, %s %s-%s of loads of %s-%s" % (
        doing, fmt_s(min(spent)), fmt_s(max(spent)), fmt_s(min(totals)), fmt_s(max(totals)))


def together_text(loads, memcpy):
    """"; the same copies started together as the loads are: <median round> (<ratio>)": the
    span (first start -> last end over the ranks) of bench_rank.py's memcpy rounds started at
    a barrier, their median, and the ratio a restore that were nothing but that copy would
    score against `memcpy` (the baseline); "" for reports without them."""
    rounds = [x.get("memcpy_together") for x in loads]
    if not all(rounds) or len({len(r) for r in rounds}) != 1:
        return ""
    spans = [max(r[i][1] for r in rounds) - min(r[i][0] for r in rounds)
             for i in range(len(rounds[0]))]
    mid, _ = median_p90(spans)
    return "; the same copies started together, as the loads are: %s (%d rounds' median; " \
        "%.2f)" % (fmt_s(mid), len(spans), memcpy / mid if mid > 0 else 0.0)


def memory_rows(raw, tag, name, ranks, client_memcpy):
    """Figure 4m: the last saved step loaded on the same layout from the agents' memory tier,
    in each of run.sh's runs. Per run: bytes / (first load() call -> last returned), against
    the slowest rank's memcpy of its bytes with the client's threads, taken by the loading ranks
    right before the load (bench_rank.py --memcpy-baseline; else figure 1's `client_memcpy`,
    (threads, seconds)). The row is the run of median ratio. Judged only if no run read from
    disk; failed if any run lacks a rank's report."""
    runs = load_runs(raw, "memload", tag)
    failed = [Row("4m memory restore, %s" % name, "failed (see logs/%s)" % tag)]
    if runs == []:
        return []
    if runs is None or any(len(loads) < ranks or any(x["mismatched"] for x in loads)
                           for loads in runs):
        return failed + buddy_rows(raw, tag, name, ranks)
    measured = []
    for loads in runs:
        when, baseline = "figure 1's", client_memcpy
        if all("memcpy_s" in x for x in loads):
            when, baseline = "right before the load", memcpy_baselines(loads)["client"]
        span = max(x["end"] for x in loads) - min(x["start"] for x in loads)
        ratio = baseline[1] / span if span > 0 and baseline[1] > 0 else None
        measured.append((ratio, (loads, span, when, baseline)))
    median, spread_text = median_run(measured)
    if median is None:
        return failed + buddy_rows(raw, tag, name, ranks)
    ratio, (loads, span, when, (threads, memcpy)) = median
    memory = sum(x["sources"]["bytes_from_memory"] for x in loads)
    disk = sum(x["sources"]["bytes_from_disk"] for x in loads)
    total = sum(x["bytes"] for x in loads)
    # Judged only if no run read from disk.
    judged = all(sum(x["sources"]["bytes_from_disk"] for x in run[1][0]) == 0 for run in measured)
    return [Row("4m memory restore, %s" % name,
                "%s (%s in %s; %s from memory, %s from disk%s%s%s)" % (
                    fmt_bw(total / span if span > 0 else None), fmt_size(int(mib(total))),
                    fmt_s(span), fmt_size(int(mib(memory))), fmt_size(int(mib(disk))),
                    spread_text, copy_text(loads), prefetch_text(loads)),
                "memcpy (%s), %d thread%s, %s (%s per rank)%s" % (
                    when, threads, "s" if threads > 1 else "", fmt_s(memcpy),
                    fmt_bw(total / ranks / memcpy) if memcpy else "-",
                    together_text(loads, memcpy)),
                ratio, ">= 0.80", (ratio >= 0.8) if judged else None,
                chart=("memory restore %s" % name, ratio, 0.8, True))] + \
        copy_hash_rows(measured, name, judged) + buddy_rows(raw, tag, name, ranks)


def copy_hash_rows(measured, name, judged):
    """Figure 4m against what a checked restore cannot do without: the same bytes copied and
    hashed (XXH3-64) in one pass on the client's threads, every rank at once, right before the
    load (bench_rank.py parallel_copy_hash; the slowest rank's best of 3) — per run, that over
    the load's span; the row is the run of median ratio. None for reports without it."""
    runs = []
    for _, (loads, span, _, _) in measured:
        if not all(x.get("copy_xxh3", {}).get("seconds") for x in loads):
            return []
        seconds = max(x["copy_xxh3"]["seconds"] for x in loads)
        runs.append((seconds / span if span > 0 else None, (loads, span, seconds)))
    median, spread_text = median_run(runs)
    if median is None:
        return []
    ratio, (loads, span, seconds) = median
    total = sum(x["bytes"] for x in loads)
    threads, piece = loads[0]["copy_xxh3"]["threads"], loads[0]["copy_xxh3"]["piece"]
    return [Row("4m memory restore against copy + XXH3, %s" % name,
                "%s in %s%s" % (fmt_size(int(mib(total))), fmt_s(span), spread_text),
                "copy + XXH3-64 in one pass (%d KiB pieces), %d thread%s, right before the "
                "load: %s (%s per rank)" % (
                    piece >> 10, threads, "s" if threads > 1 else "", fmt_s(seconds),
                    fmt_bw(total / len(loads) / seconds)),
                ratio, ">= 0.80", (ratio >= 0.8) if judged else None,
                chart=("memory restore vs copy+hash %s" % name, ratio, 0.8, True))]


def buddy_rows(raw, tag, name, ranks):
    """Figure 4m, buddy: the ranks whose node was lost restore on a new one; per run, bytes they
    read from their buddies / (first of their load() calls -> last returned), vs loopback TCP
    with as many streams measured right before (link-<tag>-run<i>.json; beside it, not
    judged, the same with the receivers checking what arrives: linkcheck-...). Judged with those
    ranks restoring alone (buddyload: the baseline runs alone, and on a cluster the surviving
    node's restores run on its own cores); reported, not judged, with every rank restoring at
    once (buddyshared: both "nodes" on this machine's cores). Each row is the run of median
    ratio; judged only if no run read from disk, failed if any run lacks a rank's report.
    None with one rank: run.sh restores from buddies only with ranks on two nodes."""
    rows = []
    if ranks < 2:
        return rows
    for prefix, label, judged in (("buddyload", "", True),
                                  ("buddyshared", ", beside the other node's restores", False)):
        runs = load_runs(raw, prefix, tag)
        if runs == []:
            continue
        figure = "4m buddy restore%s, %s" % (label, name)
        measured = []
        for i, loads in enumerate(runs or [], 1):
            moved = [x for x in loads if x["rank"] % 2 == 1]
            # Every rank of the lost node reported, and nobody read a wrong byte.
            if len(moved) != loads[0]["world"] // 2 or any(x["mismatched"] for x in loads):
                measured = []
                break
            link = load_json(os.path.join(raw, "link-%s-run%d.json" % (tag, i)))
            checked = load_json(os.path.join(raw, "linkcheck-%s-run%d.json" % (tag, i)))
            fetched = sum(x["sources"]["bytes_fetched_from_peers"] for x in moved)
            disk = sum(x["sources"]["bytes_from_disk"] for x in moved)
            span = max(x["end"] for x in moved) - min(x["start"] for x in moved)
            bw = fetched / span if span > 0 else None
            link_bw = link["bytes_per_s"] if link else None
            measured.append((bw / link_bw if bw and link_bw else None,
                             (moved, span, bw, link, disk, checked)))
        median, spread_text = median_run(measured) if measured else (None, "")
        if median is None:
            rows.append(Row(figure, "failed (see logs/%s)" % tag))
            continue
        ratio, (moved, span, bw, link, _, checked) = median
        fetched = sum(x["sources"]["bytes_fetched_from_peers"] for x in moved)
        by_trainers = sum(x["sources"].get("bytes_fetched_by_client", 0) for x in moved)
        disk = sum(x["sources"]["bytes_from_disk"] for x in moved)
        clean = all(run[1][4] == 0 for run in measured)  # no run read from disk
        met = (ratio >= 0.8) if judged and clean else None
        rows.append(Row(
            figure,
            "%s (%d ranks on a new node: %s from buddies in %s, %s of it read by the "
            "trainers themselves; %s from disk%s%s)" % (
                fmt_bw(bw), len(moved), fmt_size(int(mib(fetched))), fmt_s(span),
                fmt_size(int(mib(by_trainers))), fmt_size(int(mib(disk))), spread_text,
                copy_text(moved, "fetch_seconds", "fetching")),
            link_text(link, checked),
            ratio, ">= 0.80" if judged else "not judged", met,
            chart=("buddy restore %s" % name, ratio, 0.8, True) if judged else None))
    return rows


def link_text(link, checked):
    """The buddy row's baseline: the loopback link, and beside it (if measured) the same link
    with the receivers checking what arrives, as a fraction of it."""
    if not link:
        return "-"
    text = "loopback TCP %s (%d streams)" % (fmt_bw(link["bytes_per_s"]), link["streams"])
    if checked:
        text += "; its receivers checking what arrives (XXH3): %s (%.2f of it), not judged" % (
            fmt_bw(checked["bytes_per_s"]), checked["bytes_per_s"] / link["bytes_per_s"])
    return text


LLAMA_STAGED = re.compile(r"rank (\d+): step (\d+) staged: ([\d.]+) ms trainer stall for "
                          r"([\d.]+) MiB")
LLAMA_LOADED = re.compile(r"rank (\d+): loaded step (\d+) on \S+: ([\d.]+) MiB verified byte "
                          r"for byte in ([\d.]+) s")
LLAMA_RESERVED = re.compile(r"rank (\d+): staging reserved for [\d.]+ MiB in ([\d.]+) ms")
LLAMA_SOURCES = re.compile(r"rank (\d+): load sources: memory_bytes=(\d+) disk_bytes=(\d+)")


def llama_lines(paths, pattern):
    """Every match of `pattern` in the files."""
    out = []
    for path in paths:
        out += [m for m in (pattern.search(line) for line in read_text(path, "").splitlines())
                if m]
    return out


def llama_rows(raw, mesh, world, llama_mib, fio_w, fio_r, notes):
    """Figure 7: the quickstart's model saved by tessera-llama-trainer as `mesh` (PPxTPxDP)."""
    tag = "llama-%dM-%s" % (llama_mib, mesh)
    pp, tp, dp = mesh.split("x")
    name = "llama %s, pp%s tp%s dp%s (%d rank%s)" % (fmt_size(llama_mib), pp, tp, dp, world,
                                                    "s" if world > 1 else "")
    staged = llama_lines(glob.glob(os.path.join(raw, "llama-save-%s-*.out" % tag)), LLAMA_STAGED)
    memcpys = [load_json(p) for p in glob.glob(os.path.join(raw, "llama-memcpy-%s-*.json" % tag))]
    memcpys = [m for m in memcpys if m]
    if len({m.group(1) for m in staged}) < world or len(memcpys) < world:
        return [Row("7 llama, %s" % name, "failed: %d of %d trainers saved, %d of %d memcpy "
                    "baselines (see logs/%s)" % (len({m.group(1) for m in staged}), world,
                                                 len(memcpys), world, tag))]
    stalls = {}
    for m in staged:
        step = int(m.group(2))
        stalls[step] = max(stalls.get(step, 0), float(m.group(3)) / 1000)
    rank_bytes = {int(m.group(1)): float(m.group(4)) * 2**20 for m in staged}
    phases = session_steps(os.path.join(raw, "sessions-%s" % tag))
    total = max((v["bytes"] for v in phases.values()), default=0)
    baselines = memcpy_baselines(memcpys)
    notes.append("%s: per rank %s MiB (the trainer's bytes, replicated parameters included); "
                 "checkpoint %s (replicas written once); stall per step (slowest rank): %s" % (
                     name, "/".join("%.1f" % mib(rank_bytes[r]) for r in sorted(rank_bytes)),
                     fmt_size(int(mib(total))),
                     "; ".join("step %d %s" % (st, fmt_s(v)) for st, v in sorted(stalls.items()))))
    reserved = llama_lines(glob.glob(os.path.join(raw, "llama-save-%s-*.out" % tag)),
                           LLAMA_RESERVED)
    rows, _, _ = saves_rows(LLAMA_FIGURES, name, max(rank_bytes.values()), stalls, baselines, None,
                            phases, total, {st: v["span_s"] for st, v in phases.items()}, fio_w,
                            max((float(m.group(2)) / 1000 for m in reserved), default=None))
    layouts = read_text(os.path.join(raw, "llama-load-layout-%s.txt" % tag), "").split()
    if len(layouts) == 2:
        load_world = 1
        for part in layouts[1].split(","):
            load_world *= int(part.split("=")[1])
        runs = []
        for cache_file in sorted(glob.glob(os.path.join(raw, "llama-load-cache-%s-run*.txt" % tag))):
            run = cache_file[:-len(".txt")].rsplit("-run", 1)[1]
            outs = glob.glob(os.path.join(raw, "llama-load-run%s-%s-*.out" % (run, tag)))
            loaded = llama_lines(outs, LLAMA_LOADED)
            sources = llama_lines(outs, LLAMA_SOURCES)
            if len(loaded) < load_world:
                notes.append("%s: load run %s failed (see logs/%s)" % (name, run, tag))
                continue
            runs.append({"bytes": sum(float(m.group(3)) * 2**20 for m in loaded),
                         "seconds": max(float(m.group(4)) for m in loaded),
                         "cache": read_text(cache_file),
                         "from_memory": sum(int(m.group(2)) for m in sources),
                         "from_disk": sum(int(m.group(3)) for m in sources),
                         "from_device": device_read(counters_file(
                             os.path.join(raw, "llama-load-disk-%s-run%s.txt" % (tag, run))))})
        rows.append(load_row("7 llama", name, "%s -> %s" % tuple(layouts), runs, fio_r, tag))
    return rows


# The planning targets (issue 15): (ranks, shards) -> first plan s, cached plan s, RSS MiB,
# manifest load s. Other configurations are the sweep of the plot, reported but not judged.
PLAN_TARGETS = {(1024, 1000): (1.0, 0.05, 1024, None), (16384, 300): (10.0, 0.2, 4096, 2.0)}


def plan_runs(raw):
    """{(ranks, shards): [plan.json of each run]}; failed runs under the key None."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(raw, "plan-*.json"))):
        data = load_json(path)
        if data is None or not data.get("ok"):
            runs.setdefault(None, []).append(
                (os.path.basename(path), (data or {}).get("error", "no output")))
            continue
        key = (data["ranks"], data["shards_per_rank"])
        if not data.get("fingerprints", True):
            key = ("whole",) + key  # the baseline: agents re-send whole plans
        runs.setdefault(key, []).append(data)
    return runs


def baseline_text(xs):
    if not xs:
        return ""
    med, p90 = median_p90([x["cached_plan_s"] for x in xs])
    return "; whole plans re-sent (no fingerprints): %s (p90 %s, median of %d)" % (
        fmt_s(med), fmt_s(p90), len(xs))


def ratio(cached, xs):
    """The cached save's time as a fraction of re-sending whole plans."""
    if not xs:
        return None
    return cached / median_p90([x["cached_plan_s"] for x in xs])[0]


def plan_rows(raw):
    runs = plan_runs(raw)
    rows = [Row("5 plan", "failed: %s (%s)" % (err, name)) for name, err in runs.pop(None, [])]
    whole = {key[1:]: runs.pop(key) for key in [k for k in runs if k[0] == "whole"]}
    for key in sorted(runs, key=lambda k: (k not in PLAN_TARGETS, k)):
        ranks, shards = key
        xs = runs[key]
        targets = PLAN_TARGETS.get(key)
        scale = "%d ranks x %d shards" % key
        n = "median of %d" % len(xs)

        def stat(field, fmt=fmt_s):
            med, p90 = median_p90([x[field] for x in xs])
            return med, "%s (p90 %s)" % (fmt(med), fmt(p90))

        first, first_text = stat("first_plan_s")
        cached, cached_text = stat("cached_plan_s")
        hwm, hwm_text = stat("hwm_kib_after_first", lambda v: "%.0f MiB" % (v / 1024))
        hwm /= 1024
        load, load_text = stat("manifest_load_s")
        mbytes = xs[0]["manifest_bytes"]
        judged = targets is not None
        t = targets or (None, None, None, None)
        suffix = "" if judged else " (sweep: not judged)"
        rows += [
            Row("5 plan first, %s" % scale, first_text,
                "(%s; first submit->last PIN %s)" % (n, fmt_s(median_p90(
                    [x["first_span_s"] for x in xs])[0])), None,
                ("< %s" % fmt_s(t[0]) if judged else "-") + suffix,
                first < t[0] if judged else None),
            Row("5 plan cached, %s" % scale, cached_text,
                "(%s; fingerprints only: %d of %d PINs without assignment)%s" % (
                    n, min(x["pins_without_assignment"] for x in xs), ranks,
                    baseline_text(whole.get(key))), ratio(cached, whole.get(key)),
                ("< %s" % fmt_s(t[1]) if judged else "-") + suffix,
                cached < t[1] if judged else None),
            Row("5 plan peak RSS, %s" % scale, "%s VmHWM after the first save" % hwm_text,
                "(%s; after registration %.0f MiB)" % (n, xs[0]["rss_kib_registered"] / 1024),
                None, ("< %d MiB" % t[2] if judged else "-") + suffix,
                hwm < t[2] if judged else None),
            Row("5 manifest load, %s" % scale, load_text,
                "(ReadManifest, median of 5 per run; %.1f MiB, %d chunks)" % (
                    mbytes / 2**20, xs[0]["manifest_chunks"]), None,
                ("< %s" % fmt_s(t[3]) if judged and t[3] else "-") + suffix,
                load < t[3] if judged and t[3] else None),
        ]
        if all("manifest_write_s" in x for x in xs):  # runs of a load tool that measures it
            _, write_text = stat("manifest_write_s")
            rows.append(Row("5 manifest write, %s" % scale, write_text,
                            "(WriteManifest as a commit does: manifest.pb and manifest.json, "
                            "each fsynced and renamed, then the directory; median of 5 per run)",
                            None, "-" + suffix, None))
    return rows


def plan_chart(raw, path):
    """First and cached plan time and peak RSS against ranks, at the sweep's shard count."""
    runs = {k: xs for k, xs in plan_runs(raw).items() if k is not None and k[0] != "whole"}
    by_shards = {}
    for (ranks, shards), xs in runs.items():
        by_shards.setdefault(shards, []).append((ranks, xs))
    sweep = max(by_shards.items(), key=lambda kv: len(kv[1]), default=(None, []))
    if len(sweep[1]) < 2:
        return "fewer than two rank counts to plot"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is missing"
    points = sorted(sweep[1])
    ranks = [r for r, _ in points]
    med = lambda xs, f: median_p90([x[f] for x in xs])[0]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(ranks, [med(xs, "first_plan_s") for _, xs in points], "o-", label="first plan")
    ax1.plot(ranks, [med(xs, "cached_plan_s") for _, xs in points], "s-",
             label="cached (fingerprints)")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("ranks (%d shards each)" % sweep[0])
    ax1.set_ylabel("last submission -> last PIN (s)")
    ax1.legend()
    ax1.grid(True, which="both", alpha=0.3)
    ax2.plot(ranks, [med(xs, "hwm_kib_after_first") / 1024 for _, xs in points], "o-",
             color="tab:purple")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("ranks (%d shards each)" % sweep[0])
    ax2.set_ylabel("coordinator peak RSS (MiB)")
    ax2.grid(True, which="both", alpha=0.3)
    fig.suptitle("Planning through the real coordinator (median of runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def gpu_rows(raw, device):
    data = load_json(os.path.join(raw, "gpu-0.json"))
    if data is None:
        return [Row("6 GPU", "failed on %s (see logs/gpu)" % device)]
    if "skipped" in data:
        return [Row("6 GPU", "skipped: " + data["skipped"])]
    steady = [x for x in data["saves"] if x["step"] >= 2] or data["saves"]
    blocked = median_p90([x["blocked_s"] for x in steady])[0]
    committed = median_p90([x["committed_s"] for x in steady])[0]
    name = "%s on %s" % (fmt_size(int(mib(data["bytes"]))), data.get("device", device))
    ratio = blocked / data["d2h_s"] if data["d2h_s"] > 0 else None
    rows = [Row("6 GPU stall, %s" % name, fmt_s(blocked),
                "pinned D2H %s (%s)" % (fmt_s(data["d2h_s"]), fmt_bw(data["bytes"] / data["d2h_s"])),
                ratio, "<= 1.2", None if ratio is None else ratio <= 1.2,
                chart=("GPU stall %s" % name, ratio, 1.2, False))]
    if data.get("dcp"):
        runs = data["dcp"][1:] or data["dcp"]
        d_blocked = median_p90([x["blocked_s"] for x in runs])[0]
        d_durable = median_p90([x["durable_s"] for x in runs])[0]
        rows.append(Row("6 GPU vs DCP async_save blocked, %s" % name, fmt_s(blocked),
                        "async_save %s (torch %s)" % (fmt_s(d_blocked), data["torch"]),
                        d_blocked / blocked if blocked > 0 else None, "> 1x (report)",
                        d_blocked > blocked,
                        ratio_text="%.1fx" % (d_blocked / blocked) if blocked > 0 else None))
        rows.append(Row("6 GPU vs DCP async_save durable, %s" % name, fmt_s(committed),
                        "async_save done %s" % fmt_s(d_durable),
                        d_durable / committed if committed > 0 else None, "> 1x (report)",
                        d_durable > committed,
                        ratio_text="%.2fx" % (d_durable / committed) if committed > 0 else None))
    else:
        rows.append(Row("6 GPU vs DCP async_save", "not run: %s" % data.get("dcp_error", "?")))
    return rows


def fio_table(points):
    """results.md's table of the fio sweep: every point's write and read bandwidth."""
    reads = {(p["bs"], p["iodepth"], p["numjobs"]): p for p in points["read"]}
    keys = sorted({(p["bs"], p["iodepth"], p["numjobs"]) for p in points["write"]} | set(reads),
                  key=lambda k: (int(re.sub(r"\D", "", k[0]) or 0), k[1], k[2]))
    writes = {(p["bs"], p["iodepth"], p["numjobs"]): p for p in points["write"]}
    out = ["fio sweep (aggregate bandwidth of all jobs; the fastest of each column is the "
           "limit):", "", "| bs | iodepth | numjobs | write | read |", "|---|---|---|---|---|"]
    for k in keys:
        w, r = writes.get(k), reads.get(k)
        out.append("| %s | %d | %d | %s | %s |" % (
            k[0], k[1], k[2], fmt_bw(w["bw"]) if w else "-",
            "-" if not r else fmt_bw(r["bw"]) + ("" if r["cache"] == "dropped" else
                                                  " (cache %s)" % r["cache"])))
    out.append("")
    return out


def chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is missing (deploy/install-deps.sh installs python3-matplotlib)"
    charted = [r for r in rows if r.chart and r.chart[1] is not None]
    if not charted:
        return "nothing to chart"
    items = [r.chart for r in charted]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(items) + 1.5))
    labels = [i[0] + ("" if r.met is not None else " (not judged)") for i, r in zip(items, charted)]
    values = [i[1] for i in items]
    colors = [{True: "tab:green", False: "tab:red", None: "tab:gray"}[r.met] for r in charted]
    y = range(len(items))
    ax.barh(y, values, color=colors)
    for yi, (_, _, target, _) in zip(y, items):
        ax.plot([target, target], [yi - 0.4, yi + 0.4], color="black", linewidth=2)
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ratio (log scale); black tick: target; green: met, red: missed, "
                  "gray: not judged")
    ax.set_title("Tessera vs same-run baselines")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--data-dir", default="", help="run.sh's data directory (named <data-dir>)")
    a = p.parse_args()
    raw = os.path.join(a.results, "raw")
    env = read_env(os.path.join(raw, "machine.env"))
    notes = []
    points = fio_points(raw)
    fio_w, fio_r = sweep_limit(points["write"]), sweep_limit(points["read"])
    rows = fio_limit_rows({"write": fio_w, "read": fio_r}) if points["write"] or \
        points["read"] or os.path.isdir(os.path.join(raw, "fio")) else []
    configs = []
    try:
        with open(os.path.join(raw, "configs.txt")) as f:
            configs = [line.split() for line in f if line.strip()]
    except OSError:
        pass
    for m, r, verdict, need in configs:
        m, r, need = int(m), int(r), int(need)
        if verdict != "run":
            rows.append(Row("1-4 %s x %d rank%s" % (fmt_size(m), r, "s" if r > 1 else ""),
                            "not run: needs %.1f GiB (3 x %s x %d ranks + 1 GiB), %.1f GiB "
                            "available" % (need / 1024, fmt_size(m), r,
                                           int(env.get("mem_available_kib", 0)) / 2**20)))
            continue
        if glob.glob(os.path.join(raw, "save-%dM-x%d-*.json" % (m, r))) or \
                os.path.exists(os.path.join(raw, "load-layout-%dM-x%d.txt" % (m, r))):
            rows += config_rows(raw, m, r, fio_w, fio_r, notes)
        elif fio_w is not None:
            rows.append(Row("1-4 %s x %d ranks" % (fmt_size(m), r), "failed (see logs)"))
    for line in read_text(os.path.join(raw, "llama-configs.txt"), "").splitlines():
        mesh, world, verdict, need, llama_mib = line.split()
        if verdict != "run":
            rows.append(Row("7 llama %s" % mesh, "not run: needs %.1f GiB, %.1f GiB available" % (
                int(need) / 1024, int(env.get("mem_available_kib", 0)) / 2**20)))
            continue
        rows += llama_rows(raw, mesh, int(world), int(llama_mib), fio_w, fio_r, notes)
    s3_rows, s3_section = report_s3.report(sys.modules[__name__], raw, env, notes)
    rows += s3_rows
    rows += plan_rows(raw)
    gpu = ""
    try:
        gpu = open(os.path.join(raw, "gpu.txt")).read().strip()
    except OSError:
        pass
    if gpu:
        if gpu.startswith("skipped"):
            rows.append(Row("6 GPU", gpu))
        else:
            rows += gpu_rows(raw, gpu.splitlines()[0])

    chart_error = chart(rows, os.path.join(a.results, "chart.png"))
    plan_chart_error = plan_chart(raw, os.path.join(a.results, "plan.png"))
    mem = int(env.get("mem_kib", 0)) / 2**20
    out = []
    out.append("# Tessera benchmark results")
    out.append("")
    out.append("| machine | |")
    out.append("|---|---|")
    for label, value in [
            ("CPU", "%s, %s cores" % (env.get("cpu", "?"), env.get("cores", "?"))),
            ("memory", "%.1f GiB (%.1f GiB available at start)" % (
                mem, int(env.get("mem_available_kib", 0)) / 2**20)),
            ("disk", env.get("disk", "?") + " (" + env.get("disk_source", "?") + ")"),
            ("file system of the bench dir", "%s at %s" % (env.get("fs", "?"),
                                                           env.get("data_dir", "?"))),
            ("kernel", env.get("kernel", "?")),
            ("/dev/shm huge pages", "huge=" + env.get("shm_huge", "?")),
            ("load average at start", env.get("loadavg", "?")),
            ("taken", "%s, commit %s" % (env.get("date", "?"), env.get("commit", "?"))),
            ("software", "torch %s, %s" % (env.get("torch", "?"), env.get("fio", "?"))),
            ("run.sh arguments", env.get("args", "") or "(defaults)")]:
        out.append("| %s | %s |" % (label, value))
    out.append("")
    out.append("| figure | tessera | baseline | ratio | target | met? |")
    out.append("|---|---|---|---|---|---|")
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in r.cells()) + " |")
    out.append("")
    if points["write"] or points["read"]:
        out += fio_table(points)
    out += s3_section
    if chart_error is None:
        out.append("![ratios against targets](chart.png)")
        out.append("")
    if plan_chart_error is None:
        out.append("![planning against rank count](plan.png)")
        out.append("")
    out.append("Notes:")
    out.append("")
    sweep = read_env(os.path.join(raw, "fio", "sweep.env"))
    if sweep:
        out.append("- fio sweep (%s): `%s`%s" % (
            sweep.get("sweep", "?"), sweep.get("options", "?"),
            "" if sweep.get("direct") == "1" else "; O_DIRECT was refused here, so it went "
            "through the page cache"))
    out.append("- Tessera saves: %d per configuration; step 1 (plans from scratch, sizes "
               "staging) is the first-save row; the stall and persist rows give the median and "
               "p90 of steps >= 2 (plan cached, staging pool reused). Layout of figures 1-4: "
               "tp=N (each rank holds distinct rows; every byte is written once)." % a.steps)
    for n in notes:
        out.append("- " + n)
    if chart_error:
        out.append("- chart: " + chart_error)
    out.append("- Definitions: tests/bench/report.py (module docstring).")
    text = "\n".join(out) + "\n"
    # Results are shared (a reference is committed): name directories by their role, not by
    # where this run happened to put them.
    if a.data_dir:
        text = text.replace(os.path.abspath(a.data_dir), "<data-dir>")
    text = text.replace(os.path.abspath(a.results), "<results>")
    text = re.sub(r"--output_base=\S+", "--output_base=<output-base>", text)
    text = re.sub(r"--bin=\S+", "--bin=<bazel-bin>", text)
    with open(os.path.join(a.results, "results.md"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
