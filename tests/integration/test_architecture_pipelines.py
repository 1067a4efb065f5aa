"""The pipelines on every architecture of issue 55, in this process; in the default tier on one of each
kind: ALBERT (learned positions, one shared layer), GTE (rotary, full layers), ModernBERT (rotary,
windowed layers). Slow only: what needs a fresh process (the upload folder loaded without the plugin)
or an ONNX export (10-16 s each)."""

import numpy as np
import pytest
import torch
import transformers as T
from hub_fixtures import load_without_plugin
from tiny import KINDS, default_tier
from training_fixtures import save_tiny_mlm, write_news_files

import hf_efficient_attn as hea
from hf_efficient_attn.hub import export_variant


def inputs(model, length=60, real=41):
    torch.manual_seed(1)
    ids = torch.randint(5, model.config.vocab_size, (2, length))
    mask = torch.ones_like(ids)
    mask[1, real:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def shared_variants(tmp_path_factory):
    """Per kind, built on first use: convert_to_long.py stretches a tiny masked-LM model with mra2,
    pretrain_mlm.py trains it, and its Hub upload folder is written; read-only for the tests."""
    from hf_efficient_attn.tasks import convert
    from hf_efficient_attn.tasks.mlm import pretrain

    built = {}

    def variant(model_type):
        if model_type not in built:
            root = tmp_path_factory.mktemp(model_type)
            source = save_tiny_mlm(str(root / "short"), model_type, max_positions=64)
            convert.main(["--model_name_or_path", source, "--max_length", "256", "--attn_impl", "mra2",
                          "--attn_config", '{"block_per_row": 1}', "--output_dir", str(root / "long")])  # fmt: skip
            train, validation = write_news_files(str(root))
            pretrain.main(["--model_name_or_path", str(root / "long"), "--train_file", train, "--validation_file",
                           validation, "--max_seq_length", "128", "--per_device_train_batch_size", "2", "--max_steps",
                           "3", "--do_train", "--output_dir", str(root / "mlm"), "--report_to", "none"])  # fmt: skip
            model = T.AutoModelForMaskedLM.from_pretrained(root / "mlm").eval()
            folder = export_variant(model, T.AutoTokenizer.from_pretrained(root / "mlm"), root / "hub",
                                    repo_id="someone/x", base_model="someone/base", license="apache-2.0")  # fmt: skip
            built[model_type] = model, folder, root
        return built[model_type]

    return variant


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_convert_pretrain_and_share(model_type, shared_variants):
    """convert_to_long.py stretches it with mra2, pretrain_mlm.py trains it (loss finite, the folder
    reloads as itself), and the Hub upload folder, its card naming the architecture, holds the base
    model too (GTE's weights converted from its original layout, as Transformers' own class does)."""
    model, folder, _ = shared_variants(model_type)
    assert model.config.attn_impl == "mra2" and model.config.max_position_embeddings >= 256
    batch = inputs(model, 200, 150)
    with torch.no_grad():
        assert torch.isfinite(model(**batch).logits).all()
        encoded = hea.AutoModel.from_pretrained(folder).eval()(**batch).last_hidden_state
        torch.testing.assert_close(encoded, model.base_model(**batch).last_hidden_state)  # all its weights
    card = (folder / "README.md").read_text()
    assert f"- {model_type}\n" in card and type(model).__name__ in card  # the card's tags and class name it


@pytest.mark.slow
@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_the_upload_folder_loads_without_the_plugin(model_type, shared_variants):
    """The Hub upload folder loads in a process without the plugin with the same outputs, as the
    masked-LM model and as the base model."""
    model, folder, root = shared_variants(model_type)
    batch = inputs(model, 200, 150)
    with torch.no_grad():
        expected, encoded = model(**batch).logits, model.base_model(**batch).last_hidden_state
    jobs = {"m": (folder, "AutoModelForMaskedLM", batch), "base": (folder, "AutoModel", batch)}
    seen = load_without_plugin(jobs, root)
    torch.testing.assert_close(seen["m"]["output"], expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(seen["base"]["output"], encoded, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_lora_trains_and_reloads(model_type, tmp_path):
    """PEFT LoRA (the scripts' --peft lora, its default targets) on a patched classifier: a step changes
    the outputs, the saved adapter reloads onto a fresh copy of the base with the same outputs."""
    from peft import PeftModel

    from hf_efficient_attn.tasks.common.adapters import PeftArguments, apply_lora

    source = save_tiny_mlm(str(tmp_path / "base"), model_type)
    torch.manual_seed(0)
    base = hea.AutoModelForSequenceClassification.from_pretrained(source, attn_impl="mra2", num_labels=2)
    lora = apply_lora(base, PeftArguments(peft="lora", lora_r=4), task_type="SEQ_CLS")
    for name, parameter in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter)  # LoRA starts at B = 0: no change to see
    batch = inputs(base)
    with torch.no_grad():
        before = lora.eval()(**batch).logits
    lora.train()
    loss = lora(**batch, labels=torch.tensor([0, 1])).loss
    loss.backward()
    torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=0.1).step()
    lora.eval().save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        expected = lora(**batch).logits
    assert not torch.allclose(expected, before)
    torch.manual_seed(0)
    fresh = hea.AutoModelForSequenceClassification.from_pretrained(source, attn_impl="mra2", num_labels=2)
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, expected)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_onnx_export_equals_pytorch(model_type, tmp_path):
    """export_onnx.py's export folder: ONNX Runtime equals PyTorch at the length exported and another
    (the export's own checks), and encode_onnx.py's embeddings (the mean of the real tokens) equal the
    PyTorch model's."""
    from hf_efficient_attn.serving.encoding import encode
    from hf_efficient_attn.serving.onnx import export_folder

    source = save_tiny_mlm(str(tmp_path / "base"), model_type)
    model = hea.AutoModel.from_pretrained(source, attn_impl="mra2", attn_config={"block_per_row": 1}).eval()
    model.save_pretrained(tmp_path / "variant")
    tokenizer = T.AutoTokenizer.from_pretrained(source)
    tokenizer.save_pretrained(tmp_path / "variant")
    checks = export_folder(str(tmp_path / "variant"), tmp_path / "onnx", seq_len=64, check_lengths=[100])
    assert all(check.passed for check in checks) and len(checks) == 2
    texts = ["A short text.", "A longer text of several words, " * 6]
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state
    mask = encoded["attention_mask"][..., None].to(hidden.dtype)
    expected = (hidden * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(encode(tmp_path / "onnx", texts), expected.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_finetune_glue_predicts_what_the_saved_model_predicts(model_type, tmp_path):
    """finetune_glue.py on MRPC (pairs of real sentences) with mra2: it trains and evaluates, and its
    submission file holds the saved model's own predictions."""
    from glue_fixtures import write_task_files
    from glue_runs import SEQ, predictions_file, read_rows, run

    # GTE's and jina-v3's configs have one token type; the small BERT tokenizer gives a pair's second
    # sentence type 1 (their own tokenizers give no token types).
    types = {"type_vocab_size": 2} if model_type in ("gte", "jina_embeddings_v3") else {}
    workspace = {
        "model": save_tiny_mlm(str(tmp_path / "tiny"), model_type, **types),
        "files": {"mrpc": write_task_files(str(tmp_path / "mrpc"), "mrpc")},
    }
    out = tmp_path / "run"
    metrics = run(workspace, "mrpc", out, max_steps=3)
    assert 0 <= metrics["eval_accuracy"] <= 1
    model = hea.AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert model.config.attn_impl == "mra2" and model.config.model_type == model_type
    rows = read_rows(workspace["files"]["mrpc"]["test"])
    tokenizer = T.AutoTokenizer.from_pretrained(out)
    encoded = tokenizer([r["sentence1"] for r in rows], [r["sentence2"] for r in rows], padding="max_length",
                        max_length=SEQ, truncation=True, return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        predicted = model(**encoded).logits.argmax(-1).tolist()
    assert [int(label) for _, label in predictions_file(out / "predict_results_mrpc.txt")] == predicted


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_compare_methods_trains_each_method_from_the_same_start(model_type, tmp_path, monkeypatch):
    """compare_methods.py: softmax and mra2, each from the same warmed weights, evaluated at every
    checkpoint (the stages run in this process)."""
    from hf_efficient_attn.tasks.mlm import compare, compare_stage
    from hf_efficient_attn.tasks.mlm.compare_stage import START_WEIGHTS, read_json

    monkeypatch.setattr(compare, "run_in_own_process", compare_stage.run_stage)
    model = save_tiny_mlm(str(tmp_path / "tiny"), model_type)
    train, validation = write_news_files(str(tmp_path))
    out = tmp_path / "compare"
    rows = compare.main(["--model_name_or_path", model, "--methods", "softmax,mra2", "--train_file", train,
                         "--validation_file", validation, "--max_seq_length", "64", "--max_steps", "2", "--eval_steps",
                         "2", "--per_device_train_batch_size", "2", "--max_eval_samples", "4", "--output_dir", str(out),
                         "--report_to", "none"])  # fmt: skip
    assert {(row["method"], row["step"]) for row in rows} == {(m, s) for m in ("softmax", "mra2") for s in (0, 2)}
    assert read_json(out / "softmax" / START_WEIGHTS) == read_json(out / "mra2" / START_WEIGHTS)  # mra2: no own weights
    assert T.AutoConfig.from_pretrained(out / "mra2").attn_impl == "mra2"
