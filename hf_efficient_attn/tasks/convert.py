"""Stretch a 512-position checkpoint to long inputs with an efficient attention, as a masked-LM model
ready for pretrain_mlm.py (``scripts/convert_to_long.py``, the command line over
``convert_to_long()``): the first step of the MRA paper's long-sequence recipe (Zeng et al., ICML
2022, section 5.2) and of Longformer's (Beltagy et al. 2020, section 5). The pretrained positions
are repeated to fill the longer table, rotary positions (ModernBERT, GTE, ESM-2, ...) have their
limit raised (optionally rescaled: --rope_scaling); a checkpoint without an MLM head (a sentence encoder) gets a
new one, drawn from --seed. Prints what it did.

Reads: --model_name_or_path: a local folder or a Hub id of an encoder checkpoint (config, weights,
tokenizer) of an architecture whose attention Transformers dispatches (docs/architectures.md).
Writes: into --output_dir (new or empty): the long masked-LM model (config.json with attn_impl and
attn_config, weights), its tokenizer (model_max_length = --max_length) and provenance.json (the Hub
checkpoint it came from and its license, for push_to_hub.py's card); a sentence-transformers
checkpoint's pipeline too (modules.json, its module folders, the new max_seq_length).

examples:
  python scripts/convert_to_long.py --model_name_or_path roberta-base --max_length 4096 \\
      --attn_impl mra2 --output_dir outputs/roberta-base-4096-mra2
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch
from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..integration.architectures import has_rotary_positions
from ..integration.auto import chosen_method
from ..integration.bridge import check_supported
from ..integration.patching import patch_model
from ..integration.positions import ROPE_SCALINGS, check_max_length, extend_position_embeddings, max_tokens
from .common.loading import HeldBackLoadReport
from .common.provenance import source_record, write_provenance
from .common.sentence_pipeline import copy_pipeline


@dataclass
class ConversionReport:
    """What :func:`convert_to_long` did, for the user to read."""

    model_type: str
    tokens_before: int
    tokens_after: int
    attn_impl: str | None
    attn_config: dict[str, Any]
    new_head_tensors: list[str] = field(default_factory=list)
    output_dir: str | None = None
    #: The sentence-transformers modules carried over (None: the checkpoint had no pipeline).
    sentence_pipeline: list[str] | None = None
    #: Rotary positions (no table to copy); ``rope_scaling``: how they were rescaled, if at all.
    rotary: bool = False
    rope_scaling: str | None = None

    def lines(self) -> list[str]:
        if self.tokens_after > self.tokens_before and self.rotary:
            scaled = (
                f"rescaled by {self.rope_scaling} RoPE scaling"
                if self.rope_scaling
                else "unscaled: inputs that fit before give the same outputs"
            )
            positions = f"rotary positions: {self.tokens_before} -> {self.tokens_after} tokens ({scaled})"
        elif self.tokens_after > self.tokens_before:
            positions = (
                f"position table: {self.tokens_before} -> {self.tokens_after} tokens "
                f"(the pretrained {self.tokens_before} positions repeated to fill it)"
            )
        else:
            already = "Longformer is already a long model: " if self.model_type == "longformer" else ""
            positions = f"position table: unchanged, {already}it already takes {self.tokens_before} tokens"
        attention = f"attention: {self.attn_impl} {self.attn_config}" if self.attn_impl else "attention: unchanged (exact)"
        lines = [f"model type: {self.model_type}", positions, attention]
        if self.new_head_tensors:
            lines.append(
                f"MLM head: the checkpoint has none; a new one was initialised ({len(self.new_head_tensors)} tensors: "
                f"{', '.join(self.new_head_tensors)}); continue MLM pretraining (scripts/pretrain_mlm.py) to train it"
            )
        lines.append(f"tokenizer: model_max_length = {self.tokens_after}")
        if self.sentence_pipeline:
            lines.append(
                f"sentence-transformers pipeline: kept ({' -> '.join(self.sentence_pipeline)}), max_seq_length = "
                f"{self.tokens_after}"
            )
        if self.output_dir:
            lines.append(f"saved model and tokenizer to {self.output_dir}")
        return lines


def convert_to_long(
    model_name_or_path: str,
    max_length: int = 4096,
    attn_impl: str | None = None,
    attn_config: dict[str, Any] | None = None,
    output_dir: str | None = None,
    config_name: str | None = None,
    tokenizer_name: str | None = None,
    seed: int = 0,
    base_model: str | None = None,
    rope_scaling: str | None = None,
    **hub_kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, ConversionReport]:
    """Load a checkpoint as a masked-LM model, stretch its position table to ``max_length``
    tokens (:func:`~hf_efficient_attn.extend_position_embeddings`, with ``rope_scaling`` for rotary
    positions), swap its attention to
    ``attn_impl`` and set the tokenizer's ``model_max_length``; save both to ``output_dir``.

    The method is attached after the extension, so that methods whose parameters are sized by
    the length (Linformer's E, F) get the new length. A checkpoint without an MLM head (e.g. a
    sentence encoder saved as ``BertModel``) gets a newly initialised head, listed in the report;
    its initialisation is drawn from ``seed``, so converting twice gives the same model.
    Without ``attn_impl``, the method saved in the checkpoint's config (if any) is kept.
    ``output_dir`` also gets ``provenance.json`` (:mod:`.common.provenance`): the Hub checkpoint
    this came from (``base_model``, default: the source's own record, or its Hub id) and its license,
    for the model card of what is trained from it.
    ``config_name`` / ``tokenizer_name`` load those from elsewhere; ``hub_kwargs``
    (``cache_dir``, ``revision``, ``token``, ``trust_remote_code``) go to
    every ``from_pretrained``.
    """
    max_length = check_max_length(max_length)
    if output_dir is not None and os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"--output_dir {output_dir!r} is a file; give a folder")
    if output_dir is not None and os.path.isfile(os.path.join(output_dir, "config.json")):
        raise ValueError(
            f"--output_dir {output_dir} already holds a model (config.json); give a new folder, or delete that one first"
        )
    config = AutoConfig.from_pretrained(config_name or model_name_or_path, **hub_kwargs)
    check_supported(config, attn_impl or getattr(config, "attn_impl", None) or "softmax")
    choice = chosen_method(config, attn_impl, attn_config)
    # Plain Transformers loads the weights; the method is attached after the extension (see above).
    held_back = HeldBackLoadReport()
    with torch.random.fork_rng(), held_back:  # a new head's init is seeded; the caller's generator is restored
        torch.manual_seed(seed)
        model, loading_info = AutoModelForMaskedLM.from_pretrained(
            model_name_or_path, config=config, output_loading_info=True, **hub_kwargs
        )
    held_back.release(model, loading_info)  # the expected ones: the report's "MLM head" line says them
    prefix = model.base_model_prefix + "."
    new_head = sorted(k for k in loading_info["missing_keys"] if not k.startswith(prefix))
    tokens_before = max_tokens(config)
    if max_length > tokens_before:  # a table as long or longer is kept (e.g. Longformer's 4096)
        extend_position_embeddings(model, max_length, rope_scaling=rope_scaling)
    elif rope_scaling is not None:
        raise ValueError(f"--rope_scaling {rope_scaling}: the model already takes {tokens_before} tokens, nothing to rescale")
    if choice is not None:
        patch_model(model, choice)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name or model_name_or_path, **hub_kwargs)
    tokenizer.model_max_length = max_tokens(model.config)
    report = ConversionReport(
        model_type=config.model_type,
        tokens_before=tokens_before,
        tokens_after=max_tokens(model.config),
        attn_impl=None if choice is None else choice.name,
        attn_config={} if choice is None else choice.attn_config,
        new_head_tensors=new_head,
        output_dir=output_dir,
        rotary=has_rotary_positions(config),
        rope_scaling=rope_scaling,
    )
    if output_dir is not None:
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        report.sentence_pipeline = copy_pipeline(model_name_or_path, output_dir, report.tokens_after, **hub_kwargs)
        stage = {"stage": "conversion", "script": "convert_to_long.py", "model": model_name_or_path,
                 **{key: value for key, value in asdict(report).items() if key != "output_dir"}}  # fmt: skip
        write_provenance(output_dir, source_record(model_name_or_path, base_model, **hub_kwargs), stage)
    return model, tokenizer, report


@dataclass
class ConversionArguments:
    """``scripts/convert_to_long.py``'s own flags (the model flags are :class:`ModelArguments`)."""

    output_dir: str = field(metadata={"help": "Where to save the long model and its tokenizer."})
    max_length: int = field(default=4096, metadata={"help": "Tokens the model will take."})
    rope_scaling: str | None = field(
        default=None,
        metadata={
            "help": "Rotary models only: rescale the positions by --max_length over the pretrained length with "
            "this RoPE scaling (changes the outputs at every length; default: none, the limit is only raised "
            "and inputs that fit before give the same outputs).",
            "choices": list(ROPE_SCALINGS),
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of a newly initialised MLM head (checkpoints without one)."})
    base_model: str | None = field(
        default=None,
        metadata={
            "help": "Hub id of the checkpoint converted, recorded for the model card (push_to_hub.py) when "
            "--model_name_or_path is a local folder that does not record it."
        },
    )


def main(argv: Sequence[str] | None = None) -> ConversionReport:
    """Command line of ``scripts/convert_to_long.py``: convert, save, print what was done."""
    from .common.args import ModelArguments, parse_arguments

    model_args, conversion_args = parse_arguments((ModelArguments, ConversionArguments), argv, __doc__)
    *_, report = convert_to_long(
        model_args.model_name_or_path,
        conversion_args.max_length,
        model_args.attn_impl,
        model_args.attn_options,
        conversion_args.output_dir,
        config_name=model_args.config_name,
        tokenizer_name=model_args.tokenizer_name,
        seed=conversion_args.seed,
        base_model=conversion_args.base_model,
        rope_scaling=conversion_args.rope_scaling,
        **model_args.hub_kwargs(),
    )
    print("\n".join(report.lines()))
    return report
