"""The seed papers' released checkpoints, saved by Transformers' ``Mra*``, ``Yoso*`` and
``Nystromformer*`` classes (uw-madison/mra-base-4096-8-d3, uw-madison/yoso-4096,
uw-madison/nystromformer-512 ...), loaded as BERT models running the matching method.

Those three models are BERT's architecture with another attention: the same layer names, BERT's
masked-LM head (``cls.predictions``, its activation ``config.hidden_act``), token types, and absolute
positions counted from 2 in a table of ``max_position_embeddings + 2`` rows whose first two rows no
input reaches. So a checkpoint becomes a ``Bert*`` model by renaming its base-model prefix to
``bert``, dropping those two rows, and moving YOSO's and Nystromformer's convolution over V
(``attention.self.conv``) to the method's (``attention.self.efficient_attn.conv``); its config's
attention fields become the method's options (:func:`released_method`). (RoBERTa would fit the
embeddings as they are but not the heads: its MLM head applies gelu whatever ``hidden_act``, and
Nystromformer's is gelu_new.)

Two of Transformers' task heads have no BERT counterpart: sequence classification (dense,
``hidden_act``, projection on the first token) and multiple choice (dense, ReLU, projection). Released
checkpoints have neither (they are masked-LM models), so those heads are new, BERT's; a fine-tuned
checkpoint that holds one is refused rather than loaded into a head that computes something else.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch
from transformers import BertConfig, PretrainedConfig

from ..registry import MethodChoice

#: The released formats, by ``config.model_type``.
RELEASED_MODEL_TYPES = ("mra", "nystromformer", "yoso")
#: Rows of the released position tables that no input reaches (positions start at 2).
POSITION_OFFSET = 2
#: Weights files of a checkpoint folder, in the order tried (sharded: their index).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
#: Config fields the conversion carries over to BertConfig unchanged.
SHARED_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "initializer_range", "layer_norm_eps", "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings",
    "chunk_size_feed_forward", "id2label", "label2id", "problem_type", "dtype",
)  # fmt: skip
#: Transformers' task heads that BERT's heads do not compute, by the auto class that would load
#: them: a key of theirs, and what they compute.
FOREIGN_HEADS = {
    "AutoModelForSequenceClassification": (
        "classifier.dense.weight",
        "sequence classification head (dense, hidden_act, projection)",
    ),
    "AutoModelForMultipleChoice": ("pre_classifier.weight", "multiple-choice head (dense, ReLU, projection)"),
}


def _refuse(config: PretrainedConfig, field: str, why: str) -> ValueError:
    return ValueError(f"{config.model_type} checkpoint: {field}={getattr(config, field, None)!r} {why}")


def released_method(config: PretrainedConfig) -> MethodChoice:
    """The method and options a released checkpoint's config records (docs/released_checkpoints.md).
    ``ValueError`` naming the field for a setting the plugin cannot honour."""
    if getattr(config, "add_cross_attention", False) or getattr(config, "is_decoder", False):
        raise _refuse(config, "is_decoder" if getattr(config, "is_decoder", False) else "add_cross_attention",
                      "makes a decoder; the plugin runs encoders' self-attention only")  # fmt: skip
    if config.model_type == "mra":
        if config.approx_mode not in ("full", "sparse"):
            raise _refuse(config, "approx_mode", 'is not one of MRA\'s "full" (mra2) and "sparse" (mra2_s)')
        options = {
            "block_per_row": config.block_per_row,
            "initial_prior_first_n_blocks": config.initial_prior_first_n_blocks,
            "initial_prior_diagonal_n_blocks": config.initial_prior_diagonal_n_blocks,
        }
        return MethodChoice.of("mra2" if config.approx_mode == "full" else "mra2_s", options)
    if config.model_type == "yoso":
        if config.use_expectation:  # Transformers' YOSO-E back-propagates eq. (3), the lower bound
            return MethodChoice.of("yoso_e", {"hash_code_len": config.hash_code_len, "conv_window": config.conv_window})
        if not config.lsh_backward:
            raise _refuse(config, "lsh_backward", "(hashed forward, backward through the expectation) is not available; "
                          "yoso back-propagates with the forward's hashes (lsh_backward=True)")  # fmt: skip
        options = {"hash_code_len": config.hash_code_len, "num_hash": config.num_hash, "use_fast_hash": config.use_fast_hash}
        return MethodChoice.of("yoso", {**options, "conv_window": config.conv_window})
    if config.model_type == "nystromformer":
        if config.num_landmarks == config.segment_means_seq_len:
            raise _refuse(config, "num_landmarks", "equals segment_means_seq_len: Transformers' Nystromformer then runs "
                          "exact softmax attention, not Nyströmformer")  # fmt: skip
        options = {
            "num_landmarks": config.num_landmarks,
            "conv_kernel_size": config.conv_kernel_size,
            # False: Transformers' (and the official) 1 / largest column sum over every head of the call;
            # True: 1 / ||A||_1 per matrix (Transformers reads it from a misspelled key and fails to build).
            "pinv_coefficient": "matrix" if config.inv_coeff_init_option else "heads",
        }
        return MethodChoice.of("nystromformer", options)
    raise ValueError(f"not a released checkpoint format: {config.model_type!r}; these are: {', '.join(RELEASED_MODEL_TYPES)}")


def bert_config(config: PretrainedConfig) -> BertConfig:
    """The BERT config of a released checkpoint's, with its method recorded (``attn_impl``,
    ``attn_config``) as a saved variant's, and the source named (``converted_from``)."""
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise _refuse(config, "position_embedding_type", "is not available; the released models use absolute positions")
    choice = released_method(config)
    fields = {field: getattr(config, field) for field in SHARED_FIELDS if hasattr(config, field)}
    architectures = [re.sub(r"^(Mra|Yoso|Nystromformer)", "Bert", name) for name in config.architectures or []]
    converted = BertConfig(**fields, architectures=architectures or None)
    converted.attn_impl, converted.attn_config = choice.name, choice.attn_config
    converted.converted_from = {"model_type": config.model_type, "name_or_path": config._name_or_path}
    converted._name_or_path = config._name_or_path
    return converted


def converted_state_dict(state_dict: dict[str, torch.Tensor], model_type: str) -> dict[str, torch.Tensor]:
    """A released checkpoint's weights under BERT's names (module docstring); a key with no BERT
    counterpart is a ``ValueError`` naming it. Buffers are dropped (BERT's are not saved)."""
    converted = {}
    for key, tensor in state_dict.items():
        name = re.sub(rf"^{model_type}\.", "bert.", key)
        bare = name.removeprefix("bert.")
        if bare in ("embeddings.position_ids", "embeddings.token_type_ids"):
            continue
        if bare == "embeddings.position_embeddings.weight":
            tensor = tensor[POSITION_OFFSET:]
        name = re.sub(r"\.attention\.self\.conv\.weight$", ".attention.self.efficient_attn.conv.weight", name)
        if _KNOWN.match(name) is None:
            raise ValueError(f"{model_type} checkpoint: weight {key!r} has no counterpart in BERT's architecture")
        converted[name] = tensor
    return converted


_KNOWN = re.compile(
    r"^(bert\.)?(embeddings\.(word|position|token_type)_embeddings\.weight|embeddings\.LayerNorm\.(weight|bias)"
    r"|encoder\.layer\.\d+\.(attention\.self\.(query|key|value)\.(weight|bias)|attention\.self\.efficient_attn\.conv\.weight"
    r"|attention\.output\.(dense|LayerNorm)\.(weight|bias)|intermediate\.dense\.(weight|bias)"
    r"|output\.(dense|LayerNorm)\.(weight|bias)))$"
    r"|^cls\.predictions\.(transform\.(dense|LayerNorm)\.(weight|bias)|decoder\.(weight|bias)|bias)$"
    r"|^(classifier|qa_outputs|pre_classifier)\.(weight|bias)$|^classifier\.(dense|out_proj)\.(weight|bias)$"
)


def check_heads(state_dict: dict[str, torch.Tensor], auto_class_name: str, model_type: str) -> None:
    """``ValueError`` when ``auto_class_name`` would load a head of the checkpoint that computes
    something else in BERT (:data:`FOREIGN_HEADS`)."""
    key, head = FOREIGN_HEADS.get(auto_class_name, (None, None))
    if key in state_dict:
        raise ValueError(
            f"{model_type} checkpoint: its {head} has no BERT counterpart; load it with hf_efficient_attn.AutoModel "
            f"or AutoModelForMaskedLM, save that, and load the saved folder with {auto_class_name} for a new head to fine-tune"
        )


def read_state_dict(path: str, **hub_kwargs: Any) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint folder or Hub id (safetensors or pytorch_model.bin, sharded or not)."""
    from safetensors.torch import load_file
    from transformers.utils import cached_file

    for name in WEIGHT_FILES:
        found = cached_file(path, name, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
        if found is None:
            continue
        files = [found]
        if name.endswith(".index.json"):
            with open(found) as index:
                shards = sorted(set(json.load(index)["weight_map"].values()))
            files = [cached_file(path, shard, **hub_kwargs) for shard in shards]
        state_dict = {}
        for file in files:
            state_dict.update(
                load_file(file) if file.endswith(".safetensors") else torch.load(file, map_location="cpu", weights_only=True)
            )
        return state_dict
    raise ValueError(f"{path}: no weights found (looked for {', '.join(WEIGHT_FILES)})")
