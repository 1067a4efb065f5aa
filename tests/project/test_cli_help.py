"""Every script's ``--help`` (the scripts of tests/project/flag_table.py): it opens with what the script does,
what it reads and what it writes (a line ``Reads:`` and a line ``Writes:``, as ``parse_arguments``'
docstring asks); no flag shows ``(default: None)``, a required flag shows no default, a help that
states its default in words gets no second one; every ``--no_X`` flag says what it does, not the
positive's text. A misspelled flag's "did you mean" names the flag meant, and a flag that a script
lacks on purpose (GLUE's text columns) is answered with what it does instead, which works."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re

import pytest
from flag_table import SCRIPT_MAINS, script_main
from glue_fixtures import write_rows
from training_fixtures import Captured, capture_trainer, save_tiny_mlm, small_tokenizer

from hf_efficient_attn.tasks.common import args

#: The scripts that train as Transformers' examples do, and what those write into --output_dir (with
#: provenance.json, push_to_hub.py's card).
TRAINING_SCRIPTS = ("finetune_glue", "finetune_wikihop", "pretrain_mlm")
TRAINING_OUTPUTS = ("train_results.json", "eval_results.json", "all_results.json", "trainer_state.json", "provenance.json")


@functools.lru_cache(maxsize=None)
def script_help(script: str) -> tuple[str, argparse.ArgumentParser]:
    """The text ``script --help`` prints (one flag's help per line: a wide terminal) and its parser."""
    parsers = []

    class RecordingParser(args.HfArgumentParser):
        def __init__(self, dataclass_types, **kwargs):
            super().__init__(dataclass_types, **kwargs)
            parsers.append(self)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        patch.setattr(args, "HfArgumentParser", RecordingParser)
        patch.setenv("COLUMNS", "1000")
        script_main(script)(["--help"])
    return out.getvalue(), parsers[0]


def description(text: str) -> str:
    """The part of a --help between the usage and the flags."""
    return text.split("\n\n", 1)[1].split("\noptions:\n", 1)[0]


def flag_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each flag's help as --help shows it (its default added by the formatter, if any)."""
    formatter = parser._get_formatter()
    return {action.option_strings[0]: formatter._expand_help(action) for action in parser._actions if action.help}


@pytest.mark.parametrize("script", sorted(SCRIPT_MAINS))
def test_help_opens_with_what_the_script_does_reads_and_writes(script):
    text, _ = script_help(script)
    described = description(text)
    lines = described.splitlines()
    assert lines and lines[0].strip() and not lines[0].startswith(("Reads:", "Writes:", "Default:")), described
    reads = [line for line in lines if line.startswith("Reads: ")]
    writes = "\n".join(described.split("\nWrites: ", 1)[1:])
    assert len(reads) == 1 and writes, described
    if script in TRAINING_SCRIPTS:  # the files of Transformers' examples, by name
        assert all(name in writes for name in TRAINING_OUTPUTS), writes
        assert "--output_dir" in writes and "model and tokenizer" in writes


@pytest.mark.parametrize("script", sorted(SCRIPT_MAINS))
def test_no_unset_required_or_doubled_default_is_shown(script):
    text, parser = script_help(script)
    assert "(default: None)" not in text
    helps = flag_helps(parser)
    for action in parser._actions:
        if action.help in (None, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
            continue
        shown, written = helps[action.option_strings[0]], action.help.replace("%%", "%")
        assert shown.startswith(written)
        added = shown[len(written) :]  # what --help adds to the help text
        unset = action.default is None or action.default == [] or action.default == ""
        negative = isinstance(action, argparse._StoreFalseAction)  # its default is the positive's
        if action.required or unset or negative or re.search(r"\bdefault", action.help, re.IGNORECASE):
            assert not added, f"{action.option_strings[0]}: {shown}"
        else:
            assert added == f" (default: {action.default})", f"{action.option_strings[0]}: {shown}"


@pytest.mark.parametrize("script", sorted(SCRIPT_MAINS))
def test_every_negative_flag_says_what_it_does(script):
    _, parser = script_help(script)
    positives = {a.dest: a for a in parser._actions if not isinstance(a, argparse._StoreFalseAction)}
    negatives = [a for a in parser._actions if isinstance(a, argparse._StoreFalseAction)]
    for negative in negatives:
        positive = positives[negative.dest]
        assert negative.option_strings[0] == f"--no_{negative.dest}"
        assert negative.help and negative.help != positive.help, negative.option_strings[0]
    if script == "finetune_glue":  # the three kinds: the package's own text, the generic one, a refusal
        helps = {a.option_strings[0]: a.help for a in negatives}
        assert helps["--no_pad_to_max_length"].startswith("Pad each batch to its longest example")
        assert helps["--no_skip_memory_metrics"] == "Turn off --skip_memory_metrics (on unless this is given)."
        assert helps["--no_use_fast_tokenizer"].startswith("Refused")


#: (script, misspelled flag, the flag meant): typos, abbreviations, other tools' names, wrong separators.
MISSPELLINGS = [
    ("finetune_glue", "--lerning_rate", "--learning_rate"),
    ("finetune_glue", "--task", "--task_name"),
    ("finetune_glue", "--out-dir", "--output_dir"),
    ("finetune_glue", "--max_seq_lenght", "--max_seq_length"),
    ("finetune_glue", "--maxseqlength", "--max_seq_length"),
    ("finetune_glue", "--num_epochs", "--num_train_epochs"),
    ("finetune_glue", "--batch_size", "--per_device_train_batch_size"),
    ("finetune_glue", "--lr", "--learning_rate"),
    ("finetune_glue", "--model", "--model_name_or_path"),
    ("finetune_glue", "--attn_implementation", "--attn_impl"),
    ("finetune_glue", "--seeed", "--seed"),
    ("pretrain_mlm", "--text_column", "--text_column_name"),
    ("pretrain_mlm", "--mlm_prob", "--mlm_probability"),
    ("benchmark", "--out_dir", "--output_dir"),
    ("benchmark", "--thread", "--threads"),
    ("benchmark", "--seq_len", "--seq_lens"),
]


#: The required flags of the scripts above (argparse asks for those before any unknown flag is looked at).
REQUIRED = {"finetune_glue": ["--model_name_or_path", "m"], "pretrain_mlm": ["--model_name_or_path", "m"]}


@pytest.mark.parametrize("script, typed, meant", MISSPELLINGS)
def test_did_you_mean_names_the_flag_meant(script, typed, meant):
    with pytest.raises(ValueError) as raised:
        script_main(script)([*REQUIRED.get(script, []), typed, "1"])
    assert f"unknown flag {typed} (did you mean {meant}?)" in str(raised.value)


@pytest.mark.parametrize(
    "script, typed", [("finetune_glue", "--lr_schedule_kind"), ("benchmark", "--lr"), ("quality", "--text_column")]
)
def test_no_suggestion_without_a_plausible_flag(script, typed):
    with pytest.raises(ValueError, match=f"unknown flag {typed} \\(see") as raised:
        script_main(script)([*REQUIRED.get(script, []), typed, "1"])
    assert "did you mean" not in str(raised.value)


@pytest.mark.parametrize(
    "typed, answer",
    [("--text_column", "takes the text columns from --task_name, else from the data"),
     ("--label_column", "reads the labels from the column named label")],
)  # fmt: skip
def test_glue_answers_a_column_flag_with_how_it_chooses_columns(typed, answer, tmp_path):
    """Transformers' run_classification.py has --text_column_names / --label_column_name; GLUE chooses
    its columns itself. Not --length_column_name (a TrainingArguments flag about something else)."""
    config = str(write_json(tmp_path / "c.json", {typed[2:]: "sentence"}))
    for argv in ([*REQUIRED["finetune_glue"], typed, "sentence"], [config]):
        with pytest.raises(ValueError) as raised:
            script_main("finetune_glue")(argv)
        assert answer in str(raised.value) and "did you mean" not in str(raised.value), str(raised.value)


def write_json(path, values: dict):
    import json

    path.write_text(json.dumps(values))
    return path


def test_the_glue_column_advice_works(tmp_path, monkeypatch):
    """The advice taken: without --task_name the text is sentence1 and sentence2 when both are there
    (other string columns ignored), else the first string column besides label and idx (an integer id
    skipped); the labels are the label column's; with --task_name the task's columns."""
    model = save_tiny_mlm(str(tmp_path / "model"))
    tokenizer = small_tokenizer()
    texts = ["a first real sentence here", "the second one", "and a third", "the last of them"]
    pairs = [{"note": "ignored", "sentence2": t[::-1], "sentence1": t, "label": f"c{i % 2}"} for i, t in enumerate(texts)]
    single = [{"id": 10 + i, "review": t, "label": f"c{i % 2}"} for i, t in enumerate(texts)]
    sst2 = [{"idx": i, "sentence": t, "label": i % 2} for i, t in enumerate(texts)]
    cases = {
        "pairs": (pairs, [], lambda r: (r["sentence1"], r["sentence2"])),
        "single": (single, [], lambda r: (r["review"],)),
        "sst2": (sst2, ["--task_name", "sst2"], lambda r: (r["sentence"],)),
    }
    capture_trainer(monkeypatch)
    for name, (rows, flags, text_of) in cases.items():
        path = write_rows(str(tmp_path / f"{name}.csv"), rows)
        argv = ["--model_name_or_path", model, "--train_file", path, "--do_train", "--max_seq_length", "32",
                "--no_pad_to_max_length", "--report_to", "none", "--output_dir", str(tmp_path / name), *flags]  # fmt: skip
        with pytest.raises(Captured) as captured:
            script_main("finetune_glue")(argv)
        train = captured.value.kwargs["train_dataset"]
        expected = [tokenizer(*text_of(r), truncation=True, max_length=32)["input_ids"] for r in rows]
        assert train["input_ids"] == expected, name
        names = captured.value.kwargs["model"].config.id2label
        label_of = (lambda r: ("negative", "positive")[r["label"]]) if flags else (lambda r: r["label"])
        assert [names[i] for i in train["labels"]] == [label_of(r) for r in rows], name
