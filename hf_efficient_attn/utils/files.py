"""Files written whole or not at all: a reader (a resumed run, a rerun, the model card) never meets
half of one, whenever the writer is killed."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(path: str | os.PathLike, value: Any, **options: Any) -> None:
    """Write ``value`` as indented JSON (``options``: more ``json.dump`` keywords) into a temporary
    file beside ``path``, then rename it over ``path``, which the OS does atomically."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as f:
        json.dump(value, f, indent=2, **options)
    os.replace(temporary, path)
