"""How well each method approximates exact attention on real Q, K, V (``scripts/quality.py``).

:func:`capture_qkv` records the query/key/value projections of a real pretrained encoder's layers
on real text; :func:`evaluate_method` runs a method on them and measures its relative Frobenius and
spectral errors against exact attention in float64 (and against its own exact kernel);
:func:`embedding_agreement` swaps the whole model's attention without training and compares
sentence embeddings. The method and results: docs/benchmarks.md (Approximation quality on real data).

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
