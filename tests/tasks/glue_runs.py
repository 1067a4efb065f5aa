"""Running finetune_glue.py in tests: a workspace (tiny models and task files of real text), a whole
configuration and its command line, and readers of what a run writes."""

import json

from glue_fixtures import write_task_files
from training_fixtures import save_tiny_mlm

from hf_efficient_attn.tasks.glue import main

SEQ = 64


def make_workspace(root):
    """Tiny models (one without dropout) and CoLA, MRPC, STS-B and MNLI files of real text under ``root``."""
    return {
        "root": root,
        "model": save_tiny_mlm(str(root / "tiny")),
        "no_dropout": save_tiny_mlm(str(root / "tiny-no-dropout"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
        "files": {task: write_task_files(str(root / task), task) for task in ("cola", "mrpc", "stsb", "mnli")},
    }


def run_config(workspace, task, output_dir, **overrides):
    """A whole configuration of finetune_glue.py (flag -> value); ``None`` drops a flag."""
    files = workspace["files"][task]
    config = {
        "model_name_or_path": workspace["model"], "attn_impl": "mra2", "attn_config": {"block_size": 16},
        "task_name": task, "train_file": files["train"], "validation_file": files["validation"],
        "test_file": files["test"], "max_seq_length": SEQ, "do_train": True, "do_eval": True, "do_predict": True,
        "max_steps": 6, "per_device_train_batch_size": 16, "per_device_eval_batch_size": 16, "learning_rate": 2e-3,
        "logging_steps": 1, "report_to": "none", "disable_tqdm": True, "seed": 7, "use_cpu": True,
        "output_dir": str(output_dir),
    }  # fmt: skip
    if task == "mnli":
        config.update(validation_mismatched_file=files["validation_mismatched"], test_mismatched_file=files["test_mismatched"])
    config.update(overrides)
    return {key: value for key, value in config.items() if value is not None}


def argv(config):
    """The configuration as command-line flags."""
    args = []
    for key, value in config.items():
        if isinstance(value, list):
            args += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            args += [f"--{key}", json.dumps(value)]
        else:
            args += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return args


def run(workspace, task, output_dir, **overrides):
    return main(argv(run_config(workspace, task, output_dir, **overrides)))


def read_rows(path):
    if path.endswith((".json", ".jsonl")):
        return [json.loads(line) for line in read_text(path).splitlines()]
    import pandas as pd

    return pd.read_csv(path, sep="\t" if path.endswith(".tsv") else ",", quoting=3 if path.endswith(".tsv") else 0).to_dict(
        "records"
    )


def read_text(path):
    with open(path) as f:
        return f.read()


def predictions_file(path):
    lines = read_text(path).splitlines()
    assert lines[0] == "index\tprediction"
    return [line.split("\t") for line in lines[1:]]
