"""python -m tessera.convert: into Tessera from PyTorch DCP, and back out — no lock-in.

    python -m tessera.convert from-dcp DCP_DIR --trust-pickle --coordinator=HOST:PORT \\
        --job=NAME --step=N [--agent-bin=PATH]
    python -m tessera.convert to-dcp CHECKPOINT OUT_DIR [--cli=PATH]

from-dcp: reads a DCP checkpoint whole with torch's own FileSystemReader, in this one
  process (it must fit in memory), and saves it as step N of job NAME through one agent this
  command starts (layout dp=1): a committed, verified Tessera checkpoint that tessera.dcp.load
  reads on any mesh, resharded, as it would the DCP one. DCP's ``.metadata`` is a pickle:
  reading it runs code of whoever wrote it, so the command refuses without --trust-pickle.
to-dcp: writes the Tessera checkpoint CHECKPOINT (a step directory, or s3://) as a DCP
  checkpoint in OUT_DIR that ``dcp.load`` reads: every tensor whole (``tessera export
  --consolidate``, verified as it is read), the non-tensor values tessera.dcp saved under
  their keys. Per-rank objects (tessera.Client's ``objects=``) have no DCP form and are left
  out, said so.
Round trips are bitwise (client/python:dcp_switch_test).
"""

import argparse
import os
import sys
import tempfile

from . import dcp as tessera_dcp
from . import export
from . import objects as objects_codec
from .client import Client
from .run import Agents, UsageError, find_agent_bin


def _read_dcp(directory):
    """The whole DCP checkpoint in `directory` as a nested state dict (unpickles .metadata)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    state = {}
    _load_state_dict(state, storage_reader=FileSystemReader(directory),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


def from_dcp(args):
    if not args.trust_pickle:
        raise UsageError("%s/.metadata is a pickle: reading it runs code of whoever wrote it. "
                         "Convert only a checkpoint you trust, and say so with --trust-pickle"
                         % args.dcp_dir)
    if not os.path.isfile(os.path.join(args.dcp_dir, ".metadata")):
        raise UsageError("%s is not a DCP checkpoint (no .metadata)" % args.dcp_dir)
    agent_bin = find_agent_bin(args.agent_bin)
    state = _read_dcp(args.dcp_dir)
    sockets = tempfile.mkdtemp(prefix="tessera-convert-", dir="/tmp")
    agents = Agents(agent_bin, args.coordinator, args.job, "dp=1", [0], sockets)
    try:
        agents.start()
        problems = agents.await_registered(args.register_timeout)
        if problems:
            raise RuntimeError("\n".join(problems))
        tessera_dcp.set_client(Client(agents.socket(0)))
        where = tessera_dcp.save(state, checkpoint_id=args.step)
    finally:
        tessera_dcp.set_client(None)
        agents.stop()
    print("from-dcp: %s -> job %s step %d, committed at %s" % (args.dcp_dir, args.job, args.step,
                                                            where))


def to_dcp(args):
    import safetensors.torch
    import torch.distributed.checkpoint as dcp
    with tempfile.TemporaryDirectory(prefix="tessera-to-dcp-") as work:
        whole = os.path.join(work, "whole.safetensors")
        report = export.consolidate(args.checkpoint, whole, cli=args.cli)
        tensors = safetensors.torch.load_file(whole)
    header_key, body_key = tessera_dcp._VALUES + ".header", tessera_dcp._VALUES
    values = {}
    if body_key in tensors:
        tensors.pop(header_key, None)
        values = objects_codec.decode(tensors.pop(body_key).numpy().tobytes(), body_key)
    dcp.save({**tensors, **values}, storage_writer=dcp.FileSystemWriter(args.out_dir),
             no_dist=True)
    skipped = [line for line in report.splitlines() if line.startswith("skipped")]
    print("to-dcp: %s -> %s: %d tensors, %d values%s" % (
        args.checkpoint, args.out_dir, len(tensors), len(values),
        ("; " + "; ".join(skipped)) if skipped else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tessera.convert",
                                 description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="direction", required=True)
    f = sub.add_parser("from-dcp", help="a DCP checkpoint into a committed Tessera step")
    f.add_argument("dcp_dir")
    f.add_argument("--trust-pickle", action="store_true",
                   help="read DCP's .metadata, a pickle (runs code of whoever wrote it)")
    f.add_argument("--coordinator", required=True)
    f.add_argument("--job", required=True)
    f.add_argument("--step", type=int, required=True)
    f.add_argument("--agent-bin", default=os.environ.get("TESSERA_AGENT_BIN", "tessera-agent"))
    f.add_argument("--register-timeout", type=float, default=60.0)
    t = sub.add_parser("to-dcp", help="a Tessera checkpoint into a DCP checkpoint")
    t.add_argument("checkpoint")
    t.add_argument("out_dir")
    t.add_argument("--cli", default=export.cli_path(),
                   help="the tessera CLI (default: $TESSERA_CLI, else tessera on PATH)")
    args = ap.parse_args(argv)
    try:
        (from_dcp if args.direction == "from-dcp" else to_dcp)(args)
    except UsageError as e:
        print("tessera.convert: %s" % e, file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - one clear line, not a traceback, for a CLI
        print("tessera.convert %s: %s: %s" % (args.direction, type(e).__name__, e),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
