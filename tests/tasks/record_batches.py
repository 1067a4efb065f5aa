"""Run a training script with every process saving the batches it trains on, for the slow
multi-process tests: ``python tests/tasks/record_batches.py FOLDER scripts/pretrain_mlm.py ARGS...``
(under torchrun or accelerate launch too) writes ``FOLDER/rank<R>-step<S>.pt`` with the tensors
of each optimisation step's batch of process R (one micro-batch per step: no accumulation)."""

import os
import runpy
import sys

import torch
from transformers import Trainer

folder, script, *arguments = sys.argv[1:]
os.makedirs(folder, exist_ok=True)
training_step = Trainer.training_step


def recording_step(self, model, inputs, *args, **kwargs):
    tensors = {key: value.detach().cpu() for key, value in inputs.items() if torch.is_tensor(value)}
    torch.save(tensors, os.path.join(folder, f"rank{self.args.process_index}-step{self.state.global_step}.pt"))
    return training_step(self, model, inputs, *args, **kwargs)


Trainer.training_step = recording_step
sys.argv = [script, *arguments]
runpy.run_path(script, run_name="__main__")
