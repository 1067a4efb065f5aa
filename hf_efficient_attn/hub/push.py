"""Share a variant: write its upload folder (:mod:`.export`) and upload it through huggingface_hub."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, ModelCard, get_token

from .export import prepare_upload


def upload_variant(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
) -> str:
    """Upload ``folder`` to model repo ``repo_id`` (created if needed; ``revision``, a branch,
    too); returns the commit URL. The token is huggingface_hub's: ``HF_TOKEN`` or ``hf auth login``."""
    ModelCard.load(Path(folder) / "README.md").validate()  # the Hub's metadata check, before any upload
    api = HfApi()
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
    if revision is not None:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id, folder_path=str(folder), revision=revision, commit_message=commit_message, repo_type="model"
    )
    return commit.commit_url


def push_variant(
    model_dir: str,
    repo_id: str,
    *,
    dry_run: str | Path | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    **export_options: Any,
) -> str:
    """Share the variant of ``model_dir`` as ``repo_id``; returns the commit URL, or with
    ``dry_run`` the folder written there (nothing is uploaded).

    ``export_options`` are those of :func:`~hf_efficient_attn.hub.export.prepare_upload`
    (``attn_impl``, ``attn_config``, ``tokenizer_name``, ``base_model``, ``license``,
    ``results_file``, ``dataset_name``, ``dataset_config_name``).
    """
    if dry_run is None and get_token() is None:
        raise ValueError("no Hugging Face token: log in with `hf auth login` or set HF_TOKEN (or use --dry_run DIR)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(dry_run or tmp)
        repo_id = prepare_upload(model_dir, folder, repo_id=repo_id, **export_options)
        if dry_run is not None:
            return str(folder)
        message = commit_message or f"Upload {repo_id.split('/')[-1]} (hf_efficient_attn variant)"
        return upload_variant(folder, repo_id, private=private, revision=revision, commit_message=message)
