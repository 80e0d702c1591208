"""python -m tessera.run: agents for this node's ranks around a training command.

    python -m tessera.run --coordinator=HOST:PORT --job=NAME --layout=dp_shard=8 \\
        [--nproc-per-node=N] [--node-rank=R] -- torchrun --nproc_per_node=8 train.py ...

For users who do not run Tessera agents as a node daemon. It starts one agent per local rank
(ranks node_rank * N .. node_rank * N + N - 1 of the layout), waits until every one registered
with the coordinator, runs the command with ``TESSERA_AGENT`` set to
``<socket dir>/agent-{local_rank}.sock`` (tessera.Client fills in the rank from torchrun's
``LOCAL_RANK``), and stops the agents when the command ends, exiting with its status.

Where the numbers come from: ``--nproc-per-node``, else torchrun's ``--nproc_per_node`` /
``--nproc-per-node`` in the command, else ``$LOCAL_WORLD_SIZE``; ``--node-rank``, else
torchrun's ``--node_rank``, else ``$NODE_RANK`` / ``$GROUP_RANK`` / ``$SLURM_NODEID``, else 0.
The layout's world size must be a multiple of the processes per node and, where torchrun's
``--nnodes`` is given, equal nnodes x nproc_per_node: anything else is refused before an
agent starts.

The agent binary: ``--agent-bin``, else ``$TESSERA_AGENT_BIN``, else ``tessera-agent`` on
PATH. ``--agent-arg=FLAG`` (repeatable) passes a flag to every agent.

Exit status: the command's; 2 for bad arguments; 3 if the agents did not all register within
``--register-timeout`` seconds (the message names each rank that did not and ends with its
log's last lines: an unreachable coordinator, a refused layout).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import errors
from .client import Client


class UsageError(Exception):
    pass


def _flag(cmd, *names):
    """The value of flag `names` in `cmd` ("--x=v" or "--x v"), or None."""
    for i, word in enumerate(cmd):
        for name in names:
            if word == name and i + 1 < len(cmd):
                return cmd[i + 1]
            if word.startswith(name + "="):
                return word[len(name) + 1:]
    return None


def _int(value, what):
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError("%s must be a whole number, not %r" % (what, value)) from None
    if number < 0:
        raise UsageError("%s must not be negative, not %d" % (what, number))
    return number


def world_of(layout):
    world = 1
    for part in layout.split(","):
        name, sep, degree = part.partition("=")
        if not sep or not name:
            raise UsageError("--layout is dims like dp_shard=4,tp=2, not %r" % layout)
        world *= _int(degree, "the degree of %s in --layout" % name)
    return world


def plan(args, env):
    """(nproc_per_node, node_rank, world) for `args`; raises UsageError naming what is wrong."""
    cmd = args.command
    torchrun = bool(cmd) and (os.path.basename(cmd[0]) == "torchrun" or
                              "torch.distributed.run" in cmd[:3])
    nproc = args.nproc_per_node
    if nproc is None and torchrun:
        nproc = _flag(cmd, "--nproc_per_node", "--nproc-per-node")
    if nproc is None:
        nproc = env.get("LOCAL_WORLD_SIZE")
    if nproc is None:
        raise UsageError("how many ranks run on this node? pass --nproc-per-node (or run "
                         "torchrun with --nproc_per_node, or set LOCAL_WORLD_SIZE)")
    nproc = _int(nproc, "processes per node")
    if nproc < 1:
        raise UsageError("processes per node must be at least 1")
    node_rank = args.node_rank
    if node_rank is None and torchrun:
        node_rank = _flag(cmd, "--node_rank", "--node-rank")
    for name in ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID"):
        if node_rank is None:
            node_rank = env.get(name)
    node_rank = _int(node_rank if node_rank is not None else 0, "the node rank")
    world = world_of(args.layout)
    if world % nproc:
        raise UsageError("layout %s has %d ranks, not a multiple of the %d processes per node"
                         % (args.layout, world, nproc))
    nnodes = _flag(cmd, "--nnodes") if torchrun else None
    if nnodes is not None and ":" not in nnodes and _int(nnodes, "--nnodes") * nproc != world:
        raise UsageError("layout %s has %d ranks, but torchrun runs %s node(s) x %d processes"
                         % (args.layout, world, nnodes, nproc))
    if torchrun and nnodes is None and world != nproc:
        raise UsageError("layout %s has %d ranks, but torchrun runs 1 node x %d processes (give "
                         "torchrun --nnodes for a job of several nodes)" % (args.layout, world,
                                                                            nproc))
    if node_rank * nproc >= world:
        raise UsageError("node rank %d is past the layout's %d ranks (%d per node)"
                         % (node_rank, world, nproc))
    return nproc, node_rank, world


def _tail(path, lines=5):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return "(no log)"


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def find_agent_bin(name):
    """The agent binary `name` (a path or a name on PATH); raises UsageError if there is none."""
    found = shutil.which(name) or (name if os.access(name, os.X_OK) else None)
    if found is None:
        raise UsageError("no agent binary %r: pass --agent-bin or set TESSERA_AGENT_BIN" % name)
    return found


class Agents:
    """Agents of ranks `ranks` of a job, their sockets and logs in `sockets`
    (agent-<local>.sock, agent-<local>.log). start() launches them; await_registered() waits
    until each serves its trainer (or explains which did not); stop() ends them."""

    def __init__(self, agent_bin, coordinator, job, layout, ranks, sockets, agent_args=()):
        self.agent_bin, self.coordinator, self.job, self.layout = (agent_bin, coordinator, job,
                                                                   layout)
        self.ranks, self.sockets, self.agent_args = list(ranks), sockets, list(agent_args)
        self.procs = []

    def socket(self, local):
        return os.path.join(self.sockets, "agent-%d.sock" % local)

    def log(self, local):
        return os.path.join(self.sockets, "agent-%d.log" % local)

    def start(self):
        for local, rank in enumerate(self.ranks):
            with open(self.log(local), "ab") as log:
                self.procs.append(subprocess.Popen(
                    [self.agent_bin, "--coordinator=" + self.coordinator, "--job=" + self.job,
                     "--rank=%d" % rank, "--layout=" + self.layout, "--socket=" + self.socket(local),
                     "--agents_per_node=%d" % len(self.ranks)] + self.agent_args,
                    stdout=log, stderr=log))

    def await_registered(self, timeout):
        """[] once every agent serves its trainer; else one message per rank that does not
        (it exited, or did not register within `timeout` s), with its log's last lines."""
        waiting = dict(enumerate(self.ranks))
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            if any(self.procs[local].poll() is not None for local in waiting):
                break
            for local in list(waiting):
                try:
                    Client(self.socket(local), connect_timeout=1, prefetch_resident=False)
                    del waiting[local]
                except (errors.UnavailableError, errors.DeadlineExceededError):
                    pass
            if waiting:
                time.sleep(0.2)
        problems = []
        for local, rank in waiting.items():
            state = ("exited %d" % self.procs[local].returncode
                     if self.procs[local].poll() is not None else
                     "not registered after %.0f s" % timeout)
            problems.append("the agent of rank %d (job %s, coordinator %s) %s; its log ends:\n%s"
                            % (rank, self.job, self.coordinator, state, _tail(self.log(local))))
        return problems

    def stop(self):
        _stop(self.procs)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tessera.run", description=__doc__.splitlines()[0])
    ap.add_argument("--coordinator", required=True, help="host:port of tessera-coordinator")
    ap.add_argument("--job", required=True)
    ap.add_argument("--layout", required=True, help="the job's mesh, e.g. dp_shard=8 or pp=2,dp=4")
    ap.add_argument("--nproc-per-node", default=None)
    ap.add_argument("--node-rank", default=None)
    ap.add_argument("--agent-bin", default=os.environ.get("TESSERA_AGENT_BIN", "tessera-agent"))
    ap.add_argument("--agent-arg", action="append", default=[])
    ap.add_argument("--socket-dir", default=None, help="default: a new directory under /tmp")
    ap.add_argument("--register-timeout", type=float, default=60.0)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    try:
        if not args.command:
            raise UsageError("no command to run: put it after --")
        nproc, node_rank, world = plan(args, os.environ)
        agent_bin = find_agent_bin(args.agent_bin)
        longest = os.path.join(os.path.abspath(args.socket_dir or "/tmp/tessera-run-XXXXXXXX"),
                               "agent-%d.sock" % (nproc - 1))
        if len(longest.encode()) > 107:
            raise UsageError("--socket-dir is too long: %s is %d bytes, and a unix socket path "
                             "holds at most 107" % (longest, len(longest.encode())))
    except UsageError as e:
        print("tessera.run: %s" % e, file=sys.stderr)
        return 2

    sockets = args.socket_dir or tempfile.mkdtemp(prefix="tessera-run-", dir="/tmp")
    os.makedirs(sockets, exist_ok=True)
    ranks = range(node_rank * nproc, (node_rank + 1) * nproc)
    agents = Agents(agent_bin, args.coordinator, args.job, args.layout, ranks, sockets,
                    args.agent_arg)
    try:
        agents.start()
        problems = agents.await_registered(args.register_timeout)
        if problems:
            for problem in problems:
                print("tessera.run: " + problem, file=sys.stderr)
            return 3
        env = dict(os.environ, TESSERA_AGENT=os.path.join(sockets, "agent-{local_rank}.sock"))
        print("tessera.run: %d agents registered (job %s, ranks %d-%d of %d); running %s"
              % (nproc, args.job, ranks[0], ranks[-1], world, " ".join(args.command)),
              file=sys.stderr, flush=True)
        child = subprocess.Popen(args.command, env=env)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda s, _f: child.send_signal(s))
        return child.wait()
    finally:
        agents.stop()


if __name__ == "__main__":
    sys.exit(main())
