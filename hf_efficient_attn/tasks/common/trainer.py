"""The crash-safe ``Trainer`` of every training script (:class:`CrashSafeTrainer`). A module of its
own, imported where a trainer is built: ``transformers.Trainer`` imports ``datasets`` and more, which a
script's ``--help`` and flag errors do not need."""

from __future__ import annotations

import os
from typing import Any

from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from .driver import mark_complete


class CrashSafeTrainer(Trainer):
    """``Trainer`` whose checkpoints can be killed at any moment: ``checkpoint-N/`` is marked
    complete (:data:`COMPLETE_MARKER`) after every process has written its files, and only then are
    older checkpoints rotated away (``--save_total_limit``), so the last complete checkpoint is on
    disk whenever the process dies. :func:`checkpoint_to_resume` picks the highest complete one."""

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # Trainer has no public hook between writing a checkpoint and rotating the old ones away (the
        # on_save callbacks run after the rotation), so its private save is extended: the rotation is
        # held back until the new checkpoint is marked complete, then done as Trainer does it.
        limit = self.args.save_total_limit
        self.args.save_total_limit = None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        self.accelerator.wait_for_everyone()  # each process has written its own rng_state_<rank>.pth
        if self.args.should_save:
            run_dir = self._get_output_dir(trial=trial)
            step = self.state.global_step
            mark_complete(os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}"), step)
            # By step, the order resuming reads them in (Trainer's order by mtime falls back to it, with a
            # warning, whenever two checkpoints are less than a second apart).
            rotate_checkpoints(run_dir, limit, self.state.best_model_checkpoint, use_mtime=False)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
        # Resumed from the checkpoint of the last step (a kill during the final save or evaluation),
        # Trainer 5.24 would still run one more optimiser step in mid-epoch (its loop tests max_steps
        # only after a step), changing the model unless the learning rate has reached 0. This private
        # method is the one place that runs before that step: there is nothing to train.
        if self.state.global_step >= self.state.max_steps > 0:
            self.control.should_training_stop = True
            return
        super()._run_epoch(*args, **kwargs)
