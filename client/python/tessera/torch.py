"""tessera.torch: checkpoint a PyTorch training loop in two lines.

    from tessera.torch import Checkpointer
    ckpt = Checkpointer(model, optimizer, lr_scheduler=scheduler, dataloader=loader)
    start = ckpt.load() or 0            # resume from `latest`, on whatever mesh this job has
    for step in range(start + 1, steps + 1):
        ...                             # forward, backward, optimizer.step(), scheduler.step()
        if step % 100 == 0:
            ckpt.save(step)             # blocks only while the tensors are copied
    ckpt.wait()                         # the last save committed (or raises why not)

A save every step, off the training's path (docs/design/overlapped-save.md):

    for step in ...:
        ...                             # forward, backward, optimizer.step()
        ckpt.save(step, overlap=True, memory_only=step % 100 != 0)   # returns at once

The tensors are copied while the next forward and backward run (they only read them); the next
optimizer.step() first fences the copy (a step pre-hook this class installs). Whatever else
writes the state in place — an EMA, BatchNorm statistics in forward, a manual write — must
come after ``ckpt.fence()``; a write before it is caught (tensor version counters) and that
step is not committed (warned, last_save_error; wait() raises AbortedError STATE_CHANGED).

What a checkpoint holds, and how each part comes back:

* **Model and optimizer** through ``torch.distributed.checkpoint.state_dict``
  (``get_model_state_dict`` / ``get_optimizer_state_dict`` on save, ``set_*`` on load), so
  plain modules, DDP, FSDP2 (``fully_shard``) and tensor parallelism (DTensors) alike; a load
  reshards to the loading job's mesh. Frozen parameters (``requires_grad=False``) are saved as
  parameters without optimizer state, and an optimizer that has not stepped yet is saved as
  such (tessera.Absent; get_optimizer_state_dict would step it with zero gradients to make
  state up, which changes what training does next): a resume leaves those parameters without
  state again, never with state made up.
* **Job-wide state**, identical on every rank: the optimizer's param_groups (learning rates
  and the like, without the parameters), the LR scheduler's ``state_dict()`` and each
  ``extra_state`` entry's (any object with ``state_dict`` / ``load_state_dict``: a Stateful).
  Saved as one tensor replicated over every dim of the job's layout, so the coordinator
  checks that every rank holds the same bytes (a rank whose state differs fails the save with
  REPLICA_DIVERGED, where DCP would silently keep rank 0's), and any rank of any later mesh
  reads it.
* **Per-rank state**: the RNGs (torch's CPU generator, every CUDA device's where CUDA is
  initialised, numpy's global and Python's ``random``) and the data loader's
  ``state_dict()`` (torchdata's StatefulDataLoader, or any loader with those two methods),
  as this rank's objects (tessera.objects: JSON, no pickle). A rank of a larger mesh that did
  not exist at the save has none: it keeps its own, and ``last_load_missing`` names what was
  not restored.

The encoding of objects is tessera.objects'; job-wide and per-rank state must be made of what
it encodes (numbers, strings, bytes, lists, tuples, dicts, tensors, numpy arrays).
"""

import random
import time
import warnings

import numpy
import torch
from torch.distributed.tensor import DTensor
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)

from . import errors, replicated
from .client import HEADER_FQN, Client
from .shards import Absent, Shard
from .state import flatten_state, init_optimizer_state

# The job-wide state (tessera.replicated) is saved under this name.
JOB_STATE = "tessera.torch.job"


def _storage(t):
    """(data pointer, shape, dtype) of the memory tensor `t` (a DTensor's local shard) uses."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return (local.data_ptr(), tuple(local.shape), local.dtype)


def _rng_state():
    state = {"torch": torch.get_rng_state(), "numpy": numpy.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state):
    torch.set_rng_state(state["torch"])
    numpy.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """Saves and loads a training loop's whole state through the Tessera agent beside this
    rank (module docstring). One per rank; not thread-safe.

    Args:
      model: the ``torch.nn.Module`` (plain, DDP, FSDP2 or TP).
      optimizer: its ``torch.optim.Optimizer``, or None.
      lr_scheduler: an LR scheduler (``state_dict`` / ``load_state_dict``), or None.
      dataloader: a loader with ``state_dict`` / ``load_state_dict`` (torchdata's
        StatefulDataLoader), or None. Per rank.
      extra_state: {name: Stateful} saved job-wide, or None.
      client: a ``tessera.Client``; default: one on ``$TESSERA_AGENT`` (or ``agent``).
      agent: the agent's socket path, when no client is given.
      rng: save and restore the RNGs per rank. Default: True.
    """

    def __init__(self, model, optimizer=None, lr_scheduler=None, dataloader=None,
                 extra_state=None, *, client=None, agent=None, rng=True):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.dataloader = dataloader
        self.extra_state = dict(extra_state or {})
        for name, obj in self.extra_state.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise errors.malformed("extra_state[%r] has no state_dict/load_state_dict: "
                                       "only Stateful objects can be checkpointed" % (name,))
        self.rng = rng
        self.client = client if client is not None else Client(agent)
        self._last_step = None
        self._waited = True
        self.last_load_missing = []
        self.last_save_error = None
        self.last_save_reused_preparation = False
        self._prepared_signature = self._prepared_tensors = None
        self._fence_hook = None  # the optimizer step pre-hook of overlapped saves, once made

    # --- what is saved

    def _state_dicts(self):
        model_sd = get_model_state_dict(self.model)
        if self.optimizer is None:
            return model_sd, None
        if not self.optimizer.state:
            # Not stepped yet. get_optimizer_state_dict would make state up by stepping it
            # with zero gradients (AdamW's step count would then start at 1: training
            # changed by a save); flatten_state marks every parameter's state Absent instead.
            return model_sd, self.optimizer
        return model_sd, get_optimizer_state_dict(self.model, self.optimizer)

    def _job_state(self):
        state = {}
        if self.optimizer is not None:
            state["param_groups"] = [{k: v for k, v in g.items() if k != "params"}
                                     for g in self.optimizer.param_groups]
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        state["extra"] = {name: obj.state_dict() for name, obj in self.extra_state.items()}
        return state

    def _rank_state(self):
        state = {}
        if self.rng:
            state["rng"] = _rng_state()
        if self.dataloader is not None:
            state["dataloader"] = self.dataloader.state_dict()
        return state

    def _live_tensors(self):
        """Every parameter, buffer and optimizer-state tensor, in a stable order; None if the
        optimizer holds non-tensor state (a Python number is copied into the mapping when it
        is made, so that mapping cannot be kept)."""
        live = list(self.model.parameters()) + list(self.model.buffers())
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for value in state.values():
                    if not torch.is_tensor(value):
                        return None
                    live.append(value)
        return live

    def _prepared(self):
        """flatten_state's mapping of the model and optimizer: reused from the previous save
        while every tensor it names still has the same storage (a save copies today's
        values from it) and no tensor was added or replaced; made anew otherwise.
        last_save_reused_preparation says which."""
        live = self._live_tensors()
        signature = None if live is None else tuple(_storage(t) for t in live)
        if signature is not None and signature == self._prepared_signature:
            self.last_save_reused_preparation = True
            return self._prepared_tensors
        model_sd, optim_sd = self._state_dicts()
        tensors = flatten_state(model_sd, optim_sd)
        # Kept only if it names live storage alone, no copy the state dicts made (a later
        # save would save the copy, stale).
        live_ptrs = {entry[0] for entry in signature or ()}
        keep = signature is not None and all(
            _storage(v.tensor if isinstance(v, Shard) else v)[0] in live_ptrs
            for v in tensors.values() if not isinstance(v, Absent))
        self._prepared_signature = signature if keep else None
        self._prepared_tensors = tensors if keep else None
        self.last_save_reused_preparation = False
        return tensors

    def save(self, step, *, memory_only=False, overlap=False, when_busy="wait"):
        """Saves the whole state as checkpoint `step`; returns tessera.SaveResult once this
        rank's tensors are copied (the persist goes on in the agent: wait() for the commit),
        its stall_seconds the whole time this call blocked.
        A job has one save in flight, so it first waits for the previous save to end (its
        failure is warned about and kept in last_save_error). Every rank of the job calls it
        with the same step. Raises what Client.save raises.

        overlap=True returns once the state is described: the copy runs while the next
        forward and backward do, the previous save's end is waited for in the background,
        and the optimizer's next step fences it (module docstring; Client.save's overlap and
        when_busy). Call fence() first where anything else writes the state in place."""
        start = time.perf_counter()
        if overlap:
            self._install_fence_hook()
            self.fence()  # a save after the optimizer step: usually fenced by the hook already
        else:
            self._finish_previous()
        tensors = dict(self._prepared())
        tensors.update(replicated.tensors(self.client, JOB_STATE, self._job_state()))
        result = self.client.save(step, tensors, objects=self._rank_state(),
                                  memory_only=memory_only, overlap=overlap, when_busy=when_busy)
        if result.skipped:
            return result._replace(stall_seconds=time.perf_counter() - start)
        # An overlapped save's commit is waited for by the client's save thread.
        self._last_step, self._waited = step, overlap
        # What this call blocked, all of it: the wait for the previous save, the preparation.
        return result._replace(stall_seconds=time.perf_counter() - start)

    def fence(self):
        """Ends the overlap of the last save(overlap=True) (Client.fence): call it before
        anything but the optimizer writes the state in place (the optimizer's step calls it
        itself). Returns True if that save stands (or none was pending); False if it does not
        — the state was written before the fence (STATE_CHANGED) or the save failed — which
        is warned about and kept in last_save_error, never raised: training goes on."""
        try:
            self.client.fence()
        except errors.TesseraError as e:
            self.last_save_error = e
            warnings.warn("tessera: checkpoint step %s was not committed: %s"
                          % (self._last_step, e), RuntimeWarning, stacklevel=2)
            return False
        return True

    def _install_fence_hook(self):
        """The optimizer's step first fences a pending overlapped save (once per Checkpointer)."""
        if self._fence_hook is None and self.optimizer is not None:
            self._fence_hook = self.optimizer.register_step_pre_hook(self._fence_before_step)

    def _fence_before_step(self, optimizer, args, kwargs):
        self.fence()  # a pre-hook returns None (or new arguments)

    def close(self):
        """Fences a pending overlapped save (it then commits in the background) and removes
        the optimizer hook. A trainer that exits without it leaves its last overlapped save
        uncommitted — never half-committed."""
        self.fence()
        if self._fence_hook is not None:
            self._fence_hook.remove()
            self._fence_hook = None

    def _finish_previous(self):
        """A job has one save in flight: waits for the previous one (usually committed long
        ago). Its failure does not stop this save; it is warned about, and kept in
        last_save_error."""
        if self._last_step is None or self._waited:
            return
        self._waited = True
        try:
            self.client.wait(self._last_step)
        except errors.TesseraError as e:
            self.last_save_error = e
            warnings.warn("tessera: checkpoint step %d was not committed: %s"
                          % (self._last_step, e), RuntimeWarning, stacklevel=3)

    def wait(self, step=None, timeout=None):
        """Blocks until checkpoint `step` (default: the last one saved here) is committed;
        returns its directory ("" for a memory-only save, which has none). Raises what
        Client.wait raises (AbortedError with the reason)."""
        step = self._last_step if step is None else step
        if step is None:
            raise errors.malformed("wait(): nothing was saved through this Checkpointer")
        self.fence()  # a pending overlapped save commits only once fenced
        where = self.client.wait(step, timeout=timeout)
        if step == self._last_step:
            self._waited = True
        return where

    # --- loading

    def load(self, step="latest"):
        """Loads checkpoint `step` ("latest", "newest" or a number) into the model, optimizer,
        scheduler, extra state, and this rank's RNGs and data loader; returns the step, or
        None if the job has no checkpoint (a fresh start). Raises what Client.load raises."""
        if step == "latest" and self.client.latest() is None:
            return None
        self._prepared_signature = self._prepared_tensors = None
        step, job = replicated.load(self.client, JOB_STATE, step)
        if self.optimizer is not None:
            init_optimizer_state(self.optimizer)  # tensors for the load to fill
        model_sd, optim_sd = self._state_dicts()
        tensors = flatten_state(model_sd, optim_sd)
        for key in [k for k, v in tensors.items() if isinstance(v, Absent)]:
            del tensors[key]  # frozen parameters: no state to fill
        self.last_load_missing = []
        try:
            step, rank_state = self.client.load(step, into=tensors, objects=True)
        except errors.InvalidArgumentError as e:
            if e.fqns != [HEADER_FQN]:
                raise
            # No rank of this number saved the step (a larger mesh): its own state stays.
            step = self.client.load(step, into=tensors)
            rank_state = {}
            self.last_load_missing = [n for n, on in (("rng", self.rng),
                                                      ("dataloader", self.dataloader))
                                      if on is not None and on is not False]
        set_model_state_dict(self.model, model_sd)
        if self.optimizer is not None:
            if optim_sd is not self.optimizer:  # one that keeps no state (SGD, no momentum)
                # strict=False: a parameter saved without optimizer state stays without it.
                set_optimizer_state_dict(self.model, self.optimizer, optim_sd,
                                         options=StateDictOptions(strict=False))
            for group, saved in zip(self.optimizer.param_groups, job.get("param_groups", [])):
                group.update(saved)
        if self.lr_scheduler is not None and "lr_scheduler" in job:
            self.lr_scheduler.load_state_dict(job["lr_scheduler"])
        for name, obj in self.extra_state.items():
            if name in job.get("extra", {}):
                obj.load_state_dict(job["extra"][name])
            else:
                self.last_load_missing.append("extra_state[%r]" % (name,))
        if "rng" in rank_state and self.rng:
            _set_rng_state(rank_state["rng"])
        if "dataloader" in rank_state and self.dataloader is not None:
            self.dataloader.load_state_dict(rank_state["dataloader"])
        return step
