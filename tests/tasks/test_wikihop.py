"""WikiHop fine-tuning, the parts: inputs against the tokenizer's own pair encoding, chunk scores
summed over chunks against a chunk-by-chunk computation, packed chunks against padded ones, the loss
and accuracy against references, bad data. Long synthetic examples cover chunking without the real
ones (an optional download). Runs through the command line: test_wikihop_cli.py."""

import math

import numpy as np
import pytest
import tiny
import torch
import torch.nn.functional as F
from datasets import Dataset
from sklearn.metrics import accuracy_score
from tiny import ARCHITECTURES, KINDS, default_tier
from transformers import EvalPrediction, RobertaForMaskedLM
from wikihop_fixtures import LONG, SHORT, real_or_skip, save_tiny_encoder, tiny_config, tokenizer, write_files

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
from hf_efficient_attn.tasks.wikihop.finetune import CandidateAccuracy, WikiHopDataArguments
from hf_efficient_attn.tasks.wikihop.heads import AutoModelForCandidateScoring
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


#: The query and key (or fused query-key-value) projections of each architecture.
QUERY_KEY_WEIGHTS = (
    "query.weight",
    "key.weight",
    "q_lin.weight",
    "k_lin.weight",
    "q_proj.weight",
    "k_proj.weight",
    "qkv_proj.weight",
    "Wqkv.weight",
)


@pytest.mark.parametrize("model_type", ARCHITECTURES + default_tier(*KINDS))
def test_every_architecture_saves_and_reloads_as_itself(model_type, tmp_path):
    """XxxForCandidateScoring for each supported encoder, the BERT family's and every architecture of
    issue 55: the saved model reloads with its method and gives the same scores and hidden states
    (MRA-2 with 1 of 3 blocks per row, query/key weights scaled up so that attention is peaked: plain
    attention gives other hidden states)."""
    config = tiny.tiny_config(model_type)
    options = {"block_size": 16, "block_per_row": 1}
    model = AutoModelForCandidateScoring.from_config(config, attn_impl="mra2", attn_config=options).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(QUERY_KEY_WEIGHTS):
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


def test_the_scorers_dropout_is_the_one_the_architectures_own_classifier_uses():
    """Each architecture's sequence classifier (Transformers' own) as the reference for the scorer's
    dropout: its head's dropout modules, those outside the encoder (none: no dropout)."""
    from transformers import AutoModelForSequenceClassification

    cases = [(a, {}) for a in ARCHITECTURES + list(tiny.DISPATCHING_ARCHITECTURES)]
    cases += [("bert", {"classifier_dropout": 0.3}), ("albert", {"classifier_dropout_prob": 0.25})]
    for model_type, overrides in cases:
        config = tiny.tiny_config(model_type, num_labels=2, **overrides)
        reference = AutoModelForSequenceClassification.from_config(config)
        head = {m.p for name, m in reference.named_modules() if isinstance(m, torch.nn.Dropout)
                and not name.startswith(reference.base_model_prefix + ".")}  # fmt: skip
        scorer = AutoModelForCandidateScoring.from_config(config)
        assert {scorer.dropout.p} == (head or {0.0}), (model_type, overrides)


@pytest.mark.parametrize("model_type", ["deberta-v2", "gpt2"])
def test_a_scorer_of_an_architecture_that_cannot_be_patched_is_refused(model_type):
    """DeBERTa computes its own attention, GPT-2 is a decoder: refused with the reason, as patching them."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=1, num_attention_heads=4)
    with pytest.raises(ValueError, match="computes its attention itself|decoder"):
        AutoModelForCandidateScoring.from_config(config)


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
