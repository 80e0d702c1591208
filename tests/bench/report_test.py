"""report.py's figure 4m rows from memory, on reports written as bench_rank.py writes them, and
figure 8's S3 rows (report_s3.py) on a raw/s3 directory as run.sh writes it."""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (tests/bench is not a package)
import report_s3  # noqa: E402
import testlib  # noqa: E402

MIB = 1 << 20
TAG = "256M-x2"


def load_report(rank, start, load_s, copy_s, memcpy_s, together, memory=256 * MIB, disk=0):
    """One rank's `bench_rank.py load --memcpy-baseline` report (the fields report.py reads)."""
    return {"rank": rank, "world": 2, "bytes": memory + disk, "step": 3, "start": start,
            "load_s": load_s, "end": start + load_s, "mismatched": [],
            "sources": {"bytes_from_memory": memory, "bytes_from_disk": disk,
                        "memory_blocks_rejected": 0, "bytes_fetched_from_peers": 0,
                        "bytes_verified_by_client": memory, "bytes_fetched_by_client": 0,
                        "bytes_checked_ahead": memory, "copy_seconds": copy_s},
            "memcpy_threads": {"one": 1, "client": 2, "all_cores": 2},
            "memcpy_s": {"1": 2 * memcpy_s, "2": memcpy_s},
            "memcpy_together": together}


class RawDir(unittest.TestCase):
    """A run.sh raw/ directory of a configuration whose memory restores ran three times."""

    def setUp(self):
        self.raw = tempfile.mkdtemp()
        with open(os.path.join(self.raw, "memory-runs-%s.txt" % TAG), "w") as f:
            f.write("3\n")

    def write(self, name, content):
        with open(os.path.join(self.raw, name), "w") as f:
            json.dump(content, f)


class MemoryRows(RawDir):
    def write_run(self, run, reports):
        for r in reports:
            self.write("memload-%s-run%d-%d.json" % (TAG, run, r["rank"]), r)

    def test_row_is_the_median_run_with_its_copies_and_the_baseline_started_together(self):
        # Runs whose spans are 0.100, 0.050 and 0.080 s against a 0.040 s memcpy (the slowest
        # rank's): ratios 0.40, 0.80, 0.50; the median run is the third.
        for run, span in ((1, 0.100), (2, 0.050), (3, 0.080)):
            together = [[10.0, 10.045], [11.0, 11.060], [12.0, 12.050]]
            self.write_run(run, [
                load_report(0, 100.0, span, span - 0.010, 0.030, together),
                load_report(1, 100.0 + span / 2, span / 2, span / 2 - 0.005, 0.040,
                            [[10.005, 10.055], [11.002, 11.050], [12.0, 12.040]]),
            ])
        rows = report.memory_rows(self.raw, TAG, "256 MiB x 2 ranks", 2, (2, 1.0))
        row = rows[0]
        self.assertEqual(row.figure, "4m memory restore, 256 MiB x 2 ranks")
        # Two ranks: the buddy restores (alone, and beside the other node's) were due and no
        # report of theirs was written.
        self.assertEqual([(r.figure, r.tessera) for r in rows[1:]],
                         [("4m buddy restore, 256 MiB x 2 ranks", "failed (see logs/256M-x2)"),
                          ("4m buddy restore, beside the other node's restores, 256 MiB x 2 "
                           "ranks", "failed (see logs/256M-x2)")])
        self.assertAlmostEqual(row.ratio, 0.040 / 0.080)
        self.assertIs(row.met, False)
        self.assertIn("median of 3 runs: 0.40-0.80", row.tessera)
        # Each rank's copy within its load, in the median run: 35.0 and 70.0 ms of 40.0 and
        # 80.0 ms.
        self.assertIn("per rank, copying 35.0 ms-70.0 ms of loads of 40.0 ms-80.0 ms",
                      row.tessera)
        # Rounds spanned 55, 60 and 50 ms (first start to last end over the ranks; rank 0's
        # own: 45, 60, 50): median 55 ms, which a bare copy would score 0.040 / 0.055 = 0.73
        # against.
        self.assertIn("2 threads, 40.0 ms", row.baseline)
        self.assertIn("the same copies started together, as the loads are: 55.0 ms "
                      "(3 rounds' median; 0.73)", row.baseline)

    def test_reports_without_copy_times_or_rounds_leave_them_out(self):
        for run in (1, 2, 3):
            reports = [load_report(r, 100.0, 0.050, 0.040, 0.045, []) for r in (0, 1)]
            for r in reports:
                del r["sources"]["copy_seconds"]
                del r["memcpy_together"]
            self.write_run(run, reports)
        row = report.memory_rows(self.raw, TAG, "256 MiB x 2 ranks", 2, (2, 1.0))[0]
        self.assertAlmostEqual(row.ratio, 0.045 / 0.050)
        self.assertIs(row.met, True)
        self.assertNotIn("copying", row.tessera)
        self.assertNotIn("started together", row.baseline)

    def test_a_run_that_read_from_disk_is_not_judged(self):
        for run in (1, 2, 3):
            self.write_run(run, [load_report(r, 100.0, 0.050, 0.040, 0.045, [],
                                             memory=128 * MIB, disk=128 * MIB if run == 2 else 0)
                                 for r in (0, 1)])
        row = report.memory_rows(self.raw, TAG, "256 MiB x 2 ranks", 2, (2, 1.0))[0]
        self.assertIsNone(row.met)

    def test_against_copy_and_hash_the_median_run_of_the_slowest_ranks_pass(self):
        # Spans 0.100, 0.050, 0.080 s; the slowest rank's copy + hash 0.060 s in every run:
        # ratios 0.60, 1.20, 0.75; the median run is the third.
        for run, span in ((1, 0.100), (2, 0.050), (3, 0.080)):
            reports = [load_report(r, 100.0, span, span - 0.010, 0.030, []) for r in (0, 1)]
            for r, seconds in zip(reports, (0.050, 0.060)):
                r["copy_xxh3"] = {"seconds": seconds, "threads": 2, "piece": 512 << 10}
            self.write_run(run, reports)
        rows = report.memory_rows(self.raw, TAG, "256 MiB x 2 ranks", 2, (2, 1.0))
        row = rows[1]
        self.assertEqual(row.figure, "4m memory restore against copy + XXH3, 256 MiB x 2 ranks")
        self.assertAlmostEqual(row.ratio, 0.060 / 0.080)
        self.assertIs(row.met, False)
        self.assertIn("median of 3 runs: 0.60-1.20", row.tessera)
        self.assertIn("(512 KiB pieces), 2 threads", row.baseline)
        self.assertIn("60.0 ms", row.baseline)

    def test_reports_without_copy_and_hash_have_no_such_row(self):
        for run in (1, 2, 3):
            self.write_run(run, [load_report(r, 100.0, 0.050, 0.040, 0.045, []) for r in (0, 1)])
        rows = report.memory_rows(self.raw, TAG, "256 MiB x 2 ranks", 2, (2, 1.0))
        self.assertFalse(any("copy + XXH3" in r.figure for r in rows))

    def test_a_missing_rank_report_fails_the_row(self):
        for run in (1, 2, 3):
            ranks = (0,) if run == 3 else (0, 1)
            self.write_run(run, [load_report(r, 100.0, 0.050, 0.040, 0.045, []) for r in ranks])
        rows = report.memory_rows(self.raw, TAG, "256 MiB x 2 ranks", 2, (2, 1.0))
        self.assertEqual(rows[0].tessera, "failed (see logs/%s)" % TAG)


def buddy_report(start, load_s, fetched=256 * MIB, disk=0):
    """Rank 1's report of a restore from its buddy on a new node (bench_rank.py load)."""
    r = load_report(1, start, load_s, 0.0, 0.0, [], memory=fetched, disk=disk)
    r["sources"]["bytes_fetched_from_peers"] = fetched
    r["sources"]["bytes_fetched_by_client"] = fetched
    r["sources"]["copy_seconds"] = 0.0
    r["sources"]["fetch_seconds"] = load_s - 0.010
    return r


class BuddyRows(RawDir):
    def write_run(self, run, prefix, load_s, link_mib_s, checked_mib_s, disk=0):
        self.write("%s-%s-run%d-1.json" % (prefix, TAG, run),
                   buddy_report(50.0, load_s, disk=disk))
        self.write("%s-%s-run%d-0.json" % (prefix, TAG, run),
                   load_report(0, 50.0, 0.1, 0.0, 0.0, []))
        self.write("link-%s-run%d.json" % (TAG, run),
                   {"streams": 1, "bytes": 256 * MIB, "seconds": 256.0 / link_mib_s,
                    "bytes_per_s": link_mib_s * MIB, "checked": False})
        if checked_mib_s:
            self.write("linkcheck-%s-run%d.json" % (TAG, run),
                       {"streams": 1, "bytes": 256 * MIB, "seconds": 256.0 / checked_mib_s,
                        "bytes_per_s": checked_mib_s * MIB, "checked": True})

    def test_judged_against_the_link_with_the_checking_receivers_beside_it(self):
        # 256 MiB in 0.25, 0.19 and 0.16 s against a link of 1600 MiB/s: ratios 0.64, 0.84
        # and 1.00; the median run is the second.
        for run, load_s, checked in ((1, 0.25, 1200), (2, 0.19, 1280), (3, 0.16, 1000)):
            self.write_run(run, "buddyload", load_s, 1600, checked)
        rows = report.buddy_rows(self.raw, TAG, "256 MiB x 2 ranks", 2)
        row = rows[0]
        self.assertEqual(row.figure, "4m buddy restore, 256 MiB x 2 ranks")
        # The restores beside the other node's were due too and wrote nothing.
        self.assertEqual(rows[1].tessera, "failed (see logs/%s)" % TAG)
        self.assertAlmostEqual(row.ratio, 256 / 0.19 / 1600)
        self.assertIs(row.met, True)
        self.assertIn("1 ranks on a new node: 256 MiB from buddies in 190.0 ms", row.tessera)
        self.assertIn("median of 3 runs: 0.64-1.00", row.tessera)
        # Rank 1 (the lost node's one rank) fetched for 180 of its 190 ms.
        self.assertIn("per rank, fetching 180.0 ms-180.0 ms of loads of 190.0 ms-190.0 ms",
                      row.tessera)
        self.assertEqual(row.baseline, "loopback TCP 1600 MiB/s (1 streams); its receivers "
                                       "checking what arrives (XXH3): 1280 MiB/s (0.80 of "
                                       "it), not judged")

    def test_without_the_checking_measurement_the_link_alone(self):
        for run in (1, 2, 3):
            self.write_run(run, "buddyload", 0.20, 1600, None)
        row = report.buddy_rows(self.raw, TAG, "256 MiB x 2 ranks", 2)[0]
        self.assertEqual(row.baseline, "loopback TCP 1600 MiB/s (1 streams)")

    def test_a_run_that_read_from_disk_is_not_judged(self):
        for run in (1, 2, 3):
            self.write_run(run, "buddyload", 0.20, 1600, 1200, disk=MIB if run == 3 else 0)
        row = report.buddy_rows(self.raw, TAG, "256 MiB x 2 ranks", 2)[0]
        self.assertIsNone(row.met)


def cpu(weed, agents, busy, all_ticks):
    """A bench_rank.py cpu_sample."""
    return {"machine": [busy, all_ticks], "cpus": 2, "clk_tck": 100, "weed": weed,
            "agents": agents}


class S3Rows(unittest.TestCase):
    """Figure 8 on 256 MiB x 2 ranks: a raw sweep of two points each way, three saves, two
    loads onto 1 rank, DCP skipped."""

    def setUp(self):
        self.raw = tempfile.mkdtemp()
        os.mkdir(os.path.join(self.raw, "s3"))
        self.put("configs.txt", "256 2 run 3072\n1024 4 skip 18432\n")
        self.put("s3.env", "weed=4.48\ndefaults=part_size_mb=16 parts_in_flight=4 \n")
        self.put("dcp-%s.txt" % TAG, "skipped: s3torchconnector does not import: no module\n")
        self.put("load-layout-%s.txt" % TAG, "2 1\n")
        for op, part, k, bw in (("put", 8, 4, 200), ("put", 16, 4, 250), ("get", 16, 1, 900),
                                ("get", 16, 8, 1000)):
            self.put("%s-%s-p%d-k%d.json" % (op, TAG, part, k), json.dumps({
                "op": op, "ranks": 2, "bytes": 512 * MIB, "part_mb": part, "in_flight": k,
                "seconds": 512.0 / bw, "bytes_per_s": bw * MIB, "cpu_seconds": 0.1,
                "watched_cpu_seconds": {"42": 1.8 * 512.0 / bw}, "machine_busy": 0.97}))
        # Saves of 512 MiB in 2.2, 2.0 and 2.56 s: steady median 2.56 s = 200 MiB/s, 0.80 of
        # the 250 MiB/s limit. The machine's two cores: 200 of 256 ticks busy over 1.28 s.
        for rank in (0, 1):
            saves = [{"step": st, "start": 10.0 * st, "committed_at": 10.0 * st + span,
                      "cpu_self_s": 0.128} for st, span in ((1, 2.2), (2, 2.0), (3, 2.56))]
            if rank == 0:
                for x in saves:
                    x["cpu"] = [cpu(0, 0, 0, 0), cpu(230, 26, 200, 256)]
            self.put("save-%s-%d.json" % (TAG, rank), json.dumps(
                {"rank": rank, "world": 2, "bytes": 256 * MIB, "saves": saves}))
        # Loads of 512 MiB in 0.64 and 0.512 s: median 0.64 s = 800 MiB/s, 0.80 of 1000.
        for run, span in ((1, 0.64), (2, 0.512)):
            self.put("load-%s-run%d-0.json" % (TAG, run), json.dumps({
                "rank": 0, "world": 1, "bytes": 512 * MIB, "start": 1.0, "end": 1.0 + span,
                "mismatched": [], "sources": {"bytes_from_memory": 0}}))

    def put(self, name, text):
        with open(os.path.join(self.raw, "s3", name), "w") as f:
            f.write(text)

    def rows(self):
        rows, section = report_s3.report(report, self.raw, {"cores": "2"}, [])
        return {r.figure: r for r in rows}, section

    def test_limits_name_their_point_and_the_saves_and_loads_are_held_to_them(self):
        rows, _ = self.rows()
        name = "256 MiB x 2 ranks"
        self.assertTrue(rows["8 S3 raw PUT limit, %s" % name].baseline.startswith(
            "250 MiB/s at 16 MiB x 4 in flight (fastest of 2 points; weed 1.80 cores"))
        self.assertTrue(rows["8 S3 raw GET limit, %s" % name].baseline.startswith(
            "1000 MiB/s at 16 MiB x 8 in flight"))
        save = rows["8 S3 save -> COMMITTED, %s" % name]
        self.assertAlmostEqual(save.ratio, 0.80)
        self.assertFalse(save.met)
        # The ranks' own CPU: 0.256 s in 2.0 and 2.56 s; the upper middle of 0.10 and 0.128.
        self.assertIn("weed 1.80 cores, agents 0.20, trainers 0.13, machine 78 % busy",
                      save.tessera)
        load = rows["8 S3 load tp=2 -> tp=1, %s" % name]
        self.assertAlmostEqual(load.ratio, 0.80)
        self.assertFalse(load.met)

    def test_dcp_skipped_and_configurations_not_run_say_why(self):
        rows, _ = self.rows()
        self.assertEqual(rows["8 S3 vs DCP + s3torchconnector, 256 MiB x 2 ranks"].tessera,
                         "skipped: s3torchconnector does not import: no module")
        self.assertTrue(rows["8 S3 1 GiB x 4 ranks"].tessera.startswith("not run: needs 18.0 GiB"))

    def test_the_section_tables_the_sweep_and_marks_the_default_setting(self):
        _, section = self.rows()
        text = "\n".join(section)
        self.assertIn("| 16 MiB | 8 | - | 1000 MiB/s", text)
        self.assertIn("| 16 MiB (default) | 4 | 200 MiB/s (2 saves) | 0.80 |", text)


class RatioFigures(unittest.TestCase):
    def ratio_cell(self, ratio, target, met):
        return report.Row("f", ratio=ratio, target=target, met=met).cells()[3]

    def test_a_judged_ratio_never_reads_as_the_other_judgment(self):
        # 0.7981 rounds to 0.80, which would read as met beside "no".
        self.assertEqual(self.ratio_cell(0.7981, ">= 0.80", False), "0.798")
        self.assertEqual(self.ratio_cell(0.7996, ">= 0.80", False), "0.7996")  # 0.800: met
        self.assertEqual(self.ratio_cell(1.1549, "<= 1.15", False), "1.155")
        self.assertEqual(self.ratio_cell(0.8049, ">= 0.80", True), "0.80")
        self.assertEqual(self.ratio_cell(0.61, ">= 0.80", False), "0.61")

    def test_unjudged_ratios_keep_two_decimals(self):
        self.assertEqual(self.ratio_cell(0.7981, "not judged", None), "0.80")
        self.assertEqual(self.ratio_cell(0.7981, ">= 0.80", None), "0.80")


if __name__ == "__main__":
    testlib.main()
