"""The benchmark's S3 rows (figure 8), from run.sh's measurements under <results>/raw/s3, set into
report.py's table, with the sweeps as tables of their own (results.md's "S3" section).

Definitions (every figure against a limit measured in the same run, on the same server):
  raw PUT limit   the fastest point of run.sh's sweep: R multipart uploads at once (R = the
                  configuration's ranks, one object of its MiB each), part size x parts of each
                  upload in flight, with storage/s3's client alone (tessera-s3-raw: no part
                  buffers, no copies, no checksums); all objects' bytes / (first
                  CreateMultipartUpload -> last CompleteMultipartUpload). One sample a point.
  raw GET limit   the same R objects (uploaded at the agents' default part size) read whole,
                  ranged GETs of piece size x GETs of each object in flight, into pre-faulted
                  memory: bytes / (first GET -> last answered). The fastest point.
  save            Tessera: all ranks' bytes / (first rank's save() call -> last rank's wait()
                  returned COMMITTED) per steady-state save (steps >= 2), the agents' default
                  part size and parts in flight, vs the raw PUT limit; target >= 0.90. Beside
                  it, the persist phase (the first write began -> COMMITTED, the coordinator's
                  session phases), not judged.
  load            all loaders' bytes / (first load() call -> last returned) per run, the last
                  step loaded onto another TP degree (R/2, or 2 for 1) by fresh agents,
                  vs the raw GET limit; target >= 0.90.
  settings        the same save at other part sizes x parts in flight (agent flags), its
                  steady saves' median against the raw PUT limit: how the defaults were chosen.
  DCP             dcp.save through s3torchconnector's S3StorageWriter on the same state and
                  ranks: first call -> last returned (uploads completed, .metadata written),
                  median over steps >= 2, vs Tessera's save -> COMMITTED median; dcp.load
                  through its S3StorageReader onto the load's world size vs Tessera's load
                  median. Ratio = DCP time / Tessera time; target > 1 (Tessera ahead).
  CPU             where each figure's time went on this machine's cores: the server's (weed)
                  and the agents' CPU seconds over the window, as cores (CPU s / wall s), and the
                  share of all cores' time not idle (/proc/stat), recorded around each raw point
                  by tessera-s3-raw and around each save and load by rank 0 (bench_rank.py
                  cpu_sample); medians over the steady saves and the load runs.
"""

import glob
import os
import re

PUT_POINT = re.compile(r"^(put|get)-(\d+M-x\d+)-p(\d+)-k(\d+)\.json$")


def _points(h, raw):
    """{(op, tag): [point JSON, ...]} of the raw sweep."""
    out = {}
    directory = os.path.join(raw, "s3")
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        m = PUT_POINT.match(name)
        data = h.load_json(os.path.join(directory, name)) if m else None
        if data and data.get("bytes_per_s"):
            out.setdefault((m.group(1), m.group(2)), []).append(data)
    return out


def _cores(seconds, wall):
    return "%.2f" % (seconds / wall) if seconds is not None and wall > 0 else "?"


def _point_cpu(p):
    """"weed 1.62 cores, client 0.05, machine 97 % busy" of a raw point."""
    weed = [s for s in p.get("watched_cpu_seconds", {}).values() if s >= 0]
    return "weed %s cores, client %s, machine %.0f %% busy" % (
        _cores(weed[0] if weed else None, p["seconds"]), _cores(p["cpu_seconds"], p["seconds"]),
        100 * p.get("machine_busy", 0))


def _limit(points):
    """The fastest point and its text, or (None, reason)."""
    if not points:
        return None, "not measured (see logs/s3-raw.log)"
    best = max(points, key=lambda p: p["bytes_per_s"])
    return best, "%s at %d MiB x %d in flight (fastest of %d points; %s)" % (
        _fmt_bw(best["bytes_per_s"]), best["part_mb"], best["in_flight"], len(points),
        _point_cpu(best))


def _fmt_bw(bps):
    return "%.0f MiB/s" % (bps / 2**20)


def _window_cpu(pairs):
    """Medians over windows [[sample before, sample after], ...] (bench_rank.py cpu_sample):
    (weed cores, agents cores, machine busy share) or None."""
    rows = []
    for before, after in (p for p in pairs if p and p[0] and p[1]):
        tck = before.get("clk_tck", 100)
        all_ticks = after["machine"][1] - before["machine"][1]
        if all_ticks <= 0:
            continue
        busy = (after["machine"][0] - before["machine"][0]) / all_ticks
        wall = all_ticks / tck / (before.get("cpus") or os.cpu_count() or 1)

        def cores(name):
            if before.get(name) is None or after.get(name) is None:
                return None
            return (after[name] - before[name]) / tck / wall if wall > 0 else None
        rows.append((cores("weed"), cores("agents"), busy))
    if not rows:
        return None

    def med(i):
        xs = sorted(r[i] for r in rows if r[i] is not None)
        return xs[len(xs) // 2] if xs else None
    return med(0), med(1), med(2)


def _cpu_text(cpu, trainers=None):
    """"; weed W cores, agents A, trainers T, machine B % busy" (trainers: [cores per window]
    from the ranks' own CPU time, "cpu_self_s"; left out where the reports lack it)."""
    if not cpu:
        return ""
    weed, agents, busy = cpu
    fmt = lambda v: "?" if v is None else "%.2f" % v
    text = "; weed %s cores, agents %s" % (fmt(weed), fmt(agents))
    if trainers:
        text += ", trainers %s" % fmt(sorted(trainers)[len(trainers) // 2])
    return text + ", machine %.0f %% busy" % (100 * busy)


def _trainer_cores(windows):
    """[all ranks' CPU s / span] per window [(span, [rank reports of it])], where every rank
    recorded cpu_self_s."""
    return [sum(x["cpu_self_s"] for x in xs) / span for span, xs in windows
            if span > 0 and all("cpu_self_s" in x for x in xs)]


def _saves(h, raw, prefix, ranks):
    """(total bytes, {step: span s}, [cpu window per steady step], [trainers' cores per steady
    step]) of bench_rank.py save reports `prefix`-<rank>.json, or None if a rank is missing."""
    reports = [h.load_json(p) for p in glob.glob(os.path.join(raw, "s3", prefix + "-*.json"))]
    reports = [r for r in reports if r and "saves" in r]
    if len(reports) < ranks:
        return None
    total = sum(r["bytes"] for r in reports)
    steps = sorted({x["step"] for r in reports for x in r["saves"]})
    spans, cpu, windows = {}, [], []
    for st in steps:
        xs = [x for r in reports for x in r["saves"] if x["step"] == st]
        spans[st] = max(x["committed_at"] for x in xs) - min(x["start"] for x in xs)
        if st >= 2:
            cpu += [x["cpu"] for x in xs if x.get("cpu")]
            windows.append((spans[st], xs))
    return total, spans, cpu, _trainer_cores(windows)


def _steady(spans):
    return [spans[st] for st in sorted(spans) if st >= 2]


def config_rows(h, raw, mib, ranks, points, notes):
    tag = "%dM-x%d" % (mib, ranks)
    name = "%s x %d rank%s" % (h.fmt_size(mib), ranks, "s" if ranks > 1 else "")
    Row = h.Row
    put, put_text = _limit(points.get(("put", tag), []))
    get, get_text = _limit(points.get(("get", tag), []))
    rows = [Row("8 S3 raw PUT limit, %s" % name, "-", put_text),
            Row("8 S3 raw GET limit, %s" % name, "-", get_text)]
    put_bw = {"bw": put["bytes_per_s"]} if put else None
    get_bw = {"bw": get["bytes_per_s"]} if get else None

    saved = _saves(h, raw, "save-%s" % tag, ranks)
    tessera_span = None
    if saved is None or not _steady(saved[1]):
        rows.append(Row("8 S3 save -> COMMITTED, %s" % name,
                        "failed or no steady-state save (see logs/s3-%s)" % tag))
    else:
        total, spans, cpu, trainers = saved
        steady = _steady(spans)
        tessera_span = h.median_p90(steady)[0]
        bw, text = h.bw_spread(total, steady)
        rows.append(h.judged_row("8 S3 save -> COMMITTED, %s" % name, "s3 save",
                                 "S3 save %s" % name,
                                 text + _cpu_text(_window_cpu(cpu), trainers),
                                 "raw PUT limit %s" % (_fmt_bw(put["bytes_per_s"]) if put else "-"),
                                 h.fio_ratio(bw, put_bw)))
        phases = h.session_steps(os.path.join(raw, "s3", "sessions-%s" % tag))
        persist = [phases[st]["persist_s"] for st in sorted(phases)
                   if st >= 2 and phases[st].get("persist_s")]
        if persist:
            bw, text = h.bw_spread(total, persist)
            rows.append(Row("8 S3 persist phase, %s" % name,
                            "%s; first write began -> COMMITTED" % text,
                            "raw PUT limit %s" % (_fmt_bw(put["bytes_per_s"]) if put else "-"),
                            h.fio_ratio(bw, put_bw), "- (reported)"))
        notes.append("S3 %s: save -> COMMITTED per step: %s" % (name, ", ".join(
            "step %d %s" % (st, h.fmt_s(spans[st])) for st in sorted(spans))))

    tessera_load = None
    layout = h.read_text(os.path.join(raw, "s3", "load-layout-%s.txt" % tag), "").split()
    if len(layout) == 2:
        runs, cpu, windows = [], [], []
        for i in range(1, 1000):
            loads = [h.load_json(p) for p in
                     glob.glob(os.path.join(raw, "s3", "load-%s-run%d-*.json" % (tag, i)))]
            loads = [x for x in loads if x]
            if not loads and not glob.glob(os.path.join(raw, "s3", "load-%s-run%d-*" % (tag, i))):
                break
            if len(loads) < int(layout[1]) or any(x["mismatched"] for x in loads):
                notes.append("S3 %s: load run %d failed (see logs/s3-%s)" % (name, i, tag))
                continue
            runs.append((sum(x["bytes"] for x in loads),
                         max(x["end"] for x in loads) - min(x["start"] for x in loads),
                         sum(x["sources"]["bytes_from_memory"] for x in loads)))
            cpu += [x["cpu"] for x in loads if x.get("cpu")]
            windows.append((runs[-1][1], loads))
        label = "8 S3 load tp=%s -> tp=%s, %s" % (layout[0], layout[1], name)
        if runs:
            tessera_load = h.median_p90([r[1] for r in runs])[0]
            bw, text = h.bw_spread(runs[0][0], [r[1] for r in runs])
            memory = sum(r[2] for r in runs)
            rows.append(h.judged_row(
                label, "s3 load", "S3 load %s" % name,
                text + _cpu_text(_window_cpu(cpu), _trainer_cores(windows)),
                "raw GET limit %s" % (_fmt_bw(get["bytes_per_s"]) if get else "-"),
                h.fio_ratio(bw, get_bw),
                "%s came from the agents' memory" % h.fmt_size(int(memory / 2**20))
                if memory else None))
        else:
            rows.append(Row(label, "failed (see logs/s3-%s)" % tag))
    rows += dcp_rows(h, raw, tag, name, ranks, layout, tessera_span, tessera_load)
    return rows


def dcp_rows(h, raw, tag, name, ranks, layout, tessera_span, tessera_load):
    """PyTorch DCP through s3torchconnector beside Tessera: save and load, or why not."""
    Row = h.Row
    skipped = h.read_text(os.path.join(raw, "s3", "dcp-%s.txt" % tag), "")
    if skipped:
        return [Row("8 S3 vs DCP + s3torchconnector, %s" % name, skipped)]
    saves = [h.load_json(p) for p in glob.glob(os.path.join(raw, "s3", "dcp-save-%s-*.json" % tag))]
    saves = [s for s in saves if s]
    if not saves:
        return []
    rows = []
    errors = [s["variants"].get("save", {}).get("error") for s in saves]
    if len(saves) < ranks or any(errors):
        rows.append(Row("8 S3 vs DCP + s3torchconnector save, %s" % name,
                        "failed: %s" % (next((e for e in errors if e), None) or
                                        "%d of %d ranks reported" % (len(saves), ranks))[:200]))
    else:
        runs = [x for s in saves for x in s["variants"]["save"]["runs"]]
        steps = sorted({x["step"] for x in runs})
        steady = [st for st in steps if st >= 2] or steps
        durable = [max(x["durable_at"] for x in runs if x["step"] == st) -
                   min(x["start"] for x in runs if x["step"] == st) for st in steady]
        d_med, d_text = h.spread(durable, h.fmt_s)
        ratio = d_med / tessera_span if tessera_span else None
        rows.append(Row("8 S3 vs DCP + s3torchconnector save, %s" % name,
                        "%s (Tessera save -> COMMITTED, median)" % h.fmt_s(tessera_span),
                        "dcp.save via S3StorageWriter %s (s3torchconnector %s, torch %s)" % (
                            d_text, saves[0].get("s3torchconnector", "?"), saves[0]["torch"]),
                        ratio, "> 1 (Tessera ahead)", None if ratio is None else ratio > 1,
                        ratio_text=None if ratio is None else "%.2fx" % ratio,
                        chart=("S3 DCP save / Tessera %s" % name, ratio, 1.0, True)))
    loads = [h.load_json(p) for p in glob.glob(os.path.join(raw, "s3", "dcp-load-%s-*.json" % tag))]
    loads = [x for x in loads if x]
    if len(layout) == 2:
        label = "8 S3 vs DCP + s3torchconnector load tp=%s -> tp=%s, %s" % (layout[0], layout[1],
                                                                          name)
        if len(loads) < int(layout[1]) or any(x["mismatched"] for x in loads):
            rows.append(Row(label, "failed (see logs/s3-%s)" % tag))
        else:
            span = max(x["end"] for x in loads) - min(x["start"] for x in loads)
            ratio = span / tessera_load if tessera_load else None
            rows.append(Row(label, "%s (Tessera's load, median)" % h.fmt_s(tessera_load),
                            "dcp.load via S3StorageReader %s (%s; one run)" % (
                                h.fmt_s(span), _fmt_bw(sum(x["bytes"] for x in loads) / span)),
                            ratio, "> 1 (Tessera ahead)", None if ratio is None else ratio > 1,
                            ratio_text=None if ratio is None else "%.2fx" % ratio,
                            chart=("S3 DCP load / Tessera %s" % name, ratio, 1.0, True)))
    return rows


SETTING = re.compile(r"^setting-(\d+M-x\d+)-p(\d+)-k(\d+)-\d+\.json$")


def settings_table(h, raw, configs, points):
    """results.md's table of Tessera's save at each part size x parts in flight."""
    directory = os.path.join(raw, "s3")
    found = {}
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        m = SETTING.match(name)
        if m:
            found.setdefault(m.group(1), set()).add((int(m.group(2)), int(m.group(3))))
    env = h.read_env(os.path.join(directory, "s3.env"))
    defaults = dict(kv.split("=") for kv in env.get("defaults", "").split() if "=" in kv)
    default = (int(defaults.get("part_size_mb", 0)), int(defaults.get("parts_in_flight", 0)))
    out = []
    for mib, ranks in configs:
        tag = "%dM-x%d" % (mib, ranks)
        put, _ = _limit(points.get(("put", tag), []))
        rows = []
        judged = _saves(h, raw, "save-%s" % tag, ranks)
        settings = sorted(found.get(tag, set()) | ({default} if judged else set()))
        for part, k in settings:
            saved = judged if (part, k) == default else _saves(
                h, raw, "setting-%s-p%d-k%d" % (tag, part, k), ranks)
            if saved is None or not _steady(saved[1]):
                rows.append("| %d MiB | %d | failed | - | - |" % (part, k))
                continue
            total, spans, cpu, trainers = saved
            steady = _steady(spans)
            med = h.median_p90(steady)[0]
            rows.append("| %d MiB%s | %d | %s (%d saves) | %s | %s |" % (
                part, " (default)" if (part, k) == default else "", k,
                _fmt_bw(total / med), len(steady),
                "%.2f" % (total / med / put["bytes_per_s"]) if put else "-",
                _cpu_text(_window_cpu(cpu), trainers).lstrip("; ") or "-"))
        if rows:
            out += ["Tessera's save -> COMMITTED at each part size x parts in flight, %s "
                    "(median of the steady saves; ratio to the raw PUT limit):" % h.fmt_size(mib)
                    + " %d rank%s" % (ranks, "s" if ranks > 1 else ""), "",
                    "| part size | parts in flight | save -> COMMITTED | of the PUT limit | CPU |",
                    "|---|---|---|---|---|"] + rows + [""]
    return out


def sweep_table(h, configs, points):
    """results.md's table of the raw sweep: every point's PUT and GET bandwidth."""
    out = []
    for mib, ranks in configs:
        tag = "%dM-x%d" % (mib, ranks)
        puts = {(p["part_mb"], p["in_flight"]): p for p in points.get(("put", tag), [])}
        gets = {(p["part_mb"], p["in_flight"]): p for p in points.get(("get", tag), [])}
        if not puts and not gets:
            continue
        out += ["Raw sweep, %s x %d rank%s (tessera-s3-raw; all objects' bytes / wall time; "
                "one sample a point; the fastest of each column is the limit):" % (
                    h.fmt_size(mib), ranks, "s" if ranks > 1 else ""), "",
                "| part / piece | in flight | PUT | GET |", "|---|---|---|---|"]
        for key in sorted(set(puts) | set(gets)):
            out.append("| %d MiB | %d | %s | %s |" % (
                key[0], key[1],
                "%s (%s)" % (_fmt_bw(puts[key]["bytes_per_s"]), _point_cpu(puts[key]))
                if key in puts else "-",
                "%s (%s)" % (_fmt_bw(gets[key]["bytes_per_s"]), _point_cpu(gets[key]))
                if key in gets else "-"))
        out.append("")
    return out


def report(h, raw, env, notes):
    """(rows, results.md lines of the S3 section) of figure 8, or ([], []) if it did not run."""
    directory = os.path.join(raw, "s3")
    if not os.path.isdir(directory):
        return [], []
    failed = h.read_text(os.path.join(directory, "failed.txt"), "")
    if failed:
        return [h.Row("8 S3", failed)], []
    points = _points(h, raw)
    rows, configs = [], []
    for line in h.read_text(os.path.join(directory, "configs.txt"), "").splitlines():
        mib, ranks, verdict, need = line.split()
        mib, ranks = int(mib), int(ranks)
        if verdict != "run":
            rows.append(h.Row("8 S3 %s x %d ranks" % (h.fmt_size(mib), ranks),
                              "not run: needs %.1f GiB, %.1f GiB available" % (
                                  int(need) / 1024, int(env.get("mem_available_kib", 0)) / 2**20)))
            continue
        configs.append((mib, ranks))
        rows += config_rows(h, raw, mib, ranks, points, notes)
    s3env = h.read_env(os.path.join(directory, "s3.env"))
    section = [
        "## S3 (figure 8)", "",
        "The object store is SeaweedFS %s (the tests' tessera-local-s3) on loopback, on this "
        "machine's %s cores: the server, the raw client and Tessera's agents and trainers share "
        "them. The limits are what this machine's server takes with the client beside it, not "
        "what an object store on its own hosts would take, and the CPU columns say where the "
        "cores went. Agents' S3 defaults: %s. DCP: s3torchconnector %s." % (
            s3env.get("weed", "?"), env.get("cores", "?"), s3env.get("defaults", "?").strip(),
            s3env.get("s3torchconnector", "") or "not installed"), "",
        "What the raw GET limit leaves out: a load verifies every block's XXH3 checksum and "
        "copies it into the trainer's tensors, work the raw client does not do. Where the "
        "machine is busy to its last core (the CPU columns), those agent cores come out of the "
        "server's, so a load row below 0.90 here says the cores are shared, not that the store "
        "waits on Tessera; only a server on hosts of its own can judge that target.", ""]
    section += sweep_table(h, configs, points) + settings_table(h, raw, configs, points)
    return rows, section
