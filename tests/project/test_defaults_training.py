"""The training scripts' defaults as their --help states them (tests/project/defaults_table.py): each script runs
without the flag and stops where it would train (its Trainer, or compare_methods' stages, read there);
what the help says happens then is checked, the help text read here where it holds a value."""

from __future__ import annotations

import json
import shutil

import pytest
import transformers as T
from defaults_table import help_statement
from flag_table import parsed_dataclasses
from huggingface_hub.utils import build_hf_headers
from test_flags_data import comparison_stages
from test_flags_model_training import run_until_trainer, script_args, workspace  # noqa: F401  (a fixture)
from training_fixtures import small_tokenizer

import hf_efficient_attn as hea
from hf_efficient_attn.integration.positions import max_tokens
from hf_efficient_attn.tasks.common.args import parse_arguments
from hf_efficient_attn.tasks.convert import main as convert_main
from hf_efficient_attn.tasks.mlm import compare
from hf_efficient_attn.tasks.wikihop import finetune as wikihop

MODEL_SCRIPTS = ["compare_methods", "convert_to_long", "finetune_glue", "finetune_wikihop", "pretrain_mlm"]


def trained_model_config(script, w, output_dir, monkeypatch, *flags):
    """The config of the model ``script`` would train (convert_to_long: of the model it saved)."""
    if script == "convert_to_long":
        convert_main([*flags, "--output_dir", str(output_dir), "--max_length", "256"])
        return T.AutoConfig.from_pretrained(output_dir)
    return run_until_trainer(script, script_args(script, w, output_dir, "--do_train", *flags), monkeypatch).trainer.model.config


@pytest.mark.parametrize("script", ["convert_to_long", "finetune_glue", "finetune_wikihop", "pretrain_mlm"])
def test_attn_impl_default_is_the_saved_method_else_exact_attention(script, workspace, tmp_path, monkeypatch):  # noqa: F811
    assert help_statement(script, "attn_impl") == "the method saved in the checkpoint's config, else exact attention."
    variant = tmp_path / "variant"
    hea.AutoModelForMaskedLM.from_pretrained(
        workspace["model"], attn_impl="mra2", attn_config={"block_per_row": 2}
    ).save_pretrained(variant)
    small_tokenizer().save_pretrained(variant)
    saved = trained_model_config(script, workspace, tmp_path / "a", monkeypatch, "--model_name_or_path", str(variant))
    assert (saved.attn_impl, saved.attn_config["block_per_row"]) == ("mra2", 2)
    plain = trained_model_config(script, workspace, tmp_path / "b", monkeypatch, "--model_name_or_path", workspace["model"])
    assert getattr(plain, "attn_impl", None) is None  # (a saved config records no Transformers attention either)
    assert plain._attn_implementation in ("sdpa", "eager", None)


@pytest.mark.parametrize("script", MODEL_SCRIPTS)
def test_token_default_is_the_one_hf_auth_login_stored(script, tmp_path, monkeypatch):
    """Without --token every from_pretrained gets token=None, which huggingface_hub reads as the token
    ``hf auth login`` stored (not False, which would send none)."""
    import huggingface_hub.constants

    assert help_statement(script, "token") == "the one `hf auth login` stored."
    (tmp_path / "token").write_text("hf_stored_by_login")
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    model_arguments = next(cls for cls in parsed_dataclasses(script) if "token" in cls.__dataclass_fields__)
    (parsed,) = parse_arguments([model_arguments], ["--model_name_or_path", str(tmp_path)])
    token = parsed.hub_kwargs()["token"]
    assert build_hf_headers(token=token)["authorization"] == "Bearer hf_stored_by_login"


@pytest.mark.parametrize("script", ["compare_methods", "finetune_wikihop", "pretrain_mlm"])
def test_max_seq_length_default_is_the_tokenizer_limit_capped_by_the_position_table(
    script,
    workspace,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    statement = help_statement(script, "max_seq_length")
    assert statement.startswith("the tokenizer's model_max_length, capped by the model's") and "table" in statement
    table = max_tokens(T.AutoConfig.from_pretrained(workspace["model"]))
    chunk_lengths = []
    chunk_encoder = wikihop.ChunkEncoder
    monkeypatch.setattr(
        wikihop, "ChunkEncoder", lambda tokenizer, n, chunks: chunk_lengths.append(n) or chunk_encoder(tokenizer, n, chunks)
    )
    lengths = []
    for tokenizer_limit in (table // 2, table * 4):  # the tokenizer's limit, then the table's
        model = tmp_path / f"model{tokenizer_limit}"
        shutil.copytree(workspace["model"], model)
        tokenizer = T.AutoTokenizer.from_pretrained(model)
        tokenizer.model_max_length = tokenizer_limit
        tokenizer.save_pretrained(model)
        argv = [arg for arg in script_args(script, workspace, tmp_path / f"out{tokenizer_limit}", "--do_train")]
        at = argv.index("--max_seq_length")
        del argv[at : at + 2]
        trainer = run_until_trainer(script, ["--model_name_or_path", str(model), *argv], monkeypatch).trainer
        if script == "finetune_wikihop":
            lengths.append(chunk_lengths[-1])
        else:
            lengths.append(len(trainer.train_dataset.examples["input_ids"][0]))
    assert lengths == [table // 2, table]


@pytest.mark.parametrize("script", ["compare_methods", "pretrain_mlm"])
def test_text_column_default_is_text(script, workspace, tmp_path, monkeypatch):  # noqa: F811
    assert help_statement(script, "text_column_name") == "text."
    with open(workspace["train"]) as f:
        texts = [line.strip() for line in f if line.strip()]
    rows = [{"title": f"Article {i}", "text": text, "summary": text[:40]} for i, text in enumerate(texts)]
    path = tmp_path / "articles.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = script_args(script, workspace, tmp_path / "out", "--do_train", "--line_by_line")
    argv[argv.index("--train_file") + 1] = argv[argv.index("--validation_file") + 1] = str(path)
    trainer = run_until_trainer(script, ["--model_name_or_path", workspace["model"], *argv], monkeypatch).trainer
    expected = small_tokenizer()(texts, truncation=True, max_length=64)["input_ids"]
    assert list(trainer.train_dataset.examples["input_ids"]) == expected


@pytest.mark.parametrize("script", ["compare_methods", "pretrain_mlm"])
def test_validation_split_percentage_default_carves_the_percentage_its_help_states(
    script,
    workspace,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """Training data without a validation split: the percentage the help states of the first rows (here the
    lines) is the validation set, the rest trains."""
    statement = help_statement(script, "validation_split_percentage")
    percentage = int(statement.removesuffix("."))
    argv = script_args(script, workspace, tmp_path / "out", "--do_train", "--do_eval", "--line_by_line")
    at = argv.index("--validation_file")
    del argv[at : at + 2]
    trainer = run_until_trainer(script, ["--model_name_or_path", workspace["model"], *argv], monkeypatch).trainer
    with open(workspace["train"]) as f:
        texts = [line.strip() for line in f if line.strip()]
    carved = round(len(texts) * percentage / 100)
    assert 0 < carved < len(texts)
    encoded = small_tokenizer()(texts, truncation=True, max_length=64)["input_ids"]
    assert list(trainer.eval_dataset.examples["input_ids"]) == encoded[:carved]
    assert list(trainer.train_dataset.examples["input_ids"]) == encoded[carved:]


def test_glue_without_a_task_takes_its_classes_and_metric_from_the_data(workspace, tmp_path, monkeypatch):  # noqa: F811
    """The columns themselves: tests/project/test_cli_help.py::test_the_glue_column_advice_works."""
    from glue_fixtures import write_rows

    statement = help_statement("finetune_glue", "task_name")
    assert "the classes come from the data" in statement and "the metric is accuracy (mse for float labels)" in statement
    sentences = ["a first sentence", "a second one", "the third", "and the fourth"]
    for labels, names, metric in ((["pos", "neg", "mid", "neg"], ("mid", "neg", "pos"), "accuracy"),
                                  ([0.5, 1.25, 3.0, 2.0], None, "mse")):  # fmt: skip
        path = write_rows(str(tmp_path / f"{metric}.csv"), [{"sentence": s, "label": v} for s, v in zip(sentences, labels)])
        trainer = run_until_trainer("finetune_glue", ["--model_name_or_path", workspace["model"], "--train_file", path,
                                                      "--do_train", "--output_dir", str(tmp_path / metric),
                                                      "--report_to", "none"], monkeypatch).trainer  # fmt: skip
        config = trainer.model.config
        if names is None:
            assert config.num_labels == 1 and trainer.compute_metrics.regression
        else:
            assert tuple(config.id2label[i] for i in range(config.num_labels)) == names
        assert trainer.compute_metrics.kind == metric


def test_glue_without_peft_fine_tunes_every_weight(workspace, tmp_path, monkeypatch):  # noqa: F811
    assert help_statement("finetune_glue", "peft") == "full fine-tuning."
    argv = script_args("finetune_glue", workspace, tmp_path, "--do_train", "--model_name_or_path", workspace["model"])
    trainer = run_until_trainer("finetune_glue", argv, monkeypatch).trainer
    model = trainer.model
    assert isinstance(model, T.PreTrainedModel) and not any("lora" in name for name, _ in model.named_parameters())
    assert all(parameter.requires_grad for parameter in model.parameters())


def test_wikihop_without_max_chunks_reads_every_chunk(workspace, tmp_path, monkeypatch):  # noqa: F811
    """Every chunk: the same chunks as with a cap no example reaches; short chunks make several per example."""
    assert help_statement("finetune_wikihop", "max_chunks") == "every chunk, so every document is read."

    def chunks(*flags):
        argv = script_args("finetune_wikihop", workspace, tmp_path / str(len(flags)), "--do_train", "--model_name_or_path",
                           workspace["model"], *flags)  # fmt: skip
        argv[argv.index("--max_seq_length") + 1] = "48"
        return run_until_trainer("finetune_wikihop", argv, monkeypatch).trainer.train_dataset["input_ids"]

    every = chunks()
    assert max(len(example) for example in every) > 1
    assert every == chunks("--max_chunks", "1000")


def test_comparison_head_warmup_default_follows_whether_the_head_is_new(workspace, tmp_path, monkeypatch):  # noqa: F811
    statement = help_statement("compare_methods", "head_warmup_steps")
    assert statement.startswith("100 when the checkpoint's MLM head is new") and statement.endswith("else 0.")
    encoder = tmp_path / "encoder"  # a checkpoint without an MLM head (a sentence encoder)
    T.AutoModel.from_pretrained(workspace["model"]).save_pretrained(encoder)
    small_tokenizer().save_pretrained(encoder)
    data = ("--train_file", workspace["train"], "--validation_file", workspace["validation"], "--max_seq_length", "64")
    new_head = comparison_stages({"model": str(encoder)}, monkeypatch, tmp_path / "new", *data)
    assert new_head[compare.WARMUP_FOLDER].training_args.max_steps == 100
    trained_head = comparison_stages({"model": workspace["model"]}, monkeypatch, tmp_path / "trained", *data)
    assert compare.WARMUP_FOLDER not in trained_head


def test_comparison_method_left_out_of_attn_config_takes_its_defaults(workspace, tmp_path, monkeypatch):  # noqa: F811
    assert "Methods left out take their defaults." in help_statement("compare_methods", "attn_config")
    stages = comparison_stages({"model": workspace["model"]}, monkeypatch, tmp_path, "--train_file", workspace["train"],
                               "--attn_config", '{"linformer": {"k": 8}}', methods=("softmax", "mra2", "linformer"))  # fmt: skip
    defaults = {name: option.default for name, option in hea.method_options("mra2").items()}
    assert stages["mra2"].model_args.attn_options == defaults
    assert stages["linformer"].model_args.attn_options["k"] == 8


@pytest.mark.slow  # compare_methods reads and tokenises all of the bundled Wikipedia before its stages
def test_comparison_default_data_is_gensims_wikipedia_last_8_held_out(workspace, tmp_path, monkeypatch):  # noqa: F811
    from hf_efficient_attn.tasks.common.corpus import wikipedia_articles

    statement = help_statement("compare_methods", "(mode) default")
    assert "the real English Wikipedia articles of gensim's test data" in statement and "the last 8 held out" in statement
    stages = comparison_stages(
        {"model": workspace["model"]}, monkeypatch, tmp_path, "--max_seq_length", "64", methods=("softmax",)
    )
    data_args = stages["softmax"].data_args
    assert (data_args.train_file, data_args.validation_file) == (
        str(tmp_path / "data" / "train.jsonl"),
        str(tmp_path / "data" / "validation.jsonl"),
    )
    read = {split: [json.loads(line)["text"] for line in open(path)] for split, path in
            (("train", data_args.train_file), ("validation", data_args.validation_file))}  # fmt: skip
    articles = wikipedia_articles(min_words=0)
    assert (read["train"], read["validation"]) == (articles[:-8], articles[-8:])
