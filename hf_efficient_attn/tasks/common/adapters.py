"""Parameter-efficient fine-tuning: ``--peft lora`` wraps the (patched) model in a LoRA adapter
through the peft library (Hu et al. 2021: a trainable low-rank update ``B A`` beside each
targeted frozen weight, scaled by ``lora_alpha / r``).

The efficient attention stays active (LoRA only adds a parallel path to the query and value
projections that feed it), and the method's own parameters (Linformer's projections,
``hea.modules_to_save``) are trained and saved with the adapter next to the task head, so
``PeftModel.from_pretrained(<the same base loaded with the same method>, output_dir)`` restores
the fine-tuned model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from ...integration.bridge import self_attention_modules
from ...integration.patching import modules_to_save
from .args import check_positive_flags

logger = logging.getLogger("hf_efficient_attn.tasks")

#: Values of ``--peft``.
PEFT_METHODS = ("lora",)


@dataclass
class PeftArguments:
    """``--peft lora`` and LoRA's options (default targets: the LoRA paper's ``W_q``, ``W_v``)."""

    peft: str | None = field(
        default=None,
        metadata={"help": "Parameter-efficient fine-tuning: 'lora' (through the peft library). Default: full fine-tuning."},
    )
    lora_r: int = field(default=8, metadata={"help": "LoRA rank r."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator: the update is scaled by alpha / r."})
    lora_dropout: float = field(default=0.1, metadata={"help": "Dropout on LoRA's input."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": (
                "Names of the linear layers that get a LoRA update. Default: the attention layers' query and value "
                "projections (query value; q_proj v_proj; q_lin v_lin), or their fused projection where the "
                "architecture has one (ModernBERT's Wqkv)."
            )
        },
    )

    def __post_init__(self) -> None:
        if self.peft is not None and self.peft not in PEFT_METHODS:
            raise ValueError(f"--peft {self.peft!r}: unknown; allowed: {', '.join(PEFT_METHODS)}")
        check_positive_flags(self, "lora_r")
        if not self.lora_alpha > 0:
            raise ValueError(f"--lora_alpha must be positive, got {self.lora_alpha!r}")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"--lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
        if self.lora_target_modules is not None and not self.lora_target_modules:
            raise ValueError("--lora_target_modules needs at least one module name, e.g. query value")


#: The query and value projections of the attention layers (the LoRA paper's W_q, W_v), by the names
#: the architectures give them, and the fused projections of those that compute q, k, v in one.
QUERY_VALUE_PROJECTIONS = ("query", "value", "q_proj", "v_proj", "q_lin", "v_lin")
FUSED_PROJECTIONS = ("Wqkv",)


def attention_projections(model: nn.Module) -> list[str]:
    """The default LoRA targets of ``model``: the query and value projections of its self-attention
    layers, or their fused projection; empty when it has neither."""
    names = {
        name.rsplit(".", 1)[-1]
        for attention in self_attention_modules(model)
        for name, module in attention.named_modules()
        if isinstance(module, nn.Linear)
    }
    return [n for n in QUERY_VALUE_PROJECTIONS if n in names] or [n for n in FUSED_PROJECTIONS if n in names]


def apply_lora(model: nn.Module, args: PeftArguments, task_type: str, also_save: Sequence[str] = ()) -> nn.Module:
    """``model`` wrapped in a LoRA adapter per ``args`` (``task_type``: peft's ``TaskType``
    name, e.g. ``"SEQ_CLS"``, which keeps the task head trainable and saved). The method's own
    parameters (``hea.modules_to_save``) and the modules named in ``also_save`` are trained
    in full and saved with the adapter. ``ValueError`` when a target module does not exist."""
    from peft import LoraConfig, get_peft_model

    linear = ", ".join(sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}))
    targets = args.lora_target_modules or attention_projections(model)
    if not targets:
        raise ValueError(
            f"found no query and value projections to adapt: give --lora_target_modules; linear layers here: {linear}"
        )
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [name for name in targets if name not in present]
    if missing:
        raise ValueError(f"--lora_target_modules {missing}: no such module; linear layers here: {linear}")
    config = LoraConfig(
        task_type=task_type,
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=list(targets),
        modules_to_save=modules_to_save(model) + list(also_save) or None,
    )
    wrapped = get_peft_model(model, config)
    trainable, total = wrapped.get_nb_trainable_parameters()
    logger.info(f"LoRA r={args.lora_r} on {targets}: {trainable:,} of {total:,} parameters train")
    return wrapped
