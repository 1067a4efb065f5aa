"""Where a model folder came from: ``provenance.json``, written by ``convert_to_long`` and by every
training script next to the model it saves, read by ``push_to_hub`` for the model card.

It holds the Hub checkpoint the chain started from (``base_model``) with its ``license``, and one
entry per stage (conversion, masked-LM pretraining, fine-tuning), each stage's record being its
source's record plus itself, so the last folder of a chain knows every stage. A field nobody could
tell is ``None``; nothing is guessed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ...utils.files import write_json

PROVENANCE_FILE = "provenance.json"


def read_provenance(folder: str | os.PathLike | None) -> dict[str, Any] | None:
    """The record of ``folder``, or None when it has none (or is not a local folder)."""
    if folder is None:
        return None
    path = Path(folder) / PROVENANCE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def card_metadata(folder: str | os.PathLike) -> dict[str, Any]:
    """The metadata block of ``folder``'s README.md (a model card), or ``{}``."""
    from huggingface_hub import ModelCard

    readme = Path(folder) / "README.md"
    return ModelCard.load(readme, ignore_metadata_errors=True).data.to_dict() if readme.is_file() else {}


def _hub_card_metadata(repo_id: str, hub_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The model card metadata of a Hub checkpoint (from the cache when offline), or ``{}``."""
    from huggingface_hub import hf_hub_download

    try:
        readme = hf_hub_download(
            repo_id, "README.md", revision=hub_kwargs.get("revision"), cache_dir=hub_kwargs.get("cache_dir"),
            token=hub_kwargs.get("token"),
        )  # fmt: skip
    except Exception:  # noqa: BLE001  (no card, no network, no cache: the license stays unknown)
        return {}
    return card_metadata(Path(readme).parent)


def source_record(name_or_path: str, base_model: str | None = None, **hub_kwargs: Any) -> dict[str, Any]:
    """The record a new folder made from ``name_or_path`` starts with: a local folder's own record,
    its missing ``base_model`` / ``license`` taken from its README.md (a model card); for a Hub id,
    the id itself and the license of its card. ``base_model`` overrides the one found."""
    if os.path.isdir(name_or_path):
        record = read_provenance(name_or_path) or {"base_model": None, "license": None, "stages": []}
        metadata = card_metadata(name_or_path)
        found = metadata.get("base_model")
        record["base_model"] = record.get("base_model") or (found[0] if isinstance(found, list) else found)
        record["license"] = record.get("license") or metadata.get("license")
    else:
        record = {"base_model": name_or_path, "license": _hub_card_metadata(name_or_path, hub_kwargs).get("license"),
                  "stages": []}  # fmt: skip
    if base_model is not None:
        record["base_model"] = base_model
    return record


def write_provenance(folder: str | os.PathLike, record: dict[str, Any], stage: dict[str, Any]) -> dict[str, Any]:
    """Write ``record`` with ``stage`` appended into ``folder`` (atomically); returns it."""
    written = {**record, "stages": [*record.get("stages", []), stage]}
    write_json(Path(folder) / PROVENANCE_FILE, written, default=str)
    return written


def data_description(data_args: Any) -> dict[str, Any]:
    """The data of a run: a Hub dataset (id and configuration) or local files (their names), and the
    GLUE task (``--task_name``) when one is named."""
    if getattr(data_args, "dataset_name", None) is not None:
        data = {"dataset_name": data_args.dataset_name, "dataset_config_name": data_args.dataset_config_name}
    else:
        flags = ("train_file", "validation_file", "test_file", "validation_mismatched_file", "test_mismatched_file")
        given = {flag: getattr(data_args, flag, None) for flag in flags}
        data = {"files": {flag: os.path.basename(path) for flag, path in given.items() if path}}
    task = getattr(data_args, "task_name", None)
    return {**data, "task_name": task} if task else data
