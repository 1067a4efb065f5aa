"""WikiHop test data and tiny models.

The tokenizer is the real WordPiece tokenizer of all-MiniLM-L6-v2 (offline), whose vocabulary
holds the synthetic examples' people and places as single words; the tiny encoders are saved
as plain ``BertModel`` checkpoints (as MiniLM is), so the candidate scorer loads them with a new
scoring layer. The two real WikiHop examples come from the allennlp wheel
(``hf_efficient_attn.tasks.wikihop.qangaroo``); tests that need them skip when it was not fetched.
"""

from __future__ import annotations

import os

import pytest
import tiny
import transformers as T

from hf_efficient_attn.tasks.wikihop.qangaroo import (
    FETCH_COMMAND,
    real_examples,
    synthetic_examples,
    write_qangaroo_json,
)
from hf_efficient_attn.tools.minilm import minilm_path

#: Synthetic examples small enough for fast tests: two documents of one news sentence each
#: (one of them also holds the answer sentence); about 70-100 tokens.
SHORT = {"num_supports": 2, "sentences_per_support": 1}
#: Synthetic examples long enough to need several chunks at 128 tokens (about 450-650 tokens).
LONG = {"num_supports": 4, "sentences_per_support": 5}


def tokenizer() -> T.PreTrainedTokenizerBase:
    """A fresh copy (the scripts add marker tokens to it)."""
    return T.AutoTokenizer.from_pretrained(minilm_path())


def tiny_config(**overrides) -> T.BertConfig:
    common = {
        "vocab_size": len(tokenizer()),
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 512,
    }
    return T.BertConfig(**{**common, **overrides})


def save_tiny_encoder(path: str, seed: int = 0, model_type: str = "bert", **overrides) -> str:
    """A randomly initialised tiny encoder checkpoint (BertModel, or the tests' tiny model of another
    ``model_type``, with MiniLM's vocabulary, padding and two token types) and the MiniLM tokenizer at
    ``path``. (Trainer sets the config's padding to the tokenizer's: a RoBERTa-family model built with
    another would change its positions, which start after the padding id, on the way.)"""
    T.set_seed(seed)
    if model_type == "bert":
        T.BertModel(tiny_config(**overrides), add_pooling_layer=False).save_pretrained(path)
    else:
        tok = tokenizer()
        config = tiny.tiny_config(model_type, vocab_size=len(tok), type_vocab_size=2, pad_token_id=tok.pad_token_id, **overrides)
        T.AutoModel.from_config(config).save_pretrained(path)
    tokenizer().save_pretrained(path)
    return path


def real_or_skip() -> list[dict]:
    try:
        return real_examples()
    except FileNotFoundError:
        pytest.skip(f"the real WikiHop examples are not fetched; run once: {FETCH_COMMAND}")


def write_files(folder: str, train: int = 24, dev: int = 8, with_real: bool = True, seed: int = 0) -> tuple[str, str]:
    """``train.json`` (synthetic, original schema without ``annotations``, as WikiHop's training
    file) and ``dev.json`` (the two real development examples with their ``annotations``, then
    synthetic ones), one JSON array each."""
    real = real_or_skip() if with_real else []
    train_path = write_qangaroo_json(os.path.join(folder, "train.json"), synthetic_examples(train, seed=seed, **SHORT))
    dev_examples = real + synthetic_examples(dev, seed=seed + 1000, **SHORT)
    return train_path, write_qangaroo_json(os.path.join(folder, "dev.json"), dev_examples)
