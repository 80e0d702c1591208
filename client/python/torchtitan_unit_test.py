"""Unit tests of tessera.torchtitan that need no agent: how a torchtitan config selects the
manager (use_tessera, and torchtitan's own command-line parsing keeping the subclass), and
the settings the manager refuses, each with a message naming it."""

import dataclasses
import unittest

import torch
import tyro
from torchtitan.components.checkpointer import BaseCheckpointManager, CheckpointManager
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig
from torchtitan.config.manager import ConfigManager, custom_registry

import testlib
from tessera import errors
from tessera.torchtitan import TesseraCheckpointManager, use_tessera


@dataclasses.dataclass(kw_only=True, slots=True)
class TrainerConfig:
    """The part of torchtitan's Trainer.Config the manager lives in (its trainer module
    imports parts of PyTorch newer than the pinned one)."""
    checkpoint: BaseCheckpointManager.Config = dataclasses.field(
        default_factory=CheckpointManager.Config)


class UseTessera(unittest.TestCase):
    def test_swaps_the_section_keeping_shared_settings(self):
        config = TrainerConfig(checkpoint=CheckpointManager.Config(
            interval=7, keep_latest_k=3, async_mode="async", exclude_from_loading=["dataloader"]))
        config = use_tessera(config, enable=True, interval=5)
        ckpt = config.checkpoint
        self.assertIs(type(ckpt), TesseraCheckpointManager.Config)
        self.assertIs(ckpt._owner, TesseraCheckpointManager)  # what build() constructs
        self.assertEqual((ckpt.enable, ckpt.interval, ckpt.keep_latest_k, ckpt.async_mode,
                          ckpt.exclude_from_loading), (True, 5, 3, "async", ["dataloader"]))

    def test_command_line_overrides_keep_the_subclass(self):
        ConfigManager()  # registers torchtitan's parsing rules, as its trainer does
        default = use_tessera(TrainerConfig(), enable=True)
        parsed = tyro.cli(TrainerConfig, default=default, registry=custom_registry,
                          args=["--checkpoint.interval", "3", "--checkpoint.async_mode",
                                "async_with_pinned_mem", "--checkpoint.exclude_from_loading",
                                "dataloader,lr_scheduler"])
        ckpt = parsed.checkpoint
        self.assertIs(type(ckpt), TesseraCheckpointManager.Config)
        self.assertEqual((ckpt.interval, ckpt.async_mode, ckpt.exclude_from_loading),
                         (3, "async_with_pinned_mem", ["dataloader", "lr_scheduler"]))


class Refusals(unittest.TestCase):
    def test_seed_checkpoint_refused_saying_why(self):
        with self.assertRaisesRegex(ValueError, "create_seed_checkpoint is not needed.*reshards"):
            TesseraCheckpointManager.Config(enable=True, create_seed_checkpoint=True)

    def test_unknown_async_mode_named(self):
        with self.assertRaisesRegex(ValueError, "async_mode must be one of.*'threads'"):
            TesseraCheckpointManager.Config(async_mode="threads")

    def test_torchtitans_own_checks_still_apply(self):
        with self.assertRaisesRegex(ValueError, "at least 2 checkpoint replicas"):
            TesseraCheckpointManager.Config(keep_latest_k=1)

    def build(self, model_parts, optimizers, **settings):
        """Refusals come before the manager connects to an agent: none is needed here."""
        return TesseraCheckpointManager.Config(enable=True, **settings).build(
            dataloader=None, model_parts=model_parts, optimizers=optimizers,
            lr_schedulers=None, states={"train_state": object()}, sd_adapter=None)

    def test_unknown_exclusion_named_with_the_keys(self):
        model = torch.nn.Linear(2, 2)
        with self.assertRaisesRegex(ValueError, "exclude_from_loading names 'optimiser'.*"
                                    "dataloader, lr_scheduler, model, optimizer, train_state"):
            self.build([model], torch.optim.SGD(model.parameters(), lr=0.1),
                       exclude_from_loading=["optimiser"])

    def test_several_model_parts_refused(self):
        parts = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
        with self.assertRaisesRegex(errors.InvalidArgumentError, "one model part per rank, not 2"):
            self.build(parts, None)

    def test_several_optimizers_refused(self):
        model = torch.nn.Linear(2, 2)
        optimizers = OptimizersContainer.Config(implementation="for-loop", param_groups=[
            ParamGroupConfig(pattern=r"bias$", optimizer_name="Adam",
                             optimizer_kwargs={"lr": 0.1}),
            ParamGroupConfig(pattern=r".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 0.1}),
        ]).build(model_parts=[model])
        with self.assertRaisesRegex(errors.InvalidArgumentError, "this OptimizersContainer holds 2"):
            self.build([model], optimizers)

    def test_disabled_manager_builds_nothing(self):
        manager = TesseraCheckpointManager.Config(enable=False).build(
            dataloader=None, model_parts=[], optimizers=None, lr_schedulers=None, states={},
            sd_adapter=None)
        self.assertFalse(manager.load())
        self.assertFalse(manager.save(10))
        manager.close()


if __name__ == "__main__":
    testlib.main()
