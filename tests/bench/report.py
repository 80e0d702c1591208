"""Turns tests/bench/run.sh's raw measurements (<results>/raw) into <results>/results.md and
<results>/chart.png.

  report.py RESULTS_DIR [--steps K]

Every row is figure, Tessera, baseline, ratio, target, met? (DESIGN.md "Performance
targets"). Definitions, as measured by bench_rank.py / tessera-plan-load:
  stall    Tessera: the slowest rank's time blocked in client.save() (Python wall clock),
           median over the steady-state saves (steps >= 2: plan cached, staging pool reused).
           Baseline: the slowest rank's ctypes.memmove (libc memcpy, one thread) of the same
           tensors into a pre-faulted buffer, best of 3, all ranks copying at once as they
           do in a save. Ratio = Tessera / baseline.
  persist  Tessera: all ranks' bytes / (first rank's save() call -> last rank's wait()
           returned COMMITTED), median over the steady-state saves. Baseline: fio sequential
           write of the same directory (options in the table's notes). Ratio = Tessera / fio.
           This is issue 7's definition: it includes the trainer's copy, which runs before
           any write.
  persist phase (2b): all ranks' bytes / the mean PERSISTING + COMMITTING time the
           coordinator measured (tessera_phase_seconds: data files written, fsynced and
           reported, manifest committed) over every save of the configuration — DESIGN.md's
           "persist" target. Same baseline.
  peer     torch.save per rank of the same tensors (a dict fqn -> tensor) + flush + fsync.
           blocked: the slowest rank's torch.save() call vs Tessera's stall (above);
           durable: first start -> last fsync returned vs Tessera's save() -> COMMITTED span.
           Ratio = torch.save / Tessera (how many times longer torch.save takes).
  load     all loaders' bytes / (first load() call -> last load() returned), loading the
           checkpoint onto another TP degree (rows resharded), destinations pre-faulted, page
           cache dropped before (or not: the row says). Baseline: fio sequential read
           (O_DIRECT, after dropping the cache; the faster of one and four requests in
           flight). Ratio = Tessera / fio.
  memory   (4m) right after the saves, the same layout loads the last step from its agents'
           memory tier (DESIGN.md "Memory tier"): all loaders' bytes / (first load() call ->
           last returned). Baseline: figure 1's memcpy of the same bytes; ratio = memcpy time
           / restore time (target >= 0.80, issue 16); judged only if every byte came from
           memory. A restore is two copies (resident region -> load staging, verified; staging
           -> tensors), so one memcpy is the physical limit it is held to.
           Buddy restore (2+ ranks): the odd ranks' agents are SIGKILLed once their buddies
           hold the last step, restart on a new node id and load it: bytes they read from
           their buddies' memory / (first of their load() calls -> last returned). Baseline:
           loopback TCP with as many parallel streams (link_bw.py, best of 3).
  3c, 4b   PyTorch DCP on the same state and ranks: tests/bench/report_dcp.py.
  plan     through a real tessera-coordinator over gRPC with fake agents: first plan = start
           of the last SubmitLocalPlan -> last PIN received (validated, persisted to RocksDB,
           delivered); cached = the same for the next save with identical plans, which the
           agents submit as fingerprints and whose PINs leave the assignments out; RSS = the
           coordinator's VmHWM; manifest load = ReadManifest of the committed checkpoint.
           Each configuration's figures are the median (and p90) of its runs. No baseline:
           the targets are absolute (issue 15); the sweep's rank counts are not judged.
"""

import argparse
import datetime
import glob
import json
import os
import re
import statistics
import sys

import report_dcp  # figures 3c and 4b: PyTorch DCP beside Tessera


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


def fio_bw(raw, name, key):
    data = load_json(os.path.join(raw, name))
    try:
        return float(data["jobs"][0][key]["bw_bytes"])
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def phase_seconds(path):
    """Mean seconds per completed phase from the coordinator's Prometheus text
    (tessera_phase_seconds_sum / _count, label phase), or None."""
    sums, counts = {}, {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return None
    for line in lines:
        m = re.match(r'tessera_phase_seconds_(sum|count)\{phase="([A-Z_]+)"\} ([0-9.eE+-]+)', line)
        if m:
            (sums if m.group(1) == "sum" else counts)[m.group(2)] = float(m.group(3))
    return {p: sums[p] / counts[p] for p in sums if counts.get(p)}


FIO_MODES = ("psync", "libaio4")  # run.sh: one request at a time; four in flight


def fio_best(raw, kind, notes):
    """The faster of run.sh's fio modes for `kind` ("write" or "read"), in bytes/s; notes
    both."""
    measured = {}
    for mode in FIO_MODES:
        bw = fio_bw(raw, "fio-%s-%s.json" % (kind, mode), kind)
        if bw:
            measured[mode] = bw
    if not measured:
        return None
    notes.append("fio sequential %s: %s; the faster is the baseline" % (
        kind, ", ".join("%s %s" % (m, fmt_bw(bw)) for m, bw in measured.items())))
    return max(measured.values())


class Row:
    def __init__(self, figure, tessera="-", baseline="-", ratio=None, target="-", met=None,
                 ratio_text=None, chart=None):
        self.figure, self.tessera, self.baseline = figure, tessera, baseline
        self.ratio, self.target, self.met = ratio, target, met
        self.ratio_text = ratio_text
        self.chart = chart  # (label, ratio, target, higher_is_better) for the chart

    def cells(self):
        ratio = self.ratio_text or ("-" if self.ratio is None else "%.2f" % self.ratio)
        met = {True: "yes", False: "**no**", None: "-"}[self.met]
        return [self.figure, self.tessera, self.baseline, ratio, self.target, met]


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
    steady = [st for st in steps if st >= 2] or steps

    def per_step(step):
        xs = [x for s in saves for x in s["saves"] if x["step"] == step]
        return {"blocked": max(x["blocked_s"] for x in xs),
                "stall": max(x["stall_s"] for x in xs),
                "span": max(x["committed_at"] for x in xs) - min(x["start"] for x in xs),
                "cached": all(x["plan_cached"] for x in xs)}

    by_step = {st: per_step(st) for st in steps}
    blocked = statistics.median(by_step[st]["blocked"] for st in steady)
    client_stall = statistics.median(by_step[st]["stall"] for st in steady)
    span = statistics.median(by_step[st]["span"] for st in steady)
    memcpy = max(s["memcpy_s"] for s in saves)
    first = by_step[steps[0]]
    notes.append("%s: %d tensors of <= 64 MiB per rank; per step (slowest rank): %s" % (
        name, saves[0]["tensors"], "; ".join(
            "step %d blocked %s (client stall %s), save->COMMITTED %s%s" % (
                st, fmt_s(v["blocked"]), fmt_s(v["stall"]), fmt_s(v["span"]),
                ", plan cached" if v["cached"] else "") for st, v in sorted(by_step.items()))))

    ratio = blocked / memcpy if memcpy > 0 else None
    rows.append(Row("1 stall, %s" % name,
                    "%s (client: %s; first save %s)" % (fmt_s(blocked), fmt_s(client_stall),
                                                       fmt_s(first["blocked"])),
                    "memcpy %s (%s)" % (fmt_s(memcpy), fmt_bw(mib(total / ranks) * 2**20 / memcpy)
                                        if memcpy else "-"),
                    ratio, "<= 1.2", None if ratio is None else ratio <= 1.2,
                    chart=("stall %s" % name, ratio, 1.2, False)))
    bw = total / span if span > 0 else None
    ratio = bw / fio_w if bw and fio_w else None
    rows.append(Row("2 persist, %s" % name,
                    "%s (%s in %s)" % (fmt_bw(bw), fmt_size(int(mib(total))), fmt_s(span)),
                    "fio write %s" % fmt_bw(fio_w), ratio, ">= 0.90",
                    None if ratio is None else ratio >= 0.9,
                    chart=("persist %s" % name, ratio, 0.9, True)))
    phases = phase_seconds(os.path.join(raw, "metrics-%s.txt" % tag))
    if phases and phases.get("PERSISTING") and phases.get("COMMITTING"):
        # DESIGN.md's persist target: the writing phases alone (data files written, fsynced and
        # reported; manifest written, renamed, fsynced), mean over every save of the run.
        persist_s = phases["PERSISTING"] + phases["COMMITTING"]
        pbw = total / persist_s
        ratio = pbw / fio_w if fio_w else None
        rows.append(Row("2b persist phase, %s" % name,
                        "%s (PERSISTING %s + COMMITTING %s, mean)" % (
                            fmt_bw(pbw), fmt_s(phases["PERSISTING"]),
                            fmt_s(phases["COMMITTING"])),
                        "fio write %s" % fmt_bw(fio_w), ratio, ">= 0.90",
                        None if ratio is None else ratio >= 0.9,
                        chart=("persist phase %s" % name, ratio, 0.9, True)))
    torch = [s.get("torch") for s in saves]
    if all(torch):
        t_blocked = max(t["blocked_s"] for t in torch)
        t_durable = max(t["durable_at"] for t in torch) - min(t["start"] for t in torch)
        rb = t_blocked / blocked if blocked > 0 else None
        rd = t_durable / span if span > 0 else None
        rows.append(Row("3 peer blocked, %s" % name, fmt_s(blocked),
                        "torch.save %s" % fmt_s(t_blocked), rb,
                        "> 25x (torchsnapshot's claim)", None if rb is None else rb > 25,
                        ratio_text=None if rb is None else "%.1fx" % rb,
                        chart=("peer blocked %s" % name, rb, 25, True)))
        rows.append(Row("3 peer durable, %s" % name, fmt_s(span),
                        "torch.save+fsync %s" % fmt_s(t_durable), rd, "> 1x (report)",
                        None if rd is None else rd > 1,
                        ratio_text=None if rd is None else "%.2fx" % rd))
    rows += report_dcp.save_rows(Row, fmt_s, raw, tag, name, ranks, blocked, span)
    rows += memory_rows(raw, tag, name, ranks, memcpy)
    loads = [load_json(p) for p in sorted(glob.glob(os.path.join(raw, "load-%s-*.json" % tag)))]
    loads = [x for x in loads if x]
    layout_file = os.path.join(raw, "load-layout-%s.txt" % tag)
    if os.path.exists(layout_file):
        saved_world, load_world = open(layout_file).read().split()
        cache = open(os.path.join(raw, "load-cache-%s.txt" % tag)).read().strip()
        if len(loads) < int(load_world) or any(x["mismatched"] for x in loads):
            rows.append(Row("4 load, %s" % name, "failed (see logs/%s)" % tag))
        else:
            lbytes = sum(x["bytes"] for x in loads)
            lspan = max(x["end"] for x in loads) - min(x["start"] for x in loads)
            lbw = lbytes / lspan if lspan > 0 else None
            ratio = lbw / fio_r if lbw and fio_r else None
            rows.append(Row("4 load tp=%s -> tp=%s, %s" % (saved_world, load_world, name),
                            "%s (%s in %s; page cache %s)" % (fmt_bw(lbw), fmt_size(int(mib(lbytes))),
                                                               fmt_s(lspan), cache),
                            "fio read %s" % fmt_bw(fio_r), ratio, ">= 0.90",
                            None if ratio is None else ratio >= 0.9,
                            chart=("load %s" % name, ratio, 0.9, True)))
            rows += report_dcp.load_rows(Row, fmt_s, fmt_bw, raw, tag, name, saved_world,
                                         load_world, lspan)
    return rows


def memory_rows(raw, tag, name, ranks, memcpy):
    """Figure 4m: the last saved step loaded on the same layout from the agents' memory tier.
    Baseline: the slowest rank's memcpy of its bytes (figure 1's). Judged only if every byte
    came from memory."""
    loads = [load_json(p) for p in
             sorted(glob.glob(os.path.join(raw, "memload-%s-*.json" % tag)))]
    loads = [x for x in loads if x]
    if not loads:
        return []
    if len(loads) < ranks or any(x["mismatched"] for x in loads):
        return [Row("4m memory restore, %s" % name, "failed (see logs/%s)" % tag)]
    disk = sum(x["sources"]["bytes_from_disk"] for x in loads)
    memory = sum(x["sources"]["bytes_from_memory"] for x in loads)
    total = sum(x["bytes"] for x in loads)
    span = max(x["end"] for x in loads) - min(x["start"] for x in loads)
    ratio = memcpy / span if span > 0 and memcpy > 0 else None
    judged = disk == 0 and ratio is not None
    rows = buddy_rows(raw, tag, name)
    return [Row("4m memory restore, %s" % name,
                "%s (%s in %s; %s from memory, %s from disk)" % (
                    fmt_bw(total / span if span > 0 else None), fmt_size(int(mib(total))),
                    fmt_s(span), fmt_size(int(mib(memory))), fmt_size(int(mib(disk)))),
                "memcpy %s (%s)" % (fmt_s(memcpy), fmt_bw(mib(total / ranks) * 2**20 / memcpy)
                                    if memcpy else "-"),
                ratio, ">= 0.80", (ratio >= 0.8) if judged else None,
                chart=("memory restore %s" % name, ratio, 0.8, True))] + rows


def buddy_rows(raw, tag, name):
    """Figure 4m, buddy: the ranks whose node was lost restore on a new one; bytes they read
    from their buddies / (first of their load() calls -> last returned), vs loopback TCP with
    as many streams. Judged only if they read nothing from disk."""
    loads = [load_json(p) for p in
             sorted(glob.glob(os.path.join(raw, "buddyload-%s-*.json" % tag)))]
    loads = [x for x in loads if x]
    if not loads:
        return []
    moved = [x for x in loads if x["rank"] % 2 == 1]
    link = load_json(os.path.join(raw, "link-%s.json" % tag))
    if not moved or any(x["mismatched"] for x in loads):
        return [Row("4m buddy restore, %s" % name, "failed (see logs/%s)" % tag)]
    fetched = sum(x["sources"]["bytes_fetched_from_peers"] for x in moved)
    disk = sum(x["sources"]["bytes_from_disk"] for x in moved)
    span = max(x["end"] for x in moved) - min(x["start"] for x in moved)
    bw = fetched / span if span > 0 else None
    link_bw = link["bytes_per_s"] if link else None
    ratio = bw / link_bw if bw and link_bw else None
    return [Row("4m buddy restore, %s" % name,
                "%s (%d ranks on a new node: %s from buddies in %s, %s from disk)" % (
                    fmt_bw(bw), len(moved), fmt_size(int(mib(fetched))), fmt_s(span),
                    fmt_size(int(mib(disk)))),
                "loopback TCP %s (%d streams)" % (fmt_bw(link_bw), link["streams"]) if link else "-",
                ratio, ">= 0.80", (ratio >= 0.8) if ratio is not None and disk == 0 else None,
                chart=("buddy restore %s" % name, ratio, 0.8, True))]


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


def median_p90(values):
    xs = sorted(values)
    return xs[len(xs) // 2], xs[min(len(xs) - 1, (len(xs) * 9) // 10)]


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
    blocked = statistics.median(x["blocked_s"] for x in steady)
    committed = statistics.median(x["committed_s"] for x in steady)
    name = "%s on %s" % (fmt_size(int(mib(data["bytes"]))), data.get("device", device))
    ratio = blocked / data["d2h_s"] if data["d2h_s"] > 0 else None
    rows = [Row("6 GPU stall, %s" % name, fmt_s(blocked),
                "pinned D2H %s (%s)" % (fmt_s(data["d2h_s"]), fmt_bw(data["bytes"] / data["d2h_s"])),
                ratio, "<= 1.2", None if ratio is None else ratio <= 1.2,
                chart=("GPU stall %s" % name, ratio, 1.2, False))]
    if data.get("dcp"):
        runs = data["dcp"][1:] or data["dcp"]
        d_blocked = statistics.median(x["blocked_s"] for x in runs)
        d_durable = statistics.median(x["durable_s"] for x in runs)
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


def chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is missing (deploy/install-deps.sh installs python3-matplotlib)"
    items = [r.chart for r in rows if r.chart and r.chart[1] is not None]
    if not items:
        return "nothing to chart"
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(items) + 1.5))
    labels = [i[0] for i in items]
    values = [i[1] for i in items]
    colors = []
    for label, value, target, higher in items:
        met = value >= target if higher else value <= target
        colors.append("tab:green" if met else "tab:red")
    y = range(len(items))
    ax.barh(y, values, color=colors)
    for yi, (_, _, target, _) in zip(y, items):
        ax.plot([target, target], [yi - 0.4, yi + 0.4], color="black", linewidth=2)
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ratio (log scale); black tick = target; green = met")
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
    fio_w = fio_best(raw, "write", notes)
    fio_r = fio_best(raw, "read", notes)
    rows = []
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
    if chart_error is None:
        out.append("![ratios against targets](chart.png)")
        out.append("")
    if plan_chart_error is None:
        out.append("![planning against rank count](plan.png)")
        out.append("")
    out.append("Notes:")
    out.append("")
    fio_opts = ""
    try:
        fio_opts = open(os.path.join(raw, "fio-options.txt")).read().strip()
    except OSError:
        pass
    if fio_opts:
        out.append("- fio: `%s`" % fio_opts)
        try:
            out.append("- fio read page cache: %s" % open(os.path.join(raw, "fio-read-cache.txt")).read().strip())
        except OSError:
            pass
    out.append("- Tessera saves: %d per configuration; the stall, persist and peer rows use the "
               "median of steps >= 2 (plan cached, staging pool reused); step 1 is shown for "
               "reference. Layout of the save: tp=N (each rank holds distinct rows; every byte "
               "is written once)." % a.steps)
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
    with open(os.path.join(a.results, "results.md"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
