"""Method presets: JSON files ``{"attn_impl": name, "attn_config": {options}}`` (``configs/methods/``)."""

from __future__ import annotations

import json
import os
from typing import Any

from .registry import resolve_options


def load_preset(path: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """``(attn_impl, attn_config)`` of a preset file, options validated and defaults filled in."""
    with open(path) as f:
        preset = json.load(f)
    unknown = sorted(set(preset) - {"attn_impl", "attn_config"})
    if "attn_impl" not in preset or unknown:
        raise ValueError(f"{path}: a preset holds 'attn_impl' (required) and 'attn_config'; got keys {sorted(preset)}")
    name = preset["attn_impl"]
    return name, resolve_options(name, preset.get("attn_config")).to_dict()
