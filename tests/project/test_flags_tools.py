"""The flags of the tool scripts (convert_to_long, demo, export_onnx, push_to_hub, quickstart, the
prepare_* data scripts, mutation_check) reach the place they act on: each test passes values other
than the defaults and checks their effect on what the script writes, or, where the real work is slow
(ONNX export, training, the mutation runs), what the function doing it receives."""

import json
import os
import types

import pandas as pd
import pytest
import torch
import transformers as T
from flag_table import script_main
from hub_fixtures import BERT_WORDS, bert_tokenizer, small_options, tiny_config
from huggingface_hub import ModelCard
from tiny import option_defaults

import hf_efficient_attn as hea
from hf_efficient_attn.hub import cli as push_cli
from hf_efficient_attn.serving import cli as onnx_cli
from hf_efficient_attn.serving import onnx as serving
from hf_efficient_attn.tasks import convert
from hf_efficient_attn.tasks.common import corpus
from hf_efficient_attn.tasks.wikihop import qangaroo
from hf_efficient_attn.tools import demo, quickstart


def value_of(argv, flag):
    return argv[argv.index(flag) + 1]


# ---- convert_to_long ------------------------------------------------------------------------------


def test_convert_flags_length_seed_base_model_and_output_dir(tmp_path):
    """--max_length sizes the position table and the tokenizer, --seed draws the new MLM head (as a
    load seeded with it does), --base_model is recorded in provenance.json; all saved in --output_dir."""
    encoder = str(tmp_path / "encoder")
    T.BertModel(tiny_config("bert")).save_pretrained(encoder)
    bert_tokenizer().save_pretrained(encoder)
    out = tmp_path / "long"
    convert.main(["--model_name_or_path", encoder, "--output_dir", str(out), "--max_length", "300", "--seed", "3",
                  "--base_model", "someone/base"])  # fmt: skip

    saved = T.AutoModelForMaskedLM.from_pretrained(out)
    assert saved.config.max_position_embeddings == 300 != tiny_config("bert").max_position_embeddings
    assert T.AutoTokenizer.from_pretrained(out).model_max_length == 300

    def head(seed):
        torch.manual_seed(seed)
        return T.AutoModelForMaskedLM.from_pretrained(encoder).cls.predictions.transform.dense.weight

    drawn_from_3 = head(3)
    torch.testing.assert_close(saved.cls.predictions.transform.dense.weight, drawn_from_3, rtol=0, atol=0)
    assert not torch.equal(drawn_from_3, head(0))
    assert json.loads((out / "provenance.json").read_text())["base_model"] == "someone/base"
    # A folder that holds a model is not overwritten (a later run's provenance may point at it).
    written = (out / "model.safetensors").stat().st_mtime_ns
    with pytest.raises(ValueError, match=r"--output_dir .*long already holds a model \(config.json\); give a new folder"):
        convert.main(["--model_name_or_path", encoder, "--output_dir", str(out), "--max_length", "400"])
    assert (out / "model.safetensors").stat().st_mtime_ns == written


# ---- demo -----------------------------------------------------------------------------------------


def run_demo(tmp_path, monkeypatch, argv):
    """The demo's (attn_impl, attn_config, position table, input shape) of every model it pools, a
    tiny checkpoint and four articles standing in for the real ones."""
    checkpoint = str(tmp_path / "checkpoint")
    T.BertModel(tiny_config("bert", max_position_embeddings=512)).save_pretrained(checkpoint)
    bert_tokenizer().save_pretrained(checkpoint)
    monkeypatch.setattr(demo, "minilm_path", lambda: checkpoint)
    articles = (
        ("short", "the cat was on the mat " * 10),
        ("long", "she was not " * 250),
        ("b", "it is " * 400),
        ("c", "he was " * 400),
    )
    monkeypatch.setattr(corpus, "_all_wikipedia_articles", lambda: articles)
    pooled = []

    def mean_pooled(model, batch):
        config = model.config
        pooled.append((getattr(config, "attn_impl", None), getattr(config, "attn_config", None),
                       config.max_position_embeddings, tuple(batch["input_ids"].shape)))  # fmt: skip
        return torch.nn.functional.normalize(torch.ones(batch["input_ids"].shape[0], 4), dim=-1)

    monkeypatch.setattr(demo, "mean_pooled", mean_pooled)
    demo.main(argv)
    return pooled


def test_demo_flags_reach_the_models_and_the_text(tmp_path, monkeypatch):
    """--attn_impl / --attn_config build the swapped model (the exact one stays plain), --num_articles
    passages make the 512-token batch, --long_length picks articles that long, stretches both models
    and is the long input's length."""
    pooled = run_demo(tmp_path, monkeypatch, ["--attn_impl", "yoso", "--attn_config", '{"num_hash": 4}',
                                              "--num_articles", "2", "--long_length", "600"])  # fmt: skip
    options = {**option_defaults("yoso"), "num_hash": 4}
    assert pooled[0][:3] == (None, None, 512) and pooled[1][:3] == ("yoso", options, 512)
    assert pooled[0][3] == pooled[1][3] and pooled[0][3][0] == 2
    assert {entry[0] for entry in pooled[2:]} == {None, "yoso"}
    assert all(entry[1:] == ((options if entry[0] else None), 600, (1, 600)) for entry in pooled[2:])


# ---- export_onnx ----------------------------------------------------------------------------------


def test_export_flags_reach_the_export_and_the_checks(tmp_path, monkeypatch):
    """--model_dir's model is traced at --export_length tokens with --opset into --output_dir, and
    ONNX Runtime checks it at --export_length and each of --check_lengths. (torch.onnx.export and the
    ONNX Runtime check are spied on: tests/serving/test_onnx_export.py runs them.)"""
    torch.manual_seed(0)
    variant = hea.AutoModelForMaskedLM.from_config(tiny_config("bert"), attn_impl="performer",
                                                   attn_config=small_options("performer"))  # fmt: skip
    variant.save_pretrained(tmp_path / "variant")
    bert_tokenizer().save_pretrained(tmp_path / "variant")
    exported, checked = [], []

    def export(model, args, path, kwargs, opset_version, **_):
        exported.append((model, path, tuple(kwargs["input_ids"].shape), opset_version))

    def validate(model, path, seq_len, seed=0):
        checked.append((model, str(path), seq_len))
        return serving.Validation(seq_len, {"logits": 0.0})

    monkeypatch.setattr(torch.onnx, "export", export)
    monkeypatch.setattr(serving, "validate", validate)
    out = tmp_path / "onnx"
    onnx_cli.main(["--model_dir", str(tmp_path / "variant"), "--output_dir", str(out), "--export_length", "48",
                   "--check_lengths", "20", "70", "--opset", "17"])  # fmt: skip

    ((model, path, shape, opset),) = exported
    assert (path, shape, opset) == (str(out / "model.onnx"), (2, 48), 17)
    assert model.config.attn_impl == "performer"
    torch.testing.assert_close(model.state_dict(), variant.state_dict(), rtol=0, atol=0)
    assert [(m is model, p, n) for m, p, n in checked] == [(True, str(out / "model.onnx"), n) for n in (48, 20, 70)]
    assert {"config.json", "tokenizer.json"} <= set(os.listdir(out))


# ---- push_to_hub (the upload flags: tests/hub/test_hub_upload.py) --------------------------------------


def test_push_flags_make_the_upload_folder(tmp_path, capsys):
    """A plain checkpoint pushed with --dry_run: --attn_impl / --attn_config convert --model_dir's
    weights, --tokenizer_name's tokenizer is shipped (not --model_dir's), --base_model and --license are
    the card's, --results_file's metrics on --dataset_name / --dataset_config_name are its model-index,
    and the repository is named in the namespace --repo_id by base, method, length and configuration."""
    plain = tmp_path / "plain"
    torch.manual_seed(0)
    T.BertForMaskedLM(tiny_config("bert")).save_pretrained(plain)
    bert_tokenizer().save_pretrained(plain)
    reordered = BERT_WORDS[:5] + BERT_WORDS[:4:-1]  # same special tokens, other ids for the words
    T.BertTokenizer(vocab={w: i for i, w in enumerate(reordered)}).save_pretrained(tmp_path / "tokenizer")
    (tmp_path / "eval_results.json").write_text(json.dumps({"eval_accuracy": 0.625, "epoch": 1.0}))
    out = tmp_path / "upload"
    folder = push_cli.main([
        "--model_dir", str(plain), "--repo_id", "someone", "--attn_impl", "performer", "--attn_config",
        '{"num_features": 16}', "--tokenizer_name", str(tmp_path / "tokenizer"), "--base_model", "org/base-x",
        "--license", "mit", "--results_file", str(tmp_path / "eval_results.json"), "--dataset_name", "org/data",
        "--dataset_config_name", "cfg", "--dry_run", str(out),
    ])  # fmt: skip

    assert folder == str(out)
    assert f"{out} to https://huggingface.co/someone/base-x-performer-128-cfg" in capsys.readouterr().out
    shipped = hea.AutoModelForMaskedLM.from_pretrained(out)
    assert shipped.config.attn_impl == "performer" and shipped.config.attn_config["num_features"] == 16
    assert hea.method_options("performer")["num_features"].default != 16
    original = T.BertForMaskedLM.from_pretrained(plain)
    torch.testing.assert_close(shipped.bert.embeddings.word_embeddings.weight,
                               original.bert.embeddings.word_embeddings.weight, rtol=0, atol=0)  # fmt: skip
    vocab = T.AutoTokenizer.from_pretrained(out).get_vocab()
    assert vocab == {w: i for i, w in enumerate(reordered)} != bert_tokenizer().get_vocab()
    card = ModelCard.load(out / "README.md").data
    assert (card.base_model, card.license, card.model_name) == ("org/base-x", "mit", "base-x-performer-128-cfg")
    (result,) = card.eval_results
    assert (result.metric_type, result.metric_value) == ("accuracy", 0.625)
    assert (result.dataset_type, result.dataset_config) == ("org/data", "cfg")


# ---- quickstart -----------------------------------------------------------------------------------


def run_quickstart(monkeypatch, argv):
    """What each step of the quickstart receives (the steps spied on; the slow tier runs them)."""
    calls = {}

    def trained(name):
        def main(argv, callbacks=()):
            calls[name] = argv
            os.makedirs(value_of(argv, "--output_dir"))
            results = {"eval_accuracy": 0.5, "perplexity": 2.0, "eval_samples": 4}
            with open(os.path.join(value_of(argv, "--output_dir"), "all_results.json"), "w") as f:
                json.dump(results, f)

        return main

    def convert_to_long(*args, **kwargs):
        calls["convert"] = (args, kwargs)
        return None, None, types.SimpleNamespace(lines=list)

    monkeypatch.setattr(quickstart, "minilm_path", lambda: "minilm")
    monkeypatch.setattr(quickstart, "write_wikipedia_jsonl", lambda folder: calls.setdefault("wikipedia", folder))
    monkeypatch.setattr(quickstart.glue, "write_offline_sample", lambda name, folder: calls.setdefault(name, folder))
    monkeypatch.setattr(quickstart, "convert_to_long", convert_to_long)
    monkeypatch.setattr(quickstart.mlm, "main", trained("mlm"))
    monkeypatch.setattr(quickstart.glue, "main", trained("glue"))
    monkeypatch.setattr(quickstart, "push_variant", lambda *args, **kwargs: calls.setdefault("push", (args, kwargs)))
    quickstart.main(argv)
    return calls


def test_quickstart_flags_reach_their_steps(tmp_path, monkeypatch):
    """Each step receives its flags: the conversion --attn_impl, --attn_config and --max_length, MLM
    pretraining --max_length and --mlm_steps, fine-tuning --finetune_length and --finetune_epochs; every
    step writes under --output_dir."""
    out = str(tmp_path / "qs")
    calls = run_quickstart(monkeypatch, ["--output_dir", out, "--attn_impl", "yoso", "--attn_config", '{"num_hash": 4}',
                                         "--max_length", "640", "--mlm_steps", "3", "--finetune_length", "96",
                                         "--finetune_epochs", "5"])  # fmt: skip

    folder = {name: os.path.join(out, name) for name in quickstart.STEPS}
    assert calls["wikipedia"] == os.path.join(folder["data"], "wikipedia")
    assert calls["newsgroups"] == os.path.join(folder["data"], "newsgroups")
    assert calls["convert"] == (("minilm", 640, "yoso", {"num_hash": 4}),
                                {"output_dir": folder["1-long"], "base_model": quickstart.BASE_MODEL})  # fmt: skip
    mlm, glue = calls["mlm"], calls["glue"]
    assert value_of(mlm, "--model_name_or_path") == folder["1-long"]
    assert (value_of(mlm, "--max_seq_length"), value_of(mlm, "--max_steps")) == ("640", "3")
    assert value_of(mlm, "--output_dir") == value_of(glue, "--model_name_or_path") == folder["2-mlm"]
    assert (value_of(glue, "--max_seq_length"), value_of(glue, "--num_train_epochs")) == ("96", "5")
    assert value_of(glue, "--output_dir") == folder["3-newsgroups"]
    assert calls["push"] == ((folder["3-newsgroups"], "your-name"), {"dry_run": folder["4-upload"]})


@pytest.mark.parametrize("script", ["demo", "quickstart"])
def test_method_flags_choose_the_method_each_tool_runs(script, tmp_path, monkeypatch):
    """--attn_impl / --attn_config, the flags the demo and the quickstart share (MethodArguments), choose
    the method each tool runs: the demo's swapped model, the quickstart's conversion."""
    flags = ["--attn_impl", "yoso", "--attn_config", '{"num_hash": 8}']
    if script == "demo":
        swapped = run_demo(tmp_path, monkeypatch, [*flags, "--num_articles", "2", "--long_length", "600"])[1]
        assert swapped[:2] == ("yoso", {**option_defaults("yoso"), "num_hash": 8})
    else:
        convert_args = run_quickstart(monkeypatch, ["--output_dir", str(tmp_path / "qs"), *flags])["convert"][0]
        assert convert_args[2:] == ("yoso", {"num_hash": 8})


# ---- prepare_glue_sample, prepare_wikihop, prepare_wikipedia ---------------------------------------


@pytest.mark.parametrize("sample, reader", [("movie_reviews", corpus.movie_review_sentences),
                                            ("newsgroups", corpus.newsgroup_posts)])  # fmt: skip
def test_prepare_glue_sample_flags(tmp_path, sample, reader):
    """--sample's text is written to --output_dir, every --validation_every-th example of each label
    held out."""
    script_main("prepare_glue_sample")(["--sample", sample, "--output_dir", str(tmp_path), "--validation_every", "3"])
    seen, expected = {}, {"train": [], "validation": []}
    for text, label in reader():
        seen[label] = seen.get(label, 0) + 1
        expected["validation" if seen[label] % 3 == 0 else "train"].append(text)
    for split, texts in expected.items():
        assert pd.read_csv(tmp_path / f"{split}.csv", keep_default_na=False)["sentence"].tolist() == texts


def test_prepare_wikihop_flags(tmp_path, monkeypatch, capsys):
    """--train_examples synthetic examples go to train.json, the real ones and --dev_examples synthetic
    ones to dev.json, both in --output_dir; the line printed counts what each file holds. Each count
    must be positive (0 would leave dev.json with the real examples alone)."""
    real = [{"id": "WH_dev_0"}, {"id": "WH_dev_1"}]
    monkeypatch.setattr(qangaroo, "real_examples", lambda: real)
    script_main("prepare_wikihop")(["--output_dir", str(tmp_path), "--train_examples", "5", "--dev_examples", "3"])
    train = json.loads((tmp_path / "train.json").read_text())
    dev = json.loads((tmp_path / "dev.json").read_text())
    assert len(train) == 5 and dev[:2] == real and len(dev) == 2 + 3
    assert capsys.readouterr().out.strip() == f"wrote {len(train)} training and {len(dev)} development examples"
    for flag in ("--train_examples", "--dev_examples"):
        with pytest.raises(ValueError, match=f"{flag} must be a positive integer"):
            script_main("prepare_wikihop")(["--output_dir", str(tmp_path / "other"), flag, "0"])


def test_prepare_wikipedia_flags(tmp_path, monkeypatch):
    """Only articles of at least --min_words words are written to --output_dir, the last
    --validation_articles of them held out. (Five made-up articles stand in for gensim's.)"""
    articles = tuple((f"title {n}", " ".join(["word"] * n)) for n in (30, 5, 12, 3, 40))
    monkeypatch.setattr(corpus, "_all_wikipedia_articles", lambda: articles)
    script_main("prepare_wikipedia")(["--output_dir", str(tmp_path), "--validation_articles", "2", "--min_words",
                                      "10"])  # fmt: skip

    def titles(split):
        return [json.loads(line)["title"] for line in (tmp_path / f"{split}.jsonl").read_text().splitlines()]

    assert (titles("train"), titles("validation")) == (["title 30"], ["title 12", "title 40"])


# ---- mutation_check -------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, runs", [
    ([], [("baseline", ("t_a",), 2400), ("m0", ("t_a",), 1200)]),
    (["--slow"], [("baseline", ("t_a", "t_b"), 2400), ("m0", ("t_a",), 1200), ("m1", ("t_b",), 1200)]),
    (["--slow", "--only", "pkg/b", "--no_baseline", "--timeout", "7"], [("m0", ("t_b",), 7)]),
    (["--timeout", "7"], [("baseline", ("t_a",), 14), ("m0", ("t_a",), 7)]),
    (["--slow", "--list"], []),
])  # fmt: skip
def test_mutation_check_flags(monkeypatch, capsys, argv, runs):
    """--slow adds the slow mutations, --only keeps those of matching files, --no_baseline skips the
    unmutated run, --timeout limits each run (the baseline's twice), --list runs nothing and lists them.
    (Two made-up mutations; the test runs are spied on.)"""
    main = script_main("mutation_check")
    check = main.__globals__
    mutations = [check["Mutation"]("pkg/a.py", "x = 1", "x = 2", ("t_a",), "bug a"),
                 check["Mutation"]("pkg/b.py", "y = 1", "y = 2", ("t_b",), "bug b", slow=True)]  # fmt: skip
    monkeypatch.setitem(check, "MUTATIONS", mutations)

    def copy_repository(root):
        os.makedirs(os.path.join(root, "pkg"))
        for mutation in mutations:
            with open(os.path.join(root, mutation.path), "w") as f:
                f.write(mutation.original)

    recorded = []

    def run_tests(root, tests, timeout):
        recorded.append((os.path.basename(root), tests, timeout))
        return ("passed" if os.path.basename(root) == "baseline" else "failed"), 0.0

    monkeypatch.setitem(check, "copy_repository", copy_repository)
    monkeypatch.setitem(check, "run_tests", run_tests)
    assert main(argv) == 0
    assert recorded == runs
    if "--list" in argv:
        assert capsys.readouterr().out.splitlines() == ["pkg/a.py: bug a  [t_a]", "pkg/b.py: bug b  [t_b]  (slow)"]


@pytest.mark.parametrize("status, caught", [("failed", True), ("timeout", True), ("passed", False), ("error", False)])
def test_mutation_check_verdicts(monkeypatch, capsys, status, caught):
    """A mutation whose tests fail, or run past --timeout (an infinite loop the bug made), is caught;
    one whose tests pass, or cannot run (nothing collected), survived: exit status 1."""
    main = script_main("mutation_check")
    check = main.__globals__
    mutation = check["Mutation"]("pkg/a.py", "x = 1", "x = 2", ("t_a",), "bug a")
    monkeypatch.setitem(check, "MUTATIONS", [mutation])

    def copy_repository(root):
        os.makedirs(os.path.join(root, "pkg"))
        with open(os.path.join(root, mutation.path), "w") as f:
            f.write(mutation.original)

    monkeypatch.setitem(check, "copy_repository", copy_repository)
    monkeypatch.setitem(check, "run_tests", lambda root, tests, timeout: (status, 0.0))
    assert main(["--no_baseline"]) == (0 if caught else 1)
    assert capsys.readouterr().out.splitlines()[0].startswith("caught  " if caught else "SURVIVED")
