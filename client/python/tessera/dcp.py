"""tessera.dcp: PyTorch DCP's save / async_save / load, through Tessera. Code written for DCP
switches by changing one import::

    import tessera.dcp as dcp      # was: import torch.distributed.checkpoint as dcp
    dcp.save({"model": model_sd, "optim": optim_sd, "step": step},
             checkpoint_id=f"{root}/step-{step}")
    ...
    dcp.load(state_dict, checkpoint_id=f"{root}/step-{step}")   # in place, resharded

As in DCP: nested dicts (and lists) of tensors, DTensors and other values; a value with
``state_dict`` / ``load_state_dict`` (a Stateful) is saved as its ``state_dict()`` and, on load,
given back through ``load_state_dict``; tensors are loaded in place (DTensors resharded to the
loading mesh), other values replaced in the state dict; a key the checkpoint lacks, or a
tensor of another shape, fails the load. Every rank of the job calls save and load.

Where Tessera differs from DCP, on purpose:

* ``checkpoint_id`` names a step, not a directory: an int, or a path whose last component
  ends in one ("ckpt/step-100", "100"). Checkpoints live where the job's coordinator keeps
  them (its ``--storage_root``: a directory or ``s3://``); the rest of the path is ignored.
  A step is committed once: saving it again fails with STEP_EXISTS.
* A save returns the committed checkpoint's location (DCP: its Metadata), once it is
  committed — complete and verified. ``async_save`` returns as soon as this rank's tensors
  are copied to the agent, with a ``concurrent.futures.Future`` of that location.
* Non-tensor values are job-wide: every rank must hold the same (tessera.replicated; a
  mismatch fails the save with REPLICA_DIVERGED, where DCP keeps the coordinator rank's
  silently), and they are encoded by tessera.objects (numbers, strings, bytes, lists, tuples,
  dicts, tensors, numpy arrays; never pickle: anything else is refused naming its key).
* A plain tensor held under the same key by several ranks is a replica over every layout
  dim but pp, checked identical, not deduplicated blindly; a tensor must be contiguous (a
  non-contiguous one is refused, never copied: a load must write into it in place).
* ``process_group``, ``planner`` and ``storage_writer`` / ``storage_reader``: the agent
  knows the job and its storage, so a process group is not needed (passing one is accepted
  and ignored); a planner or a storage writer or reader is refused.
"""

import concurrent.futures
import os
import re

from . import errors, replicated
from .client import Client
from .shards import Shard

__all__ = ["save", "async_save", "load", "set_client"]

_VALUES = "tessera.dcp.values"  # the job-wide non-tensor values (tessera.replicated)
_client = None
_pool = None


def set_client(client):
    """Use `client` (a tessera.Client) from now on; default: one on $TESSERA_AGENT."""
    global _client
    _client = client


def _get_client():
    global _client
    if _client is None:
        _client = Client()
    return _client


def _step_of(checkpoint_id):
    if isinstance(checkpoint_id, int) and not isinstance(checkpoint_id, bool):
        return checkpoint_id
    if isinstance(checkpoint_id, (str, os.PathLike)):
        m = re.search(r"(\d+)$", os.path.basename(os.fspath(checkpoint_id).rstrip("/")))
        if m:
            return int(m.group(1))
    raise errors.malformed(
        "tessera.dcp: checkpoint_id must be a step number or a path whose last component ends "
        "in one (\"ckpt/step-100\"), not %r" % (checkpoint_id,))


def _refuse(**kwargs):
    given = [k for k, v in kwargs.items() if v is not None]
    if given:
        raise errors.malformed(
            "tessera.dcp: %s not supported: the agent writes and reads the job's checkpoints "
            "itself (drop the argument)" % ", ".join(given))


def _is_tensor(value):
    import torch
    return isinstance(value, torch.Tensor)


def _is_stateful(value):
    return (not _is_tensor(value) and hasattr(value, "state_dict") and
            hasattr(value, "load_state_dict"))


def _flatten(value, prefix, out, container=None, key=None):
    """Walks a state dict: tensors go to out.tensors[dotted key]; other leaves to
    out.values[dotted key], with (container, key) in out.slots so a load can replace them;
    a Stateful is replaced by its state_dict() (out.statefuls keeps both)."""
    if _is_stateful(value):
        inner = value.state_dict()
        out.statefuls.append((value, inner))
        value = inner
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise errors.malformed("tessera.dcp: state dict keys are strings; %r under %r "
                                       "is not" % (k, prefix or "the root"))
            _flatten(v, prefix + "." + k if prefix else k, out, value, k)
        return
    if isinstance(value, list) and any(_is_tensor(v) for v in value):
        for i, v in enumerate(value):
            _flatten(v, "%s.%d" % (prefix, i), out, value, i)
        return
    if prefix in out.tensors or prefix in out.values:
        raise errors.malformed("tessera.dcp: two entries of the state dict flatten to the key "
                               "%r" % (prefix,))
    if _is_tensor(value):
        out.tensors[prefix] = value
    else:
        out.values[prefix] = value
        out.slots[prefix] = (container, key)


class _Walk:
    def __init__(self, state_dict):
        if not isinstance(state_dict, dict):
            raise errors.malformed("tessera.dcp: the state dict must be a dict, not %s"
                                   % type(state_dict).__name__)
        self.tensors, self.values, self.slots, self.statefuls = {}, {}, {}, []
        _flatten(state_dict, "", self)


def _described(client, tensors):
    """DTensors as they are; a plain tensor is whole on every rank that holds it, a replica
    over every layout dim but those that split the model (pp): what DCP dedups, Tessera
    checks identical."""
    from torch.distributed.tensor import DTensor
    dims = client._layout.replica_dims(())
    return {k: v if isinstance(v, DTensor) else Shard(v, list(v.shape), replicated_over=dims)
            for k, v in tensors.items()}


def _save(state_dict, checkpoint_id, storage_writer, planner):
    _refuse(storage_writer=storage_writer, planner=planner)
    step = _step_of(checkpoint_id)
    client = _get_client()
    walk = _Walk(state_dict)
    tensors = _described(client, walk.tensors)
    tensors.update(replicated.tensors(client, _VALUES, walk.values))
    client.save(step, tensors)
    return client, step


def save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
         process_group=None, no_dist=False):
    """Saves `state_dict` as step `checkpoint_id` (module docstring) and returns where it was
    committed, once it is. Raises what tessera.Client.save and .wait raise."""
    client, step = _save(state_dict, checkpoint_id, storage_writer, planner)
    return client.wait(step)


def async_save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
               process_group=None, **kwargs):
    """Saves `state_dict` as step `checkpoint_id`; returns once this rank's tensors are copied,
    with a concurrent.futures.Future of where it was committed (its exception: why not)."""
    global _pool
    client, step = _save(state_dict, checkpoint_id, storage_writer, planner)
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tessera-dcp")
    return _pool.submit(client.wait, step)


def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None,
         process_group=None, no_dist=False):
    """Loads step `checkpoint_id` into `state_dict` in place (module docstring). Raises what
    tessera.Client.load raises: NotFoundError without such a step, InvalidArgumentError for a
    key the checkpoint lacks or a tensor of another shape."""
    _refuse(storage_reader=storage_reader, planner=planner)
    step = _step_of(checkpoint_id)
    client = _get_client()
    walk = _Walk(state_dict)
    step, saved_values = replicated.load(client, _VALUES, step)
    missing = sorted(set(walk.values) - set(saved_values))
    if missing:
        raise errors.InvalidArgumentError(
            "tessera.dcp: checkpoint step %d has no value for %s" % (step, ", ".join(missing)))
    client.load(step, into=_described(client, walk.tensors))
    for key, (container, slot) in walk.slots.items():
        container[slot] = saved_values[key]
    for obj, inner in reversed(walk.statefuls):  # innermost first
        obj.load_state_dict(inner)
