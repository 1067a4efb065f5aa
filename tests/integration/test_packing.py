"""Packed rows (DataCollatorWithFlattening): every method, in every architecture, gives each packed
sequence the outputs of that sequence run alone, whichever form says where the sequences start."""

import copy

import paths
import pytest
import torch
from test_bridge import SMALL_BUDGETS
from test_mlm import workspace  # noqa: F401  (the fixture of the --padding_free tests)
from tiny import ARCHITECTURES, KINDS, MATRIX_ARCHITECTURES, VOCAB, default_tier, tiny_config
from transformers import DataCollatorWithFlattening

import hf_efficient_attn as hea
from hf_efficient_attn.integration.positions import position_offset
from hf_efficient_attn.registry import get_method_class

#: Longer than every method's exact length at SMALL_BUDGETS (mra2 with one block per row is exact up
#: to its 32-token block), of different lengths, none a multiple of a block.
LENGTHS = (100, 57, 130)
FORMS = {
    "position_ids": {},
    "flash_attn_kwargs": {"return_flash_attn_kwargs": True},
    "seq_idx": {"return_seq_idx": True},
}


def packed_model(model_type, method):
    config = tiny_config(model_type, initializer_range=0.3, max_position_embeddings=140)
    return hea.AutoModel.from_config(config, attn_impl=method, attn_config=SMALL_BUDGETS.get(method, {})).eval()


def sequences(lengths=LENGTHS):
    return [torch.randint(5, VOCAB, (n,)) for n in lengths]


def pack(seqs, **collator_options):
    batch = DataCollatorWithFlattening(**collator_options)([{"input_ids": s.tolist()} for s in seqs])
    batch.pop("labels", None)
    return batch


def alone(model, seqs):
    with torch.no_grad():
        return torch.cat([model(input_ids=s[None]).last_hidden_state[0] for s in seqs])


@pytest.mark.device
@pytest.mark.parametrize("model_type", MATRIX_ARCHITECTURES)
@pytest.mark.parametrize("method", hea.list_methods())
def test_packed_row_equals_each_sequence_alone(model_type, method, device):
    """One packed row = its sequences run alone (1e-4), and the method is seen to run (the packed row
    differs from exact attention's)."""
    model = packed_model(model_type, method).to(device)
    # Longformer pads an input to its 128-token attention window: alone, 130 tokens would be 256.
    seqs = [s.to(device) for s in sequences(LENGTHS if model_type != "longformer" else (100, 57, 120))]
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in pack(seqs).items()}
    with torch.no_grad():
        packed = model(**batch).last_hidden_state[0]
    torch.testing.assert_close(packed, alone(model, seqs), atol=1e-4, rtol=1e-4)
    if method != "softmax":
        with torch.no_grad():
            exact = hea.patch_model(copy.deepcopy(model), "softmax")(**batch).last_hidden_state[0]
        assert (packed - exact).abs().max() > 1e-3, "the method cannot be told from exact attention"


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_packed_rows_of_every_dispatching_architecture(model_type):
    """In every architecture of issue 55, whichever form says where the sequences start, a packed row
    equals its sequences alone: the method's layers and the windowed layers (ModernBERT's, UltraBERT's),
    whose window stops at each sequence's end; mra2 is seen to run."""
    model = packed_model(model_type, "mra2")
    exact = hea.patch_model(copy.deepcopy(model), "softmax")
    seqs = sequences()
    for form, options in FORMS.items():
        with torch.no_grad():
            packed = model(**pack(seqs, **options)).last_hidden_state[0]
            torch.testing.assert_close(packed, alone(model, seqs), atol=1e-4, rtol=1e-4, msg=form)
            assert (packed - exact(**pack(seqs, **options)).last_hidden_state[0]).abs().max() > 1e-3


@pytest.mark.parametrize("form", ["flash_attn_kwargs", "seq_idx"])
def test_windowed_layers_of_a_plain_transformers_model_keep_packed_sequences_apart(form, tmp_path):
    """A saved ModernBERT variant built by Transformers' own class (no patched model to work the
    sequences out once): its windowed layers find them in the keywords themselves. (ModernBERT passes
    ``position_ids`` to neither its layers nor its masks: that form needs the patched model.)"""
    import transformers as T

    packed_model("modernbert", "mra2").save_pretrained(tmp_path)
    model = T.ModernBertModel.from_pretrained(tmp_path).eval()
    seqs = sequences()
    with torch.no_grad():
        packed = model(**pack(seqs, **FORMS[form])).last_hidden_state[0]
    torch.testing.assert_close(packed, alone(model, seqs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("method", ["mra2", "yoso", "linformer"])
def test_every_collator_form_keeps_sequences_apart(form, method):
    """position_ids alone, the flash-attention keywords and seq_idx all keep the sequences apart
    (a sampling method, a method with parameters sized by length, the block-sparse one)."""
    model = packed_model("roberta", method)
    seqs = sequences()
    with torch.no_grad():
        packed = model(**pack(seqs, **FORMS[form])).last_hidden_state[0]
    torch.testing.assert_close(packed, alone(model, seqs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("keyword", ["cu_seq_lens_q", "seq_idx"])
def test_packing_keywords_alone_say_where_sequences_start(keyword):
    """With position_ids that run on over the row, the keyword alone keeps the sequences apart: a
    change to the second sequence does not reach the first (it does without the keyword)."""
    model = packed_model("bert", "mra2")
    batch = pack(sequences((40, 60)), return_flash_attn_kwargs=True, return_seq_idx=True)
    keys = {"cu_seq_lens_q": ("cu_seq_lens_q", "max_length_q"), "seq_idx": ("seq_idx",)}[keyword]
    changed = batch["input_ids"].clone()
    changed[0, 40:] = torch.randint(5, VOCAB, (60,))

    def first_sequence(ids, **packing):
        with torch.no_grad():
            return model(input_ids=ids, position_ids=torch.arange(100)[None], **packing).last_hidden_state[0, :40]

    packing = {k: batch[k] for k in keys}
    torch.testing.assert_close(first_sequence(changed, **packing), first_sequence(batch["input_ids"], **packing))
    assert (first_sequence(changed) - first_sequence(batch["input_ids"])).abs().max() > 1e-4


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])  # offset positions; windowed layers
def test_several_padded_packed_rows(model_type):
    """A batch of two packed rows, the first padded at its end (the padding's positions running on),
    equals the sequences alone."""
    model = packed_model(model_type, "mra2")
    seqs = sequences((50, 70, 90, 40))
    offset = position_offset(model.config)
    width = 130
    ids = torch.full((2, width), model.config.pad_token_id)
    positions = torch.arange(width).repeat(2, 1)  # the padding's positions: any
    mask = torch.zeros(2, width, dtype=torch.long)
    for row, pair in enumerate([seqs[:2], seqs[2:]]):
        ids[row, : sum(map(len, pair))] = torch.cat(pair)
        positions[row, : sum(map(len, pair))] = torch.cat([torch.arange(len(s)) + offset for s in pair])
        mask[row, : sum(map(len, pair))] = 1
    positions[0, 120:] = torch.arange(70, 80) + offset  # the second sequence runs on into the padding
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
    packed = torch.cat([out[0, :120], out[1, :130]])
    torch.testing.assert_close(packed, alone(model, seqs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "camembert", "longformer"])
def test_offset_positions_whichever_start_the_collator_was_given(model_type):
    """RoBERTa-family positions start at pad_token_id + 1: packed position_ids from 0 (the collator's
    default) or from that offset give the same outputs; any other start is refused by name."""
    model = packed_model(model_type, "softmax")
    seqs = sequences((30, 20))
    offset = position_offset(model.config)
    with torch.no_grad():
        from_zero = model(**pack(seqs)).last_hidden_state
        from_offset = model(**pack(seqs, position_ids_start=offset)).last_hidden_state
    torch.testing.assert_close(from_zero, from_offset, atol=0, rtol=0)
    torch.testing.assert_close(from_zero[0], alone(model, seqs), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match=f"position_ids_start={offset}"):
        model(**pack(seqs, position_ids_start=offset + 3))


@pytest.mark.parametrize("form", FORMS)
def test_longformer_takes_every_collator_form(form):
    """Longformer's forward takes no packing keywords: the patched model removes them and hands the
    sequences to its layers, padded as Longformer pads rows to its attention window (128 here)."""
    model = packed_model("longformer", "mra2")
    seqs = sequences((100, 57, 40))
    with torch.no_grad():
        packed = model(**pack(seqs, **FORMS[form])).last_hidden_state[0]
    torch.testing.assert_close(packed, alone(model, seqs), atol=1e-4, rtol=1e-4)


def test_sequences_of_similar_length_share_a_call():
    """The attention runs once per batch of similar lengths (length_groups), each sequence still as
    alone; a batch holds no sequence padded by more than its rule allows."""
    from hf_efficient_attn.integration.packing import GROUP_PADDING_TOKENS, length_groups

    lengths = [300, 40, 290, 20, 600, 530, 90]
    groups = length_groups(lengths)
    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    for group in groups:
        longest = max(lengths[i] for i in group)
        assert all(longest - lengths[i] <= max(GROUP_PADDING_TOKENS, longest // 8) for i in group)
    assert groups == [[4, 5], [0, 2], [1, 6], [3]]  # 600 with 530 (70 <= 600 / 8), 90 with 40, not 20

    model = packed_model("bert", "mra2")
    calls = []
    model.encoder.layer[0].attention.self.efficient_attn.register_forward_hook(lambda m, args, out: calls.append(args[0].shape))
    seqs = sequences((130, 20, 100, 30))
    with torch.no_grad():
        packed = model(**pack(seqs)).last_hidden_state[0]
    assert sorted(shape[0] * shape[2] for shape in calls) == [2 * 30, 2 * 130]
    torch.testing.assert_close(packed, alone(model, seqs), atol=1e-4, rtol=1e-4)


def test_the_sequences_are_worked_out_once_per_forward(monkeypatch):
    """A patched model works out its packed rows once for all its layers; a layer of a plain
    Transformers model (no patched class above it) works them out itself, and keeps them apart too."""
    import transformers

    from hf_efficient_attn.integration import bridge, patching

    calls = []
    for module in (bridge, patching):
        original = module.packed_segments
        monkeypatch.setattr(module, "packed_segments", lambda *a, _f=original, **k: calls.append(1) or _f(*a, **k))
    model = packed_model("bert", "mra2")
    seqs = sequences()
    with torch.no_grad():
        model(**pack(seqs))
    assert len(calls) == 1 and model.config.num_hidden_layers > 1
    plain = transformers.BertModel(model.config, add_pooling_layer=False).eval()
    plain.load_state_dict(model.state_dict(), strict=False)
    assert type(plain) is transformers.BertModel
    with torch.no_grad():
        packed = plain(**pack(seqs)).last_hidden_state[0]
    torch.testing.assert_close(packed, alone(model, seqs), atol=1e-4, rtol=1e-4)


def test_output_attentions_refused_for_packed_rows():
    model = packed_model("bert", "softmax")
    with pytest.raises(ValueError, match="packed rows"):
        model(**pack(sequences((30, 20))), output_attentions=True)


def test_padding_never_starts_a_sequence():
    """Padded tokens join the sequence before them, so padded rows do not become one sequence per
    padded token (a batch as large as the padding)."""
    from hf_efficient_attn.integration.packing import packed_segments

    positions = torch.tensor([[2, 3, 4, 2, 3, 1, 1, 1], [2, 3, 4, 5, 6, 7, 1, 1]])
    real = positions != 1
    segments = packed_segments({"position_ids": positions}, real, *positions.shape)
    assert (segments.count, segments.length) == (3, 8)  # the second row: 6 real tokens, 2 padded
    assert packed_segments({"position_ids": positions[1:]}, real[1:], 1, 8) is None  # one sequence: no unpacking


@pytest.mark.parametrize("method", ["mra2", pytest.param("nystromformer", marks=pytest.mark.slow)])
def test_packed_rows_compile_in_one_graph(method):
    """With the flash-attention keywords (shapes known when tracing), a packed row runs under
    torch.compile in one graph and equals eager; with position_ids alone, a traced model refuses a
    packed row at run time instead of mixing it."""
    from compile_fixtures import compiled

    model = packed_model("bert", method)
    seqs = sequences((40, 70, 30))
    batch = pack(seqs, return_flash_attn_kwargs=True)
    with torch.no_grad():
        eager = model(**batch).last_hidden_state
        torch.testing.assert_close(compiled(model)(**batch).last_hidden_state, eager, atol=1e-5, rtol=1e-4)
        with pytest.raises(RuntimeError, match="cu_seq_lens_q and max_length_q"):
            compiled(model)(**pack(seqs))


def test_padding_free_mlm_packs_and_keeps_the_loss(workspace, tmp_path, monkeypatch):
    """pretrain_mlm.py --padding_free: batches are packed rows, and a packed batch's loss equals the
    padded batch's (the token-weighted mean over the same sequences)."""
    from test_mlm import captured
    from transformers import DataCollatorForTokenClassification

    trainer = captured(workspace, monkeypatch, tmp_path, "--do_train", "--line_by_line", "--padding_free")
    examples = [trainer["train_dataset"][i] for i in range(6)]
    packed = trainer["data_collator"](examples)
    padded = DataCollatorForTokenClassification(trainer["processing_class"])(examples)
    assert packed["input_ids"].shape == (1, sum(len(e["input_ids"]) for e in examples))
    assert padded["input_ids"].shape[1] < packed["input_ids"].shape[1]
    model = trainer["model"].eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**packed).loss, model(**padded).loss, atol=1e-5, rtol=1e-5)


def test_padding_free_needs_an_attention_method(workspace, tmp_path):
    from hf_efficient_attn.tasks.mlm.pretrain import main

    with pytest.raises(ValueError, match="--padding_free needs an attention method of this package"):
        main(["--model_name_or_path", workspace["model"], "--train_file", workspace["train"], "--do_train",
              "--padding_free", "--output_dir", str(tmp_path)])  # fmt: skip


@pytest.mark.parametrize("method", [name for name in hea.list_methods() if get_method_class(name).samples])
def test_training_mode_draws_as_a_padded_batch(method):
    """In training mode a sampling method draws for a packed row's sequences what it draws for the
    same sequences in a padded batch (same seed): the two give the same outputs."""
    config = tiny_config(
        "bert", initializer_range=0.3, max_position_embeddings=140, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    model = hea.AutoModel.from_config(config, attn_impl=method, attn_config=SMALL_BUDGETS.get(method, {})).train()
    lengths = (30, 130, 60)  # lengths that batches of similar length would reorder
    seqs = sequences(lengths)
    ids = torch.zeros(3, 130, dtype=torch.long)
    mask = torch.zeros(3, 130, dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)], mask[row, : len(s)] = s, 1
    torch.manual_seed(3)
    packed = model(**pack(seqs, return_flash_attn_kwargs=True)).last_hidden_state[0]
    torch.manual_seed(3)
    padded = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(packed, torch.cat([padded[row, :n] for row, n in enumerate(lengths)]), atol=1e-5, rtol=1e-4)


def test_the_documented_inference_recipe():
    """docs/packing.md's recipe runs as written, and each embedding is that of the document alone."""
    import re

    text = (paths.REPO / "docs" / "packing.md").read_text()
    (recipe,) = re.findall(r"```python\n(.*?)```", text, re.S)
    scope = {}
    exec(recipe, scope)
    model, tokenizer = scope["model"], scope["tokenizer"]
    for document, embedding in zip(scope["documents"], scope["embeddings"]):
        with torch.no_grad():
            alone = model(**tokenizer(document, return_tensors="pt")).last_hidden_state[0].mean(0)
        torch.testing.assert_close(embedding, alone, atol=1e-4, rtol=1e-4)


def test_mixed_length_batches_hold_the_same_documents():
    """The benchmark's padded batches (each padded to its longest) and packed rows hold the same
    tokens and labels, batch by batch."""
    from hf_efficient_attn.tools.benchmark.steps import mixed_length_batches

    lengths = [40, 64, 10, 33, 50]
    padded, packed = mixed_length_batches(lengths, 2, 64, pad_token_id=1)
    assert [b["input_ids"].shape for b in padded] == [(2, 64), (2, 33), (1, 50)]
    assert [b["input_ids"].shape for b in packed] == [(1, 104), (1, 43), (1, 50)]
    for p, q in zip(padded, packed):
        real = p["attention_mask"].bool()
        assert torch.equal(p["input_ids"][real], q["input_ids"][0])
        assert torch.equal(p["labels"][real], q["labels"][0])


def test_mixed_length_timings_measure_equal_outputs():
    """Both forms are timed, forward and training step, and give the same logits."""
    from hf_efficient_attn.tools.benchmark.steps import mixed_length_timings

    timings = mixed_length_timings("mra2", 64, lengths=[40, 64, 10, 33], options={"block_size": 16}, layers=1,
                                   vocab_size=64, batch=2)  # fmt: skip
    assert set(timings) == {"padded_forward_s", "packed_forward_s", "padded_train_s", "packed_train_s",
                            "max_abs_logit_difference"}  # fmt: skip
    assert timings["max_abs_logit_difference"] < 1e-4


def test_mixed_lengths_table_arithmetic():
    """Tokens/s are the real tokens over each time; the speed-up is padded time over packed time
    (median of the rounds' ratios); the padded tokens are each batch's longest times its size."""
    from hf_efficient_attn.tools.benchmark.report import mixed_lengths_table

    job = {"method": "mra2", "lengths": [100, 300, 50], "batch": 2}
    rounds = [{"padded_forward_s": 2.0, "packed_forward_s": 1.0, "padded_train_s": 6.0, "packed_train_s": 4.0,
               "max_abs_logit_difference": 1e-6},
              {"padded_forward_s": 4.0, "packed_forward_s": 1.0, "padded_train_s": 6.0, "packed_train_s": 4.0,
               "max_abs_logit_difference": 3e-6}]  # fmt: skip
    (row,) = mixed_lengths_table([job], [rounds])
    assert (row["tokens"], row["padded_tokens"]) == (450, 2 * 300 + 50)
    assert row["forward_padded_tok_per_s"] == round(450 / 3.0) and row["forward_packed_tok_per_s"] == 450
    assert row["forward_packed_speedup"] == 3.0 and row["train_packed_speedup"] == 1.5
    assert row["max_abs_logit_difference"] == 3e-6


def test_benchmark_mixed_lengths_flag(monkeypatch, tmp_path):
    """--mixed_lengths measures each method (softmax beside) on the real document lengths truncated at
    the longest --seq_lens, --batch documents at a time; Transformers' SDPA is refused (it would mix)."""
    from hf_efficient_attn.tools.benchmark import cli

    asked = {}

    def lengths(count, max_len):
        asked.update(count=count, max_len=max_len)
        return [min(n, max_len) for n in (700, 20, 300)]

    def timings(jobs, rounds):
        asked["jobs"] = jobs
        return [[{"padded_forward_s": 1.0, "packed_forward_s": 1.0, "padded_train_s": 1.0, "packed_train_s": 1.0,
                  "max_abs_logit_difference": 0.0}] for _ in jobs], {}  # fmt: skip

    monkeypatch.setattr(cli, "document_lengths", lengths)
    monkeypatch.setattr(cli, "measure_timings", timings)
    rows = cli.main(["--mixed_lengths", "--methods", "mra2", "--seq_lens", "256", "512", "--batch", "3",
                     "--output_dir", str(tmp_path)])  # fmt: skip
    assert [job["method"] for job in asked["jobs"]] == ["softmax", "mra2"]
    assert asked["max_len"] == 512 and all(job["seq_len"] == 512 for job in asked["jobs"])
    assert all(job["kind"] == "mixed_lengths" and job["batch"] == 3 and job["lengths"] == [512, 20, 300]
               for job in asked["jobs"])  # fmt: skip
    assert [row["method"] for row in rows] == ["softmax", "mra2"]
    assert "3 per batch, through a roberta-base-width roberta encoder, " in (tmp_path / "mixed_lengths.md").read_text()
    with pytest.raises(ValueError, match="unknown method 'sdpa'"):
        cli.parse_args(["--mixed_lengths", "--methods", "sdpa"])


def test_document_lengths_are_real_token_counts():
    from transformers import AutoTokenizer

    from hf_efficient_attn.tasks.common.corpus import wikipedia_articles
    from hf_efficient_attn.tools.benchmark.steps import document_lengths
    from hf_efficient_attn.tools.minilm import minilm_path

    lengths = document_lengths(6, 2048)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    full = [len(tokenizer(text)["input_ids"]) for text in wikipedia_articles()[:6]]
    assert lengths == [min(n, 2048) for n in full] and max(full) > 2048 > min(full)


@pytest.mark.parametrize("model_type", ARCHITECTURES + default_tier("gte", "modernbert"))
def test_packed_sequence_classification_scores_each_sequence(model_type):
    """A sequence classifier given a packed row returns one row of logits per sequence, equal to each
    sequence's own (the head reads every sequence's first token, BERT's pooler included, and GTE's,
    which its model applies itself); its loss is the mean over the sequences; unpatched, the model is
    plain again (no hook left)."""
    pooling = {"classifier_pooling": "bos"} if model_type == "eurobert" else {}  # its first-token head
    config = tiny_config(model_type, initializer_range=0.3, max_position_embeddings=140, num_labels=3, **pooling)
    model = hea.AutoModelForSequenceClassification.from_config(config, attn_impl="mra2",
                                                               attn_config=SMALL_BUDGETS["mra2"]).eval()  # fmt: skip
    seqs = sequences()
    labels = torch.tensor([2, 0, 1])
    with torch.no_grad():
        packed = model(**pack(seqs, return_flash_attn_kwargs=True), labels=labels)
        alone = torch.cat([model(input_ids=s[None]).logits for s in seqs])
        torch.testing.assert_close(packed.logits, alone, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(packed.loss, torch.nn.functional.cross_entropy(alone, labels), atol=1e-5, rtol=1e-4)
        hea.unpatch_model(model)
        assert not any(m._forward_hooks for m in model.modules()) and model(**pack(seqs)).logits.shape == (1, 3)


def test_sequence_label_flattening_keeps_token_types_and_one_label_per_example():
    from hf_efficient_attn.tasks.common.packing import SequenceLabelFlattening

    features = [{"input_ids": [5, 6, 7], "token_type_ids": [0, 0, 1], "labels": 2},
                {"input_ids": [8, 9], "token_type_ids": [0, 1], "labels": 0}]  # fmt: skip
    batch = SequenceLabelFlattening()(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]] and batch["token_type_ids"].tolist() == [[0, 0, 1, 0, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]] and batch["cu_seq_lens_q"].tolist() == [0, 3, 5]
    assert batch["labels"].tolist() == [2, 0]


@pytest.mark.parametrize(("model_type", "pooling"), [("eurobert", "late"), ("eurobert", "mean"), ("modernbert", "mean")])
def test_a_head_that_averages_each_row_refuses_packed_rows(model_type, pooling):
    """A classifier whose head averages each row's tokens would average the padding of the rows the
    sequences are unpacked into: refused, naming the pooling; padded rows still run."""
    config = tiny_config(model_type, max_position_embeddings=140, num_labels=2, classifier_pooling=pooling)
    model = hea.AutoModelForSequenceClassification.from_config(config, attn_impl="mra2").eval()
    with pytest.raises(ValueError, match=f"packed rows: classifier_pooling='{pooling}' averages each row's tokens"):
        model(**pack(sequences()))
    assert model(input_ids=sequences()[0][None]).logits.shape == (1, 2)
