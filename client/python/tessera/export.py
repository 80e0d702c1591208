"""tessera.export: a committed Tessera checkpoint as one plain safetensors file, through the
``tessera export --consolidate`` command (client/cli/export.h): every tensor whole, checksums
verified as it is read, resharded from whatever chunks it was saved in.

Used by ``python -m tessera.convert to-dcp`` and by tessera.torchtitan's last-step export.
"""

import os
import subprocess


def cli_path(cli=None):
    """The tessera CLI to run: `cli`, else $TESSERA_CLI, else ``tessera`` on PATH."""
    return cli or os.environ.get("TESSERA_CLI") or "tessera"


def consolidate(checkpoint, out_path, *, cli=None, filter="params"):
    """Writes checkpoint `checkpoint` (a step directory, or s3://) to `out_path` as one
    safetensors file; `filter` "params" (parameters and buffers) or "all" (optimizer state
    too). Returns the command's report (stdout: "skipped ..." lines name what was left out).
    Raises RuntimeError with the command's message if it fails; OSError if it cannot run."""
    run = subprocess.run([cli_path(cli), "export", checkpoint, "--consolidate",
                          "--filter=" + filter, "--out=" + out_path],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        raise RuntimeError("tessera export %s failed: %s" % (checkpoint, run.stderr.strip()))
    return run.stdout
