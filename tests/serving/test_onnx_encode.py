"""Texts encoded by an ONNX export (hf_efficient_attn.serving.encode(), scripts/encode_onnx.py): equal to
the PyTorch model (sentence-transformers for an embedding model, the classifier's logits) on texts of
mixed lengths through an approximating method (MRA-2, past 128 tokens), in the order given; the
pooling recorded with the model; batches of similar lengths; the int8 model; the session's threads."""

import copy
import json
import random
import shutil

import joblib
import numpy as np
import pytest
import torch
from hub_fixtures import BERT_WORDS, bert_tokenizer, tiny_config

import hf_efficient_attn as hea
from hf_efficient_attn.serving import cli as export_cli
from hf_efficient_attn.serving import encode_cli, encoding
from hf_efficient_attn.serving import onnx as serving
from hf_efficient_attn.utils.cli_errors import run_cli

onnxruntime = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
sentence_transformers = pytest.importorskip("sentence_transformers")

#: MRA-2 with 32-token blocks, 2 exact blocks per query block: an approximation past 64 tokens.
MRA = {"block_size": 32, "block_per_row": 2}
#: Tokens per text (special tokens included), not sorted: the order must come back as given.
LENGTHS = [40, 450, 7, 300, 130, 300, 2, 220, 64]


def texts_of(lengths, seed=0):
    """Texts of the tiny WordPiece vocabulary that tokenize to ``lengths`` tokens ([CLS] and [SEP] included)."""
    words = BERT_WORDS[5:]
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(n - 2)) for n in lengths]


def write_sentence_transformers_files(folder, modes="mean", normalize=True, max_seq_length=400):
    """modules.json (Transformer, Pooling, optionally Normalize), the Pooling config and the settings."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pooling = modes if isinstance(modes, dict) else {"embedding_dimension": 32, "pooling_mode": modes}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))


def save_tiny(folder, head="AutoModel", **config):
    torch.manual_seed(0)
    # One layer: what is checked (pooling, order, batching, int8) needs no second, and each layer
    # lengthens the export (torch.export traces it).
    config = tiny_config("bert", max_position_embeddings=512, initializer_range=0.5, num_hidden_layers=1, **config)
    model = getattr(hea, head).from_config(config,
                                           attn_impl="mra2", attn_config=MRA)  # fmt: skip
    model.save_pretrained(folder)
    bert_tokenizer().save_pretrained(folder)
    return model.eval()


def build_embedder(tmp):
    save_tiny(tmp / "model")
    write_sentence_transformers_files(tmp / "model")
    (tmp / "texts.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts_of(LENGTHS))))
    export_cli.main(["--model_dir", str(tmp / "model"), "--output_dir", str(tmp / "onnx"), "--export_length", "100",
                     "--int8", "--validation_file", str(tmp / "texts.jsonl"), "--validation_length", "300"])  # fmt: skip


def build_classifier(tmp):
    save_tiny(tmp / "model", "AutoModelForSequenceClassification", num_labels=3)
    export_cli.main(["--model_dir", str(tmp / "model"), "--output_dir", str(tmp / "onnx"), "--export_length", "100"])


@pytest.fixture(scope="module")
def embedder(built_once):
    """A tiny sentence-transformers model (mean pooling, normalized) with MRA-2, exported by the script
    with --int8 and checked on texts (a .jsonl file) at --validation_length 300 (read-only). Seconds,
    once per test run: torch.export traces MRA-2's model."""
    return built_once("onnx_encode_embedder", build_embedder)


@pytest.fixture(scope="module")
def classifier(built_once):
    """A tiny 3-label classifier with MRA-2, exported (read-only), and the PyTorch model. Seconds, once
    per test run: torch.export traces MRA-2's model."""
    tmp = built_once("onnx_encode_classifier", build_classifier)
    return hea.AutoModelForSequenceClassification.from_pretrained(tmp / "model").eval(), tmp


def sentence_transformer(folder, max_seq_length=None):
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    if max_seq_length:
        model.max_seq_length = max_seq_length
    return model


def test_embeddings_equal_sentence_transformers_in_the_order_given(embedder):
    """Mixed lengths up to 450 tokens, in batches of 3: each row is sentence-transformers' embedding of
    that text alone through the PyTorch model (MRA-2 sparse past 64 tokens: not exact attention),
    truncated at the max_seq_length the folder records (400)."""
    texts = texts_of(LENGTHS)
    assert {"modules.json", "sentence_bert_config.json", "1_Pooling"} <= {p.name for p in (embedder / "onnx").iterdir()}
    served = encoding.encode(embedder / "onnx", texts, batch_size=3)
    expected = sentence_transformer(embedder / "model").encode(texts, batch_size=1)
    assert served.shape == (len(texts), 32) and served.dtype == np.float32
    np.testing.assert_allclose(served, expected, atol=1e-4, rtol=0)
    exact = hea.AutoModel.from_pretrained(embedder / "model", attn_impl="softmax").eval()
    with torch.no_grad():
        hidden = exact(**bert_tokenizer()(texts[1], truncation=True, max_length=400, return_tensors="pt")).last_hidden_state
    exact_embedding = torch.nn.functional.normalize(hidden.mean(1), dim=-1)[0].numpy()
    assert np.abs(exact_embedding - expected[1]).max() > 1e-3  # the long text's MRA-2 is an approximation


@pytest.mark.parametrize("modes, normalize", [
    ("cls", False), ("max", True), ("mean", False), ("mean_sqrt_len_tokens", False), ("weightedmean", True),
    ("lasttoken", False), (["cls", "mean"], False),
    ({"word_embedding_dimension": 32, "pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": True}, True),
])  # fmt: skip
def test_the_pooling_recorded_with_the_model_is_the_one_applied(embedder, tmp_path, modes, normalize):
    """Each sentence-transformers pooling mode, several concatenated, the legacy config keys, with and
    without Normalize: the export's rows equal sentence-transformers' on the model folder."""
    for name in ("model", "onnx"):
        shutil.copytree(embedder / name, tmp_path / name)
        shutil.rmtree(tmp_path / name / "1_Pooling")
        write_sentence_transformers_files(tmp_path / name, modes, normalize)
    texts = texts_of([300, 9, 130, 51])
    expected = sentence_transformer(tmp_path / "model").encode(texts, batch_size=1)
    np.testing.assert_allclose(encoding.encode(tmp_path / "onnx", texts, batch_size=2), expected, atol=1e-4, rtol=0)


def test_a_folder_without_modules_is_mean_pooled_as_sentence_transformers_does(embedder, tmp_path):
    shutil.copytree(embedder / "onnx", tmp_path / "onnx")
    for name in ("modules.json", "sentence_bert_config.json"):
        (tmp_path / "onnx" / name).unlink()
    texts = texts_of([300, 9, 130])
    model = hea.AutoModel.from_pretrained(embedder / "model").eval()
    expected = []
    for text in texts:
        with torch.no_grad():
            expected.append(model(**bert_tokenizer()(text, return_tensors="pt")).last_hidden_state.mean(1)[0].numpy())
    np.testing.assert_allclose(encoding.encode(tmp_path / "onnx", texts, batch_size=2), np.stack(expected), atol=1e-4)


def test_classifier_rows_are_its_logits(classifier):
    model, tmp = classifier
    texts = texts_of(LENGTHS, seed=1)
    expected = []
    for text in texts:
        with torch.no_grad():
            expected.append(model(**bert_tokenizer()(text, return_tensors="pt")).logits[0].numpy())
    served = encoding.encode(tmp / "onnx", texts, batch_size=4)
    np.testing.assert_allclose(served, np.stack(expected), atol=1e-4, rtol=0)


def test_a_classifiers_check_on_texts_is_the_share_of_labels_kept(classifier):
    """validate_texts of a classifier: the share of texts whose label (the largest logit) ONNX Runtime
    and PyTorch agree on; a PyTorch model with other weights disagrees on some."""
    model, tmp = classifier
    texts = texts_of(LENGTHS, seed=3)
    check = serving.validate_texts(model, tmp / "onnx", texts, 512)
    assert (check.agreement, check.texts, check.min_cosine) == (1.0, len(texts), None) and check.passed
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.classifier.weight.add_(torch.randn_like(other.classifier.weight))
    with torch.no_grad():
        labels = [int(other(**bert_tokenizer()(t, return_tensors="pt")).logits.argmax()) for t in texts]
    served = encoding.encode(tmp / "onnx", texts).argmax(1)
    check = serving.validate_texts(other, tmp / "onnx", texts, 512)
    assert check.agreement == pytest.approx(np.mean(np.array(labels) == served)) and check.agreement < 1


def test_batches_are_length_sorted_and_batch_size_long(embedder, monkeypatch):
    """batch_size texts per ONNX Runtime call, longest first, each batch padded to its own longest."""
    widths = []
    forward = encoding.session_forward

    def spy(session):
        run = forward(session)

        def recorded(feed):
            widths.append(feed["attention_mask"].sum(1).tolist())
            assert feed["input_ids"].shape[1] == max(widths[-1])
            return run(feed)

        return recorded

    monkeypatch.setattr(encoding, "session_forward", spy)
    encoding.encode(embedder / "onnx", texts_of(LENGTHS), batch_size=4)
    ordered = sorted(min(n, 400) for n in LENGTHS)[::-1]  # truncated at the recorded max_seq_length
    assert widths == [ordered[:4], ordered[4:8], ordered[8:]]


def test_max_length_truncates_each_text(embedder):
    texts = texts_of([450, 30, 200])
    expected = sentence_transformer(embedder / "model", max_seq_length=100).encode(texts, batch_size=1)
    served = encoding.encode(embedder / "onnx", texts, max_length=100)
    np.testing.assert_allclose(served, expected, atol=1e-4, rtol=0)
    assert np.abs(encoding.encode(embedder / "onnx", texts) - expected).max() > 1e-3  # default: the recorded 400


def test_int8_model_is_written_loads_and_is_close(embedder):
    """--int8 writes model_quantized.onnx; int8=True runs it: close to the fp32 rows, not equal to them;
    the export recorded its checks (padded batches, and the texts at --validation_length)."""
    texts = texts_of(LENGTHS)
    fp32 = encoding.encode(embedder / "onnx", texts)
    int8 = encoding.encode(embedder / "onnx", texts, int8=True)
    cosine = (fp32 * int8).sum(1)  # normalized rows
    assert cosine.min() > 0.99 and np.abs(int8 - fp32).max() > 1e-4
    # 7-bit weights (reduce_range): full-range int8 weights saturate the int16 pair sums of x86 CPUs
    # without VNNI (on such a CPU the cosine above fell to 0.98).
    weights = [init for init in onnx.load(embedder / "onnx" / "model_quantized.onnx").graph.initializer
               if init.data_type == onnx.TensorProto.INT8 and not init.name.endswith("_zero_point")]  # fmt: skip
    assert weights and max(np.abs(onnx.numpy_helper.to_array(w)).max() for w in weights) <= 64
    checks = json.loads((embedder / "onnx" / "onnx_validation.json").read_text())
    text_checks = {c["file"]: c for c in checks if "texts" in c}
    assert {c["file"] for c in checks if "seq_len" in c} == {"model.onnx", "model_quantized.onnx"}
    assert text_checks["model.onnx"]["max_abs_diff"] <= 1e-4
    assert text_checks["model_quantized.onnx"]["texts"] == len(texts) and text_checks["model_quantized.onnx"]["max_length"] == 300
    truncated = encoding.encode(embedder / "onnx", texts, max_length=300, int8=True, batch_size=1)  # as checked
    expected = sentence_transformer(embedder / "model", max_seq_length=300).encode(texts, batch_size=1)
    assert text_checks["model_quantized.onnx"]["min_cosine"] == pytest.approx((truncated * expected).sum(1).min(), abs=1e-5)


def test_threads_set_the_sessions_intra_op_threads(embedder, monkeypatch):
    threads = []
    session_class = onnxruntime.InferenceSession

    def spy(path, options, providers):
        threads.append(options.intra_op_num_threads)
        return session_class(path, options, providers=providers)

    monkeypatch.setattr(onnxruntime, "InferenceSession", spy)
    monkeypatch.setattr(joblib, "cpu_count", lambda only_physical_cores: 3 if only_physical_cores else 6)
    encoding.encode(embedder / "onnx", ["the cat"], threads=1)
    encoding.encode(embedder / "onnx", ["the cat"])
    assert threads == [1, 3]  # by default the physical cores joblib counts within the CPU quota, not 0 (the host's)


def test_bad_inputs_are_clear_errors(embedder, tmp_path):
    onnx = embedder / "onnx"
    with pytest.raises(ValueError, match="holds no model.onnx"):
        encoding.encode(tmp_path, ["x"])
    with pytest.raises(ValueError, match="list of strings"):
        encoding.encode(onnx, "one string")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        encoding.encode(onnx, ["x"], batch_size=0)
    with pytest.raises(ValueError, match=r"exceeds the model's position table \(512"):
        encoding.encode(onnx, ["x"], max_length=600)
    with pytest.raises(ValueError, match="token-level head"):
        encoding.output_kind({"logits": 3})
    (tmp_path / "modules.json").write_text(json.dumps([{"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ValueError, match="runs Transformer, Pooling and Normalize only"):
        encoding.read_pooling(tmp_path)
    with pytest.raises(ValueError, match="not supported; supported: cls, max"):
        encoding.pooling_modes({"pooling_mode": "attention"})


# ---- scripts/encode_onnx.py ----------------------------------------------------------------------


@pytest.mark.parametrize("source", ["texts", "txt", "csv"])
def test_encode_script_flags_reach_encode_and_the_output_file(embedder, tmp_path, monkeypatch, source):
    """--export_dir, the texts (--texts, or --texts_file as .txt / .csv), --batch_size, --max_length,
    --int8 and --threads reach encode(); --output_file gets its rows (.npy, or .jsonl in order)."""
    texts = texts_of([20, 300, 9])
    calls = []
    real = encoding.encode
    monkeypatch.setattr(encoding, "encode", lambda *args, **kwargs: calls.append((args, kwargs)) or real(*args, **kwargs))
    if source == "texts":
        given = ["--texts", *texts]
    elif source == "txt":
        (tmp_path / "in.txt").write_text("\n".join(texts[:2]) + "\n\n" + texts[2] + "\n")
        given = ["--texts_file", str(tmp_path / "in.txt")]
    else:
        (tmp_path / "in.csv").write_text("label,sentence\n" + "".join(f'0,"{t}"\n' for t in texts))
        given = ["--texts_file", str(tmp_path / "in.csv")]
    flags = ["--export_dir", str(embedder / "onnx"), *given, "--batch_size", "2", "--max_length", "100", "--int8",
             "--threads", "1"]  # fmt: skip
    encode_cli.main([*flags, "--output_file", str(tmp_path / "out.npy")])
    ((args, kwargs),) = calls
    assert args == (str(embedder / "onnx"), texts)
    assert kwargs == {"batch_size": 2, "max_length": 100, "int8": True, "threads": 1}
    rows = real(embedder / "onnx", texts, batch_size=2, max_length=100, int8=True)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), rows)
    encode_cli.main([*flags, "--output_file", str(tmp_path / "out.jsonl")])
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2]
    np.testing.assert_allclose(np.array([line["embedding"] for line in lines]), rows, rtol=1e-6)


def test_encode_script_writes_a_classifiers_logits_and_labels(classifier, tmp_path):
    model, tmp = classifier
    texts = texts_of([12, 200], seed=2)
    encode_cli.main(["--export_dir", str(tmp / "onnx"), "--texts", *texts, "--output_file", str(tmp_path / "out.jsonl")])
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    logits = encoding.encode(tmp / "onnx", texts)
    np.testing.assert_allclose(np.array([line["logits"] for line in lines]), logits, rtol=1e-6)
    assert [line["label"] for line in lines] == [model.config.id2label[i] for i in logits.argmax(1)]


@pytest.mark.parametrize("argv, message", [
    (["--texts", "a"], "the following arguments are required: --export_dir"),
    (["--export_dir", "missing", "--texts", "a", "--output_file", "o.npy"], "--export_dir missing: no such folder"),
    (["--export_dir", "onnx", "--output_file", "o.npy"], "give the texts: --texts or --texts_file"),
    (["--export_dir", "onnx", "--texts", "a", "--texts_file", "t.txt", "--output_file", "o.npy"], "not both"),
    (["--export_dir", "onnx", "--texts", "a", "--output_file", "o.csv"], "--output_file must end in .npy or .jsonl"),
    (["--export_dir", "onnx", "--texts_file", "t.md", "--output_file", "o.npy"], "give a .txt"),
    (["--export_dir", "onnx", "--texts", "a", "--output_file", "o.npy", "--threads", "0"], "--threads must be a positive"),
    (["--export_dir", "onnx", "--texts", "a", "--output_file", "o.npy", "--int8"], "holds no model_quantized.onnx"),
])  # fmt: skip
def test_encode_script_reports_bad_arguments_in_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "model.onnx").write_text("")
    (tmp_path / "t.md").write_text("a\n")
    with pytest.raises(SystemExit) as exit_info:
        run_cli(encode_cli.main, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
