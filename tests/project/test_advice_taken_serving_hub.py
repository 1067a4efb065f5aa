"""Each error that advises an alternative, triggered, then the advice taken exactly: the advised call or
flags go on and do what they should (tests/project/advice_table.py lists every advice and its test). Advice
that needs what this machine lacks (a GPU, the Hub, the network) is taken as far as it can be, and
the test says where it stops: here the ONNX export and encoding, and the Hub
export and model card."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers as T
from advice_table import raises
from hub_fixtures import bert_tokenizer
from hub_fixtures import tiny_config as hub_tiny_config
from huggingface_hub import ModelCard
from test_onnx_encode import classifier, texts_of  # noqa: F401  (classifier: a fixture)
from test_onnx_export import save_variant

import hf_efficient_attn as hea
from hf_efficient_attn.tools.minilm import minilm_path

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
