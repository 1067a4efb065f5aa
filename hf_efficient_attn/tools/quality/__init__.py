"""How well each method approximates exact attention on real Q, K, V (``scripts/quality.py``).

1. :func:`capture_qkv` records the query/key/value projections of every self-attention layer
   of a real pretrained encoder (forward hooks on the ``query``/``key``/``value`` Linear
   modules) run with exact attention on real text. For inputs longer than the position table
   the model is a copy with the table tiled to the needed length (the Longformer recipe,
   :func:`hf_efficient_attn.extend_position_embeddings`); the copy is only there to obtain
   realistic Q/K/V statistics at long lengths, it is not a trained long model.
2. :func:`evaluate_method` runs a method (eval mode, ``scaling = D**-0.5``) on each layer's
   captured (B, H, N, D) tensors and compares it with exact attention computed in float64:

   - relative Frobenius error ``||A V - R||_F / ||A V||_F`` (the MRA paper, Zeng et al.
     ICML 2022, section 5.1), and
   - relative spectral-norm error ``||A V - R||_2 / ||A V||_2`` (Skeinformer, Chen, Zeng et al.
     NAACL 2022, section 5, and Skyformer, Chen et al. NeurIPS 2021, section 5, report the
     spectral norm ``||B V - R||_2``
     of the difference, with ``B = D^-1 A``, as a "percentage score"; we divide by
     ``||B V||_2`` so that heads of different scale average sensibly; the absolute value is
     kept as ``spec_abs``),

   each per (text, head) N x D matrix, then averaged over texts, heads and layers; plus the
   wall time of the call. Methods that approximate another kernel (``approximates_softmax``
   False: YOSO, Skyformer, kernelized attention) are measured against softmax too, and also
   against their own exact kernel (the method class's ``exact_reference``).
3. :func:`embedding_agreement` swaps the attention of the whole pretrained model without any
   training (as in the MRA paper's Table 1, "Before" column) and compares mean-pooled sentence
   embeddings with exact attention's.

Modules: ``budgets`` (the grid of budgets per method), ``capture`` (real Q/K/V), ``errors``
(measuring a method against exact attention), ``report`` (tables, the papers' claims, plot),
``embeddings`` (whole-model agreement) and ``cli`` (the command line).
"""

from .budgets import SWEEPS, budget_grid, budget_size
from .capture import capture_qkv, long_articles, tokenize_windows
from .cli import main
from .embeddings import EmbeddingAgreement, embedding_agreement, embedding_markdown
from .errors import (
    EXACT,
    QualityResult,
    evaluate,
    evaluate_method,
    exact_reference,
    exact_softmax_attention,
    exact_time_ms,
    relative_errors,
)
from .report import check_claims, markdown_table, plot, rows

__all__ = [
    "SWEEPS",
    "EXACT",
    "EmbeddingAgreement",
    "QualityResult",
    "budget_grid",
    "budget_size",
    "capture_qkv",
    "check_claims",
    "embedding_agreement",
    "embedding_markdown",
    "evaluate",
    "evaluate_method",
    "exact_reference",
    "exact_softmax_attention",
    "exact_time_ms",
    "long_articles",
    "main",
    "markdown_table",
    "plot",
    "relative_errors",
    "rows",
    "tokenize_windows",
]
