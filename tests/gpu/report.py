"""Turns tests/gpu/on_device.sh's measurements (WORK/raw, WORK/logs) into its results: OUT/
results.md (the shape of docs/benchmarks' reference pages), results.json (everything measured),
tests.txt (every test case) and memcheck.txt. Standard library only: it runs under the GPU
machine's python3 (3.12) and Debian's (3.11).

  report.py --work=WORK --out=OUT [--configs=1Gx1,...] [--steps=K]

Rows (targets: issue 13; benchmark rows, never timed tests):
  1 stall     Tessera: per save, the slowest rank's wall time blocked in Client::Save(); the
              median (and p90) over the steady-state saves (steps >= 2: plan cached, staging
              pinned and reused). Baseline: pinned cudaMemcpy device->host of the same tensors
              into cudaHostAlloc memory, every rank at once; per repetition the slowest rank;
              the fastest repetition (the physical limit). Target: ratio <= 1.15.
  1a first    the first save's stall (plans; sizes and pins staging unless the ranks reserved
              it with Client::ReserveStaging before, whose time the row gives): against the
              steady stall, target <= 3x (issue 14's first-save target); the steady stall is
              the median, or the steady target (1.15 x the D2H limit) if that is lower, so a
              broken steady state never excuses a slow first save.
  3 peer      DCP async_save of the same bytes in one process (1-rank configurations), the
              variant that blocks least: blocked and durable, medians of the runs after the
              first. Target: Tessera's stall below DCP's blocked time; durable is reported.
  4 load      all loaders' bytes / (first Load() call -> last returned), onto another layout,
              into device memory, page cache dropped (or not: the row says), every byte
              checked. Baseline: the disk's sequential read limit in the same directory, the
              fastest of dd O_DIRECT (1 and 4 requests in flight), dd buffered after dropping
              the cache and fio where present. Target: ratio >= 0.90. 4b compares the same load
              with the pinned host->device limit of its bytes (no target).
  7 tests     every packed test binary: cases passed, failed, skipped (a skip says why and
              never counts as passed).
  8 memcheck  compute-sanitizer --tool memcheck over one save and one load.
  9 NCCL      what one GPU can run of the NCCL transport's tests, and what it cannot.
"""

import argparse
import glob
import json
import os
import re
import statistics
import xml.etree.ElementTree as ET

STALL_TARGET = 1.15
FIRST_SAVE_TARGET = 3.0
LOAD_TARGET = 0.90


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def read_env(path):
    out = {}
    for line in read(path).splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def fmt_s(seconds):
    if seconds is None:
        return "-"
    if seconds < 1:
        return "%.1f ms" % (seconds * 1000)
    return "%.2f s" % seconds


def fmt_bw(bps):
    if not bps:
        return "-"
    return "%.1f GiB/s" % (bps / 2**30) if bps >= 2**30 else "%.0f MiB/s" % (bps / 2**20)


def fmt_size(nbytes):
    m = nbytes // 2**20
    return "%d GiB" % (m // 1024) if m >= 1024 and m % 1024 == 0 else "%d MiB" % m


def p90(values):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]


class Row:
    def __init__(self, figure, tessera="-", baseline="-", ratio="-", target="-", met=None):
        self.cells = [figure, tessera, baseline, ratio, target,
                      {True: "yes", False: "**no**", None: "-"}[met]]


def parse_configs(text):
    out = []
    for c in filter(None, text.split(",")):
        m = re.match(r"^(\d+)([MmGg]?)x(\d+)$", c)
        if m:
            mib = int(m.group(1)) * (1024 if m.group(2) in "Gg" and m.group(2) else 1)
            out.append((mib, int(m.group(3))))
    return out


# --- tests
def test_cases(work):
    """{binary: {"rc": int|None, "cases": [(name, outcome, message)]}}"""
    out = {}
    raw = os.path.join(work, "raw", "tests")
    names = {os.path.splitext(os.path.basename(p))[0]
             for p in glob.glob(os.path.join(raw, "*.rc")) + glob.glob(os.path.join(raw, "*.xml"))}
    for name in sorted(names):
        rc_text = read(os.path.join(raw, name + ".rc")).strip()
        entry = {"rc": int(rc_text) if rc_text.lstrip("-").isdigit() else None, "cases": []}
        try:
            root = ET.parse(os.path.join(raw, name + ".xml")).getroot()
            for case in root.iter("testcase"):
                full = "%s.%s" % (case.get("classname", ""), case.get("name", ""))
                failure = case.find("failure")
                skipped = case.find("skipped")
                if failure is not None or case.find("error") is not None:
                    msg = (failure.get("message", "") if failure is not None else "error")
                    entry["cases"].append((full, "failed", " ".join(msg.split())[:300]))
                elif (skipped is not None or case.get("result") == "skipped"
                      or case.get("status") == "notrun"):
                    msg = skipped.get("message", "") if skipped is not None else ""
                    # GoogleTest: "file:line\n<the reason given to GTEST_SKIP>"
                    lines = [x for x in msg.strip().splitlines() if x.strip()]
                    entry["cases"].append((full, "skipped", lines[-1] if lines else ""))
                else:
                    entry["cases"].append((full, "passed", ""))
        except (OSError, ET.ParseError):
            entry["cases"].append((name, "failed", "no XML report (crashed, timed out or "
                                   "did not start: see logs/%s.log)" % name))
        out[name] = entry
    return out


def test_rows(tests, mode):
    rows = []
    for name, t in tests.items():
        n = {k: sum(1 for c in t["cases"] if c[1] == k) for k in ("passed", "failed", "skipped")}
        ok = n["failed"] == 0 and t["rc"] == 0 and n["passed"] > 0
        skipped = "; ".join(sorted({c[2] for c in t["cases"] if c[1] == "skipped" and c[2]}))
        rows.append(Row("7 tests: %s" % name,
                        "%d passed, %d failed, %d skipped%s" % (
                            n["passed"], n["failed"], n["skipped"],
                            " (skipped: %s)" % skipped if skipped else ""),
                        "exit %s" % t["rc"], "-", "0 failed", ok))
    if not tests:
        rows.append(Row("7 tests", "not run"))
    return rows


def nccl_row(tests, mode):
    t = tests.get("nccl_peer_transport_test")
    if t is None:
        return Row("9 NCCL transport", "not run")
    ran = [c for c in t["cases"] if c[1] != "skipped"]
    skipped = [c for c in t["cases"] if c[1] == "skipped"]
    text = "ran: %s; skipped: %s" % (
        ", ".join("%s %s" % (c[0].split(".")[-1], c[1]) for c in ran) or "none",
        ", ".join("%s (%s)" % (c[0].split(".")[-1], c[2]) for c in skipped) or "none")
    return Row("9 NCCL transport (%s)" % ("1 GPU" if mode == "gpu" else "no GPU"), text,
               "two-rank gathers need two GPUs: NCCL refuses two ranks of one communicator on "
               "one device", "-", "0 failed",
               all(c[1] == "passed" for c in ran) if ran else None)


# --- memcheck
def memcheck(work, skipped_lines):
    out = {}
    for mode in ("save", "load"):
        rc = read(os.path.join(work, "raw", "memcheck-%s.rc" % mode)).strip()
        log = read(os.path.join(work, "logs", "memcheck-%s.log" % mode))
        summary = re.findall(r"ERROR SUMMARY: (\d+) error", log)
        if rc:
            out[mode] = {"rc": int(rc) if rc.lstrip("-").isdigit() else None,
                         "errors": int(summary[-1]) if summary else None,
                         "log_tail": "\n".join(log.splitlines()[-40:])}
    reason = next((s for s in skipped_lines if s.startswith("memcheck")), None)
    return out, reason


def memcheck_row(mc, reason):
    if not mc:
        return Row("8 memcheck", "not run" + (": " + reason.split(": ", 1)[1] if reason else ""))
    parts = []
    ok = True
    for mode in ("save", "load"):
        m = mc.get(mode)
        if m is None:
            parts.append("%s: not run" % mode)
            ok = False
            continue
        parts.append("%s: %s errors, exit %s" % (
            mode, "?" if m["errors"] is None else m["errors"], m["rc"]))
        ok = ok and m["errors"] == 0 and m["rc"] == 0
    return Row("8 memcheck (compute-sanitizer)", "; ".join(parts), "-", "-", "0 errors", ok)


# --- disk
def disk_limit(work, notes):
    measured = {}
    for line in read(os.path.join(work, "raw", "disk.txt")).splitlines():
        f = line.split()
        if len(f) >= 3 and f[1].isdigit():
            try:
                sec = float(f[2])
            except ValueError:
                continue
            if sec > 0:
                measured[f[0]] = int(f[1]) / sec
                if len(f) > 3 and "not_dropped" in f[3]:
                    notes.append("disk %s: page cache not dropped before it" % f[0])
    for mode in ("psync", "libaio4"):
        data = load_json(os.path.join(work, "raw", "fio-read-%s.json" % mode))
        try:
            measured["fio-" + mode] = float(data["jobs"][0]["read"]["bw_bytes"])
        except (TypeError, KeyError, IndexError, ValueError):
            pass
    if not measured:
        return None, None
    best = max(measured, key=measured.get)
    notes.append("disk read: %s; the fastest (%s) is the limit" % (
        ", ".join("%s %s" % (k, fmt_bw(v)) for k, v in measured.items()), best))
    return measured[best], best


# --- configurations
def steady_stats(values):
    if not values:
        return None, None
    return statistics.median(values), p90(values)


def dcp_peer(work, tag, notes, name):
    d = load_json(os.path.join(work, "raw", "dcp-%s.json" % tag))
    if d is None:
        return None
    if d.get("error"):
        notes.append("%s DCP: not measured: %s" % (name, d["error"]))
        return None
    best = None
    for variant, v in sorted(d.get("variants", {}).items()):
        if "runs" not in v:
            notes.append("%s DCP %s: not run: %s" % (name, variant, v.get("error")))
            continue
        runs = v["runs"]
        later = runs[1:] or runs
        blocked = statistics.median(r["blocked_s"] for r in later)
        durable = statistics.median(r["durable_s"] for r in later)
        notes.append("%s DCP %s (torch %s): first run blocked %s, durable %s; later runs "
                     "blocked %s, durable %s" % (
                         name, variant, d.get("torch"), fmt_s(runs[0]["blocked_s"]),
                         fmt_s(runs[0]["durable_s"]),
                         ", ".join(fmt_s(r["blocked_s"]) for r in later),
                         ", ".join(fmt_s(r["durable_s"]) for r in later)))
        if best is None or blocked < best["blocked"]:
            best = {"variant": variant, "blocked": blocked, "durable": durable,
                    "runs": len(later)}
    return best


def config_rows(work, mib, ranks, disk_bw, disk_mode, notes, data):
    raw = os.path.join(work, "raw")
    tag = "%dM-x%d" % (mib, ranks)
    name = "%s x %d rank%s" % (fmt_size(mib << 20), ranks, "s" if ranks > 1 else "")
    saves = [load_json(p) for p in sorted(glob.glob(os.path.join(raw, "save-%s-*.json" % tag)))]
    saves = [s for s in saves if s]
    loads = [load_json(p) for p in sorted(glob.glob(os.path.join(raw, "load-%s-*.json" % tag)))]
    loads = [x for x in loads if x]
    data[tag] = {"saves": saves, "loads": loads}
    if not saves and not loads:
        return []
    rows = []
    if len(saves) < ranks:
        rows.append(Row("1 stall, %s" % name, "failed: %d of %d ranks reported (logs/%s)"
                        % (len(saves), ranks, tag)))
        return rows
    memory = saves[0]["memory"]
    what = "%s, %s tensors" % (name, "CUDA" if memory == "cuda" else "host (CPU fallback)")
    total = sum(s["bytes"] for s in saves)
    steps = sorted({x["step"] for s in saves for x in s["saves"]})
    by_step = {}
    for st in steps:
        xs = [x for s in saves for x in s["saves"] if x["step"] == st]
        by_step[st] = {"blocked": max(x["blocked_s"] for x in xs),
                       "stall": max(x["stall_s"] for x in xs),
                       "copy": max(x["copy_s"] for x in xs),
                       "span": max(x["committed_at"] for x in xs) - min(x["start"] for x in xs),
                       "cached": all(x["plan_cached"] for x in xs)}
    steady = [st for st in steps if st >= 2]
    med, tail = steady_stats([by_step[st]["blocked"] for st in steady])
    copy_med, _ = steady_stats([by_step[st]["copy"] for st in steady])
    span_med, _ = steady_stats([by_step[st]["span"] for st in steady])
    first = by_step[steps[0]] if steps else None
    reps = min(len(s["to_host_s"]) for s in saves)
    d2h = min(max(s["to_host_s"][k] for s in saves) for k in range(reps)) if reps else None
    h2d_reps = min(len(s.get("to_device_s", [])) for s in saves)
    h2d = (min(max(s["to_device_s"][k] for s in saves) for k in range(h2d_reps))
           if h2d_reps else None)
    base_name = "pinned cudaMemcpy D2H" if memory == "cuda" else "memcpy (one thread)"
    notes.append("%s: %d tensors of <= 64 MiB per rank; per save (slowest rank): %s" % (
        what, saves[0]["tensors"], "; ".join(
            "step %d blocked %s (copy %s), save->COMMITTED %s%s" % (
                st, fmt_s(v["blocked"]), fmt_s(v["copy"]), fmt_s(v["span"]),
                ", plan cached" if v["cached"] else "") for st, v in sorted(by_step.items()))))
    notes.append("%s: %s per repetition (slowest rank): %s%s" % (
        what, base_name, ", ".join(fmt_s(max(s["to_host_s"][k] for s in saves))
                                   for k in range(reps)),
        "; pinned H2D: " + ", ".join(fmt_s(max(s["to_device_s"][k] for s in saves))
                                     for k in range(h2d_reps)) if h2d_reps else ""))
    if med is None:
        rows.append(Row("1 stall, %s" % what, "only %d save(s): no steady state" % len(steps)))
    else:
        ratio = med / d2h if d2h else None
        rows.append(Row(
            "1 stall, %s" % what,
            "median %s, p90 %s over %d saves (copy %s)" % (fmt_s(med), fmt_s(tail), len(steady),
                                                           fmt_s(copy_med)),
            "%s %s (%s)" % (base_name, fmt_s(d2h), fmt_bw(total / d2h) if d2h else "-"),
            "%.2f" % ratio if ratio else "-", "<= %.2f" % STALL_TARGET,
            None if ratio is None or memory != "cuda" else ratio <= STALL_TARGET))
    if first:
        reserved = [s["reserve_s"] for s in saves if s.get("reserve_s") is not None]
        how = ("plans; staging reserved before it in %s" % fmt_s(max(reserved)) if reserved
               else "plans, sizes and pins staging")
        steady = min(med, STALL_TARGET * d2h) if med and d2h else med
        first_ratio = first["blocked"] / steady if steady else None
        rows.append(Row("1a first save, %s" % what,
                        "%s (copy %s; %s)" % (fmt_s(first["blocked"]), fmt_s(first["copy"]), how),
                        ("steady %s (%s)" % (fmt_s(steady), "median" if steady == med else
                                             "the steady target: the median is above it"))
                        if steady else "-",
                        "%.2f" % first_ratio if first_ratio else "-",
                        "<= %.0fx steady" % FIRST_SAVE_TARGET,
                        None if first_ratio is None or memory != "cuda"
                        else first_ratio <= FIRST_SAVE_TARGET))
    if ranks == 1:
        peer = dcp_peer(work, tag, notes, what)
        if peer and med is not None:
            ratio = peer["blocked"] / med
            rows.append(Row("3 peer blocked, %s" % what, fmt_s(med),
                            "DCP async_save (%s) %s" % (peer["variant"], fmt_s(peer["blocked"])),
                            "%.1fx" % ratio, "stall < DCP blocked", med < peer["blocked"]))
            if span_med:
                rows.append(Row("3 peer durable, %s" % what, "save -> COMMITTED %s" % fmt_s(span_med),
                                "DCP async_save -> durable %s" % fmt_s(peer["durable"]),
                                "%.2fx" % (peer["durable"] / span_med), "report", None))
        elif not peer:
            rows.append(Row("3 peer, %s" % what, "-", "DCP async_save: not measured", "-",
                            "stall < DCP blocked", None))
    starts = []
    for log in (glob.glob(os.path.join(work, "logs", tag, "agent-*.log")) +
                glob.glob(os.path.join(work, "logs", tag, "*", "agent-*.log"))):
        starts += re.findall(r"starting for job .*, (no GPU|GPU)$", read(log), re.M)
    gpu_agents = starts.count("GPU")
    notes.append("%s: %d of %d agent starts found a GPU (an agent with a GPU page-locks its "
                 "staging with cudaHostRegister, and a failure to pin fails the save)" % (
                     what, gpu_agents, len(starts)))
    if span_med:
        notes.append("%s: save -> COMMITTED median %s (%s)" % (what, fmt_s(span_med),
                                                              fmt_bw(total / span_med)))
    if loads:
        lw = loads[0]["world"]
        lbytes = sum(x["bytes"] for x in loads)
        span = max(x["end"] for x in loads) - min(x["start"] for x in loads)
        bad = sum(x["mismatched_tensors"] for x in loads)
        steps_ok = all(x["step"] == x["expected_step"] for x in loads)
        cache = read(os.path.join(raw, "load-cache-%s.txt" % tag)).strip() or "?"
        identical = bad == 0 and steps_ok and len(loads) == lw
        bw = lbytes / span if span > 0 else None
        ratio = bw / disk_bw if bw and disk_bw else None
        rows.append(Row(
            "4 load tp=%d -> tp=%d into %s memory, %s" % (ranks, lw, loads[0]["memory"], name),
            "%s (%s in %s; page cache %s; %s)" % (
                fmt_bw(bw), fmt_size(lbytes), fmt_s(span), cache,
                "every byte identical" if identical else
                "**%d tensors differ or wrong step**" % bad),
            "disk read %s (%s)" % (fmt_bw(disk_bw), disk_mode) if disk_bw else "disk: not measured",
            "%.2f" % ratio if ratio else "-", ">= %.2f" % LOAD_TARGET,
            (ratio >= LOAD_TARGET and identical) if ratio else (False if not identical else None)))
        copies = [x["copy_s"] for x in loads if "copy_s" in x]
        if copies:
            notes.append("%s: load: each trainer's mapping of the load region and copy into its "
                         "tensors after the agent's reply took %s (ranks: %s)" % (
                             name, fmt_s(max(copies)), ", ".join(fmt_s(c) for c in copies)))
        if h2d and memory == "cuda":
            rows.append(Row("4b load vs pinned H2D, %s" % name, fmt_bw(bw),
                            "pinned cudaMemcpy H2D %s" % fmt_bw(total / h2d),
                            "%.2f" % (bw / (total / h2d)) if bw else "-", "report", None))
    elif saves:
        rows.append(Row("4 load, %s" % name, "failed: no loader reported (logs/%s)" % tag))
    return rows


def machine_table(env, pack_mode):
    gpu = env.get("gpu", "")
    q = env.get("gpu_query", "")
    mem_kib = int(env.get("mem_kib", "0") or 0)
    avail = int(env.get("mem_available_kib", "0") or 0)
    lines = ["| machine | |", "|---|---|",
             "| GPU | %s |" % (gpu + ("; " + q if q else "") if gpu else "-"),
             "| CPU | %s, %s cores |" % (env.get("cpu", "?"), env.get("cores", "?")),
             "| memory | %.1f GiB (%.1f GiB available at start) |" % (mem_kib / 2**20,
                                                                    avail / 2**20),
             "| disk of the checkpoints | %s, %s |" % (env.get("disk_source", "?"), env.get("fs", "?")),
             "| OS, kernel | %s; %s; %s |" % (env.get("os", "?"), env.get("kernel", "?"),
                                            env.get("glibc", "?")),
             "| software | CUDA (nvcc) %s, %s, torch %s, compute-sanitizer: %s, NCCL from %s |" % (
                 env.get("nvcc") or "-", env.get("python", "?"), env.get("torch") or "-",
                 env.get("sanitizer", "-"), env.get("nccl_dir", "-")),
             "| load average at start | %s |" % env.get("loadavg", "?"),
             "| taken | %s, pack of commit %s |" % (env.get("date", "?"), env.get("pack_commit", "?")),
             "| run | %s; %s |" % (pack_mode, env.get("configs", ""))]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="")
    ap.add_argument("--steps", type=int, default=0)
    a = ap.parse_args()
    work = a.work
    env = read_env(os.path.join(work, "raw", "machine.env"))
    mode = env.get("mode", "gpu")
    skipped = [s for s in read(os.path.join(work, "raw", "skipped.txt")).splitlines() if s]
    failures = [s for s in read(os.path.join(work, "raw", "failures.txt")).splitlines() if s]
    notes = []
    data = {"machine": env, "check_pack": read(os.path.join(work, "raw", "check_pack.txt")),
            "skipped": skipped, "failures": failures}

    rows = []
    disk_bw, disk_mode = disk_limit(work, notes)
    data["disk"] = {"limit_bytes_per_s": disk_bw, "mode": disk_mode}
    for mib, ranks in parse_configs(a.configs):
        rows += config_rows(work, mib, ranks, disk_bw, disk_mode, notes, data)
        for s in skipped:
            if s.startswith("%dM-x%d" % (mib, ranks)):
                rows.append(Row("1-4 %s x %d" % (fmt_size(mib << 20), ranks),
                                "not run: " + s.split(": ", 1)[-1]))
    tests = test_cases(work)
    data["tests"] = tests
    rows += test_rows(tests, mode)
    mc, mc_reason = memcheck(work, skipped)
    data["memcheck"] = mc
    rows.append(memcheck_row(mc, mc_reason))
    rows.append(nccl_row(tests, mode))

    md = ["# Tessera GPU benchmark results", ""]
    if mode != "gpu":
        md += ["**CPU fallback run: no GPU was used.** The same binaries took host memory at run "
               "time; GPU rows are skipped or describe host copies.", ""]
    md += machine_table(env, mode) + [""]
    md += ["| figure | tessera | baseline | ratio | target | met? |",
           "|---|---|---|---|---|---|"]
    md += ["| " + " | ".join(r.cells) + " |" for r in rows]
    md += ["", "Notes:", ""]
    md += ["- " + n for n in notes]
    md += ["- not run: " + s for s in skipped]
    md += ["- **failed**: " + f for f in failures]
    md += ["- pack check on this machine: " + line for line in
           data["check_pack"].splitlines() if line.startswith("check_pack")]
    md += ["- Definitions: tests/gpu/report.py (module docstring). Produced by "
           "`tests/gpu/run.sh --on-device`."]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)
    with open(os.path.join(a.out, "tests.txt"), "w") as f:
        for name, t in tests.items():
            f.write("== %s (exit %s)\n" % (name, t["rc"]))
            for case, outcome, msg in t["cases"]:
                f.write("  %-8s %s%s\n" % (outcome, case, "  -- " + msg if msg else ""))
    with open(os.path.join(a.out, "memcheck.txt"), "w") as f:
        if not mc:
            f.write("not run%s\n" % (": " + mc_reason if mc_reason else ""))
        for m, v in mc.items():
            f.write("== %s: exit %s, ERROR SUMMARY %s\n%s\n" % (m, v["rc"], v["errors"],
                                                             v["log_tail"]))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
