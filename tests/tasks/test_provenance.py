"""Every folder of a convert -> pretrain -> fine-tune chain records where it came from
(``provenance.json``), so that ``push_to_hub.py --model_dir D --repo_id R --dry_run OUT`` needs
nothing else, and the card it writes is true: every stage (MLM included), Hub dataset ids only in
``datasets:``, the base model and license of the checkpoint the chain started from."""

from __future__ import annotations

import json
import os

import datasets
import pytest
from glue_fixtures import write_task_files
from huggingface_hub import ModelCard
from training_fixtures import save_tiny_mlm, write_news_files

import hf_efficient_attn as hea
from hf_efficient_attn.hub import cli
from hf_efficient_attn.hub.card import hub_datasets
from hf_efficient_attn.hub.export import trained_task
from hf_efficient_attn.tasks import glue
from hf_efficient_attn.tasks.common.provenance import read_provenance
from hf_efficient_attn.tasks.convert import convert_to_long
from hf_efficient_attn.tasks.mlm import pretrain as mlm
from hf_efficient_attn.utils.cli_errors import run_cli

BASE = "google-bert/bert-base-uncased"
COMMON = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--max_seq_length", "64", "--report_to", "none",
          "--disable_tqdm", "true", "--do_train", "--do_eval", "--max_eval_samples", "8"]  # fmt: skip


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """A tiny checkpoint whose card names its license (as a Hub download's does), converted with
    --base_model, pretrained on local text, fine-tuned on local CoLA-layout files (and predicting a
    test file)."""
    root = tmp_path_factory.mktemp("chain")
    source = save_tiny_mlm(str(root / "source"))
    (root / "source" / "README.md").write_text("---\nlicense: mit\n---\n# a checkpoint\n")
    convert_to_long(source, 128, "mra2", {"block_size": 16}, output_dir=str(root / "long"), base_model=BASE)
    train, validation = write_news_files(str(root))
    mlm.main(["--model_name_or_path", str(root / "long"), "--train_file", train, "--validation_file", validation,
              "--output_dir", str(root / "mlm"), *COMMON])  # fmt: skip
    cola = write_task_files(str(root / "cola"), "cola")
    glue.main(["--model_name_or_path", str(root / "mlm"), "--task_name", "cola", "--train_file", cola["train"],
               "--validation_file", cola["validation"], "--test_file", cola["test"], "--do_predict",
               "--output_dir", str(root / "glue"), *COMMON])  # fmt: skip
    return root


def test_each_folder_records_its_stages(chain):
    records = {name: read_provenance(chain / name) for name in ("long", "mlm", "glue")}
    for record in records.values():
        assert (record["base_model"], record["license"]) == (BASE, "mit")
    assert [s["stage"] for s in records["glue"]["stages"]] == ["conversion", "masked-LM pretraining",
                                                               "GLUE COLA fine-tuning"]  # fmt: skip
    assert records["mlm"]["stages"] == records["glue"]["stages"][:2]  # each stage extends its source's record
    pretraining = records["glue"]["stages"][1]
    results = json.loads((chain / "mlm" / "all_results.json").read_text())
    assert pretraining["data"] == {"files": {"train_file": "train.txt", "validation_file": "validation.txt"}}
    assert (pretraining["steps"], pretraining["global_batch_size"], pretraining["max_seq_length"]) == (2, 8, 64)
    assert pretraining["eval"]["eval_accuracy"] == results["eval_accuracy"]
    assert pretraining["eval"]["perplexity"] == results["perplexity"]


def test_push_with_only_the_folder_the_repo_and_the_dry_run(chain, tmp_path, capsys):
    out = tmp_path / "upload"
    run_cli(cli.main, ["--model_dir", str(chain / "glue"), "--repo_id", "me/tiny-cola", "--dry_run", str(out)])
    captured = capsys.readouterr()
    assert "warning" not in captured.err  # base model and license were recorded
    assert "https://huggingface.co/me/tiny-cola" in captured.out
    for name in ("README.md", "config.json", "model.safetensors", "modeling_efficient_attn.py"):
        assert f"  {name} " in captured.out

    card = ModelCard.load(out / "README.md")
    assert (card.data.base_model, card.data.license) == (BASE, "mit")
    assert card.data.datasets is None  # local files only: no Hub dataset id to list
    assert "Converted from `google-bert/bert-base-uncased`" in card.text
    assert "Masked-LM pretraining (`pretrain_mlm.py`, attention `mra2`): 2 steps" in card.text
    for stage in read_provenance(chain / "glue")["stages"][1:]:  # each training stage's own numbers
        assert (
            f"of {stage['global_batch_size']} examples ({stage['epochs']:.3g} epochs over {stage['train_samples']} "
            f"training examples), each example up to {stage['max_seq_length']} tokens, learning rate "
            f"{stage['learning_rate']:g}" in card.text
        )
    assert card.text.count("examples), each example up to 64 tokens, learning rate 5e-05") == 2
    assert "GLUE COLA fine-tuning (`finetune_glue.py`" in card.text
    assert "local files (`train.txt` for training, `validation.txt` for evaluation; not on the Hub)" in card.text
    accuracy = json.loads((chain / "mlm" / "all_results.json").read_text())["eval_accuracy"]
    assert f"accuracy {accuracy:.4g}" in card.text
    assert "`output_attentions=True` raises a ValueError" in card.text
    assert "newly initialised" not in card.text  # trained


def test_card_of_local_data_records_the_run_as_it_was(chain, tmp_path):
    """A model fine-tuned on local files, its results file alone (no Hub dataset; docs/hub.md's command on
    a tiny model): the model-index's
    dataset loads the evaluation file (type: the `datasets` builder; args: its data_files); the
    training record holds trainer_state.json's steps and epochs and train_results.json's examples,
    lists the files trained and evaluated on but not the file only predicted on; the labels are
    config.json's id2label."""
    run_dir, out = chain / "glue", tmp_path / "upload"
    results_file = run_dir / "all_results.json"
    run_cli(cli.main, ["--model_dir", str(run_dir), "--repo_id", "me/tiny-cola", "--results_file", str(results_file),
                       "--dry_run", str(out)])  # fmt: skip
    card = ModelCard.load(out / "README.md")
    results, state, config = (json.loads((run_dir / name).read_text()) for name in
                              ("all_results.json", "trainer_state.json", "config.json"))  # fmt: skip
    train_results = json.loads((run_dir / "train_results.json").read_text())

    expected = {"loss": results["eval_loss"], "matthews_correlation": results["eval_matthews_correlation"]}
    assert {r.metric_type: r.metric_value for r in card.data.eval_results} == expected
    validation = chain / "cola" / "validation.csv"  # the --validation_file of the run
    for result in card.data.eval_results:
        assert result.dataset_split == "validation" and result.dataset_args == {"data_files": validation.name}
        assert "validation.csv" in result.dataset_name and "not on the Hub" in result.dataset_name
        loaded = datasets.load_dataset(result.dataset_type, data_files=str(validation), split="train")
        assert loaded.num_rows >= results["eval_samples"] and {"sentence", "label"} <= set(loaded.column_names)
    assert card.data.datasets is None  # local files only
    assert "On local files (`validation.csv`; not on the Hub), from `all_results.json`:" in card.text

    line = next(line for line in card.text.splitlines() if line.startswith("- GLUE COLA fine-tuning"))
    assert f"{state['global_step']} steps of 8 examples ({state['epoch']:.3g} epochs over " in line  # --per_device 8
    assert f" over {train_results['train_samples']} training examples)" in line
    assert "(`train.csv` for training, `validation.csv` for evaluation; not on the Hub)" in line
    assert os.path.exists(run_dir / "predict_results_cola.txt") and "test.csv" not in card.text  # predicted only
    labels = ", ".join(f"{i} `{name}`" for i, name in sorted((int(i), name) for i, name in config["id2label"].items()))
    assert f"- Labels (`config.id2label`): {labels}.\n" in card.text
    assert sorted(config["id2label"].values()) == ["acceptable", "unacceptable"]


def test_results_the_run_did_not_write_are_refused_before_loading(chain, tmp_path, capsys, monkeypatch):
    """A results file that no recorded training run wrote (here: another evaluation's) names no data:
    one error line, before the model is loaded, whose two ways out both work."""
    from hf_efficient_attn.hub import export

    other = {**json.loads((chain / "glue" / "all_results.json").read_text()), "eval_loss": 9.5}
    (tmp_path / "eval_results.json").write_text(json.dumps(other))
    argv = ["--model_dir", str(chain / "glue"), "--repo_id", "me/tiny-cola", "--dry_run"]
    loads = []
    with monkeypatch.context() as patched:
        patched.setattr(export, "load_variant", lambda *args: loads.append(args))
        with pytest.raises(SystemExit) as exited:
            run_cli(cli.main, [*argv, str(tmp_path / "up0"), "--results_file", str(tmp_path / "eval_results.json")])
    error = capsys.readouterr().err
    assert exited.value.code == 2 and loads == [] and error.count("\n") == 1 and error.startswith("error: ")
    assert "--dataset_name" in error and "all_results.json" in error

    # Way out 1: the results file of the training run that made --model_dir (the test above reads its card).
    run_cli(cli.main, [*argv, str(tmp_path / "up1"), "--results_file", str(chain / "glue" / "all_results.json")])
    assert ModelCard.load(tmp_path / "up1" / "README.md").data.eval_results
    # Way out 2: name the data on the Hub.
    run_cli(cli.main, [*argv, str(tmp_path / "up2"), "--results_file", str(tmp_path / "eval_results.json"),
                       "--dataset_name", "someone/cola-copy"])  # fmt: skip
    card = ModelCard.load(tmp_path / "up2" / "README.md")
    assert {(r.dataset_type, r.metric_type, r.metric_value) for r in card.data.eval_results} >= {
        ("someone/cola-copy", "loss", 9.5)}  # fmt: skip
    assert card.data.datasets == ["someone/cola-copy"]


def test_push_of_a_folder_that_records_nothing_warns_once_per_field(tmp_path, capsys):
    model = hea.patch_model(hea.AutoModelForMaskedLM.from_pretrained(save_tiny_mlm(str(tmp_path / "plain"))), "vmean")
    model.save_pretrained(tmp_path / "variant")
    from training_fixtures import small_tokenizer

    small_tokenizer().save_pretrained(tmp_path / "variant")
    run_cli(cli.main, ["--model_dir", str(tmp_path / "variant"), "--repo_id", "me/x", "--dry_run",
                       str(tmp_path / "up")])  # fmt: skip
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 2 and all(line.startswith("warning: ") for line in warnings), warnings
    assert "--base_model" in warnings[0] and "--license" in warnings[1]
    card = ModelCard.load(tmp_path / "up" / "README.md")
    assert card.data.base_model is None and card.data.license is None
    assert "A bert model with its self-attention replaced by **vmean**" in card.text
    assert "No training is recorded" in card.text


def test_datasets_lists_hub_ids_only():
    record = {"stages": [
        {"stage": "conversion"},
        {"stage": "masked-LM pretraining", "data": {"files": {"train_file": "train.txt"}}},
        {"stage": "GLUE SST2 fine-tuning", "data": {"dataset_name": "nyu-mll/glue", "dataset_config_name": "sst2"}},
    ]}  # fmt: skip
    assert hub_datasets(record, None) == ["nyu-mll/glue"]
    assert hub_datasets(record, "nyu-mll/glue") == ["nyu-mll/glue"]
    assert hub_datasets(None, "stanfordnlp/imdb") == ["stanfordnlp/imdb"]


def test_recorded_batch_is_the_global_batch(tmp_path):
    """global_batch_size = per-device batch x accumulation steps x processes; the stage records the
    run's steps, epochs, length and learning rate as given."""
    from types import SimpleNamespace

    from hf_efficient_attn.tasks.common.args import ModelArguments
    from hf_efficient_attn.tasks.common.driver import record_stage

    source = save_tiny_mlm(str(tmp_path / "source"))
    args = SimpleNamespace(per_device_train_batch_size=3, gradient_accumulation_steps=5, world_size=2,
                           learning_rate=4e-5, output_dir=str(tmp_path / "out"))  # fmt: skip
    (tmp_path / "out").mkdir()
    trainer = SimpleNamespace(args=args, state=SimpleNamespace(global_step=7, epoch=1.5),
                              model=SimpleNamespace(config=SimpleNamespace(attn_impl="mra2")),
                              is_world_process_zero=lambda: True)  # fmt: skip
    data_args = SimpleNamespace(dataset_name="someone/news", dataset_config_name="en")
    record_stage(trainer, ModelArguments(model_name_or_path=source), data_args, "masked-LM pretraining",
                 "pretrain_mlm.py", 96, {"train_samples": 40}, {"eval_loss": 2.5, "eval_runtime": 1.0})  # fmt: skip
    (stage,) = read_provenance(tmp_path / "out")["stages"]
    assert stage["global_batch_size"] == 3 * 5 * 2
    assert (stage["steps"], stage["epochs"], stage["max_seq_length"], stage["learning_rate"]) == (7, 1.5, 96, 4e-5)
    assert stage["train_samples"] == 40 and stage["eval"] == {"eval_loss": 2.5}
    assert stage["data"] == {"dataset_name": "someone/news", "dataset_config_name": "en"}


@pytest.mark.parametrize("folder, suffix", [("long", ""), ("mlm", "-mlm"), ("glue", "-cola")])
def test_default_name_and_card_carry_the_task(chain, tmp_path, folder, suffix):
    """A bare namespace names each variant of the chain by what it was last trained on: nothing for
    the converted model, mlm for local pretraining text, the GLUE task for fine-tuning; the card's
    model_name is that name."""
    out = tmp_path / "upload"
    repo_id = cli.main(["--model_dir", str(chain / folder), "--repo_id", "me", "--dry_run", str(out)])
    table = json.loads((chain / "long" / "config.json").read_text())["max_position_embeddings"]  # BERT: no offset
    name = f"bert-base-uncased-mra2-{table}{suffix}"
    assert repo_id == str(out) and ModelCard.load(out / "README.md").data.model_name == name
    assert f"me/{name}" in (out / "README.md").read_text()  # the loading example names the repository


def test_trained_task_reads_the_last_stage():
    conversion = {"stage": "conversion", "script": "convert_to_long.py"}
    hub = {"script": "finetune_glue.py", "data": {"dataset_name": "stanfordnlp/imdb", "dataset_config_name": None}}
    local = {"script": "finetune_glue.py", "data": {"files": {"train_file": "train.csv"}}}
    assert trained_task({"stages": [conversion]}) is None and trained_task(None) is None
    assert trained_task({"stages": [conversion, hub]}) == "imdb"
    assert trained_task({"stages": [conversion, local]}) == "classification"
    assert trained_task({"stages": [hub, {**local, "script": "finetune_wikihop.py"}]}) == "wikihop"
