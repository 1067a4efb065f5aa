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
#: The encoders of issue 55 (besides ARCHITECTURES), with what a tiny config of each needs: a padding id
#: inside the vocabulary, a window that bites at SEQ tokens (ModernBERT: local_attention 8, a radius of 4;
#: UltraBERT: 4), one full and one windowed layer, grouped k, v heads (EuroBERT, UltraBERT), ESM-2's rotary
#: positions and token dropout.
DISPATCHING_ARCHITECTURES = {
    "distilbert": {},
    "albert": {"embedding_size": 16},
    "xlm-roberta-xl": {"pad_token_id": 1},
    "ernie": {},
    "roberta-prelayernorm": {"pad_token_id": 1},
    "data2vec-text": {"pad_token_id": 1},
    "modernbert": {"pad_token_id": 0, "local_attention": 8, "global_attn_every_n_layers": 2},
    "gte": {"pad_token_id": 1},
    "nomic_bert": {},
    "eurobert": {"pad_token_id": 0, "num_key_value_heads": 2},
    "jina_embeddings_v3": {"pad_token_id": 1},
    "ultrabert": {
        "pad_token_id": 0,
        "sliding_window": 4,
        "num_key_value_heads": 2,
        "layer_types": ["full_attention", "sliding_attention"],
    },  # fmt: skip
    "esm": {
        "pad_token_id": 1,
        "mask_token_id": 3,
        "position_embedding_type": "rotary",
        "token_dropout": True,
        "emb_layer_norm_before": False,
    },  # fmt: skip
}
#: One of DISPATCHING_ARCHITECTURES of each kind for the costlier checks of the default tier: learned
#: positions, rotary with full layers only, rotary with windowed layers (the rest in the slow tier).
KINDS = ["albert", "gte", "modernbert"]


def default_tier(*architectures: str) -> list:
    """DISPATCHING_ARCHITECTURES, with those not named in the slow tier."""
    return [a if a in architectures else pytest.param(a, marks=pytest.mark.slow) for a in DISPATCHING_ARCHITECTURES]


def tiny_config(model_type="roberta", **overrides):
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    if model_type == "longformer":
        common.update(attention_window=[128, 128], max_position_embeddings=132, pad_token_id=1)
    else:
        common.update(max_position_embeddings=130)
    common.update(DISPATCHING_ARCHITECTURES.get(model_type, {}))
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


def no_dropout(model_type: str) -> dict[str, float]:
    """Config overrides that turn off every dropout of the architecture (each names its own)."""
    names = [name for name, value in tiny_config(model_type).to_dict().items() if "dropout" in name and isinstance(value, float)]
    return dict.fromkeys(names, 0.0)
