"""Every planner rejection reached through the real client, against a real coordinator and
agents (started by rejections_test.sh: jobs "rejdp", dp=2, and "rejpp", pp=2).

Trainer ranks are long-lived processes (rejection_worker.py, one tessera.Client each, as a
real trainer keeps); what Python cannot express (names that are not UTF-8, plans over the
size limits) goes through rejection_client, a C++ trainer rank on tessera::Client. Every case
asserts that
  - each rank that saved gets the right exception and code, with a message naming what is
    wrong (the fqn, the ranks with their mesh coordinates, the boxes, the state key);
  - nothing was written: the storage root lists exactly what it did before (no step
    directory, no temporary or partial file);
  - `latest` is unchanged and loads back bitwise on every rank;
  - the same agents then accept a valid save of the refused step, which commits.
The error of every case is printed at the end (and written to
$TEST_UNDECLARED_OUTPUTS_DIR/rejections.txt).
"""

import json
import os
import select
import subprocess
import sys
import time
import unittest

import testlib

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "rejection_worker.py")
SOCK_DIR = os.environ.get("REJ_SOCK_DIR", "")
RUN_DIR = os.environ.get("REJ_DIR", "")
CLIENT = os.environ.get("REJ_CLIENT", "")
CKPT = os.path.join(RUN_DIR, "ckpt")
JOBS = {"rejdp": 2, "rejpp": 2}
OP_TIMEOUT_S = 120
# REPLICA_DIVERGED aborts after chunks were written to the session's temporary directory; the
# coordinator removes it right after the abort. Bound on that removal.
CLEANUP_TIMEOUT_S = 15

REPORT = []  # (case, who, code, message), printed at the end


def sock(job, rank):
    return os.path.join(SOCK_DIR, "%s-%d.sock" % (job, rank))


def listing():
    """Every path under the storage root, relative, directories marked with '/'."""
    out = set()
    for root, dirs, files in os.walk(CKPT):
        rel = os.path.relpath(root, CKPT)
        for d in dirs:
            out.add(os.path.normpath(os.path.join(rel, d)) + "/")
        for f in files:
            out.add(os.path.normpath(os.path.join(rel, f)))
    return out


class Worker:
    """A rejection_worker.py process for one rank, driven one JSON line at a time."""

    def __init__(self, job, rank):
        self.job, self.rank = job, rank
        self.log_path = os.path.join(RUN_DIR, "logs", "worker-%s-%d.log" % (job, rank))
        self.log = open(self.log_path, "wb")
        # -P: the script's directory must not shadow the built package.
        self.proc = subprocess.Popen([sys.executable, "-P", WORKER, "--agent", sock(job, rank)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, bufsize=0)
        self.buf = b""

    def send(self, request):
        self.proc.stdin.write((json.dumps(request) + "\n").encode())

    def recv(self, timeout=OP_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("rank %d of %s gave no reply within %d s"
                                     % (self.rank, self.job, timeout))
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self.log.flush()
                    with open(self.log_path, "rb") as f:
                        tail = f.read()[-3000:].decode("utf-8", "replace")
                    raise AssertionError("rank %d of %s exited (status %s):\n%s"
                                         % (self.rank, self.job, self.proc.poll(), tail))
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line.decode("utf-8"))  # strict: every message must be UTF-8

    def stop(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


@unittest.skipUnless(SOCK_DIR and RUN_DIR and CLIENT, "needs the cluster of rejections_test.sh")
class RejectionsTest(unittest.TestCase):
    workers = {}
    latest = {}

    @classmethod
    def setUpClass(cls):
        cls.workers = {job: [Worker(job, r) for r in range(n)] for job, n in JOBS.items()}
        try:
            for w in cls.all_workers():
                ready = w.recv()
                assert ready.get("ready"), ready
            # A committed checkpoint to keep intact: step 1 of every job.
            for job in JOBS:
                cls.commit(job, 1)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for w in cls.all_workers():
            w.stop()
        lines = ["%-36s %-14s %-26s %s" % r for r in REPORT]
        text = "\n".join(["rejections (case, who, code, message):"] + lines) + "\n"
        sys.stderr.write(text)
        out = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
        if out:
            with open(os.path.join(out, "rejections.txt"), "w") as f:
                f.write(text)

    @classmethod
    def all_workers(cls):
        return [w for ws in cls.workers.values() for w in ws]

    @classmethod
    def ask(cls, job, request, ranks=None):
        """Sends `request` to the ranks of `job` (all by default) at once; their replies."""
        ws = [w for w in cls.workers[job] if ranks is None or w.rank in ranks]
        for w in ws:
            w.send(request)
        return {w.rank: w.recv() for w in ws}

    @classmethod
    def commit(cls, job, step):
        replies = cls.ask(job, {"op": "valid", "step": step})
        for rank, reply in replies.items():
            assert reply.get("raised") is None, ("valid save of step %d on rank %d of %s: %s"
                                                 % (step, rank, job, reply))
            assert os.path.isfile(os.path.join(reply["dir"], "manifest.pb")), reply
            assert reply["dir"].endswith("step-%09d" % step), reply
        cls.latest[job] = step

    # --- checks shared by every case -------------------------------------------------------

    def assert_nothing_written(self, before, job, step, wait_for_cleanup):
        deadline = time.monotonic() + (CLEANUP_TIMEOUT_S if wait_for_cleanup else 0)
        while True:
            now = listing()
            if now == before or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        self.assertEqual(sorted(now - before), [], "written under the storage root")
        self.assertEqual(sorted(before - now), [], "removed from the storage root")
        self.assertFalse([p for p in now
                          if p.startswith(job + "/step-%09d" % step) or ".tmp" in p])

    def assert_latest_intact_then_commit(self, job, step):
        for rank, reply in self.ask(job, {"op": "check"}).items():
            self.assertEqual(reply.get("latest"), self.latest[job], (rank, reply))
            self.assertTrue(reply.get("equal"), (rank, reply))
        # The same agents accept a valid save of the refused step: they are not wedged.
        self.commit(job, step)

    def reject(self, case, job, code, contains, exception="InvalidArgumentError", ranks=None,
               fqn=None, named_ranks=(), state_key=None, phase="save"):
        """Runs `case` on `ranks` (all of `job`'s by default) and checks everything."""
        before = listing()
        step = self.latest[job] + 1
        replies = self.ask(job, {"op": "save", "case": case, "step": step}, ranks)
        for rank, r in sorted(replies.items()):
            REPORT.append((case, "%s rank %d" % (job, rank), r.get("code"), r.get("message")))
            self.assertEqual(r.get("raised"), exception, (rank, r))
            self.assertEqual((r["phase"], r["code"]), (phase, code), (rank, r))
            for text in contains:
                self.assertIn(text, r["message"], (rank, r))
            if fqn is not None:
                self.assertIn(fqn, r["fqns"], (rank, r))
            for named in named_ranks:
                self.assertIn(list(named), r["ranks"], (rank, r))
            if state_key is not None:
                self.assertEqual(r["state_key"], state_key, (rank, r))
        self.assert_nothing_written(before, job, step, wait_for_cleanup=(phase == "wait"))
        if ranks is not None and all(r.get("in_save") for r in replies.values()):
            # Refused by the client's save: the other ranks are told. (A tessera.Shard that
            # refuses its own arguments raises before any save: nothing to tell.)
            self.assert_others_told(job, step, code, refused_by=min(ranks))
        self.assert_latest_intact_then_commit(job, step)
        return replies

    def assert_others_told(self, job, step, code, refused_by):
        """A subset of ranks refused `step` in their own clients: each other rank's save of it
        is answered at once with the refusal, naming the refusing rank (issue 52, bug 4)."""
        others = [w.rank for w in self.workers[job] if w.rank != refused_by]
        for rank, r in sorted(self.ask(job, {"op": "valid", "step": step}, others).items()):
            self.assertEqual(r.get("raised"), "AbortedError", (rank, r))
            self.assertEqual(r.get("code"), code, (rank, r))
            self.assertRegex(r.get("message", ""),
                             r"rank %d('s plan of| refused its tensors for) step %d: "
                             % (refused_by, step), (rank, r))

    def reject_native(self, case, code, contains, fqn=None, state_key=None):
        """Runs rejection_client `case` as rank 0 of rejdp, then the same checks."""
        job = "rejdp"
        before = listing()
        step = self.latest[job] + 1
        p = subprocess.run([CLIENT, "--agent=" + sock(job, 0), "--case=" + case,
                            "--step=%d" % step], capture_output=True, timeout=OP_TIMEOUT_S)
        self.assertEqual(p.returncode, 0, p.stderr.decode("utf-8", "replace")[-2000:])
        r = json.loads(p.stdout.decode("utf-8").strip().splitlines()[-1])  # strict UTF-8
        REPORT.append(("native " + case, "rejdp rank 0", r["code"], r["message"]))
        self.assertFalse(r["saved"], r)
        self.assertEqual((r["status"], r["code"]), ("INVALID_ARGUMENT", code), r)
        for text in contains:
            self.assertIn(text, r["message"], r)
        if fqn is not None:
            self.assertIn(fqn, r["fqns"], r)
        if state_key is not None:
            self.assertEqual(r["state_key"], state_key, r)
        self.assert_nothing_written(before, job, step, wait_for_cleanup=False)
        self.assert_others_told(job, step, code, refused_by=0)
        self.assert_latest_intact_then_commit(job, step)

    # --- planner rules (both ranks submit; both get the verdict) -------------------------------

    def test_DuplicateFqn_PpStagesReuseLayerNames(self):
        self.reject("duplicate_fqn_pp_stages", "rejpp", "DUPLICATE_FQN",
                    ['"layers.0.weight" box [0:4, 0:4]', "rank 0 (pp=0)", "rank 1 (pp=1)",
                     "differ in pp"],
                    fqn="layers.0.weight", named_ranks=[(0, "pp=0"), (1, "pp=1")])

    def test_DuplicateFqn_DpRanksClaimSameBoxUnreplicated(self):
        self.reject("duplicate_fqn_dp_unreplicated", "rejdp", "DUPLICATE_FQN",
                    ['"fsdp.w" box [0:4, 0:8]', "rank 0 (dp=0)", "rank 1 (dp=1)",
                     "outside replicated_over {}"],
                    fqn="fsdp.w", named_ranks=[(0, "dp=0"), (1, "dp=1")])

    def test_OverlappingShards_RowsOverlap(self):
        self.reject("overlapping_shards", "rejdp", "OVERLAPPING_SHARDS",
                    ['"fsdp.w" overlap', "rank 0 (dp=0) holds box [0:3, 0:8]",
                     "rank 1 (dp=1) holds box [2:4, 0:8]"],
                    fqn="fsdp.w", named_ranks=[(0, "dp=0"), (1, "dp=1")])

    def test_IncompleteCoverage_RowMissing(self):
        self.reject("incomplete_coverage", "rejdp", "INCOMPLETE_COVERAGE",
                    ['Region [2:3, 0:8] of tensor "fsdp.w" (shape [4, 8]) is held by no rank'],
                    fqn="fsdp.w")

    def test_ShapeMismatch_GlobalShapesDiffer(self):
        self.reject("shape_mismatch", "rejdp", "SHAPE_MISMATCH",
                    ['"fsdp.w" is F32[4, 8] on rank 0 (dp=0) but F32[4, 9] on rank 1 (dp=1)'],
                    fqn="fsdp.w", named_ranks=[(0, "dp=0"), (1, "dp=1")])

    def test_ShapeMismatch_DtypesDiffer(self):
        self.reject("dtype_mismatch", "rejdp", "SHAPE_MISMATCH",
                    ['"fsdp.w" is F32[4, 8] on rank 0 (dp=0) but F16[4, 8] on rank 1 (dp=1)'],
                    fqn="fsdp.w", named_ranks=[(0, "dp=0"), (1, "dp=1")])

    def test_OptimizerStateMismatch_StateKeysDiffer(self):
        self.reject("optimizer_state_keys_differ", "rejdp", "OPTIMIZER_STATE_MISMATCH",
                    ['Optimizer state of "emb.weight" is [exp_avg, exp_avg_sq] on rank 0 (dp=0) '
                     "but [exp_avg] on rank 1 (dp=1)"],
                    fqn="emb.weight", state_key="exp_avg_sq",
                    named_ranks=[(0, "dp=0"), (1, "dp=1")])

    def test_OptimizerStateMismatch_AbsentOnOneRank(self):
        self.reject("optimizer_state_absent_and_present", "rejdp", "OPTIMIZER_STATE_MISMATCH",
                    ['Optimizer state of "emb.weight"', "no state (absent)", "[exp_avg]"],
                    fqn="emb.weight", named_ranks=[(0, "dp=0"), (1, "dp=1")])

    def test_OptimizerStateMismatch_StateShapeDiffers(self):
        # The same state key with another shape on one rank: rule 2 (SHAPE_MISMATCH) on the
        # state's tensor, naming its state key.
        self.reject("optimizer_state_shape_differs", "rejdp", "SHAPE_MISMATCH",
                    ['"emb.weight#exp_avg" is F32[6, 4] on rank 0 (dp=0) but F32[6, 5] on rank 1'],
                    fqn="emb.weight", state_key="exp_avg")

    def test_ReplicationMismatch_ReplicasDeclareDifferentDims(self):
        self.reject("replication_mismatch", "rejdp", "REPLICATION_MISMATCH",
                    ['"emb.weight" box [0:6, 0:4]', "over {dp} by rank 0 (dp=0)",
                     "over {} by rank 1 (dp=1)"],
                    fqn="emb.weight", named_ranks=[(0, "dp=0"), (1, "dp=1")])

    def test_ReplicaDiverged_DeclaredReplicaBytesDiffer(self):
        # Accepted by the planner (a replica claim is checked by hash, never trusted): save()
        # returns, and the session aborts once the replica's hash differs from the writer's.
        self.reject("replica_diverged", "rejdp", "REPLICA_DIVERGED", ["emb.weight"],
                    exception="AbortedError", phase="wait", fqn="emb.weight")

    # --- malformed requests, refused by the client before any RPC (rank 0 alone) --------------

    def test_Malformed_EmptyFqn(self):
        self.reject("empty_fqn", "rejdp", "MALFORMED_SHARD",
                    ['("") is malformed: bad fqn: name is empty'], ranks=[0])

    def test_Malformed_NonUtf8FqnFromPython(self):
        self.reject("non_utf8_fqn", "rejdp", "MALFORMED_SHARD",
                    ['the fqn "layers.\\udcff.weight" is not valid UTF-8'], ranks=[0],
                    fqn="layers.\\udcff.weight")

    def test_Malformed_NegativeDim(self):
        self.reject("negative_dim", "rejdp", "MALFORMED_SHARD",
                    ["global_shape must not be negative: (-4, 8)"], ranks=[0])

    def test_Malformed_DimOverInt64(self):
        self.reject("dim_over_int64", "rejdp", "MALFORMED_SHARD",
                    ["global_shape[0] = 18446744073709551616 does not fit in a signed 64-bit"],
                    ranks=[0])

    def test_Malformed_VolumeOverflowsInt64(self):
        self.reject("volume_overflows_int64", "rejdp", "MALFORMED_SHARD",
                    ["Shard: element count of [1099511627776, 1099511627776] overflows int64"],
                    ranks=[0])

    def test_Malformed_TooManyAxes(self):
        self.reject("too_many_axes", "rejdp", "MALFORMED_SHARD",
                    ["Shard: the tensor has 65 axes; at most 64 are supported"], ranks=[0])

    # --- what only the C++ client can send ------------------------------------------------------

    def test_Native_NonUtf8Fqn(self):
        self.reject_native("non_utf8_fqn", "MALFORMED_SHARD",
                           ['("layers.\\xff\\xfe.weight") is malformed: bad fqn: name is not '
                            "valid UTF-8 at byte 7"], fqn="layers.\\xff\\xfe.weight")

    def test_Native_NonUtf8StateKey(self):
        self.reject_native("non_utf8_state_key", "MALFORMED_SHARD",
                           ['state "exp_avg\\xc3") is malformed: bad state_key: name is not '
                            "valid UTF-8 at byte 7"], fqn="layers.0.weight",
                           state_key="exp_avg\\xc3")

    def test_Native_PlanOverShardLimit_PlanTooLarge(self):
        # Over the coordinator's limit of 1,048,576 shards per rank: refused by the
        # coordinator when the plan arrives, before a session opens.
        self.reject_native("too_many_shards", "PLAN_TOO_LARGE",
                           ["rank 0 submitted 1048577 shards; the limit is 1048576"])

    def test_Native_PlanOverMessageLimit_PlanTooLarge(self):
        # Over 256 MiB on the wire: refused by the client, not by the agent's transport.
        self.reject_native("request_too_large", "PLAN_TOO_LARGE",
                           ["describes 262144 tensor pieces in ",
                            "over the limit of 268369920 bytes"])


if __name__ == "__main__":
    testlib.main()
