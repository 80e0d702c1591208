"""tessera.torchtitan: torchtitan's checkpointing through Tessera, chosen in a config.

In a torchtitan config registry (a module with functions returning a Trainer.Config; run with
``-m torchtitan.train --module MODULE --config FUNCTION``), two lines::

    from tessera.torchtitan import use_tessera
    def llama3_debugmodel_tessera():
        return use_tessera(llama3_debugmodel(), enable=True, interval=10)

use_tessera replaces the config's ``checkpoint`` with ``TesseraCheckpointManager.Config``,
keeping every setting the two share; torchtitan's trainer builds the manager from it
(``config.checkpoint.build(...)``, Configurable's ``_owner``): no fork of torchtitan and no
patch of it. Command-line overrides (``--checkpoint.interval=5``) work as for its own manager.
The trainer ranks need a Tessera agent each (``python -m tessera.run ... -- torchrun ...``),
whose layout names its dims as torchtitan names its mesh dims, in its order (``fsdp=8``;
``dp_replicate=2,fsdp=4,tp=2``): a DTensor's mesh dim then maps to the layout dim of the same
name (tessera.dtensor rule 1; ``mesh_dims`` maps other names).

torchtitan's checkpoint settings, honoured as follows (docs/design/pytorch-drop-ins.md lists
what differs from DCP and from torchtitan's own CheckpointManager):

* ``enable``, ``interval``, ``enable_first_step_checkpoint``, ``load_only``: when to save, as
  torchtitan decides it.
* ``async_mode``: "disabled" waits for the commit in save(); "async" and
  "async_with_pinned_mem" return once this rank's tensors are copied to the agent (Tessera's
  staging is shared memory already, so the two are the same), ``save_future`` completing at
  the commit. A failed background save is warned about and kept in ``last_save_error``; the
  next save goes on (tessera.torch.Checkpointer).
* ``keep_latest_k``: retention is the coordinator's (its ``--keep_last``, per deployment),
  which deletes a committed checkpoint only once newer ones are committed. The trainer deletes
  nothing: a value other than the coordinator's is logged once, at start.
* ``load_step``: -1 loads the latest committed checkpoint, else that step.
* ``exclude_from_loading``: those state keys ("optimizer", "lr_scheduler", "dataloader",
  "train_state", ...) keep their values at load.
* ``last_save_model_only`` / ``last_save_in_hf`` / ``export_dtype``: the last step is saved
  whole (so it can be resumed and is committed like any other); then rank 0 exports the
  model's tensors with ``tessera export --consolidate`` (tessera.export) to
  ``<dump_folder>/<folder>/step-<N>/model.safetensors`` in ``export_dtype``, under Hugging
  Face names (torchtitan's state-dict adapter) when ``last_save_in_hf``.
* ``initial_load_path`` / ``initial_load_in_hf`` (a fresh job's weights from elsewhere): when
  the job has no Tessera checkpoint yet, torchtitan's own CheckpointManager loads them.
* ``create_seed_checkpoint`` is refused: a Tessera checkpoint reshards on load, so a job
  starts on its real mesh and needs no seed.
* ``folder``: only where the last-step export goes; checkpoints live where the job's
  coordinator keeps them (its ``--storage_root``).

What is saved (tessera.torch.Checkpointer): the model part (one per rank) and its optimizer
through get/set_model/optimizer_state_dict, resharded at load; the LR schedulers and every
``states`` entry (the trainer's ``train_state``: step, tokens seen) job-wide, checked identical
on every rank; the data loader's state and the RNGs per rank.
"""

import concurrent.futures
import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist
from torchtitan.components.checkpointer import (DATALOADER, LR_SCHEDULER, MODEL, OPTIMIZER,
                                                BaseCheckpointManager, CheckpointManager)
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.tools.logging import logger

from . import errors, export
from .client import Client
from .torch import JOB_STATE, Checkpointer

ASYNC_MODES = ("disabled", "async", "async_with_pinned_mem")


def _mesh_dims(spec):
    """{"fsdp": "dp_shard,cp"} -> {"fsdp": ("dp_shard", "cp")}: a comma names a flattened dim."""
    return {name: tuple(dims.split(",")) if "," in dims else dims for name, dims in spec.items()}


def _one_optimizer(optimizers):
    """The torch optimizer Checkpointer saves: torchtitan's OptimizersContainer holds one per
    model part and optimizer name; only one of them is supported."""
    inner = getattr(optimizers, "optimizers", None)
    if inner is None:
        return optimizers  # a torch.optim.Optimizer itself
    if len(inner) != 1:
        raise errors.malformed(
            "tessera.torchtitan saves one optimizer per rank; this OptimizersContainer holds "
            "%d (several model parts per rank, or several optimizer kinds)" % len(inner))
    return inner[0]


class TesseraCheckpointManager(BaseCheckpointManager):
    """torchtitan's checkpoint manager contract (BaseCheckpointManager) over
    tessera.torch.Checkpointer; the module docstring says how each setting is honoured.

    Built by torchtitan's trainer from its Config (``config.checkpoint.build(...)``) with the
    keyword arguments of torchtitan's CheckpointManager. One per rank; not thread-safe.

    Attributes: ``last_save_error`` (the last background save that failed, or None),
    ``last_export`` (the path of the last-step export, on rank 0, or None).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseCheckpointManager.Config):
        async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "disabled"
        """disabled: save() waits for the commit; async / async_with_pinned_mem: save()
        returns once the tensors are copied to the agent."""

        agent: str = ""
        """The Tessera agent's socket (see tessera.Client); empty: $TESSERA_AGENT."""

        cli: str = ""
        """The tessera CLI for the last-step export; empty: $TESSERA_CLI, else tessera."""

        mesh_dims: dict[str, str] = field(default_factory=dict)
        """DeviceMesh dim name -> layout dim ("a,b" for a flattened dim), where the names
        differ (tessera.dtensor rule 1)."""

        rng: bool = True
        """Save and restore each rank's RNGs (torchtitan's own manager does not)."""

        def __post_init__(self) -> None:
            BaseCheckpointManager.Config.__post_init__(self)
            self.async_mode = self.async_mode.lower()
            if self.async_mode not in ASYNC_MODES:
                raise ValueError("checkpoint.async_mode must be one of %s, not %r"
                                 % (", ".join(ASYNC_MODES), self.async_mode))
            if self.create_seed_checkpoint:
                raise ValueError(
                    "checkpoint.create_seed_checkpoint is not needed with Tessera: a Tessera "
                    "checkpoint reshards on load, so start the job on its real mesh")

    def __init__(self, config, *, dataloader, model_parts, optimizers, lr_schedulers, states,
                 sd_adapter, base_folder=""):
        self.enable = config.enable
        if not self.enable:
            return
        self.config = config
        self.save_future = None
        self.last_export = None
        if len(model_parts) != 1:
            raise errors.malformed(
                "tessera.torchtitan saves one model part per rank, not %d (interleaved "
                "pipeline schedules are not supported)" % len(model_parts))
        self.model = model_parts[0]
        self.folder = os.path.join(base_folder, config.folder)
        self.sd_adapter = sd_adapter
        if config.last_save_in_hf and sd_adapter is None:
            raise ValueError("checkpoint.last_save_in_hf is True, but the model has no "
                             "state-dict adapter to name its tensors as Hugging Face does")
        self._build_args = dict(dataloader=dataloader, model_parts=model_parts,
                                optimizers=optimizers, lr_schedulers=lr_schedulers,
                                states=states, sd_adapter=sd_adapter)
        # torchtitan's state keys -> what Checkpointer takes for each.
        self.parts = {MODEL: self.model, OPTIMIZER: _one_optimizer(optimizers),
                      LR_SCHEDULER: lr_schedulers, DATALOADER: dataloader, **states}
        for key in config.exclude_from_loading:
            if key not in self.parts:
                raise ValueError("checkpoint.exclude_from_loading names %r, which is not a "
                                 "state key (%s)" % (key, ", ".join(sorted(self.parts))))
        self.client = Client(config.agent or None, mesh_dims=_mesh_dims(config.mesh_dims))
        self.checkpointer = self._checkpointer(exclude=())
        self._waiter = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tessera-commit")
        if config.keep_latest_k:
            logger.info("Tessera: checkpoint.keep_latest_k=%d is not applied by the trainer: "
                        "the coordinator's --keep_last decides retention",
                        config.keep_latest_k)
        logger.info("Tessera checkpointing active: job %s, rank %d",
                    self.client.identity["job"], self.client.identity["rank"])

    def _checkpointer(self, exclude):
        """A Checkpointer of every part but those named in `exclude`."""
        part = {k: (None if k in exclude else v) for k, v in self.parts.items()}
        extra = {k: v for k, v in part.items()
                 if k not in (MODEL, OPTIMIZER, LR_SCHEDULER, DATALOADER) and v is not None}
        return Checkpointer(self.model, part[OPTIMIZER], lr_scheduler=part[LR_SCHEDULER],
                            dataloader=part[DATALOADER], extra_state=extra, client=self.client,
                            rng=self.config.rng)

    @property
    def last_save_error(self):
        return self.checkpointer.last_save_error

    # --- saving

    def _should_save(self, step, last_step):
        if self.config.load_only:
            return False
        if step == 1 and self.config.enable_first_step_checkpoint:
            return True
        return last_step or step % self.config.interval == 0

    @torch.no_grad()
    def _save(self, curr_step, last_step=False):
        if not self._should_save(curr_step, last_step):
            return False
        begin = time.monotonic()
        result = self.checkpointer.save(curr_step)
        if last_step or self.config.async_mode == "disabled":
            where = self.checkpointer.wait()
            logger.info("Tessera: step %d committed at %s in %.2f s", curr_step, where,
                        time.monotonic() - begin)
            if last_step and self.config.last_save_model_only:
                self._export_model(curr_step, where)
        else:
            self.save_future = self._waiter.submit(self.client.wait, curr_step)
            logger.info("Tessera: step %d staged in %.2f s (training blocked %.2f s)",
                        curr_step, time.monotonic() - begin, result.stall_seconds)
        return True

    def _export_model(self, step, where):
        """Rank 0 writes the model of committed step `step` (in `where`) as one safetensors
        file in the export dtype, under Hugging Face names if asked; the other ranks wait."""
        if not dist.is_initialized() or dist.get_rank() == 0:
            import safetensors.torch
            out_dir = os.path.join(self.folder, "step-%d" % step)
            os.makedirs(out_dir, exist_ok=True)
            dtype = TORCH_DTYPE_MAP[self.config.export_dtype]
            with tempfile.TemporaryDirectory(prefix="tessera-export-", dir=out_dir) as work:
                whole = os.path.join(work, "whole.safetensors")
                # Parameters and buffers, under get_model_state_dict's names; the job-wide
                # values are the only other tensors the filter keeps.
                export.consolidate(where, whole, cli=self.config.cli, filter="params")
                tensors = {k: (v.to(dtype) if v.is_floating_point() else v)
                           for k, v in safetensors.torch.load_file(whole).items()
                           if not k.startswith(JOB_STATE)}
            if self.config.last_save_in_hf:
                tensors = self.sd_adapter.to_hf(tensors)
            self.last_export = os.path.join(out_dir, "model.safetensors")
            safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()},
                                        self.last_export, metadata={"format": "pt"})
            logger.info("Tessera: the model of step %d exported to %s (%d tensors, %s)", step,
                        self.last_export, len(tensors), self.config.export_dtype)
        if dist.is_initialized():
            dist.barrier()

    def _maybe_wait_for_staging(self):
        """Nothing to wait for: save() returns once the tensors are copied."""

    def _wait_for_saving(self):
        """Waits for the last save's commit; raises its failure (tessera.AbortedError)."""
        future, self.save_future = self.save_future, None
        future.result()

    # --- loading

    @torch.no_grad()
    def _load(self, step=-1):
        if step == -1 and self.client.latest() is None:
            return self._initial_load()
        begin = time.monotonic()
        exclude = tuple(self.config.exclude_from_loading)
        loader = self.checkpointer if not exclude else self._checkpointer(exclude)
        loaded = loader.load("latest" if step == -1 else step)
        logger.info("Tessera: loaded step %d in %.2f s%s%s", loaded, time.monotonic() - begin,
                    " (kept: %s)" % ", ".join(exclude) if exclude else "",
                    " (not in the checkpoint for this rank: %s)"
                    % ", ".join(loader.last_load_missing) if loader.last_load_missing else "")
        return True

    def _initial_load(self):
        """A fresh job: weights from initial_load_path or the HF assets, through torchtitan's
        own CheckpointManager (its folder made absent, so it goes for the initial load)."""
        config = self.config
        if not (config.initial_load_path or config.initial_load_in_hf):
            logger.info("Tessera: the job has no checkpoint; a fresh start")
            return False
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                  if f.name.startswith("initial_load")}
        with tempfile.TemporaryDirectory(prefix="tessera-initial-load-") as empty:
            titan = CheckpointManager.Config(enable=True, folder="absent", keep_latest_k=0,
                                             **fields).build(base_folder=empty,
                                                             **self._build_args)
            try:
                return titan.load()
            finally:
                titan.close()

    def _close(self):
        self._waiter.shutdown(wait=False, cancel_futures=True)


def use_tessera(trainer_config, **settings):
    """Returns `trainer_config` with its ``checkpoint`` made a TesseraCheckpointManager.Config
    that keeps every setting the two configs share, `settings` applied over them."""
    old = trainer_config.checkpoint
    names = {f.name for f in dataclasses.fields(TesseraCheckpointManager.Config)}
    kept = {f.name: getattr(old, f.name) for f in dataclasses.fields(old)
            if f.name in names and not f.name.startswith("_")}
    trainer_config.checkpoint = TesseraCheckpointManager.Config(**{**kept, **settings})
    return trainer_config
