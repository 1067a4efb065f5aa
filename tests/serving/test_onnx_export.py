"""scripts/export_onnx.py: a variant exported to ONNX runs in ONNX Runtime as in PyTorch, at the
export length and at others, with a dynamic batch; a failed check is an error, never a silent file."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hub_fixtures import bert_tokenizer, small_options, tiny_config

import hf_efficient_attn as hea
from hf_efficient_attn.serving import cli
from hf_efficient_attn.serving import onnx as serving
from hf_efficient_attn.utils.cli_errors import run_cli

onnxruntime = pytest.importorskip("onnxruntime")


def save_variant(folder, method, head="AutoModelForMaskedLM"):
    torch.manual_seed(0)
    config = tiny_config("bert", initializer_range=0.5)
    model = getattr(hea, head).from_config(config, attn_impl=method, attn_config=small_options(method))
    model.save_pretrained(folder)
    bert_tokenizer().save_pretrained(folder)
    return model.eval()


def run_onnx(folder, inputs):
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in inputs.items()})


@pytest.mark.parametrize("method", [pytest.param("softmax", marks=pytest.mark.slow), "performer"])
def test_exported_variant_equals_pytorch_at_any_length_and_batch(tmp_path, method):
    """Seconds: torch.export traces the model (one layer would not export less code); one method
    in the default tier, the exact one in the slow tier."""
    model = save_variant(tmp_path / "variant", method)
    cli.main(["--model_dir", str(tmp_path / "variant"), "--output_dir", str(tmp_path / "onnx"), "--export_length", "64"])
    written = {p.name for p in (tmp_path / "onnx").iterdir()}
    assert {"model.onnx", "config.json", "tokenizer.json", "onnx_validation.json"} <= written
    checks = json.loads((tmp_path / "onnx" / "onnx_validation.json").read_text())
    assert [c["seq_len"] for c in checks] == [64, 97]
    for batch, length, real in [(3, 100, 71), (1, 17, 17)]:  # neither the export's batch nor its length
        ids = torch.randint(5, model.config.vocab_size, (batch, length))
        mask = torch.ones_like(ids)
        mask[-1, real:] = 0
        logits = run_onnx(tmp_path / "onnx", {"input_ids": ids, "attention_mask": mask})[0]
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask).logits
        real_tokens = mask.bool()
        np.testing.assert_allclose(logits[real_tokens.numpy()], expected[real_tokens].numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # two exports
def test_the_check_sees_a_different_model_and_a_failed_check_is_an_error(tmp_path, monkeypatch):
    save_variant(tmp_path / "variant", "softmax")
    exported = serving.load_for_export(str(tmp_path / "variant"))
    serving.export_onnx(exported, tmp_path / "model.onnx", 32)
    assert serving.validate(exported, tmp_path / "model.onnx", 40).passed
    with torch.no_grad():
        exported.bert.embeddings.word_embeddings.weight.add_(torch.randn(exported.config.vocab_size, 32) * 0.1)
    check = serving.validate(exported, tmp_path / "model.onnx", 40)
    assert not check.passed and max(check.max_abs_diff.values()) > serving.TOLERANCE
    monkeypatch.setattr(serving, "validate", lambda model, path, n, seed=0: serving.Validation(n, {"logits": 1.0}))
    with pytest.raises(ValueError, match="ONNX Runtime differs from PyTorch"):
        serving.export_folder(str(tmp_path / "variant"), tmp_path / "out", seq_len=32)


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        serving.export_folder(str(tmp_path / "missing"), tmp_path / "out")
    save_variant(tmp_path / "variant", "softmax")
    with pytest.raises(ValueError, match=r"must lie in \[2, 128\]"):
        serving.export_folder(str(tmp_path / "variant"), tmp_path / "out", seq_len=500)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        serving.export_folder(str(tmp_path / "variant"), tmp_path / "busy")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--output_dir", "out"], "the following arguments are required: --model_dir"),
        (["--model_dir", "missing", "--output_dir", "out"], "--model_dir missing: no such folder"),
        (
            ["--model_dir", "variant", "--output_dir", "out", "--export_length", "x"],
            "--export_length/--export-length: invalid int value",
        ),
    ],
)
def test_the_script_reports_bad_arguments_in_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "variant").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(cli.main, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


@pytest.mark.parametrize("package", ["onnx", "onnxscript", "onnxruntime"])
def test_a_missing_exporter_package_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys, package):
    """Each package of the serving extra missing: one error line with the install command, before
    the model is loaded, and no output folder."""
    save_variant(tmp_path / "variant", "softmax")
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now fails
    monkeypatch.setattr(serving, "load_for_export", lambda *args: pytest.fail("loaded the model"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(cli.main, ["--model_dir", str(tmp_path / "variant"), "--output_dir", str(tmp_path / "onnx")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {package} cannot be imported") and 'pip install "hf_efficient_attn[serving]"' in err[0]
    assert not (tmp_path / "onnx").exists()


@pytest.mark.parametrize("failure", ["export", "check"])
def test_a_failed_export_leaves_no_folder_behind(tmp_path, monkeypatch, failure):
    """The export or its check fails: the folders the run made are gone, a given empty folder is empty
    again, and the same command can run again (the export and the check are stubs here)."""
    save_variant(tmp_path / "variant", "softmax")

    def export(model, path, n, opset):
        Path(path).write_text("partial")
        if failure == "export":
            raise RuntimeError("the exporter failed")

    monkeypatch.setattr(serving, "export_onnx", export)
    monkeypatch.setattr(serving, "validate", lambda model, path, n, seed: serving.Validation(n, {"logits": 1.0}))
    (tmp_path / "empty").mkdir()
    for output_dir in (tmp_path / "new" / "nested" / "onnx", tmp_path / "empty"):
        for _ in range(2):  # rerunning meets the same failure, not a "not empty" folder
            with pytest.raises(RuntimeError if failure == "export" else ValueError, match="failed|differs"):
                serving.export_folder(str(tmp_path / "variant"), output_dir, seq_len=16)
    assert not (tmp_path / "new").exists() and list((tmp_path / "empty").iterdir()) == []


def test_export_folder_int8_texts_text_length_and_task_reach_their_steps(tmp_path, monkeypatch):
    """int8 writes model_quantized.onnx beside model.onnx and checks both, texts are checked on each
    file at text_length tokens, task="feature-extraction" exports the encoder of a masked-LM folder
    (whose own head, token logits, cannot take texts). The steps are spied on."""
    save_variant(tmp_path / "variant", "softmax")
    steps = []
    monkeypatch.setattr(serving, "export_onnx", lambda model, path, n, opset: steps.append(("export", type(model).__name__)))
    monkeypatch.setattr(serving, "quantize_int8", lambda path, output: steps.append(("int8", path.name, output.name)))
    monkeypatch.setattr(
        serving,
        "validate",
        lambda model, path, n, seed: (
            steps.append(("check", path.name, n)) or serving.Validation(n, {"last_hidden_state": 0.0}, file=path.name)
        ),
    )
    monkeypatch.setattr(
        serving,
        "validate_texts",
        lambda model, folder, texts, n, file: (
            steps.append(("texts", file, tuple(texts), n)) or serving.TextValidation(file, len(texts), n, 0.0)
        ),
    )
    with pytest.raises(ValueError, match="token-level head"):
        serving.export_folder(str(tmp_path / "variant"), tmp_path / "refused", seq_len=16, texts=["the cat"])
    assert steps == [] and not (tmp_path / "refused").exists()
    serving.export_folder(str(tmp_path / "variant"), tmp_path / "out", seq_len=16, check_lengths=[20], int8=True,
                          texts=["the cat", "a"], text_length=50, task="feature-extraction")  # fmt: skip
    assert steps == [
        ("export", "BertModel"),
        ("int8", "model.onnx", "model_quantized.onnx"),
        ("check", "model.onnx", 16),
        ("check", "model.onnx", 20),
        ("check", "model_quantized.onnx", 16),
        ("check", "model_quantized.onnx", 20),
        ("texts", "model.onnx", ("the cat", "a"), 50),
        ("texts", "model_quantized.onnx", ("the cat", "a"), 50),
    ]
    steps.clear()
    serving.export_folder(str(tmp_path / "variant"), tmp_path / "plain", seq_len=16, check_lengths=[20])
    assert steps == [("export", "BertForMaskedLM"), ("check", "model.onnx", 16), ("check", "model.onnx", 20)]


def test_int8_checks_are_reported_not_required(tmp_path, monkeypatch):
    """An int8 check far from PyTorch is reported; the same difference in the fp32 model fails, on the
    padded batches or on the texts."""
    save_variant(tmp_path / "variant", "softmax")
    monkeypatch.setattr(serving, "export_onnx", lambda *args: None)
    monkeypatch.setattr(serving, "quantize_int8", lambda *args: None)
    far = {"model.onnx": 0.0, "model_quantized.onnx": 0.5}
    monkeypatch.setattr(
        serving, "validate", lambda model, path, n, seed: serving.Validation(n, {"logits": far[path.name]}, path.name)
    )
    checks = serving.export_folder(str(tmp_path / "variant"), tmp_path / "out", seq_len=16, int8=True)
    assert "int8 ONNX Runtime vs PyTorch, padded batch of 16 tokens: max |diff| 5.0e-01\n" in (
        serving.describe(checks, tmp_path / "out")
    )
    far["model.onnx"] = 0.5
    with pytest.raises(ValueError, match="differs from PyTorch"):
        serving.export_folder(str(tmp_path / "variant"), tmp_path / "out2", seq_len=16, int8=True)
    far["model.onnx"] = 0.0
    far_on_texts = {"model.onnx": 0.0, "model_quantized.onnx": 0.5}
    monkeypatch.setattr(serving, "eager_kind", lambda model: "embeddings")
    monkeypatch.setattr(
        serving,
        "validate_texts",
        lambda model, folder, texts, n, file: serving.TextValidation(file, len(texts), n, far_on_texts[file], 0.9, 0.95),
    )
    checks = serving.export_folder(str(tmp_path / "variant"), tmp_path / "out3", seq_len=16, int8=True, texts=["a"])
    assert (
        "int8 ONNX Runtime vs PyTorch, 1 texts of up to 128 tokens: max |diff| 5.0e-01, embedding cosine min 0.9000 mean 0.9500"
    ) in serving.describe(checks, tmp_path / "out3")
    far_on_texts["model.onnx"] = 0.5
    with pytest.raises(ValueError, match="differs from PyTorch beyond 0.0001: 1 texts of up to 128 tokens: 0.5$"):
        serving.export_folder(str(tmp_path / "variant"), tmp_path / "out4", seq_len=16, int8=True, texts=["a"])


def test_export_script_task_exports_the_encoder(tmp_path, monkeypatch):
    """--task feature-extraction: the encoder of a masked-LM folder is exported (its weights), not the
    folder's own head; an unknown task is refused before loading (the export is spied on)."""
    model = save_variant(tmp_path / "variant", "softmax")
    exported = []
    monkeypatch.setattr(serving, "export_onnx", lambda model, path, n, opset: exported.append(model))
    monkeypatch.setattr(serving, "validate", lambda model, path, n, seed: serving.Validation(n, {"x": 0.0}))
    for task, output_dir in ((["--task", "feature-extraction"], "encoder"), ([], "head")):
        cli.main(["--model_dir", str(tmp_path / "variant"), "--output_dir", str(tmp_path / output_dir), *task])
    encoder, head = exported
    assert type(encoder).__name__ == "BertModel" and type(head).__name__ == "BertForMaskedLM"
    weights = {name: value for name, value in encoder.state_dict().items() if not name.startswith("pooler.")}
    torch.testing.assert_close(weights, model.bert.state_dict(), rtol=0, atol=0)  # the masked-LM's has no pooler
    with pytest.raises(ValueError, match="--task fill-mask: allowed: feature-extraction"):
        cli.main(["--model_dir", str(tmp_path / "variant"), "--output_dir", str(tmp_path / "x"), "--task", "fill-mask"])
