"""Overlapped saves (docs/design/overlapped-save.md) through tessera.torch.Checkpointer against
a real coordinator and agents: what commits is bitwise the state at save(), a write before the
fence is caught and that step is not committed, and a trainer that dies or exits before its
fence leaves no committed step.

Started by overlapped_save_test.sh, which runs the cluster: jobs "ovplain", "ovwrite" and
"ovkill" (dp=1), "ovfsdp" (dp_shard=2), "ovtp" (tp=2); agent sockets are $TESSERA_E2E_SOCK_DIR/<job>-<rank>.sock.
"""

import copy
import os
import signal
import subprocess
import sys
import unittest
import warnings

import torch

import tessera
import testlib
from tessera.torch import Checkpointer

HERE = os.path.dirname(os.path.abspath(__file__))
SOCK_DIR = os.environ.get("TESSERA_E2E_SOCK_DIR", "")
RUN_DIR = os.environ.get("TESSERA_E2E_DIR", "")
RANK = os.path.join(HERE, "overlapped_save_rank.py")
DIM = 16


def sock(job, rank=0):
    return os.path.join(SOCK_DIR, "%s-%d.sock" % (job, rank))


def make_model(seed, norm=False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(DIM, 32), torch.nn.ReLU(), torch.nn.Linear(32, DIM)]
    if norm:  # BatchNorm writes its running statistics in place in every training forward
        layers.insert(1, torch.nn.BatchNorm1d(32))
    return torch.nn.Sequential(*layers)


def snapshot(model, optimizer):
    """Deep copies of every model and optimizer tensor: what a checkpoint must give back."""
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()["state"])


def assert_bitwise(test, expected, model, optimizer, what):
    model_sd, optim_state = expected
    for k, v in model.state_dict().items():
        test.assertTrue(torch.equal(v, model_sd[k]), "%s: model %s differs" % (what, k))
    got = optimizer.state_dict()["state"]
    test.assertEqual(sorted(got), sorted(optim_state), what)
    for p, state in optim_state.items():
        for k, v in state.items():
            test.assertTrue(torch.equal(got[p][k], v), "%s: optimizer %s/%s differs" % (what, p, k))


def train_step(model, optimizer, step, accumulate=2):
    """One optimizer step of `accumulate` micro-batches in bf16 autocast, gradients clipped."""
    for micro in range(accumulate):
        g = torch.Generator().manual_seed(step * 100 + micro)
        x = torch.randn(8, DIM, generator=g)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean() / accumulate
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()
    optimizer.zero_grad()


@unittest.skipUnless(SOCK_DIR and RUN_DIR, "needs the cluster of overlapped_save_test.sh")
class OverlappedSaveTest(unittest.TestCase):

    def test_SaveEveryStep_EachCommitBitwiseTheStateAtItsSave(self):
        """A save every step, overlapped, memory-only but every third to disk: the next step's
        micro-batches run while it is copied, its optimizer step fences it; a disk step and the
        last (memory-only) step load back bitwise equal to the state at their save()."""
        model = make_model(1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        ckpt = Checkpointer(model, optimizer, agent=sock("ovplain"), rng=False)
        expected = {}
        for step in range(1, 6):
            train_step(model, optimizer, step)
            expected[step] = snapshot(model, optimizer)
            result = ckpt.save(step, overlap=True, memory_only=step % 3 != 0)
            self.assertEqual(result.session_id, "", "an overlapped save returns before BeginSave")
            self.assertEqual(result.skipped, "")
        # Step 6's micro-batches and optimizer step change every tensor after step 5's save.
        train_step(model, optimizer, 6)
        self.assertEqual(ckpt.wait(), "", "step 5 is memory-only")
        self.assertIsNone(ckpt.last_save_error)
        stats = ckpt.client.stats()
        self.assertEqual(stats["overlapped_saves"], 5)
        self.assertEqual(stats["overlap_refused"], 0)
        ckpt.close()

        for step in (3, 5):
            fresh = make_model(99)
            fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.01)
            loader = Checkpointer(fresh, fresh_optimizer, client=ckpt.client, rng=False)
            self.assertEqual(loader.load(step), step)
            assert_bitwise(self, expected[step], fresh, fresh_optimizer, "step %d" % step)

    def test_WriteBeforeTheFence_CaughtAndThatStepNotCommitted(self):
        """A deliberate in-place write, then BatchNorm's forward, before the fence: the fence
        sees each (version counters), warns, and the step is withdrawn (never committed,
        STATE_CHANGED); fencing first, as the contract says, commits the next one."""
        model = make_model(2, norm=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ckpt = Checkpointer(model, optimizer, agent=sock("ovwrite"), rng=False)
        train_step(model, optimizer, 1, accumulate=1)
        ckpt.save(1, overlap=True)
        with torch.no_grad():
            model[0].weight.mul_(2)  # an EMA-like write, not through the optimizer
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertFalse(ckpt.fence())
        self.assertEqual(ckpt.last_save_error.code, "STATE_CHANGED")
        self.assertIn("'0.weight'", str(ckpt.last_save_error))
        self.assertTrue(any("STATE_CHANGED" in str(w.message) for w in caught), caught)

        ckpt.save(2, overlap=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train_step(model, optimizer, 2, accumulate=1)  # the optimizer step's fence
        # BatchNorm's CPU kernel writes running_mean and running_var without moving their
        # version counters; num_batches_tracked beside them moves (docs/design/overlapped-save.md).
        self.assertEqual(ckpt.last_save_error.code, "STATE_CHANGED")
        self.assertIn("'1.num_batches_tracked'", str(ckpt.last_save_error))
        self.assertTrue(any("STATE_CHANGED" in str(w.message) for w in caught), caught)
        for step in (1, 2):
            with self.assertRaises(tessera.AbortedError) as aborted:
                ckpt.client.wait(step, timeout=60)
            self.assertEqual(aborted.exception.code, "STATE_CHANGED")
        self.assertIsNone(ckpt.client.latest())

        # The contract kept: fence before the forward that writes the state.
        ckpt.last_save_error = None
        ckpt.save(3, overlap=True)
        self.assertTrue(ckpt.fence())
        expected = snapshot(model, optimizer)
        train_step(model, optimizer, 4, accumulate=1)
        self.assertNotEqual(ckpt.wait(3), "")
        self.assertIsNone(ckpt.last_save_error)
        fresh = make_model(98, norm=True)
        fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
        loader = Checkpointer(fresh, fresh_optimizer, client=ckpt.client, rng=False)
        self.assertEqual(loader.load(), 3)
        assert_bitwise(self, expected, fresh, fresh_optimizer, "step 3")
        ckpt.close()

    def test_TrainerGoneBeforeTheFence_NoCommittedStep(self):
        """A trainer SIGKILLed right after save(overlap=True) (its copy under way or done, never
        fenced), and one that exits normally without fencing: neither step commits; latest
        stays the step before, and the step can be saved again."""
        client = tessera.Client(sock("ovkill"))
        base = {"w": torch.arange(1 << 20, dtype=torch.float32)}
        client.save(1, base)
        self.assertNotEqual(client.wait(1, timeout=60), "")
        for how, step in (("kill", 2), ("exit", 3)):
            p = subprocess.run([sys.executable, "-P", RANK, how, "--agent", sock("ovkill"),
                                "--step", str(step)], capture_output=True, text=True,
                               timeout=120)
            if how == "kill":
                self.assertEqual(p.returncode, -signal.SIGKILL, p.stderr[-2000:])
            else:
                self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            self.assertIn("saved %d overlapped" % step, p.stdout)
            # Gone before its save thread reached the agent, the step was never begun.
            with self.assertRaises((tessera.AbortedError, tessera.NotFoundError)) as aborted:
                client.wait(step, timeout=60)
            if how == "exit" and isinstance(aborted.exception, tessera.AbortedError):
                # withdrawn by the client's destructor, or its BeginSave cancelled
                self.assertEqual(aborted.exception.code, "AGENT_LOST", aborted.exception)
            self.assertEqual(client.latest(), 1)
        client.save(2, base)
        self.assertNotEqual(client.wait(2, timeout=60), "")
        self.assertEqual(client.latest(), 2)


if __name__ == "__main__":
    testlib.main()
