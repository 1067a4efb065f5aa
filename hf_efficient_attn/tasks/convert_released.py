"""A paper's released checkpoint (saved by Transformers' ``Mra*``, ``Yoso*`` or ``Nystromformer*``
classes) written as a saved variant: the BERT model running the method its config records
(``integration/released.py``), so that it reloads as itself with the plugin and with plain
Transformers, and trains and exports like any variant. ``scripts/convert_checkpoint.py`` is the
command line over ``convert_released_checkpoint()``; it prints what it did (method and options,
weights taken, new and left-over tensors).

Reads: --model_name_or_path: a folder or Hub id saved by Transformers' Mra*, Yoso* or
Nystromformer* classes (config, weights, tokenizer), e.g. uw-madison/mra-base-512-4.
Writes: into --output_dir (new or empty): the variant (config.json with attn_impl and attn_config,
weights), its tokenizer and provenance.json (the released checkpoint it came from, for
push_to_hub.py's card).

examples:
  python scripts/convert_checkpoint.py --model_name_or_path uw-madison/mra-base-512-4 \\
      --output_dir outputs/mra-base-512-4
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from transformers import AutoConfig, AutoTokenizer

from ..integration import auto
from ..integration.released import RELEASED_MODEL_TYPES
from ..registry import MethodChoice
from .common.args import attn_config_field, attn_impl_field, check_flag_choice, parse_attn_config
from .common.provenance import source_record, write_provenance

#: A released architecture's class suffix -> the auto class that loads it (default: masked LM).
ARCHITECTURE_AUTO_CLASSES = {
    "Model": "AutoModel",
    "ForMaskedLM": "AutoModelForMaskedLM",
    "ForSequenceClassification": "AutoModelForSequenceClassification",
    "ForMultipleChoice": "AutoModelForMultipleChoice",
    "ForTokenClassification": "AutoModelForTokenClassification",
    "ForQuestionAnswering": "AutoModelForQuestionAnswering",
}


@dataclass
class ReleasedConversion:
    """What :func:`convert_released_checkpoint` did, for the user to read."""

    source: str
    source_architecture: str
    auto_class: str
    attn_impl: str
    attn_config: dict[str, Any]
    weights: int
    new: list[str]
    left_over: list[str]
    output_dir: str

    def lines(self) -> list[str]:
        lines = [
            f"source: {self.source} ({self.source_architecture})",
            f"model: BERT, loaded with {self.auto_class}; attention: {self.attn_impl} {self.attn_config}",
            f"weights: {self.weights} from the checkpoint",
        ]
        if self.new:
            lines.append(f"new (not in the checkpoint, initialised): {', '.join(self.new)}")
        if self.left_over:
            lines.append(f"left over (not used by this model): {', '.join(self.left_over)}")
        lines.append(f"saved model, tokenizer and provenance.json to {self.output_dir}")
        return lines


def auto_class_of(architectures: list[str] | None) -> str:
    """The hf_efficient_attn auto class of a released checkpoint's recorded architecture."""
    for suffix, name in ARCHITECTURE_AUTO_CLASSES.items():
        if architectures and architectures[0].endswith(suffix):
            return name
    return "AutoModelForMaskedLM"


def convert_released_checkpoint(
    model_name_or_path: str,
    output_dir: str,
    attn_impl: str | None = None,
    attn_config: dict[str, Any] | None = None,
    auto_class: str | None = None,
    base_model: str | None = None,
) -> ReleasedConversion:
    """Load ``model_name_or_path`` (a released checkpoint's folder or Hub id) with ``auto_class``
    (default: its architecture's) and the method its config records (or ``attn_impl`` /
    ``attn_config``), and save it, its tokenizer and ``provenance.json`` (``base_model``: the Hub id
    recorded for the model card when the source is a local folder that does not record one) to
    ``output_dir``, a new or empty folder."""
    if auto_class is not None:
        check_flag_choice("auto_class", auto_class, list(auto.AUTO_CLASSES))
    if attn_impl is not None:
        MethodChoice.of(attn_impl, attn_config or {})  # an unknown method or option: refused before loading
    if os.path.isfile(output_dir) or (os.path.isdir(output_dir) and os.listdir(output_dir)):
        raise ValueError(f"--output_dir {output_dir} is not empty; give a new or empty folder")
    config = AutoConfig.from_pretrained(model_name_or_path)
    if config.model_type not in RELEASED_MODEL_TYPES:
        raise ValueError(
            f"{model_name_or_path} is a {config.model_type} checkpoint; convert_checkpoint.py converts those saved by "
            f"Transformers' Mra*, Yoso* or Nystromformer* classes (model types {', '.join(RELEASED_MODEL_TYPES)}); "
            "load other checkpoints with hf_efficient_attn.AutoModel* or stretch them with convert_to_long.py"
        )
    auto_class = auto_class or auto_class_of(config.architectures)
    model, info = getattr(auto, auto_class).from_pretrained(
        model_name_or_path, attn_impl=attn_impl, attn_config=attn_config, output_loading_info=True
    )
    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    AutoTokenizer.from_pretrained(model_name_or_path).save_pretrained(output_dir)
    report = ReleasedConversion(
        source=model_name_or_path,
        source_architecture=(config.architectures or [config.model_type])[0],
        auto_class=auto_class,
        attn_impl=model.config.attn_impl,
        attn_config=model.config.attn_config,
        weights=len(model.state_dict()) - len(info["missing_keys"]),
        new=sorted(info["missing_keys"]),
        left_over=sorted(info["unexpected_keys"]),
        output_dir=output_dir,
    )
    stage = {"stage": "conversion", "script": "convert_checkpoint.py", "model": model_name_or_path,
             "source_architecture": report.source_architecture, "attn_impl": report.attn_impl,
             "attn_config": report.attn_config}  # fmt: skip
    write_provenance(output_dir, source_record(model_name_or_path, base_model), stage)
    return report


@dataclass
class ConvertCheckpointArguments:
    """``scripts/convert_checkpoint.py``'s flags."""

    model_name_or_path: str = field(
        metadata={
            "help": "A folder or Hub id saved by Transformers' Mra*, Yoso* or Nystromformer* classes (a paper's released "
            "checkpoint, e.g. uw-madison/mra-base-512-4; docs/released_checkpoints.md)."
        }
    )
    output_dir: str = field(
        metadata={"help": "A new or empty folder for the converted model, its tokenizer and provenance.json."}
    )
    attn_impl: str | None = attn_impl_field(None, " Default: the method the checkpoint's config records.")
    attn_config: str | None = attn_config_field()
    auto_class: str | None = field(
        default=None,
        metadata={
            "help": f"The hf_efficient_attn class to load with: one of {', '.join(auto.AUTO_CLASSES)}. Default: the "
            "one of the checkpoint's architecture (AutoModelForMaskedLM when it records none)."
        },
    )
    base_model: str | None = field(
        default=None,
        metadata={
            "help": "Hub id of the released checkpoint, recorded for the model card (push_to_hub.py) when "
            "--model_name_or_path is a local folder that does not record it."
        },
    )


def main(argv: Sequence[str] | None = None) -> ReleasedConversion:
    """Command line of ``scripts/convert_checkpoint.py``: convert, save, print what was done."""
    from .common.args import parse_arguments

    (args,) = parse_arguments((ConvertCheckpointArguments,), argv, description=__doc__)
    report = convert_released_checkpoint(
        args.model_name_or_path,
        args.output_dir,
        args.attn_impl,
        parse_attn_config(args.attn_config) or None,
        args.auto_class,
        args.base_model,
    )
    print("\n".join(report.lines()))
    return report
