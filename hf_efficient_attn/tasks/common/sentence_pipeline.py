"""A sentence-transformers pipeline carried from one model folder to the next (stretching, continued
MLM pretraining, the Hub upload folder), so that a stretched sentence encoder such as
all-MiniLM-L6-v2 (Transformer -> mean Pooling -> Normalize) stays one: ``SentenceTransformer(folder)``
then runs the same modules, not Transformer + mean pooling alone (whose embeddings are no longer
unit length where the original normalises).

The pipeline is ``modules.json``, ``config_sentence_transformers.json``, ``sentence_bert_config.json``
and the folder of each module after the Transformer (which is the model folder itself): files only,
copied as they are, from a local folder or a Hub id, so that sentence-transformers is not needed to
carry them. ``sentence_bert_config.json`` gets the new ``max_seq_length``, and, for an architecture whose
base model builds a pooler on request (BERT's), tells sentence-transformers to build the encoder without
it when the saved model has none (a masked-LM model): mean pooling does not use it.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

MODULES_FILE = "modules.json"
SETTINGS_FILE = "sentence_bert_config.json"
VERSIONS_FILE = "config_sentence_transformers.json"


def _hub_options(hub_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The options that locate a Hub file (the scripts' hub keyword arguments hold others too)."""
    return {key: hub_kwargs.get(key) for key in ("cache_dir", "revision", "token")}


def _source_file(source: str, name: str, **hub_kwargs: Any) -> str | None:
    """The path of ``name`` in ``source`` (a folder, or a Hub id through its cache), or None."""
    if os.path.isdir(source):
        path = os.path.join(source, name)
        return path if os.path.isfile(path) else None
    from transformers.utils import cached_file

    return cached_file(source, name, _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False,
                       **_hub_options(hub_kwargs))  # fmt: skip


def pipeline_modules(source: str, **hub_kwargs: Any) -> list[dict[str, Any]] | None:
    """The modules of ``source``'s sentence-transformers pipeline, or None when it has none."""
    path = _source_file(source, MODULES_FILE, **hub_kwargs)
    if path is None:
        return None
    with open(path) as f:
        return json.load(f)


def _module_folder(source: str, folder: str, **hub_kwargs: Any) -> str | None:
    """The local copy of a module's folder (a Hub id's through a snapshot of that folder only)."""
    if os.path.isdir(source):
        path = os.path.join(source, folder)
        return path if os.path.isdir(path) else None
    from huggingface_hub import snapshot_download

    path = os.path.join(snapshot_download(source, allow_patterns=[f"{folder}/*"], **_hub_options(hub_kwargs)), folder)
    return path if os.path.isdir(path) else None


def copy_pipeline(source: str, destination: str, max_seq_length: int | None = None, **hub_kwargs: Any) -> list[str] | None:
    """Copy ``source``'s sentence-transformers pipeline beside the model saved in ``destination``,
    with ``max_seq_length`` (None: the source's) and the pooler setting of the saved model (module
    docstring). Returns the modules' types (e.g. ``["Transformer", "Pooling", "Normalize"]``), or None
    when ``source`` has no pipeline (then nothing is written)."""
    modules = pipeline_modules(source, **hub_kwargs)
    if modules is None:
        return None
    for name in (MODULES_FILE, VERSIONS_FILE):
        path = _source_file(source, name, **hub_kwargs)
        if path is not None:
            shutil.copy(path, os.path.join(destination, name))
    for module in modules:
        if module.get("path"):  # "" is the Transformer: the model folder itself
            folder = _module_folder(source, module["path"], **hub_kwargs)
            if folder is not None:  # Normalize has no files
                shutil.copytree(folder, os.path.join(destination, module["path"]), dirs_exist_ok=True)
    settings_path = _source_file(source, SETTINGS_FILE, **hub_kwargs)
    settings: dict[str, Any] = {}
    if settings_path is not None:
        with open(settings_path) as f:
            settings = json.load(f)
    if max_seq_length is not None:
        settings["max_seq_length"] = max_seq_length
    if _builds_pooler_on_request(destination):
        settings.setdefault("model_args", {})["add_pooling_layer"] = _saved_model_has_pooler(destination)
    with open(os.path.join(destination, SETTINGS_FILE), "w") as f:
        json.dump(settings, f, indent=2)
    return [module["type"].rsplit(".", 1)[-1] for module in modules]


def _builds_pooler_on_request(folder: str) -> bool:
    """Whether the base model of the architecture saved in ``folder`` takes ``add_pooling_layer``
    (BERT's does; ModernBERT's, ELECTRA's and others' have no pooler and refuse the keyword)."""
    from transformers import AutoConfig

    from ...integration.patching import takes_pooling_layer_keyword, transformers_base_model_class

    return takes_pooling_layer_keyword(transformers_base_model_class(AutoConfig.from_pretrained(folder)))


def _saved_model_has_pooler(folder: str) -> bool:
    """Whether the model saved in ``folder`` holds a pooler layer (a masked-LM model does not)."""
    from safetensors import safe_open

    weights = [name for name in os.listdir(folder) if name.endswith(".safetensors")]
    for name in weights:
        with safe_open(os.path.join(folder, name), "pt") as f:
            if any(".pooler." in key or key.startswith("pooler.") for key in f.keys()):
                return True
    return False
