"""Tiny models and padded batches shared by the tests (importable: tests/ has no __init__.py)."""

import pytest
import torch
import transformers as T

VOCAB, SEQ, REAL = 120, 40, 27
ARCHITECTURES = ["bert", "roberta", "xlm-roberta", "electra", "camembert", "longformer"]
#: XLM-R's and CamemBERT's Transformers modules are copies of RoBERTa's ("Copied from"): the
#: every-method-in-every-architecture matrices run them in the slow tier only.
ROBERTA_COPIES = ("xlm-roberta", "camembert")
#: ARCHITECTURES for those matrices.
MATRIX_ARCHITECTURES = [pytest.param(a, marks=pytest.mark.slow) if a in ROBERTA_COPIES else a for a in ARCHITECTURES]


def tiny_config(model_type="roberta", **overrides):
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    if model_type == "longformer":
        common.update(attention_window=[128, 128], max_position_embeddings=132, pad_token_id=1)
    else:
        common.update(max_position_embeddings=130)
    return T.AutoConfig.for_model(model_type, **{**common, **overrides})


def option_defaults(name):
    """The default options of method ``name``, as the dict a config's ``attn_config`` holds."""
    import hf_efficient_attn as hea

    return {option: described.default for option, described in hea.method_options(name).items()}


def batch():
    """Two rows; the second is padded after REAL tokens. Padded positions hold ordinary token ids
    (not the pad id), so a model that ignores the mask sees them."""
    ids = torch.randint(5, VOCAB, (2, SEQ))
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, REAL:] = 0
    return ids, mask


def hidden(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state
