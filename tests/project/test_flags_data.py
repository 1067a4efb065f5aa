"""The data flags of the training scripts reach what they choose (tests/project/flag_table.py), in every
script that has them (pretrain_mlm, finetune_glue, finetune_wikihop, compare_methods: the tests are
parametrized over ``script``): each file is the split it names, a Hub dataset and its configuration
are what is loaded, the sample caps and --max_seq_length shape each set, tokenisation gets
--preprocessing_num_workers / --overwrite_cache (datasets' map spied on, nothing runs in several
processes), --padding_free packs each batch, the masked-LM flags shape the masked sets; labels of
one's own GLUE data get the sorted ids, the LoRA flags shape the adapter, and compare_methods hands
its data flags to each method's run and its warm-up flags to the warm-up. Every run stops where it
builds its Trainer (nothing is trained); compare_methods' runs its first method's stage in this
process."""

import json
import os
import re

import datasets
import pytest
import torch
from datasets import Dataset, DatasetDict
from glue_fixtures import single_sentence_rows, write_rows
from glue_runs import SEQ, argv, make_workspace, read_rows, run_config
from training_fixtures import Captured, capture_trainer, save_tiny_mlm, small_tokenizer, write_news_files
from transformers import AutoTokenizer, DataCollatorForLanguageModeling
from wikihop_fixtures import SHORT, save_tiny_encoder, write_files

from hf_efficient_attn.tasks import glue
from hf_efficient_attn.tasks.common.masking import DeterministicallyMaskedDataset
from hf_efficient_attn.tasks.mlm import compare, compare_stage, pretrain
from hf_efficient_attn.tasks.wikihop import finetune as wikihop
from hf_efficient_attn.tasks.wikihop.data import ChunkEncoder, add_markers
from hf_efficient_attn.tasks.wikihop.qangaroo import synthetic_examples

# ---- workspaces and runs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """A tiny masked-LM checkpoint and real news text, as txt (one article a line) and as json lines
    whose text is in a ``body`` column."""
    root = tmp_path_factory.mktemp("flags-mlm")
    train, validation = write_news_files(str(root))
    files = {"model": save_tiny_mlm(str(root / "tiny")), "train": train, "validation": validation}
    for split in ("train", "validation"):
        with open(files[split]) as f:
            articles = [line.rstrip("\n") for line in f if line.strip()]
        rows = [{"title": f"Article {i}", "body": text} for i, text in enumerate(articles)]
        files[f"{split}_body"] = write_rows(str(root / f"{split}.jsonl"), rows)
    return files


@pytest.fixture(scope="module")
def glue_workspace(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("flags-glue"))


@pytest.fixture(scope="module")
def wikihop_workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("flags-wikihop")
    train, dev = write_files(str(root), train=10, dev=6, with_real=False)
    return {"train": train, "dev": dev, "model": save_tiny_encoder(str(root / "tiny"))}


def captured(monkeypatch, module, arguments):
    """What ``module.main(arguments)`` would give its Trainer (compare_methods: its first method's
    run, in this process)."""
    capture_trainer(monkeypatch)
    monkeypatch.setattr(compare, "run_in_own_process", compare_stage.run_stage)
    with pytest.raises(Captured) as caught:
        module.main(arguments)
    return caught.value.kwargs


#: The training scripts, and the module whose ``main`` each runs.
SCRIPTS = {"pretrain_mlm": pretrain, "finetune_glue": glue, "finetune_wikihop": wikihop, "compare_methods": compare}
MLM_SCRIPTS = ["pretrain_mlm", "compare_methods"]


@pytest.fixture(scope="module")
def workspaces(mlm, glue_workspace, wikihop_workspace):
    return {"mlm": mlm, "glue": glue_workspace, "wikihop": wikihop_workspace}


def script_arguments(script, workspaces, output_dir, *extra):
    """``script``'s flags on the workspace's train and validation files (news text, MRPC, qangaroo),
    with ``extra`` last (a flag given twice takes its last value)."""
    if script == "finetune_glue":
        return glue_arguments(workspaces["glue"], output_dir, pad_to_max_length=False) + list(extra)
    if script == "finetune_wikihop":
        return wikihop_arguments(workspaces["wikihop"], output_dir, *extra)
    mlm = workspaces["mlm"]
    files = ["--train_file", mlm["train"], "--validation_file", mlm["validation"]]
    if script == "compare_methods":
        return compare_arguments(mlm, output_dir, *files, *extra)
    return mlm_arguments(mlm, output_dir, *files, *extra)


def trainer_kwargs(script, workspaces, output_dir, monkeypatch, *extra):
    """What ``script`` with :func:`script_arguments` would give its Trainer."""
    return captured(monkeypatch, SCRIPTS[script], script_arguments(script, workspaces, output_dir, *extra))


def example_ids(dataset):
    """The token ids of each example of a training or evaluation set, as lists."""
    ids = dataset.examples["input_ids"] if hasattr(dataset, "examples") else dataset["input_ids"]  # masked LM: .examples
    return [list(map(list, row)) if row and isinstance(row[0], list) else list(row) for row in ids]


def sequences(example_ids):
    """The token sequences of one example: WikiHop's chunks, else the example itself."""
    return example_ids if example_ids and isinstance(example_ids[0], list) else [example_ids]


def mlm_arguments(mlm, output_dir, *extra):
    return ["--model_name_or_path", mlm["model"], "--max_seq_length", "64", "--do_train", "--do_eval",
            "--output_dir", str(output_dir), "--report_to", "none", "--seed", "7", *extra]  # fmt: skip


def glue_arguments(workspace, output_dir, task="mrpc", **overrides):
    return argv(run_config(workspace, task, output_dir, **overrides))


def compare_arguments(mlm, output_dir, *extra):
    return ["--model_name_or_path", mlm["model"], "--methods", "softmax,mra2", "--max_steps", "2",
            "--head_warmup_steps", "0", "--output_dir", str(output_dir), "--report_to", "none", "--seed", "7",
            *extra]  # fmt: skip


def wikihop_arguments(workspace, output_dir, *extra, files=True):
    local = ["--train_file", workspace["train"], "--validation_file", workspace["dev"]] if files else []
    return ["--model_name_or_path", workspace["model"], *local, "--max_seq_length", "128", "--do_train", "--do_eval",
            "--output_dir", str(output_dir), "--report_to", "none", "--seed", "3", *extra]  # fmt: skip


def lines(path):
    with open(path) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def qangaroo_encoding(model, examples, max_length=128):
    """Each example's chunks as ChunkEncoder makes them with the model's tokenizer and markers."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    add_markers(tokenizer)
    columns = ("id", "query", "answer", "candidates", "supports")
    return ChunkEncoder(tokenizer, max_length)({key: [e[key] for e in examples] for key in columns})["input_ids"]


def read_qangaroo(path):
    with open(path) as f:
        return json.load(f)


# ---- files and datasets ------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_file_is_the_split_it_names(workspaces, monkeypatch, tmp_path, script):
    """--train_file is trained on and --validation_file evaluated on: each set is its own file's
    examples as the tokenizer (or the WikiHop encoder) makes them, in order."""
    extra = ["--line_by_line", "--max_seq_length", "64"] if script in MLM_SCRIPTS else []
    trainer = trainer_kwargs(script, workspaces, tmp_path, monkeypatch, *extra)
    train, validation = (example_ids(trainer[s]) for s in ("train_dataset", "eval_dataset"))
    if script in MLM_SCRIPTS:
        mlm = workspaces["mlm"]
        expected = [small_tokenizer()(lines(mlm[s]), truncation=True, max_length=64)["input_ids"]
                    for s in ("train", "validation")]  # fmt: skip
    elif script == "finetune_glue":
        tokenizer = AutoTokenizer.from_pretrained(workspaces["glue"]["model"])
        expected = []
        for split in ("train", "validation"):
            rows = read_rows(workspaces["glue"]["files"]["mrpc"][split])
            pairs = [r["sentence1"] for r in rows], [r["sentence2"] for r in rows]
            expected.append(tokenizer(*pairs, truncation=True, max_length=SEQ)["input_ids"])
    else:
        wikihop_files = workspaces["wikihop"]
        expected = [qangaroo_encoding(wikihop_files["model"], read_qangaroo(wikihop_files[s])) for s in ("train", "dev")]
    assert train == expected[0] and validation == expected[1]
    assert train != validation


def fake_hub(monkeypatch, splits):
    """``datasets.load_dataset`` (imported by the pipelines where they load) returns ``splits`` (a
    DatasetDict); returns the (path, name) of each call."""
    calls = []

    def load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        return splits

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


@pytest.mark.parametrize("script", SCRIPTS)
def test_dataset_name_and_config_are_what_is_loaded(workspaces, monkeypatch, tmp_path, script):
    """--dataset_name / --dataset_config_name are the Hub dataset and configuration loaded (no local
    file), and its splits are what is trained and evaluated on."""
    glue_workspace, wikihop_workspace = workspaces["glue"], workspaces["wikihop"]
    loads = 1
    if script in MLM_SCRIPTS:
        dataset = "someone/news"
        texts = lines(workspaces["mlm"]["train"])[:24]
        calls = fake_hub(monkeypatch, DatasetDict(train=Dataset.from_dict({"text": texts[:18]}),
                                                  validation=Dataset.from_dict({"text": texts[18:]})))  # fmt: skip
        flags = ["--dataset_name", dataset, "--dataset_config_name", "en", "--line_by_line", "--max_seq_length", "64"]
        if script == "compare_methods":
            trainer = captured(monkeypatch, compare, compare_arguments(workspaces["mlm"], tmp_path, *flags))
            loads = 2  # the comparison checks the data, then the method's run reads them
        else:
            trainer = captured(monkeypatch, pretrain, mlm_arguments(workspaces["mlm"], tmp_path, *flags))
        expected = [small_tokenizer()(part, truncation=True, max_length=64)["input_ids"] for part in (texts[:18], texts[18:])]
    elif script == "finetune_glue":
        dataset = "someone/reviews"
        rows = single_sentence_rows()[0][:20]
        splits = DatasetDict(train=Dataset.from_list(rows[:14]), validation=Dataset.from_list(rows[14:]))
        calls = fake_hub(monkeypatch, splits)
        trainer = captured(monkeypatch, glue, glue_arguments(
            glue_workspace, tmp_path, "cola", task_name=None, train_file=None, validation_file=None, test_file=None,
            do_predict=None, pad_to_max_length=False, dataset_name=dataset,
            dataset_config_name="en"))  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(glue_workspace["model"])
        expected = [tokenizer([r["sentence"] for r in part], truncation=True, max_length=SEQ)["input_ids"]
                    for part in (rows[:14], rows[14:])]  # fmt: skip
        assert list(trainer["train_dataset"]["labels"]) == [r["label"] for r in rows[:14]]
    else:
        dataset = "someone/qangaroo"
        train, validation = synthetic_examples(5, seed=21, **SHORT), synthetic_examples(3, seed=22, **SHORT)
        calls = fake_hub(monkeypatch, DatasetDict(train=Dataset.from_list(train), validation=Dataset.from_list(validation)))
        arguments = wikihop_arguments(wikihop_workspace, tmp_path, "--dataset_name", dataset,
                                      "--dataset_config_name", "en", files=False)  # fmt: skip
        trainer = captured(monkeypatch, wikihop, arguments)
        expected = [qangaroo_encoding(wikihop_workspace["model"], part) for part in (train, validation)]
    assert calls == [(dataset, "en")] * loads
    assert example_ids(trainer["train_dataset"]) == expected[0]
    assert example_ids(trainer["eval_dataset"]) == expected[1]


@pytest.mark.parametrize(
    "script, flags, message",
    [
        *[(script, ["--dataset_name", "someone/data"], r"^--dataset_name and local files \(--train_file, ...\) both name the "
           "data: give one of them$") for script in SCRIPTS],
        *[(script, ["--dataset_config_name", "en"], "^--dataset_config_name is a configuration of --dataset_name: give "
           "that too, or leave it out$") for script in SCRIPTS],
        ("finetune_wikihop", ["--pad_to_max_length", "true", "--padding_free"], "^--pad_to_max_length and --padding_free: "
         "packed chunks have no padding; give one of them$"),
    ],
)  # fmt: skip
def test_data_flags_that_would_be_ignored_are_refused(workspaces, monkeypatch, tmp_path, script, flags, message):
    """A flag the loaders would skip is refused as the flags are parsed, naming why: --dataset_name
    beside local files (the Hub dataset alone would be read), --dataset_config_name without
    --dataset_name, WikiHop's --pad_to_max_length with --padding_free. (Each flag alone: the tests above.)"""
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("data loaded before the check"))
    with pytest.raises(ValueError, match=message):
        SCRIPTS[script].main(script_arguments(script, workspaces, tmp_path, *flags))


# ---- sample caps and lengths ---------------------------------------------------------------------------

#: A --max_seq_length below each script's default (GLUE's workspace: 64; the others: the tiny models' 130).
SHORTER = {"pretrain_mlm": 40, "finetune_glue": 40, "finetune_wikihop": 96, "compare_methods": 40}


@pytest.mark.parametrize("script", SCRIPTS)
def test_sample_caps_and_max_seq_length_shape_each_set(workspaces, monkeypatch, tmp_path, script):
    """--max_train_samples 5 keeps the first 5 training examples and --max_eval_samples 3 the first 3
    evaluation examples of the sets the same run makes without them (each cap its own set: swapped
    or shared caps give other sizes); with --max_seq_length L no example (WikiHop: chunk) is longer
    than L and the long texts reach it."""
    length = ["--max_seq_length", str(SHORTER[script])]
    whole = trainer_kwargs(script, workspaces, tmp_path / "whole", monkeypatch, *length)
    capped = trainer_kwargs(script, workspaces, tmp_path / "capped", monkeypatch, *length, "--max_train_samples", "5",
                            "--max_eval_samples", "3")  # fmt: skip
    train, evaluation = example_ids(whole["train_dataset"]), example_ids(whole["eval_dataset"])
    assert len(train) > 5 and len(evaluation) > 3
    assert example_ids(capped["train_dataset"]) == train[:5]
    assert example_ids(capped["eval_dataset"]) == evaluation[:3]
    lengths = [len(ids) for example in train + evaluation for ids in sequences(example)]
    assert max(lengths) == SHORTER[script]


# ---- tokenisation options -------------------------------------------------------------------------------


@pytest.fixture
def map_calls(monkeypatch):
    """(num_proc, load_from_cache_file) of every ``Dataset.map`` call, which then runs in this process."""
    calls = []
    original = Dataset.map

    def spy(self, *args, **kwargs):
        calls.append((kwargs.get("num_proc"), kwargs.get("load_from_cache_file")))
        return original(self, *args, **{**kwargs, "num_proc": None})

    monkeypatch.setattr(Dataset, "map", spy)
    return calls


@pytest.mark.parametrize(
    "flags, expected", [([], (None, True)), (["--preprocessing_num_workers", "3", "--overwrite_cache"], (3, False))]
)
@pytest.mark.parametrize("script, mode", [*[(script, "") for script in SCRIPTS], ("pretrain_mlm", "--line_by_line")])
def test_tokenisation_gets_the_workers_and_cache_flags(workspaces, monkeypatch, tmp_path, map_calls, script, mode, flags,
                                                       expected):  # fmt: skip
    """--preprocessing_num_workers is every tokenising map's num_proc, --overwrite_cache its
    load_from_cache_file=False (default: None, True); compare_methods: the comparison's and its method
    run's."""
    trainer_kwargs(script, workspaces, tmp_path, monkeypatch, *mode.split(), *flags)
    assert len(map_calls) >= 2 and set(map_calls) == {expected}


@pytest.mark.parametrize("script", SCRIPTS)
def test_padding_free_packs_each_batch(workspaces, monkeypatch, tmp_path, script):
    """--padding_free: the collator puts a batch's sequences (WikiHop: every chunk) one after another in
    one row, their starts in cu_seq_lens_q; without it, a row per example."""
    method = [] if script == "compare_methods" else ["--attn_impl", "mra2"]
    for padding_free in (True, False):
        flags = [*method, "--line_by_line"] if script in MLM_SCRIPTS else method
        trainer = trainer_kwargs(script, workspaces, tmp_path / str(padding_free), monkeypatch, *flags,
                                 *(["--padding_free"] if padding_free else []))  # fmt: skip
        features = [trainer["train_dataset"][i] for i in range(3)]
        batch = trainer["data_collator"](features)
        if padding_free:
            lengths = [len(ids) for example in example_ids(trainer["train_dataset"])[:3] for ids in sequences(example)]
            assert batch["input_ids"].shape == (1, sum(lengths))
            assert batch["cu_seq_lens_q"].tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        else:
            assert batch["input_ids"].shape[0] == 3 and "cu_seq_lens_q" not in batch


# ---- masked-LM data flags ------------------------------------------------------------------------------


@pytest.mark.parametrize("script", MLM_SCRIPTS)
def test_masked_lm_data_flags_shape_the_masked_sets(workspaces, monkeypatch, tmp_path, script):
    """On a json file with the text in a ``body`` column and no validation file: --text_column_name body
    is the text, --line_by_line makes each row an example, --validation_split_percentage 25 carves the
    first quarter of the rows for validation (the rest trains), --mlm_probability 0.3 masks that share
    of the tokens, and --eval_mask_seed 5 draws the validation masks (those of seed 5, not of seed 0)."""
    mlm = workspaces["mlm"]
    flags = ["--train_file", mlm["train_body"], "--text_column_name", "body", "--line_by_line",
             "--validation_split_percentage", "25", "--mlm_probability", "0.3", "--eval_mask_seed", "5",
             "--max_seq_length", "48"]  # fmt: skip
    arguments = (compare_arguments if script == "compare_methods" else mlm_arguments)(mlm, tmp_path, *flags)
    trainer = captured(monkeypatch, SCRIPTS[script], arguments)
    bodies = [row["body"] for row in read_rows(mlm["train_body"])]
    carved = round(len(bodies) * 25 / 100)
    tokenizer = small_tokenizer()
    assert example_ids(trainer["eval_dataset"]) == tokenizer(bodies[:carved], truncation=True, max_length=48)["input_ids"]
    assert example_ids(trainer["train_dataset"]) == tokenizer(bodies[carved:], truncation=True, max_length=48)["input_ids"]

    train = trainer["train_dataset"]
    labels = torch.cat([train[i]["labels"] for i in range(len(train))])
    masked = labels.ne(-100).sum() / sum(len(ids) - 2 for ids in example_ids(train))  # [CLS] and [SEP] never masked
    assert abs(float(masked) - 0.3) < 0.05

    evaluation = trainer["eval_dataset"]

    def validation_masks(seed):
        masker = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3)
        drawn = DeterministicallyMaskedDataset(evaluation.examples, masker, seed)
        return [drawn[i]["labels"].tolist() for i in range(len(drawn))]

    assert [evaluation[i]["labels"].tolist() for i in range(len(evaluation))] == validation_masks(5) != validation_masks(0)


@pytest.mark.parametrize("split", ["file", "hub"])
@pytest.mark.parametrize("script", MLM_SCRIPTS)
def test_validation_split_percentage_is_refused_where_the_data_have_a_validation_split(
    workspaces, monkeypatch, tmp_path, script, split
):
    """--validation_split_percentage carves a validation split only out of data without one: beside a
    --validation_file it is refused as the flags are read, with a Hub dataset that has a validation split
    once that is loaded (a comparison then records no settings), naming the split. Its advice, leaving it
    out, evaluates on that split."""
    mlm = workspaces["mlm"]
    texts = lines(mlm["train"])[:24]
    if split == "file":
        data, validation, where = ["--validation_file", mlm["validation"]], lines(mlm["validation"]), mlm["validation"]
        data += ["--train_file", mlm["train"]]
    else:
        fake_hub(monkeypatch, DatasetDict(train=Dataset.from_dict({"text": texts[:18]}),
                                          validation=Dataset.from_dict({"text": texts[18:]})))  # fmt: skip
        data, validation, where = ["--dataset_name", "someone/news"], texts[18:], "the validation split of someone/news"
    arguments = (compare_arguments if script == "compare_methods" else mlm_arguments)(
        mlm, tmp_path, *data, "--line_by_line", "--max_seq_length", "64"
    )
    message = rf"^--validation_split_percentage has no effect here: .* and these have one \({re.escape(where)}\); leave it out$"
    with pytest.raises(ValueError, match=message):
        captured(monkeypatch, SCRIPTS[script], [*arguments, "--validation_split_percentage", "10"])
    assert not (tmp_path / compare.SETTINGS_FILE).exists()
    trainer = captured(monkeypatch, SCRIPTS[script], arguments)
    assert example_ids(trainer["eval_dataset"]) == small_tokenizer()(validation, truncation=True, max_length=64)["input_ids"]


# ---- GLUE ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels", [("yes", "no", "maybe"), (10, 9, 2)])
def test_own_data_label_ids_follow_the_sorted_label_names(glue_workspace, monkeypatch, tmp_path, labels):
    """Without --task_name the class ids are those of the sorted distinct training labels
    (run_glue.py's label_list.sort(): numbers in numeric order), never their order of appearance:
    the config's id2label and every target of the training and validation sets agree with it."""
    sentences = [r["sentence"] for r in single_sentence_rows()[0]]
    train_labels = [labels[i % 3] for i in range(24)]  # first seen: in the order given
    validation_labels = [labels[(i + 2) % 3] for i in range(6)]
    train = write_rows(str(tmp_path / "train.csv"), [{"sentence": s, "label": v} for s, v in
                                                     zip(sentences, train_labels)])  # fmt: skip
    validation = write_rows(str(tmp_path / "validation.csv"), [{"sentence": s, "label": v} for s, v in
                                                               zip(sentences[24:], validation_labels)])  # fmt: skip
    trainer = captured(monkeypatch, glue, glue_arguments(
        glue_workspace, tmp_path / "out", "cola", task_name=None, train_file=train, validation_file=validation,
        test_file=None, do_predict=None))  # fmt: skip
    names = sorted(labels)
    assert names != list(labels)
    assert trainer["model"].config.id2label == {i: str(name) for i, name in enumerate(names)}
    assert list(trainer["train_dataset"]["labels"]) == [names.index(v) for v in train_labels]
    assert list(trainer["eval_dataset"]["labels"]) == [names.index(v) for v in validation_labels]


@pytest.mark.parametrize("pad", [True, False])
def test_glue_pad_to_max_length_pads_every_example(glue_workspace, monkeypatch, tmp_path, pad):
    """--pad_to_max_length: every example is --max_seq_length tokens, and so is every batch;
    --no_pad_to_max_length: each example keeps its own length and a batch is padded to its longest.
    The attention mask counts each sentence's own tokens either way (short sentences: CoLA layout)."""
    trainer = captured(monkeypatch, glue, glue_arguments(glue_workspace, tmp_path, "cola", pad_to_max_length=pad))
    tokenizer = AutoTokenizer.from_pretrained(glue_workspace["model"])
    sentences = [r["sentence"] for r in read_rows(glue_workspace["files"]["cola"]["train"])]
    lengths = [len(ids) for ids in tokenizer(sentences, truncation=True, max_length=SEQ)["input_ids"]]
    assert min(lengths) < SEQ
    train = trainer["train_dataset"]
    assert [len(ids) for ids in train["input_ids"]] == ([SEQ] * len(lengths) if pad else lengths)
    batch = trainer["data_collator"]([train[i] for i in range(8)])
    assert batch["input_ids"].shape == (8, SEQ if pad else max(lengths[:8]))
    assert batch["attention_mask"].sum(1).tolist() == lengths[:8]


def test_lora_flags_shape_the_adapter(glue_workspace, monkeypatch, tmp_path):
    """--peft lora wraps the model in a LoRA adapter: exactly the --lora_target_modules layers get an
    update of rank --lora_r, scaled by --lora_alpha / r in the forward pass, with --lora_dropout on
    its input; the base weights are frozen."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    trainer = captured(
        monkeypatch,
        glue,
        glue_arguments(
            glue_workspace, tmp_path, peft="lora", lora_r=3, lora_alpha=5, lora_dropout=0.25, lora_target_modules=["key", "value"]
        ),
    )
    model = trainer["model"]
    assert isinstance(model, PeftModel)
    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    wrapped = sorted(name.rsplit(".", 1)[-1] for name in layers)
    assert wrapped == sorted(["key", "value"] * model.config.num_hidden_layers)
    for layer in layers.values():
        assert layer.lora_A["default"].weight.shape[0] == 3 == layer.lora_B["default"].weight.shape[1]
        assert layer.lora_dropout["default"].p == 0.25
        assert not layer.base_layer.weight.requires_grad
    layer = next(iter(layers.values())).eval()
    torch.nn.init.normal_(layer.lora_B["default"].weight)  # LoRA starts at B = 0
    x = torch.randn(2, layer.base_layer.in_features)
    with torch.no_grad():
        update = layer(x) - layer.base_layer(x)
        reference = 5 / 3 * layer.lora_B["default"](layer.lora_A["default"](x))
    torch.testing.assert_close(update, reference)


# ---- compare_methods --------------------------------------------------------------------------------------


def comparison_stages(mlm, monkeypatch, output_dir, *extra, methods=("softmax", "linformer")):
    """The stages (head warm-up, methods) compare_methods would run each in its own process, by name;
    each stage, instead of running, leaves its folder (a method: with the one-row results.csv the
    comparison reads back)."""
    stages = {}

    def record(stage, description):
        stages[stage.name] = stage
        if stage.name == methods[-1]:
            raise Captured({})
        os.makedirs(stage.folder, exist_ok=True)
        if stage.head_only:
            return
        row = {"method": stage.name, "step": 0, "seconds": 0, "eval_loss": 1, "eval_accuracy": 0, "peak_memory_mb": 1}
        compare.write_rows(os.path.join(stage.folder, "results.csv"), [row])

    monkeypatch.setattr(compare, "run_or_skip", record)
    with pytest.raises(Captured):
        compare.main(["--model_name_or_path", mlm["model"], "--methods", ",".join(methods), "--max_steps", "2",
                      "--output_dir", str(output_dir), "--report_to", "none", "--seed", "7", *extra])  # fmt: skip
    return stages


def stage_datasets(monkeypatch, stage):
    """The training and validation sets of ``stage`` as its process makes them (run here, its Trainer captured)."""

    def record(model, training_args, tokenizer, train_set, eval_set, callbacks=(), padding_free=False):
        raise Captured({"train_dataset": train_set, "eval_dataset": eval_set, "padding_free": padding_free})

    monkeypatch.setattr(compare_stage, "mlm_trainer", record)
    with pytest.raises(Captured) as caught:
        compare_stage.run_stage(stage)
    return caught.value.kwargs


def masked_rows(dataset):
    return [(dataset[i]["input_ids"].tolist(), dataset[i]["labels"].tolist()) for i in range(len(dataset))]


@pytest.mark.parametrize("case", ["files", "carved", "hub"])
def test_comparison_hands_its_data_flags_to_each_method_run(mlm, monkeypatch, tmp_path, map_calls, case):
    """compare_methods trains each method in its own process on the stage it is handed: that
    stage's training and validation sets, masks included, are those pretrain_mlm makes from the
    same data flags (all of them set away from their defaults across the cases), and its
    tokenisation gets --preprocessing_num_workers / --overwrite_cache."""
    if case == "files":
        flags = ["--train_file", mlm["train_body"], "--validation_file", mlm["validation_body"], "--text_column_name",
                 "body", "--line_by_line", "--max_seq_length", "48", "--max_train_samples", "9", "--max_eval_samples",
                 "4", "--mlm_probability", "0.3", "--eval_mask_seed", "5", "--preprocessing_num_workers", "2",
                 "--overwrite_cache"]  # fmt: skip
    elif case == "carved":
        flags = ["--train_file", mlm["train"], "--validation_split_percentage", "20", "--max_seq_length", "64"]
    else:
        texts = lines(mlm["train"])[:24]
        calls = fake_hub(
            monkeypatch,
            DatasetDict(train=Dataset.from_dict({"text": texts[:18]}), validation=Dataset.from_dict({"text": texts[18:]})),
        )
        flags = ["--dataset_name", "someone/news", "--dataset_config_name", "en", "--line_by_line"]
    stages = comparison_stages(mlm, monkeypatch, tmp_path / "comparison", *flags)
    assert all(stage.data_args == stages["softmax"].data_args for stage in stages.values())
    method_run = stage_datasets(monkeypatch, stages["linformer"])
    assert set(map_calls) == {(2, False) if case == "files" else (None, True)}

    reference = captured(
        monkeypatch,
        pretrain,
        [
            "--model_name_or_path",
            mlm["model"],
            "--do_train",
            "--do_eval",
            "--output_dir",
            str(tmp_path / "mlm"),
            "--seed",
            "7",
            *flags,
        ],
    )
    for split in ("train_dataset", "eval_dataset"):
        assert masked_rows(method_run[split]) == masked_rows(reference[split])
    if case == "hub":
        assert calls == [("someone/news", "en")] * 3  # the comparison, its method run, pretrain_mlm


def test_comparison_hands_padding_free_to_each_method_run(mlm, monkeypatch, tmp_path):
    """--padding_free reaches the Trainer of each method's run (packed batches there too)."""
    for padding_free in (False, True):
        stages = comparison_stages(mlm, monkeypatch, tmp_path / str(padding_free), "--train_file", mlm["train"],
                                   "--line_by_line", *(["--padding_free"] if padding_free else []))  # fmt: skip
        assert stage_datasets(monkeypatch, stages["linformer"])["padding_free"] is padding_free


def test_comparison_stages_follow_methods_and_head_warmup_flags(mlm, monkeypatch, tmp_path):
    """--methods are the method runs, in that order, each with its method; --head_warmup_steps N first
    trains the head alone for N steps at --head_warmup_learning_rate, and every method starts from
    it at --learning_rate; 0 runs no warm-up and the methods start from the checkpoint."""
    stages = comparison_stages(mlm, monkeypatch, tmp_path / "a", "--train_file", mlm["train"], "--head_warmup_steps",
                               "3", "--head_warmup_learning_rate", "0.02", "--learning_rate", "0.004",
                               methods=("linformer", "softmax"))  # fmt: skip
    assert list(stages) == [compare.WARMUP_FOLDER, "linformer", "softmax"]
    warmup = stages[compare.WARMUP_FOLDER]
    assert warmup.head_only and warmup.model_args.model_name_or_path == mlm["model"]
    assert (warmup.training_args.max_steps, warmup.training_args.learning_rate) == (3, 0.02)
    for method in ("linformer", "softmax"):
        stage = stages[method]
        assert (stage.model_args.attn_impl, stage.model_args.model_name_or_path) == (method, warmup.folder)
        assert (stage.training_args.max_steps, stage.training_args.learning_rate) == (2, 0.004)

    unwarmed = comparison_stages(mlm, monkeypatch, tmp_path / "b", "--train_file", mlm["train"], "--head_warmup_steps",
                                 "0", methods=("softmax", "mra2"))  # fmt: skip
    assert list(unwarmed) == ["softmax", "mra2"]
    assert [stage.model_args.model_name_or_path for stage in unwarmed.values()] == [mlm["model"]] * 2
