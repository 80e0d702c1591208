"""Renders figure 9 of tests/bench/run.sh (overlapped saves, tests/bench/overlap_bench.py's
JSON) as markdown: a page of its own, or with --section a section of results.md.

  report_overlap.py overlap.json [--section]
"""

import argparse
import json
import platform
import subprocess

TARGET_S = 0.005  # save(overlap=True) blocks the host at most this long, at any size


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def ms(s):
    return "%.2f ms" % (s * 1e3)


def render(r, section):
    h = "##"
    lines = []
    if not section:
        lines += ["# Overlapped saves on the CPU", "",
                  "`./tests/bench/run.sh --only=overlap` on %s, %d torch threads; one rank, "
                  "memory-only saves (docs/design/overlapped-save.md). Host time is wall time "
                  "of the call on the trainer's thread. The machine's 1-minute load average was "
                  "%.1f before and %.1f after (other work shared its cores: maxima are "
                  "scheduling, medians the figure)." % (cpu_name(), r["threads"],
                                                        r.get("load_before", float("nan")),
                                                        r.get("load_after", float("nan"))), ""]
    lines += ["%s 9 Overlapped saves: host time blocked" % h, "",
              "| MiB per rank | blocking save(): copy into staging | its stall | "
              "save(overlap=True) median | max | target <= 5 ms | fence() right after |",
              "|---:|---:|---:|---:|---:|:--:|---:|"]
    for row in r["sizes"]:
        met = "met" if row["overlap_save_max_s"] <= TARGET_S else "NOT met"
        lines.append("| %d | %s | %s | %s | %s | %s | %s |" % (
            row["mib"], ms(row["blocking_copy_s"]), ms(row["blocking_stall_s"]),
            ms(row["overlap_save_s"]), ms(row["overlap_save_max_s"]), met,
            ms(row["overlap_fence_s"])))
    t = r["training"]
    none = t["step_s"]["none"]
    lines += ["", "%s 9b A training loop with a save every step" % h, "",
              "An MLP with AdamW, %.0f MiB of model and optimizer state, saved through the "
              "Checkpointer every step (memory-only). Reported, not judged: on two shared cores "
              "the copy threads take the cores the step computes on; the GPU figures judge the "
              "overlap (tests/gpu/overlap.sh)." % t["state_mib"], "",
              "| saves | step time (median) | step time / no save's |", "|---|---:|---:|"]
    for mode, label in (("none", "none"), ("overlap", "overlapped, every step"),
                        ("blocking", "blocking, every step")):
        s = t["step_s"][mode]
        lines.append("| %s | %s | %.3f |" % (label, ms(s), s / none))
    if not section:
        lines += ["", "## On a GPU", "",
                  "Not run: no GPU was at hand. `tests/gpu/overlap.sh` measures, on one GPU at 1 "
                  "and 8 GiB per rank, the host time blocked in save(overlap=True) (target <= 5 "
                  "ms), the GPU time lost per step (target <= 5 % of the pinned D2H time of the "
                  "same bytes) and the throughput with a save every step (target >= 0.97 of none), "
                  "beside DCP async_save with pinned staging in the same run.", "",
                  "| GiB per rank | host blocked | GPU time lost / D2H | throughput vs none | "
                  "DCP async_save (pinned) |", "|---:|---:|---:|---:|---:|",
                  "| 1 | not run | not run | not run | not run |",
                  "| 8 | not run | not run | not run | not run |"]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("json")
    p.add_argument("--section", action="store_true")
    a = p.parse_args()
    with open(a.json) as f:
        print(render(json.load(f), a.section))


if __name__ == "__main__":
    main()
