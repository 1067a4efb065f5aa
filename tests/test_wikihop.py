"""WikiHop fine-tuning: inputs against the tokenizer's own pair encoding, chunk scores summed over
chunks against a chunk-by-chunk computation, the loss and accuracy against references, bad input,
and tiny runs through the command line (outputs, predictions.json, reload, resume, each option,
gradient accumulation = one large batch). Long synthetic examples cover chunking without the real
ones (an optional download)."""

import dataclasses
import json
import math
import os
import shutil

import numpy as np
import pytest
import tiny
import torch
import torch.nn.functional as F
from datasets import Dataset
from sklearn.metrics import accuracy_score
from tiny import ARCHITECTURES
from transformers import AutoTokenizer, EvalPrediction, RobertaForMaskedLM
from wikihop_fixtures import SHORT, real_or_skip, save_tiny_encoder, tiny_config, tokenizer, write_files

import hf_efficient_attn as hea
from hf_efficient_attn.tasks.common.data import mean_length
from hf_efficient_attn.tasks.common.loss import global_mean_loss
from hf_efficient_attn.tasks.wikihop.data import (
    CANDIDATE_START,
    MARKERS,
    ChunkCollator,
    ChunkEncoder,
    PackedChunkCollator,
    add_markers,
    fit_embeddings_to,
    load_qangaroo,
)
from hf_efficient_attn.tasks.wikihop.finetune import CandidateAccuracy, WikiHopDataArguments, main
from hf_efficient_attn.tasks.wikihop.heads import AutoModelForCandidateScoring, BertForCandidateScoring
from hf_efficient_attn.tasks.wikihop.qangaroo import synthetic_examples, write_qangaroo_json
from hf_efficient_attn.tools.minilm import minilm_path


def marked_tokenizer():
    tok = tokenizer()
    add_markers(tok)
    return tok


def first_segment_text(example):
    candidates = " ".join(f"[ent] {c} [/ent]" for c in example["candidates"])
    return f"[question] {example['query']} [/question] {candidates}"


# ---- inputs ----------------------------------------------------------------------------------


def test_a_short_example_is_the_tokenizers_own_pair_encoding():
    """Question and candidates as the first segment, the documents (joined by [SEP]) as the second:
    what the tokenizer itself makes of the marked-up text."""
    tok = marked_tokenizer()
    example = synthetic_examples(1, **SHORT)[0]
    encoded = ChunkEncoder(tok, 512).encode(example["id"], example["query"], example["candidates"], example["supports"])
    reference = tok(first_segment_text(example), f" {tok.sep_token} ".join(example["supports"]))
    assert encoded["input_ids"] == [reference["input_ids"]]
    assert encoded["token_type_ids"] == [reference["token_type_ids"]]


#: Synthetic examples long enough to need several chunks at 128 tokens (about 450-650 tokens).
LONG = {"num_supports": 4, "sentences_per_support": 5}


def assert_chunked(tok, example, max_length, min_chunks):
    """Every chunk is [CLS] first segment [SEP] slice [SEP]; the slices, in order, are exactly the
    tokenised documents; every chunk but the last is full; each candidate's [ent] is at the same
    position in every chunk; --max_chunks keeps the first chunks."""
    ent = tok.convert_tokens_to_ids(CANDIDATE_START)
    encoded = ChunkEncoder(tok, max_length).encode(example["id"], example["query"], example["candidates"], example["supports"])
    first = tok(first_segment_text(example), add_special_tokens=False)["input_ids"]
    documents = tok(f" {tok.sep_token} ".join(example["supports"]), add_special_tokens=False)["input_ids"]
    head = [tok.cls_token_id, *first, tok.sep_token_id]
    room = max_length - len(head) - 1
    chunks = encoded["input_ids"]
    assert len(chunks) == math.ceil(len(documents) / room) >= min_chunks
    slices = []
    for chunk, types in zip(chunks, encoded["token_type_ids"]):
        assert chunk[: len(head)] == head and chunk[-1] == tok.sep_token_id
        assert types == [0] * len(head) + [1] * (len(chunk) - len(head))
        assert [i for i, t in enumerate(chunk) if t == ent] == encoded["candidate_positions"]
        slices += chunk[len(head) : -1]
    assert slices == documents
    assert all(len(c) == max_length for c in chunks[:-1]) and len(chunks[-1]) <= max_length
    assert len(encoded["candidate_positions"]) == len(example["candidates"])
    capped = ChunkEncoder(tok, max_length, max_chunks=2).encode(
        example["id"], example["query"], example["candidates"], example["supports"]
    )
    assert capped["input_ids"] == chunks[:2]


@pytest.mark.parametrize("max_length", [96, 128])
def test_long_examples_are_cut_into_chunks_that_each_repeat_question_and_candidates(max_length):
    """Synthetic examples of several hundred tokens (no download needed)."""
    tok = marked_tokenizer()
    for example in synthetic_examples(3, seed=11, **LONG):
        assert_chunked(tok, example, max_length, min_chunks=3)


def test_the_real_examples_are_cut_into_chunks():
    """The two real WikiHop examples (the allennlp wheel) at 128 tokens: 48 and 10 chunks."""
    tok = marked_tokenizer()
    for example in real_or_skip():
        assert_chunked(tok, example, 128, min_chunks=6)


def test_marker_strings_in_the_texts_stay_plain_text():
    tok = marked_tokenizer()
    encoded = ChunkEncoder(tok, 128).encode(
        "x", "[question] who [/question]", ["a [ent]", "b"], ["The [ent] c [/ent] marker.", "[question]"]
    )
    ids = encoded["input_ids"][0]
    marker_ids = tok.convert_tokens_to_ids(list(MARKERS))
    assert [ids.count(m) for m in marker_ids] == [1, 1, 2, 2]
    assert encoded["candidate_positions"] == [i for i, t in enumerate(ids) if t == marker_ids[2]]


def test_markers_are_added_once_with_embeddings_at_the_mean(tmp_path):
    path = save_tiny_encoder(str(tmp_path / "tiny"))
    model = AutoModelForCandidateScoring.from_pretrained(path)
    tok = tokenizer()
    old = model.get_input_embeddings().weight.detach().clone()
    assert add_markers(tok) == 4 and add_markers(tok) == 0
    assert fit_embeddings_to(model, tok) == 4 and fit_embeddings_to(model, tok) == 0
    new = model.get_input_embeddings().weight.detach()
    assert new.shape[0] == len(tok) == old.shape[0] + 4
    assert torch.equal(new[: old.shape[0]], old)
    ids = tok.convert_tokens_to_ids(list(MARKERS))
    assert sorted(ids) == list(range(old.shape[0], old.shape[0] + 4))
    torch.testing.assert_close(new[ids], old.mean(0).expand(4, -1), atol=1e-4, rtol=0)


def test_mean_length_counts_the_tokens_of_every_chunk():
    examples = Dataset.from_dict({"input_ids": [[[1, 2, 3], [4]], [[5, 6]], [[7], [8], [9]]]})
    assert mean_length(examples) == 3
    assert mean_length(examples.select([2, 0])) == 3.5


def test_collator_pads_chunks_and_candidates():
    features = [
        {"input_ids": [[5, 6, 7], [5, 6]], "token_type_ids": [[0, 1, 1], [0, 1]], "candidate_positions": [0, 1, 2],
         "labels": 2},
        {"input_ids": [[8]], "token_type_ids": [[0]], "candidate_positions": [0], "labels": 0},
    ]  # fmt: skip
    batch = ChunkCollator(pad_token_id=0)(features)
    assert batch["input_ids"].tolist() == [[[5, 6, 7], [5, 6, 0]], [[8, 0, 0], [0, 0, 0]]]
    assert batch["attention_mask"].tolist() == [[[1, 1, 1], [1, 1, 0]], [[1, 0, 0], [0, 0, 0]]]
    assert batch["token_type_ids"].tolist() == [[[0, 1, 1], [0, 1, 0]], [[0, 0, 0], [0, 0, 0]]]
    assert batch["chunk_mask"].tolist() == [[True, True], [True, False]]
    assert batch["candidate_positions"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch["candidate_mask"].tolist() == [[True, True, True], [True, False, False]]
    assert batch["labels"].tolist() == [2, 0]
    assert ChunkCollator(pad_token_id=0, pad_to_length=8)(features)["input_ids"].shape == (2, 2, 8)


def test_packed_collator_puts_every_chunk_in_one_row():
    """--padding_free: the chunks of all examples one after another, positions restarting at each
    chunk, where each chunk starts and to which example it belongs; candidates as ChunkCollator's."""
    features = [
        {"input_ids": [[5, 6, 7], [5, 6]], "token_type_ids": [[0, 1, 1], [0, 1]], "candidate_positions": [0, 1, 2],
         "labels": 2},
        {"input_ids": [[8]], "token_type_ids": [[0]], "candidate_positions": [0], "labels": 0},
    ]  # fmt: skip
    batch = PackedChunkCollator()(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 5, 6, 8]]
    assert batch["token_type_ids"].tolist() == [[0, 1, 1, 0, 1, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 6] and batch["max_length_q"] == 3
    assert batch["example_of_chunk"].tolist() == [0, 0, 1]
    padded = ChunkCollator(pad_token_id=0)(features)
    for key in ("candidate_positions", "candidate_mask", "labels"):
        assert torch.equal(batch[key], padded[key]), key
    assert "attention_mask" not in batch and "token_type_ids" not in PackedChunkCollator()(
        [{"input_ids": [[5, 6]], "candidate_positions": [0]}]
    )


# ---- model, loss, metric -----------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_every_architecture_saves_and_reloads_as_itself(model_type, tmp_path):
    """XxxForCandidateScoring for each supported encoder: the saved model reloads with its method and
    gives the same scores and hidden states (MRA-2 with 1 of 3 blocks per row, query/key weights
    scaled up so that attention is peaked: plain attention gives other hidden states)."""
    config = tiny.tiny_config(model_type)
    options = {"block_size": 16, "block_per_row": 1}
    model = AutoModelForCandidateScoring.from_config(config, attn_impl="mra2", attn_config=options).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("query.weight", "key.weight")):
                parameter.mul_(30)
    inputs = {
        "input_ids": torch.randint(5, tiny.VOCAB, (2, 3, 40)),
        "chunk_mask": torch.tensor([[True, True, False], [True, False, False]]),
        "candidate_positions": torch.tensor([[1, 4, 9], [2, 7, 0]]),
        "candidate_mask": torch.tensor([[True, True, True], [True, True, False]]),
    }
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCandidateScoring.from_pretrained(str(tmp_path)).eval()
    assert type(reloaded).__name__ == type(model).__name__ and type(model).__name__.endswith("ForCandidateScoring")
    assert reloaded.config.attn_impl == "mra2" and reloaded.config.attn_config["block_per_row"] == 1
    chunk = inputs["input_ids"][:, 0]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, model(**inputs).logits)
        hidden = reloaded.base_model(input_ids=chunk).last_hidden_state
        torch.testing.assert_close(hidden, model.base_model(input_ids=chunk).last_hidden_state)
        exact = hea.unpatch_model(reloaded).base_model(input_ids=chunk).last_hidden_state
    assert (exact - hidden).abs().max() > 0.01


def test_pretrained_encoder_weights_load_into_the_scorer(tmp_path):
    """A plain encoder checkpoint (the real MiniLM, a BertModel) and a masked-LM checkpoint (its
    encoder under `roberta.`) both fill the scorer's encoder; only the scoring layer is new."""
    minilm = hea.AutoModel.from_pretrained(minilm_path())
    scorer = AutoModelForCandidateScoring.from_pretrained(minilm_path(), attn_impl="mra2")
    encoder_weights = scorer.bert.state_dict()
    for key, value in minilm.state_dict().items():
        if not key.startswith("pooler."):
            assert torch.equal(encoder_weights[key], value), key
    assert scorer.bert.config.attn_impl == "mra2" and scorer.bert.pooler is None

    torch.manual_seed(0)
    masked_lm = RobertaForMaskedLM(tiny.tiny_config("roberta"))
    masked_lm.save_pretrained(tmp_path)
    scorer = AutoModelForCandidateScoring.from_pretrained(str(tmp_path), attn_impl="softmax")
    for key, value in masked_lm.roberta.state_dict().items():
        assert torch.equal(scorer.roberta.state_dict()[key], value), key


def encoded_batch(tok, max_length=128, max_chunks=None):
    """Two long synthetic examples (several chunks each) and three short ones (one chunk)."""
    examples = synthetic_examples(2, seed=11, **LONG) + synthetic_examples(3, **SHORT)
    encoder = ChunkEncoder(tok, max_length, max_chunks)
    features = encoder({key: [e[key] for e in examples] for key in ("id", "query", "answer", "candidates", "supports")})
    rows = [{key: values[i] for key, values in features.items()} for i in range(len(examples))]
    return examples, rows, ChunkCollator(tok.pad_token_id)(rows)


@pytest.mark.parametrize("attn_impl", ["softmax", "mra2"])
def test_scores_are_summed_over_chunks(attn_impl):
    """The batched, padded forward pass against a chunk-by-chunk loop: each chunk alone through the
    encoder, the [ent] positions found by searching the tokens, the scoring layer, the sum over the
    example's chunks. One finite score per candidate; padded slots hold the lowest value. (MRA-2
    covers all 4 blocks of a 128-token chunk, so it is exact here too; 5 chunks at most, for time.)"""
    tok = marked_tokenizer()
    model = AutoModelForCandidateScoring.from_config(tiny_config(vocab_size=len(tok)), attn_impl=attn_impl).eval()
    examples, rows, batch = encoded_batch(tok, max_chunks=None if attn_impl == "softmax" else 5)
    assert batch["chunk_mask"].sum(1).tolist() == [len(r["input_ids"]) for r in rows]
    assert min(batch["chunk_mask"].sum(1).tolist()[:2]) >= 3  # the long ones are chunked
    with torch.no_grad():
        logits = model(**batch).logits
        ent = tok.convert_tokens_to_ids(CANDIDATE_START)
        for i, (example, row) in enumerate(zip(examples, rows)):
            expected = 0
            for ids, types in zip(row["input_ids"], row["token_type_ids"]):
                ids, types = torch.tensor([ids]), torch.tensor([types])
                hidden = model.bert(input_ids=ids, token_type_ids=types).last_hidden_state[0]
                expected = expected + model.candidate_scorer(hidden[ids[0] == ent]).squeeze(-1)
            n = len(example["candidates"])
            assert expected.shape == (n,)
            torch.testing.assert_close(logits[i, :n], expected, atol=2e-5, rtol=1e-5)
            assert (logits[i, n:] == torch.finfo(logits.dtype).min).all()


@pytest.mark.parametrize("attn_impl", ["softmax", "mra2"])
@pytest.mark.parametrize("model_type", ["bert", "roberta", "longformer"])
def test_packed_chunks_score_as_padded_ones(model_type, attn_impl):
    """Every chunk of the batch in one packed row (PackedChunkCollator) gives the logits and loss of
    the padded batch: 5 examples, 9 chunks of 70 to 128 tokens. RoBERTa's packed positions start at
    0 and are shifted to its own (2); BERT keeps its token types. MRA-2 keeps 1 of 8 blocks per row,
    query/key weights scaled up so that attention is peaked: it approximates here (its logits differ
    from exact attention's by over 10 times the tolerance), so each chunk must get its own approximation."""
    tok = marked_tokenizer()
    config = tiny_config(vocab_size=len(tok)) if model_type == "bert" else tiny.tiny_config(model_type, vocab_size=len(tok))
    options = {"block_size": 16, "block_per_row": 1} if attn_impl == "mra2" else None
    torch.manual_seed(0)
    model = AutoModelForCandidateScoring.from_config(config, attn_impl=attn_impl, attn_config=options).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("query.weight", "key.weight")):
                parameter.mul_(30)
    _, rows, _ = encoded_batch(tok, max_chunks=3)
    if model_type != "bert":  # no token types, as RoBERTa's tokenizer
        rows = [{k: v for k, v in row.items() if k != "token_type_ids"} for row in rows]
    lengths = [len(chunk) for row in rows for chunk in row["input_ids"]]
    assert len(lengths) == 9 and min(lengths) < 100 and max(lengths) == 128
    padded, packed = ChunkCollator(config.pad_token_id)(rows), PackedChunkCollator()(rows)
    assert packed["input_ids"].shape == (1, sum(lengths))
    with torch.no_grad():
        expected, out = model(**padded), model(**packed)
        torch.testing.assert_close(out.logits, expected.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.loss, expected.loss, atol=1e-4, rtol=1e-4)
        if attn_impl == "mra2":
            exact = hea.unpatch_model(model)(**padded).logits
            assert (exact - expected.logits).abs().max() > 1e-3  # 10 times the tolerance above


def test_packed_input_errors():
    """A packed row needs where each chunk starts and its positions, one example per chunk, and
    chunks that fit the position table."""
    model = AutoModelForCandidateScoring.from_config(tiny_config(vocab_size=200), attn_impl="softmax").eval()
    features = [{"input_ids": [[5, 6, 7], [5, 8]], "candidate_positions": [0, 1], "labels": 1}]
    packed = PackedChunkCollator()(features)
    for missing in ("cu_seq_lens_q", "position_ids"):
        with pytest.raises(ValueError, match=f"packed chunks .* need .*{missing}.*{missing} None"):
            model(**{k: v for k, v in packed.items() if k != missing})
    with pytest.raises(ValueError, match="2 chunks in cu_seq_lens_q, 1 in example_of_chunk"):
        model(**{**packed, "example_of_chunk": torch.tensor([0])})
    with pytest.raises(ValueError, match="chunks of 600 tokens exceed the position table"):
        model(**{**packed, "max_length_q": 600})


def test_loss_is_cross_entropy_over_each_examples_candidates():
    tok = marked_tokenizer()
    model = AutoModelForCandidateScoring.from_config(tiny_config(vocab_size=len(tok)), attn_impl="softmax").eval()
    examples, _, batch = encoded_batch(tok)
    with torch.no_grad():
        outputs = model(**batch)
    reference = np.mean(
        [
            -F.log_softmax(outputs.logits[i, : len(e["candidates"])].double(), -1)[e["candidates"].index(e["answer"])]
            for i, e in enumerate(examples)
        ]
    )
    assert outputs.loss.item() == pytest.approx(reference, rel=1e-5)
    assert global_mean_loss(outputs, batch["labels"]).item() == pytest.approx(reference, rel=1e-5)


def test_accuracy_takes_the_best_of_each_examples_own_candidates():
    """Trainer pads the score rows of short batches with -100; scores below that must not lose to
    the padding. Compared with scikit-learn on the argmax over each row's real candidates."""
    rng = np.random.default_rng(0)
    counts = rng.integers(2, 8, 40)
    scores = np.full((40, 8), -100.0)
    for row, count in zip(scores, counts):
        row[:count] = rng.normal(-300, 50, count)
    labels = np.array([rng.integers(0, c) for c in counts])
    metric = CandidateAccuracy(counts)
    result = metric(EvalPrediction(predictions=scores, label_ids=labels))
    expected = [int(np.argmax(row[:count])) for row, count in zip(scores, counts)]
    assert metric.predicted == expected
    assert result["accuracy"] == pytest.approx(accuracy_score(labels, expected))
    assert 0 < result["accuracy"] < 1


# ---- bad input -------------------------------------------------------------------------------------


def test_data_errors(tmp_path):
    tok = marked_tokenizer()
    example = synthetic_examples(1, **SHORT)[0]
    with pytest.raises(ValueError, match=r"the answer 'rome' is not among its candidates"):
        ChunkEncoder(tok, 128)({key: [value] for key, value in {**example, "answer": "rome"}.items()})
    with pytest.raises(ValueError, match=r"take \d+ tokens, which with 3 special tokens leave no room .* 16"):
        ChunkEncoder(tok, 16).encode(example["id"], example["query"], example["candidates"], example["supports"])
    with pytest.raises(ValueError, match="call add_markers"):
        ChunkEncoder(tokenizer(), 128)
    renamed = write_qangaroo_json(
        str(tmp_path / "renamed.json"), [{("question" if k == "query" else k): v for k, v in example.items()}]
    )
    with pytest.raises(ValueError, match=r"not in the qangaroo \(WikiHop\) format: it lacks \['query'\]"):
        load_qangaroo(train_file=renamed)
    with pytest.raises(ValueError, match="allowed extensions: json, jsonl"):
        WikiHopDataArguments(train_file=str(tmp_path / "train.csv"))
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="--max_chunks must be a positive integer"):
            WikiHopDataArguments(train_file=renamed, max_chunks=bad)


def test_training_and_development_files_with_different_fields(tmp_path):
    """WikiHop's dev.json has an `annotations` field that train.json lacks; both load, and the JSON
    array of the original files reads as one example per element."""
    train, dev = write_files(str(tmp_path), train=3, dev=1)
    raw = load_qangaroo(train_file=train, validation_file=dev)
    assert raw["train"].num_rows == 3 and raw["validation"].num_rows == 3
    assert raw["validation"]["id"][:2] == ["WH_dev_0", "WH_dev_1"]
    assert raw["validation"].column_names == ["id", "query", "answer", "candidates", "supports"]


def test_a_dataset_by_name(tmp_path):
    """--dataset_name goes through datasets.load_dataset (here a local folder with train/validation
    files, as the Hub's community-datasets/qangaroo has them: no annotations field)."""
    write_qangaroo_json(str(tmp_path / "data" / "train.json"), synthetic_examples(3, **SHORT))
    write_qangaroo_json(str(tmp_path / "data" / "validation.json"), synthetic_examples(2, seed=5, **SHORT))
    raw = load_qangaroo(dataset_name=str(tmp_path / "data"))
    assert {split: rows.num_rows for split, rows in raw.items()} == {"train": 3, "validation": 2}


# ---- tiny runs through the command line --------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Synthetic files only, so that only the tests of the real examples skip without them."""
    root = tmp_path_factory.mktemp("wikihop")
    train, dev = write_files(str(root), with_real=False)
    return {"train": train, "dev": dev, "model": save_tiny_encoder(str(root / "tiny"))}


def run(workspace, output_dir, *extra):
    args = [
        "--model_name_or_path", workspace["model"], "--train_file", workspace["train"],
        "--validation_file", workspace["dev"], "--max_seq_length", "128", "--output_dir", str(output_dir),
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--learning_rate", "1e-3",
        "--logging_steps", "1", "--report_to", "none", "--disable_tqdm", "true", "--seed", "3", *extra,
    ]  # fmt: skip
    return main(args)


def read(folder, name):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def test_tiny_run_writes_results_and_predictions_and_reloads(workspace, tmp_path, capsys):
    """Training on synthetic examples, evaluation on the two real ones (48 and 10 chunks) and 8 synthetic."""
    _, dev_file = write_files(str(tmp_path), train=0, dev=8)
    out = tmp_path / "out"
    config = {
        "model_name_or_path": workspace["model"], "attn_impl": "mra2", "attn_config": {"block_size": 16},
        "train_file": workspace["train"], "validation_file": dev_file, "max_seq_length": 128,
        "do_train": True, "do_eval": True, "max_steps": 4, "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4, "learning_rate": 1e-3, "report_to": "none", "disable_tqdm": True,
        "output_dir": str(out),
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    main([str(tmp_path / "config.json")])  # a single .json argument is the whole configuration

    results = read(out, "all_results.json")
    assert results == {**read(out, "train_results.json"), **read(out, "eval_results.json")}
    assert results["eval_samples"] == 10 and 0 <= results["eval_accuracy"] <= 1
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("summary: attention mra2, train ") and "tokens/s" in summary
    assert f"eval accuracy {results['eval_accuracy']:.4f}" in summary

    with open(dev_file) as f:
        dev = json.load(f)
    predictions = read(out, "predictions.json")
    assert list(predictions) == [e["id"] for e in dev]
    assert all(predictions[e["id"]] in e["candidates"] for e in dev)
    correct = [predictions[e["id"]] == e["answer"] for e in dev]
    assert results["eval_accuracy"] == pytest.approx(np.mean(correct))

    # The saved model is the candidate scorer with its method and markers; it reproduces the predictions.
    model = AutoModelForCandidateScoring.from_pretrained(str(out)).eval()
    assert isinstance(model, BertForCandidateScoring)
    assert model.config.attn_impl == "mra2" and model.config.attn_config["block_size"] == 16
    tok = AutoTokenizer.from_pretrained(str(out))
    assert all(m in tok.get_vocab() for m in MARKERS) and model.get_input_embeddings().num_embeddings == len(tok)
    encoder = ChunkEncoder(tok, 128)
    collate = ChunkCollator(tok.pad_token_id)
    rows = Dataset.from_list(dev).map(encoder, batched=True, remove_columns=list(dev[0]))
    with torch.no_grad():
        logits = model(**collate([rows[i] for i in range(len(rows))])).logits
    assert {e["id"]: e["candidates"][int(logits[i].argmax())] for i, e in enumerate(dev)} == predictions

    # Evaluation only, from the saved folder, no --attn_impl: the method comes from its config.
    again = run(workspace, tmp_path / "again", "--do_eval", "--model_name_or_path", str(out), "--validation_file", dev_file)
    assert again["eval_loss"] == pytest.approx(results["eval_loss"], rel=1e-6)
    assert again["eval_accuracy"] == results["eval_accuracy"]


def test_resume_equals_uninterrupted(workspace, tmp_path, training_steps):
    """6 steps of 4 over 12 examples (3 steps per epoch); resuming from step 3 trains the 3 remaining
    steps and reaches the same evaluation as the run that never stopped (dropout on: Trainer
    restores the RNG states)."""
    common = ["--do_train", "--do_eval", "--max_steps", "6", "--max_train_samples", "12", "--save_steps", "3",
              "--attn_impl", "mra2", "--max_seq_length", "64"]  # fmt: skip
    whole = run(workspace, tmp_path / "whole", *common)
    assert len(training_steps) == 6
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole" / "checkpoint-3", resumed_dir / "checkpoint-3")
    resumed = run(workspace, resumed_dir, *common)  # finds checkpoint-3 in output_dir and resumes
    assert len(training_steps) == 6 + 3  # resumed, not restarted
    assert resumed["epoch"] == whole["epoch"] == 2
    assert resumed["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-6, abs=0)
    assert resumed["eval_accuracy"] == whole["eval_accuracy"]


def test_trainer_options_on_cpu(workspace, tmp_path):
    """The recipes' options: bf16 autocast, gradient checkpointing through the patched attention,
    per-epoch evaluation and saving; and chunks padded to --max_seq_length, at most 3 per example."""
    out = tmp_path / "opts"
    metrics = run(workspace, out, "--do_train", "--do_eval", "--use_cpu", "--bf16", "--activation_checkpointing",
                  "--attn_impl", "mra2", "--num_train_epochs", "1", "--max_train_samples", "8",
                  "--eval_strategy", "epoch", "--save_strategy", "epoch", "--pad_to_max_length",
                  "--max_chunks", "3")  # fmt: skip
    assert math.isfinite(metrics["eval_loss"]) and metrics["epoch"] == 1
    assert os.path.isdir(out / "checkpoint-2")
    assert len([e for e in read(out, "trainer_state.json")["log_history"] if "eval_loss" in e]) == 1


def test_command_line_errors(workspace, tmp_path):
    with pytest.raises(ValueError, match="--do_predict is not supported"):
        run(workspace, tmp_path, "--do_predict")
    with pytest.raises(ValueError, match=r"--max_seq_length 1024 exceeds the model's position table \(512 tokens\)"):
        run(workspace, tmp_path, "--do_train", "--max_seq_length", "1024")
    with pytest.raises(ValueError, match="--do_eval needs a validation split"):
        main(["--model_name_or_path", workspace["model"], "--train_file", workspace["train"], "--do_eval",
              "--output_dir", str(tmp_path), "--report_to", "none"])  # fmt: skip


# ---- recipes ---------------------------------------------------------------------------------------

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "train")
WIKIHOP_RECIPES = sorted(n for n in os.listdir(RECIPES) if n.startswith("wikihop-"))


@pytest.mark.parametrize("name", WIKIHOP_RECIPES)
def test_recipes(name, tmp_path, monkeypatch):
    """Every key is a flag of finetune_wikihop.py; the RoBERTa-base recipes have the MRA paper's Table 8
    settings (4096 tokens, global batch 32 on 1 or 8 GPUs, lr 5e-5, 15 epochs); the CPU recipe
    parses whole (the GPU ones ask for bf16, which TrainingArguments refuses without a GPU here)."""
    from transformers import TrainingArguments

    from hf_efficient_attn.tasks.common.args import ModelArguments, parse_arguments

    with open(os.path.join(RECIPES, name)) as f:
        recipe = json.load(f)
    types = (ModelArguments, WikiHopDataArguments, TrainingArguments)
    flags = {f.name for cls in types for f in dataclasses.fields(cls)}
    assert set(recipe) <= flags, sorted(set(recipe) - flags)
    if name.startswith("wikihop-roberta-base-4096"):
        processes = 8 if name.endswith("-8gpu.json") else 1
        batch = recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"] * processes
        settings = (recipe["max_seq_length"], batch, recipe["learning_rate"], recipe["num_train_epochs"])
        assert settings == (4096, 32, 5e-5, 15)
    else:
        assert recipe["use_cpu"]
        monkeypatch.chdir(tmp_path)
        train, dev = write_files("outputs/wikihop", train=1, dev=1, with_real=False)
        assert (train, dev) == (recipe["train_file"], recipe["validation_file"])
        os.makedirs(recipe["model_name_or_path"])  # the earlier recipe's output (a missing folder is an error)
        _, data_args, training_args = parse_arguments(types, [os.path.join(RECIPES, name)])
        assert data_args.max_seq_length == 2048 and training_args.max_steps == recipe["max_steps"]


# ---- each option does what it says; accumulation -----------------------------------------------------


def captured(workspace, monkeypatch, tmp_path, *extra):
    from training_fixtures import Captured, capture_trainer

    capture_trainer(monkeypatch)
    with pytest.raises(Captured) as caught:
        run(workspace, tmp_path / "captured", *extra)
    return caught.value.kwargs


def test_length_chunk_and_sample_options(workspace, monkeypatch, tmp_path):
    """--max_seq_length is the chunk length (documents chunked, not truncated), --max_chunks keeps
    the first chunks, --pad_to_max_length pads the batch to the length, --max_train/eval_samples
    keep the first examples; the collator's candidate positions are the tokenizer's [ent]s."""
    long_train = write_qangaroo_json(str(tmp_path / "long.json"), synthetic_examples(5, seed=11, **LONG))
    every = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--train_file", long_train,
                     "--max_seq_length", "96")  # fmt: skip
    chunks = [len(ids) for ids in every["train_dataset"]["input_ids"]]
    assert min(chunks) >= 3
    assert {len(c) for ids in every["train_dataset"]["input_ids"] for c in ids[:-1]} == {96}
    capped = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", "--train_file", long_train,
                      "--max_seq_length", "96", "--max_chunks", "2", "--pad_to_max_length", "--max_train_samples",
                      "3", "--max_eval_samples", "2")  # fmt: skip
    assert list(capped["train_dataset"]["input_ids"]) == [ids[:2] for ids in every["train_dataset"]["input_ids"][:3]]
    assert len(capped["eval_dataset"]) == 2
    batch = capped["data_collator"]([capped["train_dataset"][i] for i in range(3)])
    assert batch["input_ids"].shape == (3, 2, 96)  # the chunks of long examples are full
    ent = batch["input_ids"].gather(2, batch["candidate_positions"][:, None].expand(-1, 2, -1))
    marker = AutoTokenizer.from_pretrained(workspace["model"]).vocab_size  # markers follow the vocabulary
    assert (ent >= marker).all()
    for flags, length in ((["--pad_to_max_length"], 128), ([], None)):  # short examples: one chunk of < 128 tokens
        short = captured(workspace, monkeypatch, tmp_path, "--do_train", "--do_eval", *flags)
        features = [short["train_dataset"][i] for i in range(3)]
        longest = max(len(f["input_ids"][0]) for f in features)
        assert longest < 128 and {len(f["input_ids"]) for f in features} == {1}
        assert short["data_collator"](features)["input_ids"].shape == (3, 1, length or longest)


def test_gradient_accumulation_equals_one_large_batch(workspace, tmp_path):
    """Batch 8 equals 4 x 2 accumulated (dropout off): the same training loss and evaluation."""
    model = save_tiny_encoder(str(tmp_path / "no-dropout"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    common = ["--do_train", "--do_eval", "--max_steps", "2", "--max_train_samples", "16", "--max_eval_samples", "4",
              "--model_name_or_path", model, "--max_seq_length", "64"]  # fmt: skip
    large = run(workspace, tmp_path / "large", *common, "--per_device_train_batch_size", "8")
    accumulated = run(workspace, tmp_path / "acc", *common, "--per_device_train_batch_size", "4",
                      "--gradient_accumulation_steps", "2")  # fmt: skip
    assert accumulated["train_loss"] == pytest.approx(large["train_loss"], rel=1e-4)
    assert accumulated["eval_loss"] == pytest.approx(large["eval_loss"], rel=1e-4)


# ---- --padding_free -----------------------------------------------------------------------------------


def test_padding_free_packs_each_batch_and_keeps_logits_and_loss(workspace, monkeypatch, tmp_path):
    """--padding_free: each batch is one packed row of its examples' chunks (several per example
    here), whose logits and loss equal those of the same examples padded; it needs an attention
    method of this package (the tiny checkpoint saves none)."""
    long_train = write_qangaroo_json(str(tmp_path / "long.json"), synthetic_examples(4, seed=11, **LONG))
    trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--train_file", long_train, "--max_seq_length",
                       "96", "--attn_impl", "mra2", "--attn_config", '{"block_size": 16}', "--padding_free")  # fmt: skip
    features = [trainer["train_dataset"][i] for i in range(4)]
    chunks = [chunk for f in features for chunk in f["input_ids"]]
    assert len(chunks) >= 12
    packed = trainer["data_collator"](features)
    assert packed["input_ids"].shape == (1, sum(map(len, chunks))) and len(packed["cu_seq_lens_q"]) == len(chunks) + 1
    padded = ChunkCollator(trainer["processing_class"].pad_token_id)(features)
    model = trainer["model"].eval()
    with torch.no_grad():
        packed_out, padded_out = model(**packed), model(**padded)
    torch.testing.assert_close(packed_out.logits, padded_out.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(packed_out.loss, padded_out.loss, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="--padding_free needs an attention method of this package"):
        run(workspace, tmp_path / "plain", "--do_train", "--padding_free")


def test_padding_free_run_equals_the_padded_run(workspace, tmp_path):
    """Two steps of training and an evaluation, packed and padded (dropout off; 64-token chunks, so
    2 chunks per example): the same training loss, evaluation loss and accuracy."""
    model = save_tiny_encoder(str(tmp_path / "no-dropout"), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    common = ["--do_train", "--do_eval", "--max_steps", "2", "--max_train_samples", "8", "--max_eval_samples", "4",
              "--model_name_or_path", model, "--max_seq_length", "64", "--attn_impl", "mra2"]  # fmt: skip
    padded = run(workspace, tmp_path / "padded", *common)
    packed = run(workspace, tmp_path / "packed", *common, "--padding_free")
    assert packed["train_loss"] == pytest.approx(padded["train_loss"], rel=1e-4)
    assert packed["eval_loss"] == pytest.approx(padded["eval_loss"], rel=1e-4)
    assert packed["eval_accuracy"] == padded["eval_accuracy"]
