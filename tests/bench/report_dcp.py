"""The benchmark's PyTorch DCP rows (figures 3c and 4b), from dcp_peer.py's measurements
(<results>/raw/dcp-save-<config>-<rank>.json, dcp-load-<config>-<rank>.json), set beside
Tessera's figures of the same configuration by report.py.

Definitions (per DCP variant: dcp.save; dcp.async_save with its default stager; async_save
with the cached pinned stager and with the asynchronous pinned stager, where this machine
can pin memory):
  3c DCP stall    the slowest rank's time until the state may be modified again (dcp.save
                  returned; async_save returned with a blocking stager; staging_completion
                  with an asynchronous one), median over steps >= 2, vs Tessera's stall (the
                  slowest rank's save()). Ratio = DCP / Tessera.
  3c DCP durable  first rank's call -> last rank's save returned / upload future resolved
                  (files fsynced, .metadata written), median over steps >= 2, vs Tessera's
                  save() -> COMMITTED span. Ratio = DCP / Tessera.
  4b DCP load     all loaders' bytes / (first dcp.load() call -> last returned), loading
                  DCP's checkpoint onto the same other world size as Tessera's load, page
                  cache dropped before (or not: the row says). Ratio = DCP time / Tessera time.
No targets: these rows report.
"""

import glob
import json
import os
import statistics


def _load(paths):
    out = []
    for p in sorted(paths):
        try:
            with open(p) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            pass
    return out


def save_rows(Row, fmt_s, raw, tag, name, ranks, tessera_stall, tessera_span):
    """Rows 3c of one configuration, or [] if DCP did not run for it."""
    reports = _load(glob.glob(os.path.join(raw, "dcp-save-%s-*.json" % tag)))
    if not reports:
        return []
    if len(reports) < ranks:
        return [Row("3c DCP, %s" % name, "failed: %d of %d DCP ranks reported (see logs/%s)"
                    % (len(reports), ranks, tag))]
    rows = []
    for variant in reports[0]["variants"]:
        per_rank = [r["variants"][variant] for r in reports]
        error = next((v.get("error") for v in per_rank if v.get("error")), None)
        if error:
            rows.append(Row("3c DCP %s, %s" % (variant, name),
                            "not available here (torch %s): %s" % (reports[0]["torch"],
                                                                    error[:160])))
            continue
        steps = sorted({x["step"] for v in per_rank for x in v["runs"]})
        steady = [s for s in steps if s >= 2] or steps

        def at(step, key):
            return [x[key] for v in per_rank for x in v["runs"] if x["step"] == step]
        stall = statistics.median(max(at(s, "staged_s")) for s in steady)
        call = statistics.median(max(at(s, "call_s")) for s in steady)
        durable = statistics.median(max(at(s, "durable_at")) - min(at(s, "start"))
                                    for s in steady)
        ratio = stall / tessera_stall if tessera_stall else None
        rows.append(Row("3c DCP stall, %s, %s" % (variant, name), fmt_s(tessera_stall),
                        "DCP %s %s%s" % (variant, fmt_s(stall),
                                         "" if call == stall else " (call returned %s)"
                                         % fmt_s(call)),
                        ratio, "report", None,
                        ratio_text=None if ratio is None else "%.1fx" % ratio))
        ratio = durable / tessera_span if tessera_span else None
        rows.append(Row("3c DCP durable, %s, %s" % (variant, name), fmt_s(tessera_span),
                        "DCP %s durable %s" % (variant, fmt_s(durable)), ratio, "report", None,
                        ratio_text=None if ratio is None else "%.2fx" % ratio))
    return rows


def load_rows(Row, fmt_s, fmt_bw, raw, tag, name, saved_world, load_world, tessera_span):
    """Row 4b of one configuration, or [] if DCP did not load for it."""
    loads = _load(glob.glob(os.path.join(raw, "dcp-load-%s-*.json" % tag)))
    if not loads:
        return []
    label = "4b DCP load tp=%s -> tp=%s, %s" % (saved_world, load_world, name)
    if len(loads) < int(load_world) or any(x["mismatched"] for x in loads):
        return [Row(label, "-", "failed (see logs/%s)" % tag)]
    lbytes = sum(x["bytes"] for x in loads)
    span = max(x["end"] for x in loads) - min(x["start"] for x in loads)
    try:
        cache = open(os.path.join(raw, "dcp-load-cache-%s.txt" % tag)).read().strip()
    except OSError:
        cache = "?"
    ratio = span / tessera_span if tessera_span else None
    return [Row(label, fmt_s(tessera_span),
                "dcp.load %s (%s; page cache %s)" % (fmt_s(span), fmt_bw(lbytes / span), cache),
                ratio, "report", None, ratio_text=None if ratio is None else "%.2fx" % ratio)]
