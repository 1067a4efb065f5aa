"""Sharing variants on the Hugging Face Hub: the upload folder (weights, config with ``auto_map``,
tokenizer, the method's own code for ``trust_remote_code=True``, model card) and its upload."""

from .card import build_model_card
from .export import export_variant, load_variant, prepare_upload, variant_name
from .push import push_variant, upload_variant
from .remote_code import write_remote_code

__all__ = [
    "build_model_card",
    "export_variant",
    "load_variant",
    "prepare_upload",
    "push_variant",
    "upload_variant",
    "variant_name",
    "write_remote_code",
]
