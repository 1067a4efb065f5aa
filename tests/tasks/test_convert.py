"""convert_to_long: positions copied, method attached after the extension, tokenizer length,
new MLM head reported, save/reload as the method; extend_position_embeddings' argument check;
every architecture's leading (padding offset) rows against offsets written out here."""

import json
import os

import pytest
import torch
import transformers as T
from training_fixtures import save_tiny_mlm, small_tokenizer, tiny_config

import hf_efficient_attn as hea
from hf_efficient_attn.integration.positions import position_offset
from hf_efficient_attn.tasks.convert import convert_to_long, main
from hf_efficient_attn.tools.minilm import minilm_path

LONG = 300


def short_batch(length=40):
    ids = small_tokenizer()(["The government said on Tuesday that the fires were contained."] * 2)["input_ids"]
    ids = torch.tensor(ids)
    mask = torch.ones_like(ids)
    mask[1, ids.shape[1] // 2 :] = 0
    return ids, mask


def logits(model, ids, mask):
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("model_type", ["bert", "roberta", "xlm-roberta", "electra", "camembert"])
def test_conversion_per_architecture(tmp_path, model_type):
    source = save_tiny_mlm(str(tmp_path / "short"), model_type)
    original = T.AutoModelForMaskedLM.from_pretrained(source)
    old_table = original.base_model.embeddings.position_embeddings.weight.detach().clone()
    offset = position_offset(original.config)
    old_len = old_table.shape[0] - offset

    out = str(tmp_path / "long")
    model, tokenizer, report = convert_to_long(source, LONG, "mra2", {"block_per_row": 2}, out)

    table = model.base_model.embeddings.position_embeddings.weight.detach()
    assert table.shape[0] == LONG + offset and report.tokens_after == LONG and report.tokens_before == old_len
    torch.testing.assert_close(table[: offset + old_len], old_table, rtol=0, atol=0)  # first positions unchanged
    for start in range(offset + old_len, offset + LONG, old_len):  # every later copy equals the pretrained rows
        end = min(start + old_len, offset + LONG)
        torch.testing.assert_close(table[start:end], old_table[offset : offset + end - start], rtol=0, atol=0)
    assert not report.new_head_tensors

    reloaded = hea.AutoModelForMaskedLM.from_pretrained(out)
    assert reloaded.config.attn_impl == "mra2" and reloaded.config.attn_config["block_per_row"] == 2
    assert T.AutoTokenizer.from_pretrained(out).model_max_length == LONG
    ids, mask = short_batch()
    # A short input sees every block, so MRA-2 is exact: the long model predicts as the original.
    expected = logits(original, ids, mask)
    got = logits(reloaded, ids, mask)
    torch.testing.assert_close(got[0], expected[0], atol=1e-4, rtol=1e-4)
    real = mask[1].bool()
    torch.testing.assert_close(got[1, real], expected[1, real], atol=1e-4, rtol=1e-4)
    long_ids = torch.randint(5, len(tokenizer), (1, LONG))
    assert logits(reloaded, long_ids, torch.ones_like(long_ids)).shape == (1, LONG, len(tokenizer))


def test_longformer_is_already_long(tmp_path):
    source = save_tiny_mlm(str(tmp_path / "lf"), "longformer", max_positions=256)
    _, _, report = convert_to_long(source, 256, "mra2", output_dir=str(tmp_path / "out"))
    assert report.tokens_before == report.tokens_after == 256
    assert "Longformer is already a long model" in "\n".join(report.lines())
    assert hea.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "out")).config.attn_impl == "mra2"


def test_length_bound_method_is_sized_after_the_extension(tmp_path):
    source = save_tiny_mlm(str(tmp_path / "short"))
    model, _, _ = convert_to_long(source, LONG, "linformer", {"k": 16}, str(tmp_path / "long"))
    layer = model.bert.encoder.layer[0].attention.self.efficient_attn
    assert layer.e_proj.shape == (16, LONG)
    reloaded = hea.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "long"))
    torch.testing.assert_close(reloaded.bert.encoder.layer[0].attention.self.efficient_attn.e_proj, layer.e_proj)


def test_real_checkpoint_without_mlm_head_gets_a_new_one(tmp_path, capsys):
    """all-MiniLM-L6-v2 is a BertModel: the CLI adds a head, says so, and keeps the encoder (no
    --attn_impl: the attention stays Transformers' own)."""
    out = str(tmp_path / "minilm")
    report = main(
        [
            "--model_name_or_path",
            str(minilm_path()),
            "--max_length",
            "1024",
            "--output_dir",
            out,
        ]
    )
    printed = capsys.readouterr().out
    assert "MLM head: the checkpoint has none; a new one was initialised" in printed and "512 -> 1024 tokens" in printed
    assert any(name.startswith("cls.predictions.transform") for name in report.new_head_tensors)
    encoder = T.AutoModel.from_pretrained(minilm_path()).eval()
    long = hea.AutoModelForMaskedLM.from_pretrained(out).eval()
    tokenizer = T.AutoTokenizer.from_pretrained(out)
    assert tokenizer.model_max_length == 1024
    # What it says it wrote is what the folder holds: the tokenizer's and the sentence pipeline's lengths.
    with open(os.path.join(out, "sentence_bert_config.json")) as f:
        pipeline_length = json.load(f)["max_seq_length"]
    assert f"tokenizer: model_max_length = {tokenizer.model_max_length}\n" in printed
    assert (
        f"sentence-transformers pipeline: kept (Transformer -> Pooling -> Normalize), max_seq_length = {pipeline_length}\n"
        in printed
    )
    batch = tokenizer(["A sentence about the weather in Sydney."], return_tensors="pt")
    with torch.no_grad():
        expected = encoder(**batch).last_hidden_state
        got = long.bert(**batch).last_hidden_state
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_unsupported_model_type_is_refused(tmp_path):
    T.GPT2LMHeadModel(T.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'gpt2' is a decoder"):
        convert_to_long(str(tmp_path), LONG, "mra2")


@pytest.mark.parametrize("bad", ["4096", 1000.5, True, 0, -8])
def test_extend_position_embeddings_needs_a_positive_integer(bad):
    model = T.AutoModel.from_config(tiny_config("bert"))
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        hea.extend_position_embeddings(model, max_length=bad)
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        convert_to_long("unused", bad)


def test_a_new_head_is_drawn_from_the_seed(tmp_path):
    """Converting an encoder without an MLM head twice gives the same model (the head's init is
    seeded), another seed another head."""
    encoder = str(tmp_path / "encoder")
    T.AutoModel.from_config(tiny_config()).save_pretrained(encoder)
    small_tokenizer().save_pretrained(encoder)

    def head(seed):
        model, _, report = convert_to_long(encoder, LONG, "softmax", seed=seed)
        assert report.new_head_tensors
        return model.cls.predictions.transform.dense.weight

    first = head(0)
    torch.rand(5)  # whatever the caller's random state, the seed decides
    torch.testing.assert_close(head(0), first, rtol=0, atol=0)
    assert not torch.equal(head(1), first)


#: Rows of the position table before the first position, written out here rather than taken from
#: the library: RoBERTa-style models number positions from padding_idx + 1 (Transformers'
#: create_position_ids_from_input_ids), BERT and ELECTRA from 0.
PADDING_OFFSET_TYPES = {
    "roberta",
    "xlm-roberta",
    "camembert",
    "longformer",
    "xlm-roberta-xl",
    "roberta-prelayernorm",
    "data2vec-text",
}
NO_OFFSET_TYPES = {"bert", "electra", "distilbert", "albert", "ernie"}


@pytest.mark.parametrize("model_type", sorted(PADDING_OFFSET_TYPES | NO_OFFSET_TYPES))
def test_every_architectures_offset_rows_and_copies(tmp_path, model_type):
    """The leading rows are kept once, the pretrained positions are repeated after them, the
    tokenizer, config and buffers say the new length, and an input of exactly that length runs
    while one token more is refused. (Padding id 1, as RoBERTa's: the row before it is a trained
    row that must be kept too.)"""
    source = save_tiny_mlm(str(tmp_path / "short"), model_type, pad_token_id=1)
    original = T.AutoModelForMaskedLM.from_pretrained(source)
    embeddings = original.base_model.embeddings.position_embeddings
    old = embeddings.weight.detach().clone()
    offset = 2 if model_type in PADDING_OFFSET_TYPES else 0
    assert old[:offset].abs().sum(-1).ne(0).tolist() == [True, False][:offset]  # a trained row, the padding row
    pretrained = old.shape[0] - offset

    model, tokenizer, report = convert_to_long(source, LONG, "softmax", output_dir=str(tmp_path / "long"))
    table = model.base_model.embeddings.position_embeddings
    assert table.weight.shape[0] == LONG + offset == model.config.max_position_embeddings
    assert table.padding_idx == embeddings.padding_idx
    assert (report.tokens_before, report.tokens_after, tokenizer.model_max_length) == (pretrained, LONG, LONG)
    rows = torch.arange(offset, LONG + offset)
    torch.testing.assert_close(table.weight[:offset], old[:offset], rtol=0, atol=0)
    torch.testing.assert_close(table.weight[rows], old[offset + (rows - offset) % pretrained], rtol=0, atol=0)
    buffer = getattr(model.base_model.embeddings, "position_ids", None)  # Longformer's embeddings have none
    assert buffer is None or buffer.shape[-1] == LONG + offset

    reloaded = hea.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "long"))
    ids = torch.randint(5, len(tokenizer), (1, LONG))
    assert logits(reloaded, ids, torch.ones_like(ids)).shape == (1, LONG, len(tokenizer))
    longer = torch.randint(5, len(tokenizer), (1, LONG + 1))
    with pytest.raises(ValueError):
        logits(reloaded, longer, torch.ones_like(longer))
