"""The upload folder of a variant: exactly what ``push_to_hub.py --dry_run`` writes and a push uploads.

config.json (``attn_impl``, ``attn_config`` and ``auto_map``), the weights, the tokenizer, the
method's own code (:mod:`.remote_code`) and README.md, the model card (:mod:`.card`).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

from huggingface_hub.utils import validate_repo_id
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import hf_efficient_attn as hea

from ..integration.positions import max_tokens
from ..tasks.common.args import check_model_source
from ..tasks.common.provenance import read_provenance, source_record
from ..tasks.common.sentence_pipeline import copy_pipeline
from .card import build_model_card, read_metrics, results_data
from .remote_code import auto_class_for, write_remote_code

TRAINER_STATE = "trainer_state.json"

logger = logging.getLogger("hf_efficient_attn.hub")


def variant_name(base_model: str, attn_impl: str, max_length: int, task: str | None = None) -> str:
    """The naming convention of shared variants: ``<base>-<method>-<max_len>[-<task>]``,
    e.g. ``roberta-base-mra2-4096`` or ``roberta-base-mra2-4096-sst2``."""
    parts = [base_model.rstrip("/").split("/")[-1], attn_impl, str(max_length)] + ([task] if task else [])
    return "-".join(parts)


#: What each training script trains, the task of a variant whose data names none (local files).
SCRIPT_TASKS = {"pretrain_mlm.py": "mlm", "finetune_glue.py": "classification", "finetune_wikihop.py": "wikihop"}


def trained_task(provenance: dict[str, Any] | None) -> str | None:
    """The task of a variant, from the last stage its ``provenance.json`` records: the GLUE task
    (``--task_name``), else the Hub dataset's configuration or name, else what its script trains
    (:data:`SCRIPT_TASKS`); None when the last stage trained nothing (a conversion) or nothing is recorded."""
    stages = (provenance or {}).get("stages") or [{}]
    stage = stages[-1]
    if stage.get("script") not in SCRIPT_TASKS:
        return None
    data = stage.get("data", {})
    dataset = (data.get("dataset_name") or "").rstrip("/").split("/")[-1]
    return data.get("task_name") or data.get("dataset_config_name") or dataset or SCRIPT_TASKS[stage["script"]]


def resolve_repo_id(repo_id: str, default_name: str | None) -> str:
    """``user/name`` as given; a bare namespace (``user`` or an organisation) gets ``default_name``
    (``ValueError`` when there is none)."""
    if "/" not in repo_id and default_name is None:
        raise ValueError(
            f"--repo_id {repo_id!r} is a namespace only, and without a base model the repository cannot be named "
            f"<base>-<method>-<length>: give --repo_id {repo_id}/NAME or --base_model"
        )
    full = repo_id if "/" in repo_id else f"{repo_id}/{default_name}"
    validate_repo_id(full)  # HFValidationError (a ValueError) naming what is allowed
    return full


def load_variant(model_dir: str, attn_impl: str | None = None, attn_config: dict[str, Any] | None = None) -> PreTrainedModel:
    """The model of ``model_dir`` with its method: the one saved in its config, or ``attn_impl``
    (required for a plain checkpoint), through the ``hf_efficient_attn.AutoModel*`` class of its head."""
    config = AutoConfig.from_pretrained(model_dir)
    auto_class = auto_class_for(config.model_type, config.architectures or [])
    loader = getattr(hea, auto_class, None)
    if loader is None:
        raise ValueError(f"{model_dir} is a {config.architectures[0]}; hf_efficient_attn has no {auto_class} to load it")
    model = loader.from_pretrained(model_dir, attn_impl=attn_impl, attn_config=attn_config)
    if getattr(model.config, "attn_impl", None) is None:
        raise ValueError(
            f"{model_dir} is a plain checkpoint (its config has no attn_impl); pass --attn_impl, one of: "
            + ", ".join(hea.list_methods())
        )
    return model


def load_tokenizer(source: str, vocab_size: int) -> PreTrainedTokenizerBase:
    """The tokenizer at ``source``, checked against the model's ``vocab_size`` (Transformers 5
    builds an empty tokenizer for a folder that has none)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise ValueError(f"no tokenizer could be loaded from {source} ({err}); pass --tokenizer_name") from None
    if len(tokenizer) <= len(tokenizer.all_special_tokens):
        raise ValueError(f"{source} has no tokenizer (only special tokens were found); pass --tokenizer_name")
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer of {source} has {len(tokenizer)} tokens but the model's vocabulary has {vocab_size}; "
            "pass the tokenizer the model was trained with (--tokenizer_name)"
        )
    return tokenizer


def resolve_card_fields(model_dir: str, base_model: str | None, license: str | None) -> tuple[str | None, str | None]:
    """``base_model`` and ``license`` as given, else what ``model_dir`` records (its
    ``provenance.json``, else its README.md; for a Hub id, the id and its card's license); None
    where nothing tells (the card leaves the field out)."""
    recorded = source_record(model_dir)
    return base_model or recorded["base_model"], license or recorded["license"]


def warn_unknown_fields(model_dir: str, base_model: str | None, license: str | None) -> None:
    """One warning per card field left out, naming the flag that sets it."""
    if base_model is None:
        logger.warning(f"{model_dir} records no base model: the card names none (set it with --base_model)")
    if license is None:
        logger.warning(f"{model_dir} records no license: the card states none (set it with --license, e.g. apache-2.0)")


def find_trainer_state(*folders: str | Path | None) -> dict[str, Any] | None:
    """``trainer_state.json`` of the first of ``folders`` that has one."""
    for folder in folders:
        if folder is not None and (Path(folder) / TRAINER_STATE).is_file():
            return json.loads((Path(folder) / TRAINER_STATE).read_text())
    return None


def export_variant(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    folder: str | Path,
    *,
    repo_id: str,
    base_model: str | None,
    license: str | None,
    results_file: str | Path | None = None,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    trainer_state: dict[str, Any] | None = None,
    provenance: dict[str, Any] | None = None,
) -> Path:
    """Write the upload folder of ``model`` (patched) into ``folder`` (new or empty)."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"{folder} is not empty; give a new or empty folder for the upload")
    card = build_model_card(
        model,
        repo_id=repo_id,
        base_model=base_model,
        license=license,
        results_file=results_file,
        dataset_name=dataset_name,
        dataset_config_name=dataset_config_name,
        trainer_state=trainer_state,
        provenance=provenance,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = copy.deepcopy(model.config)
    config.auto_map = write_remote_code(model, folder)
    config.save_pretrained(folder)
    card.save(folder / "README.md")
    return folder


def prepare_upload(
    model_dir: str,
    folder: str | Path,
    *,
    repo_id: str,
    attn_impl: str | None = None,
    attn_config: dict[str, Any] | None = None,
    tokenizer_name: str | None = None,
    base_model: str | None = None,
    license: str | None = None,
    results_file: str | None = None,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
) -> str:
    """Load the variant of ``model_dir`` and write its upload folder; returns the full repo id.

    The card's training section reads ``provenance.json`` (every stage) and ``trainer_state.json``
    from ``model_dir`` (or from the folder of ``results_file``) when there are some.
    """
    check_model_source("model_dir", model_dir)
    base_model, license = resolve_card_fields(model_dir, base_model, license)
    if "/" not in repo_id and base_model is None:
        resolve_repo_id(repo_id, None)  # the error, before the model is loaded
    local_dir = model_dir if Path(model_dir).exists() else None
    provenance = read_provenance(local_dir)
    if results_file:  # the results and the data they were measured on, checked before the model is loaded
        read_metrics(results_file)
        results_data(results_file, dataset_name, dataset_config_name, provenance)
    warn_unknown_fields(model_dir, base_model, license)
    model = load_variant(model_dir, attn_impl, attn_config)
    tokenizer = load_tokenizer(tokenizer_name or model_dir, model.config.vocab_size)
    default_name = None
    if base_model is not None:
        task = dataset_config_name or trained_task(provenance)
        default_name = variant_name(base_model, model.config.attn_impl, max_tokens(model.config), task)
    repo_id = resolve_repo_id(repo_id, default_name)
    results_dir = Path(results_file).parent if results_file else None
    export_variant(
        model,
        tokenizer,
        folder,
        repo_id=repo_id,
        base_model=base_model,
        license=license,
        results_file=results_file,
        dataset_name=dataset_name,
        dataset_config_name=dataset_config_name,
        trainer_state=find_trainer_state(local_dir, results_dir),
        provenance=provenance,
    )
    copy_pipeline(model_dir, str(folder))  # a sentence-transformers model's pooling, normalisation, ...
    return repo_id
