"""The recipes of configs/train/ use the current flags: parsed by their script's argument classes,
none triggers a deprecation warning from Transformers (e.g. ``gradient_checkpointing``, renamed
``activation_checkpointing``)."""

from __future__ import annotations

import json
import os
import warnings

import paths
import pytest
from transformers import TrainingArguments

from hf_efficient_attn.tasks.common.adapters import PeftArguments
from hf_efficient_attn.tasks.common.args import ModelArguments, parse_arguments
from hf_efficient_attn.tasks.glue import GlueDataArguments
from hf_efficient_attn.tasks.mlm.pretrain import MLMDataArguments
from hf_efficient_attn.tasks.wikihop.finetune import WikiHopDataArguments

RECIPES = os.path.join(paths.REPO, "configs", "train")


def arguments_of(name: str) -> tuple[type, ...]:
    if name.startswith("glue-"):
        return ModelArguments, GlueDataArguments, PeftArguments, TrainingArguments
    if name.startswith("wikihop-"):
        return ModelArguments, WikiHopDataArguments, TrainingArguments
    return ModelArguments, MLMDataArguments, TrainingArguments


@pytest.mark.parametrize("name", sorted(os.listdir(RECIPES)))
def test_recipe_parses_without_deprecation_warnings(name, tmp_path, monkeypatch):
    """Each recipe parses whole in a folder holding the files and model folders it names (bf16
    dropped: TrainingArguments refuses it without a GPU), online: a Hub model it names (roberta-base)
    is downloadable there."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    with open(os.path.join(RECIPES, name)) as f:
        recipe = json.load(f)
    recipe.pop("bf16", None)
    monkeypatch.chdir(tmp_path)
    for key in ("train_file", "validation_file"):
        if key in recipe:
            os.makedirs(os.path.dirname(recipe[key]), exist_ok=True)
            with open(recipe[key], "w") as f:
                f.write('{"text": "A line."}\n')
    if recipe["model_name_or_path"].startswith("outputs/"):
        os.makedirs(recipe["model_name_or_path"])
    (tmp_path / name).write_text(json.dumps(recipe))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        *_, training_args = parse_arguments(arguments_of(name), [str(tmp_path / name)])
    assert training_args.output_dir == recipe["output_dir"]
