"""Small GLUE-format files of real English text (gensim's test data, offline), written in the
Hub's column layouts (``nyu-mll/glue``) as csv, tsv or json lines.

- single sentence (CoLA / SST-2 layout): Pang & Lee's movie-review sentences, real labels;
- pairs (MRPC / QQP / RTE layout): a news sentence and either the sentence that follows it in
  its article (label 1) or one from another article (label 0), real text, labels by rule;
- regression (STS-B layout): SimLex-999 word pairs with their real human similarity (0-10,
  scaled to STS-B's 0-5);
- MNLI: a news sentence as premise and as hypothesis its own first half (entailment), the next
  sentence of its article (neutral) or a sentence of another article (contradiction); the
  matched and mismatched sets come from different articles.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import random

from gensim.test.utils import datapath

from hf_efficient_attn.tasks.common.corpus import movie_review_sentences, news_articles, split_sentences

MNLI_NAMES = ("entailment", "neutral", "contradiction")


def write_rows(path: str, rows: list[dict]) -> str:
    """Rows as csv, tsv (tab-separated, quotes as text) or json lines, by the extension."""
    columns = list(rows[0])
    extension = path.rsplit(".", 1)[-1]
    with open(path, "w", encoding="utf-8") as f:
        if extension == "jsonl" or extension == "json":
            f.writelines(json.dumps(row) + "\n" for row in rows)
        elif extension == "tsv":
            f.write("\t".join(columns) + "\n")
            f.writelines("\t".join(str(row[c]) for c in columns) + "\n" for row in rows)
        else:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    return path


def single_sentence_rows() -> tuple[list[dict], list[dict]]:
    """150 training and 50 validation movie-review sentences (balanced), label 0/1."""
    rows = [{"sentence": s, "label": label} for s, label in movie_review_sentences()]
    validation = [r for i, r in enumerate(rows) if i % 4 == 3]
    return [r for i, r in enumerate(rows) if i % 4 != 3], validation


def _article_sentences(first: int, count: int) -> list[list[str]]:
    articles = news_articles()[first : first + count]
    return [[s for s in split_sentences(a) if 4 <= len(s.split()) <= 40] for a in articles]


def pair_rows(first_article: int, articles: int, seed: int) -> list[dict]:
    """``sentence1``/``sentence2`` pairs: consecutive sentences (1) or from different articles (0)."""
    rng = random.Random(seed)
    docs = [d for d in _article_sentences(first_article, articles) if len(d) >= 2]
    rows = []
    for i, doc in enumerate(docs):
        for a, b in itertools.pairwise(doc):
            if rng.random() < 0.5:
                rows.append({"sentence1": a, "sentence2": b, "label": 1})
            else:
                other = docs[(i + rng.randrange(1, len(docs))) % len(docs)]
                rows.append({"sentence1": a, "sentence2": rng.choice(other), "label": 0})
    return rows


def regression_rows() -> tuple[list[dict], list[dict]]:
    """SimLex-999 pairs: 160 training and 40 validation rows, label = similarity / 2 (0-5)."""
    with open(datapath("simlex999.txt"), encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split("\t") for line in f if not line.startswith("#")]
    rows = [{"sentence1": a, "sentence2": b, "label": float(score) / 2} for a, b, score in pairs[:200]]
    return rows[:160], rows[160:]


def mnli_rows(first_article: int, articles: int, seed: int, names: bool = True) -> list[dict]:
    """``premise``/``hypothesis`` rows with MNLI's three labels (names, or ids with ``names=False``)."""
    rng = random.Random(seed)
    docs = [d for d in _article_sentences(first_article, articles) if len(d) >= 2]
    rows = []
    for i, doc in enumerate(docs):
        for a, b in itertools.pairwise(doc):
            label = rng.randrange(3)
            if label == 0:
                words = a.split()
                hypothesis = " ".join(words[: max(3, len(words) // 2)])
            elif label == 1:
                hypothesis = b
            else:
                hypothesis = rng.choice(docs[(i + rng.randrange(1, len(docs))) % len(docs)])
            rows.append({"premise": a, "hypothesis": hypothesis, "label": MNLI_NAMES[label] if names else label})
    return rows


def write_task_files(folder: str, task: str) -> dict[str, str]:
    """``train``/``validation``/``test`` files (MNLI: also the mismatched ones) of ``task`` in
    ``folder``; the test files are the validation rows with Hub-style ``idx`` and label -1."""
    os.makedirs(folder, exist_ok=True)
    if task in ("cola", "sst2"):
        train, validation = single_sentence_rows()
        extension = "csv"
    elif task == "mrpc":
        train, validation = pair_rows(0, 40, seed=0), pair_rows(40, 12, seed=1)
        extension = "tsv"
    elif task == "stsb":
        train, validation = regression_rows()
        extension = "jsonl"
    elif task == "mnli":
        train, validation = mnli_rows(0, 30, seed=0), mnli_rows(30, 8, seed=1)
        mismatched = mnli_rows(60, 8, seed=2, names=False)  # ids, as on the Hub
        extension = "json"
    else:
        raise ValueError(task)
    files = {
        "train": write_rows(os.path.join(folder, f"train.{extension}"), train),
        "validation": write_rows(os.path.join(folder, f"validation.{extension}"), validation),
        "test": write_rows(os.path.join(folder, f"test.{extension}"), as_test(validation)),
    }
    if task == "mnli":
        files["validation_mismatched"] = write_rows(os.path.join(folder, f"validation_mm.{extension}"), mismatched)
        files["test_mismatched"] = write_rows(os.path.join(folder, f"test_mm.{extension}"), as_test(mismatched))
    return files


def as_test(rows: list[dict]) -> list[dict]:
    """The rows as the Hub's test split holds them: an ``idx`` column (here counting from 100,
    so that it differs from the row position) and label -1."""
    return [{"idx": 100 + i, **{k: v for k, v in row.items() if k != "label"}, "label": -1} for i, row in enumerate(rows)]
