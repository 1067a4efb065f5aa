"""``scripts/quality.py``: the quality study on the command line."""

from __future__ import annotations

import csv
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Sequence

import torch
import transformers

from ...registry import list_methods
from ...tasks.common.args import (
    check_model_source,
    check_positive_flags,
    parse_arguments,
    parse_method_configs,
    parse_method_names,
)
from ...tasks.common.corpus import news_articles, news_sentences, wikipedia_articles
from ..minilm import minilm_path
from .budgets import budget_grid
from .capture import capture_qkv, long_articles
from .embeddings import embedding_agreement, embedding_markdown
from .errors import QualityResult, evaluate
from .report import check_claims, markdown_table, plot, rows

DESCRIPTION = """Approximation error vs time of every method on real Q/K/V of a pretrained checkpoint
(all-MiniLM-L6-v2) on real English Wikipedia text; optionally (--embeddings), agreement of sentence
embeddings after swapping attention without training. The method and results: docs/benchmarks.md.

Default: the error study alone (--errors on, --embeddings off), of every method at each of --seq_lens.
Reads: --model_name_or_path (a folder or Hub id of an encoder checkpoint), else all-MiniLM-L6-v2 from
pip; the texts of gensim's test data (Wikipedia articles, news sentences and articles).
Writes: into --output_dir: quality.md (the report); the error study: quality.csv, quality.png and
meta.json (the model, the texts and the budget grid); --embeddings: embeddings.csv.

examples:
  python scripts/quality.py --seq_lens 512 --methods mra2,nystromformer
  python scripts/quality.py --embeddings --no_errors --attn_config '{"mra2": {"block_per_row": 8}}'
"""


@dataclass
class QualityArguments:
    """The flags of ``scripts/quality.py``, checked on construction."""

    no_flag_help: ClassVar[dict[str, str]] = {"errors": "Skip the error study: only --embeddings, which must then be given."}

    methods: str | None = field(
        default=None,
        metadata={"help": f"Methods, comma-separated. Default: every method ({','.join(list_methods())})."},
    )
    attn_config: str | None = field(
        default=None,
        metadata={
            "help": "Options per method, a JSON object keyed by method name, e.g. "
            '\'{"mra2": {"initial_prior_first_n_blocks": 1}}\'. The error study sweeps each '
            "method's budget option over its grid, the other options as given; --embeddings uses "
            "them all. A method left out runs at its defaults."
        },
    )
    seq_lens: list[int] = field(
        default_factory=lambda: [512, 2048],
        metadata={
            "help": "Sequence lengths of the error study, space-separated (beyond 512 the position table is tiled on a copy)."
        },
    )
    errors: bool = field(default=True, metadata={"help": "Measure the errors and times at --seq_lens."})
    embeddings: bool = field(
        default=False,
        metadata={"help": "Also compare sentence embeddings of the swapped model with exact attention."},
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Checkpoint folder or Hub id. Default: all-MiniLM-L6-v2 from pip."}
    )
    num_texts: int = field(default=4, metadata={"help": "Wikipedia articles per sequence length (4x as many for --embeddings)."})
    num_sentences: int = field(default=256, metadata={"help": "News sentences for --embeddings."})
    num_articles: int = field(
        default=64, metadata={"help": "Whole news articles (up to 512 tokens, padded batches) for --embeddings."}
    )
    threads: int = field(default=2, metadata={"help": "torch CPU threads."})
    repeats: int = field(
        default=3, metadata={"help": "Timed calls per layer after a warm-up call (the fastest counts); 0: time that call."}
    )
    output_dir: str = field(default="outputs/quality", metadata={"help": "Folder for the report, tables and plot."})

    def __post_init__(self) -> None:
        if not (self.errors or self.embeddings):
            raise ValueError("nothing to do: --no_errors without --embeddings")
        check_positive_flags(self, "num_texts", "num_sentences", "num_articles", "threads")
        if self.repeats < 0:
            raise ValueError(f"--repeats must be 0 or more, got {self.repeats}")
        if any(n < 2 for n in self.seq_lens):
            raise ValueError(f"--seq_lens must be integers of 2 or more, got {self.seq_lens}")
        check_model_source("model_name_or_path", self.model_name_or_path)
        self.method_names = parse_method_names(self.methods, list_methods(), list_methods())
        self.method_configs = parse_method_configs(self.attn_config, self.method_names)


def _write_csv(path: str, records: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of ``scripts/quality.py``."""
    (args,) = parse_arguments([QualityArguments], argv, description=DESCRIPTION)
    torch.set_num_threads(args.threads)
    os.makedirs(args.output_dir, exist_ok=True)
    path = args.model_name_or_path or minilm_path()
    methods, configs = args.method_names, args.method_configs
    report: list[str] = [f"# Approximation quality on real Q/K/V ({path})", ""]
    if configs:
        report += [f"Options (--attn_config): {json.dumps(configs)}", ""]
    results: list[QualityResult] = []

    if args.errors:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        model = transformers.AutoModel.from_pretrained(path).eval()
        meta: dict[str, Any] = {"model": path, "threads": args.threads, "attn_config": configs, "grid": {}, "texts": {}}
        for seq_len in args.seq_lens:
            articles = long_articles(tokenizer, seq_len, args.num_texts)
            meta["texts"][seq_len] = [title for title, _ in articles]
            meta["grid"][seq_len] = budget_grid(methods, seq_len)
            start = time.perf_counter()
            layers = capture_qkv(model, tokenizer, [text for _, text in articles], seq_len)
            q = layers[0][0]
            print(
                f"n={seq_len}: captured {len(layers)} layers of q/k/v {tuple(q.shape)} from "
                f"{', '.join(meta['texts'][seq_len])} in {time.perf_counter() - start:.1f}s",
                flush=True,
            )

            def progress(r: QualityResult) -> None:
                status = r.error or f"fro {r.fro:.4f} spec {r.spec:.4f} {r.ms:.2f} ms (exact {r.exact_ms:.2f})"
                print(f"  {r.method} {r.option}={r.value}: {status}", flush=True)

            results += evaluate(layers, methods, attn_configs=configs, repeats=args.repeats, progress=progress)
            del layers
        _write_csv(os.path.join(args.output_dir, "quality.csv"), rows(results))
        plot(results, os.path.join(args.output_dir, "quality.png"))
        with open(os.path.join(args.output_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2, default=str)
        report += [
            "Q, K, V: outputs of every layer's query/key/value projections of the unmodified model (exact "
            "attention) on the first n tokens of real English Wikipedia articles (gensim's shortened dump); "
            "for n > 512 the 512-entry position table is tiled on a copy of the model (Longformer recipe), "
            "only to obtain realistic Q/K/V statistics at long lengths. Errors per (text, head) N x D output "
            "matrix against exact softmax in float64, averaged over "
            f"{args.num_texts} texts x all heads x all layers (± = standard error). Relative spectral error "
            "= ||AV - R||_2 / ||AV||_2 (the Skeinformer paper, Chen, Zeng et al. NAACL 2022, reports ||BV - R||_2; "
            "the absolute value is in the CSV as "
            "spec_abs). Time: wall time of one layer's call (all heads) per sequence, fastest of "
            f"{args.repeats} calls after a warm-up, median over layers, CPU, "
            f"{args.threads} threads. Methods marked (not softmax) approximate another kernel by design; "
            "their error against their own exact kernel is in the last column. Linformer's projections are "
            "at their (untrained) initialisation.",
            "",
            markdown_table(results),
            "## The papers' claims on these numbers",
            "",
            "```",
            *check_claims(results),
            "```",
            "",
        ]

    if args.embeddings:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        records = []
        report += [
            "## Embeddings of the whole model with its attention swapped, no training",
            "",
            "Each method at its defaults replaces every layer's attention of the pretrained checkpoint "
            "(as the MRA paper, Zeng et al. ICML 2022, Table 1, 'Before' finetuning); "
            "mean-pooled last hidden states over real tokens "
            "compared with the unmodified model's. Padded batches. A method whose budget covers a short "
            "input is exact there (e.g. MRA-2's 4 x 32-token blocks per row, Skeinformer's 256 samples).",
            "",
        ]
        for corpus, texts, max_length, batch_size in (
            ("news sentences", news_sentences()[: args.num_sentences], 128, 32),
            ("whole news articles, truncated to 512 tokens", news_articles()[: args.num_articles], 512, 8),
            ("Wikipedia articles, first 512 tokens", wikipedia_articles(min_words=600)[: args.num_texts * 4], 512, 4),
        ):
            lengths = [min(len(ids), max_length) for ids in tokenizer(list(texts))["input_ids"]]
            what = f"{len(texts)} {corpus}; {min(lengths)}-{max(lengths)} tokens, median {int(statistics.median(lengths))}"
            agreement = embedding_agreement(
                methods, texts, model_path=path, attn_configs=configs, batch_size=batch_size, max_length=max_length
            )
            for r in agreement:
                print(f"  {corpus} {r.method}: {r.error or f'cos {r.cosine_mean:.4f} (min {r.cosine_min:.4f})'}")
                records.append({"texts": corpus, **asdict(r)})
            report.append(embedding_markdown(agreement, what))
        _write_csv(os.path.join(args.output_dir, "embeddings.csv"), records)

    with open(os.path.join(args.output_dir, "quality.md"), "w") as f:
        f.write("\n".join(report))
    print("\n".join(report))
    print(f"wrote {args.output_dir}/quality.md" + (", quality.csv, quality.png" if args.errors else ""))
