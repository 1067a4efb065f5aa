"""Tiny models and real text for the conversion and training tests.

The tokenizer is real WordPiece: all-MiniLM-L6-v2's tokenizer retrained by Transformers'
``train_new_from_iterator`` on the real Lee news corpus with an 800-token vocabulary, so that
tiny models train in seconds on CPU (the 30k vocabulary's output layer would dominate).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import subprocess
import sys
from typing import Callable, Iterator

import paths
import tiny
import transformers as T

from hf_efficient_attn.tasks.common import trainer as crash_safe_trainer
from hf_efficient_attn.tasks.common.corpus import news_articles
from hf_efficient_attn.tools.minilm import minilm_path

REPO = str(paths.REPO)
VOCAB = 800


@functools.lru_cache(maxsize=None)
def small_tokenizer() -> T.PreTrainedTokenizerBase:
    return T.AutoTokenizer.from_pretrained(minilm_path()).train_new_from_iterator(news_articles(), vocab_size=VOCAB)


def tiny_config(model_type: str = "bert", max_positions: int = 130, **overrides) -> T.PretrainedConfig:
    tokenizer = small_tokenizer()
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        pad_token_id=tokenizer.pad_token_id,
    )
    if model_type == "longformer":
        common.update(attention_window=[64, 64], max_position_embeddings=max_positions + tokenizer.pad_token_id + 1)
    else:
        common.update(max_position_embeddings=max_positions)
    # The shape the tests' tiny models of issue 55's architectures need (tiny.py), with this tokenizer's padding.
    shape = {key: value for key, value in tiny.DISPATCHING_ARCHITECTURES.get(model_type, {}).items() if key != "pad_token_id"}
    return T.AutoConfig.for_model(model_type, **{**common, **shape, **overrides})


def save_tiny_mlm(path: str, model_type: str = "bert", seed: int = 0, **overrides) -> str:
    """A randomly initialised tiny masked-LM checkpoint with the small tokenizer, at ``path``."""
    T.set_seed(seed)
    model = T.AutoModelForMaskedLM.from_config(tiny_config(model_type, **overrides))
    model.save_pretrained(path)
    small_tokenizer().save_pretrained(path)
    return path


def write_news_files(folder: str, train_articles: int = 60, validation_articles: int = 12) -> tuple[str, str]:
    """Real news text as txt files, one article per line."""
    articles = news_articles()
    train = os.path.join(folder, "train.txt")
    validation = os.path.join(folder, "validation.txt")
    with open(train, "w") as f:
        f.write("\n".join(articles[:train_articles]) + "\n")
    with open(validation, "w") as f:
        f.write("\n".join(articles[train_articles : train_articles + validation_articles]) + "\n")
    return train, validation


@contextlib.contextmanager
def default_library_logging() -> Iterator[None]:
    """Within the block, Transformers and ``datasets`` start at their defaults (warnings, progress bars
    on) and this package's logger unset; afterwards each is as it was (a run sets them for the process)."""
    import datasets.utils.logging as datasets_logging

    libraries = (T.utils.logging, datasets_logging)
    saved = [(library.get_verbosity(), library.is_progress_bar_enabled()) for library in libraries]
    own = logging.getLogger("hf_efficient_attn.tasks")
    own_level = own.level
    for library in libraries:
        library.set_verbosity_warning()
        library.enable_progress_bar()
    own.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        for library, (verbosity, bars) in zip(libraries, saved):
            library.set_verbosity(verbosity)
            (library.enable_progress_bar if bars else library.disable_progress_bar)()
        own.setLevel(own_level)


def read_json(folder: str, name: str) -> dict:
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def run_script(args: list[str], launcher: list[str] | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a command (e.g. torchrun/accelerate launch of a script) with this repository importable."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    command = (launcher or [sys.executable]) + args
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}")
    return result


#: Two gloo CPU processes, each launcher keyed by the output folder the tests give it.
TWO_PROCESS_LAUNCHERS = {
    "two": [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node", "2"],
    "accelerate": [os.path.join(os.path.dirname(sys.executable), "accelerate"), "launch", "--config_file",
                   "configs/accelerate/cpu-2proc.yaml"],
}  # fmt: skip


def run_on_two_processes(args_for: Callable[[str], list[str]], folder) -> None:
    """Run the script ``args_for(output_dir)`` under torchrun and under ``accelerate launch``, into
    ``folder``/two and ``folder``/accelerate; each run must have started a second process."""
    for name, launcher in TWO_PROCESS_LAUNCHERS.items():
        result = run_script(args_for(os.path.join(folder, name)), launcher=launcher)
        assert "process rank 1 of 2" in result.stdout + result.stderr, name


def logged_losses(output_dir) -> list[float]:
    """The training losses Trainer logged, in order."""
    return [e["loss"] for e in read_json(output_dir, "trainer_state.json")["log_history"] if "loss" in e]


class Captured(Exception):
    """Raised instead of building the Trainer (:func:`capture_trainer`); ``kwargs`` are what the
    pipeline would have given it: ``train_dataset``, ``eval_dataset``, ``data_collator``, ``model``, ..."""

    def __init__(self, kwargs: dict):
        super().__init__("Trainer captured")
        self.kwargs = kwargs


def capture_trainer(monkeypatch) -> None:
    """Make the pipelines stop where they build their Trainer (each imports the class there), raising
    :class:`Captured`: the data, masks and collator a run would train on, without training."""

    def record(*args, **kwargs):
        raise Captured(kwargs)

    monkeypatch.setattr(crash_safe_trainer, "CrashSafeTrainer", record)


class TrainingSet(T.TrainerCallback):
    """A callback for a script's ``main(argv, callbacks=[...])`` that keeps the examples it trains on."""

    examples = None

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.examples = train_dataloader.dataset


def tokens_of(value) -> int:
    """Number of tokens of an example's ``input_ids`` (a list, or a list of chunks)."""
    return sum(tokens_of(item) for item in value) if isinstance(value, list) else 1


def assert_summary_rate(summary: str, train_metrics: dict, examples) -> None:
    """The summary's ``train N tokens/s`` is Trainer's examples per second times the mean tokens of a
    training example (counted here, row by row)."""
    mean = sum(tokens_of(ids) for ids in examples["input_ids"]) / len(examples)
    assert f", train {train_metrics['train_samples_per_second'] * mean:,.0f} tokens/s (" in summary, summary


def recorded_rows(folder, step: int, ranks: int = 1) -> list[tuple]:
    """The examples (every tensor's row, as tuples) that processes ``0..ranks-1`` trained on at
    optimisation step ``step`` (``tests/tasks/record_batches.py``), sorted: the same for one process
    with the whole batch and for two processes with half of it each."""
    import torch

    rows = []
    for rank in range(ranks):
        batch = torch.load(os.path.join(folder, f"rank{rank}-step{step}.pt"))
        keys = sorted(batch)
        rows += [tuple(tuple(batch[key][i].flatten().tolist()) for key in keys) for i in range(len(batch[keys[0]]))]
    return sorted(rows)
