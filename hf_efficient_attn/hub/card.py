"""The model card of a shared variant, built with huggingface_hub: ``ModelCardData`` for the Hub
metadata (``model-index`` from a Trainer ``*_results.json`` as ``EvalResult``s) and
``ModelCard.from_template`` rendering the Jinja template ``model_cards/template.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import PreTrainedModel

from .. import __version__
from ..integration.bridge import method_modules
from ..integration.positions import max_tokens
from ..methods.base import AttentionMethod
from .remote_code import PACKAGE, auto_class_of, model_classes

#: The Jinja template: the repository's model_cards/template.md, linked here so that it ships as package data.
DEFAULT_TEMPLATE = Path(__file__).with_name("model_card_template.md")


#: Hub pipeline tag of each head (None: no pipeline; a pretraining head's evaluation is its MLM loss).
PIPELINE_TAGS: dict[str, str | None] = {
    "AutoModel": "feature-extraction",
    "AutoModelForPreTraining": None,
    "AutoModelForMaskedLM": "fill-mask",
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModelForMultipleChoice": "multiple-choice",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForQuestionAnswering": "question-answering",
}

#: Split of the metrics a Trainer prefixes with ``<prefix>_`` (``trainer.evaluate`` / ``predict``).
METRIC_SPLITS = {"eval": "validation", "test": "test", "predict": "test"}

#: Entries of a Trainer results file that are bookkeeping, not quality metrics.
_BOOKKEEPING = {
    "epoch",
    "total_flos",
    "runtime",
    "samples",
    "samples_per_second",
    "steps_per_second",
    "model_preparation_time",
    "jit_compilation_time",
}


def read_metrics(results_file: str | Path) -> list[tuple[str, str, float]]:
    """``(split, metric, value)`` of the evaluation metrics in a Trainer ``<split>_results.json``.

    Prefixed keys (``eval_accuracy``) name their split; unprefixed ones (``perplexity`` of
    ``run_mlm.py``) take the file's (``eval_results.json`` / ``all_results.json``: validation).
    Training metrics and bookkeeping (runtime, throughput, epoch, memory) are left out.
    """
    path = Path(results_file)
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a Trainer results file holds a JSON object of metrics, got {type(data).__name__}")
    file_split = METRIC_SPLITS.get(path.name.removesuffix("_results.json"), "validation")
    metrics = []
    for key, value in data.items():
        prefix, _, rest = key.partition("_")
        split, metric = (METRIC_SPLITS[prefix], rest) if prefix in METRIC_SPLITS and rest else (file_split, key)
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if prefix == "train" or not numeric or metric in _BOOKKEEPING or metric.startswith("mem_"):
            continue
        metrics.append((split, metric, value))
    if not metrics:
        raise ValueError(
            f"{path} has no evaluation metric (keys: {sorted(data)}); pass the eval_results.json, "
            "test_results.json or all_results.json that Trainer.save_metrics writes"
        )
    return metrics


def eval_results(
    metrics: list[tuple[str, str, float]], task_type: str, dataset_name: str, dataset_config_name: str | None
) -> list[EvalResult]:
    """The ``model-index`` entries of ``metrics`` on dataset ``dataset_name`` (a Hub dataset id)."""
    pretty = f"{dataset_name} ({dataset_config_name})" if dataset_config_name else dataset_name
    return [
        EvalResult(
            task_type=task_type,
            dataset_type=dataset_name,
            dataset_name=pretty,
            dataset_config=dataset_config_name,
            dataset_split=split,
            metric_type=metric,
            metric_name=metric,
            metric_value=value,
        )
        for split, metric, value in metrics
    ]


def _method(model: PreTrainedModel) -> AttentionMethod:
    return method_modules(model)[0]


def method_parameter_count(model: PreTrainedModel) -> int:
    """Learnable parameters the method adds (shared ones counted once)."""
    params = {id(p): p for m in method_modules(model) for p in m.parameters()}
    return sum(p.numel() for p in params.values())


def training_lines(trainer_state: dict[str, Any] | None) -> list[str]:
    """What ``trainer_state.json`` records: steps, epochs, batch size, last losses and evaluation."""
    if not trainer_state:
        return ["No training is recorded with this checkpoint (no `trainer_state.json`)."]
    lines = [
        f"Trained with the Transformers `Trainer`: {trainer_state.get('global_step')} steps "
        f"({trainer_state.get('epoch') or 0:.4g} epochs), {trainer_state.get('train_batch_size')} examples per device "
        f"per step (`trainer_state.json`)."
    ]
    history = trainer_state.get("log_history", [])
    train_logs = [entry for entry in history if "loss" in entry]
    if train_logs:
        last = train_logs[-1]
        lines.append(f"Last logged training loss: {last['loss']:.4g} (step {last.get('step')}).")
    eval_logs = [entry for entry in history if any(k.startswith("eval_") for k in entry)]
    if eval_logs:
        last = eval_logs[-1]
        shown = ", ".join(
            f"{k} {v:.4g}" for k, v in last.items() if k.startswith("eval_") and k.removeprefix("eval_") not in _BOOKKEEPING
        )
        lines.append(f"Last evaluation during training (step {last.get('step')}): {shown}.")
    return lines


def _is_local(name: str | None) -> bool:
    return name is None or Path(name).expanduser().exists() or name.startswith((".", "/", "~"))


def _data_text(data: dict[str, Any]) -> str:
    """A stage's data: a Hub dataset by id, local files by name (they are not on the Hub)."""
    if data.get("dataset_name"):
        config = data.get("dataset_config_name")
        hub_id = data["dataset_name"]
        return f"[`{hub_id}`](https://huggingface.co/datasets/{hub_id})" + (f" (`{config}`)" if config else "")
    files = ", ".join(f"`{name}`" for name in data.get("files", {}).values())
    return f"local files ({files}; not on the Hub)"


def _evaluation_text(metrics: dict[str, Any]) -> str:
    shown = [
        f"{key.removeprefix('eval_').replace('_', ' ')} {value:.4g}"
        for key, value in metrics.items()
        if key != "eval_samples" and isinstance(value, (int, float))
    ]
    if not shown:
        return ""
    where = f" on {metrics['eval_samples']} validation examples" if "eval_samples" in metrics else ""
    return f"; evaluation{where}: {', '.join(shown)}"


def stage_lines(provenance: dict[str, Any]) -> list[str]:
    """One line per stage of ``provenance.json`` (:mod:`hf_efficient_attn.tasks.common.provenance`)."""
    lines = []
    for stage in provenance.get("stages", []):
        if stage.get("stage") == "conversion":
            source = stage.get("model") if not _is_local(stage.get("model")) else provenance.get("base_model")
            head = "; a new masked-LM head was initialised" if stage.get("new_head_tensors") else ""
            lines.append(
                f"Converted from {f'`{source}`' if source else 'a local checkpoint'} (`{stage.get('script')}`): "
                f"position table {stage.get('tokens_before')} -> {stage.get('tokens_after')} tokens, attention "
                f"`{stage.get('attn_impl') or 'exact'}`{head}."
            )
            continue
        lines.append(
            f"{stage.get('stage', 'training')[:1].upper()}{stage.get('stage', 'training')[1:]} "
            f"(`{stage.get('script')}`, attention `{stage.get('attn_impl') or 'exact'}`): {stage.get('steps')} steps "
            f"({stage.get('epochs') or 0:.3g} epochs) of {stage.get('global_batch_size')} examples of up to "
            f"{stage.get('max_seq_length')} tokens, learning rate {stage.get('learning_rate'):g}, on "
            f"{_data_text(stage.get('data', {}))}{_evaluation_text(stage.get('eval', {}))}."
        )
    return lines


def hub_datasets(provenance: dict[str, Any] | None, dataset_name: str | None) -> list[str]:
    """The Hub dataset ids of the card's ``datasets:``: the stages' Hub datasets and ``dataset_name``
    (local files are described in the text only)."""
    names = [stage.get("data", {}).get("dataset_name") for stage in (provenance or {}).get("stages", [])]
    return list(dict.fromkeys(name for name in [*names, dataset_name] if name))


def limitations(model: PreTrainedModel, trained: bool) -> list[str]:
    """What the method does not support, from its class's declared properties."""
    method = _method(model)
    name, length = method.name, max_tokens(model.config)
    lines = [
        "Encoder self-attention only: decoder use, causal masks and cross-attention raise a ValueError.",
        "`output_attentions=True` returns the attention probabilities."
        if name == "softmax"
        else "The attention matrix is never formed: `output_attentions=True` raises a ValueError, and "
        "attention-probability dropout is not applied.",
        f"Inputs longer than {length} tokens (the position table) raise a ValueError.",
    ]
    if not method.approximates_softmax:
        lines.append(
            f"`{name}` is not softmax attention: swapped into a softmax-pretrained checkpoint it needs "
            "fine-tuning before its outputs are meaningful."
        )
    if method.samples:
        lines.append("It draws random samples; in `model.eval()` they come from the `seed` option, so inference is reproducible.")
    if not method.padding_invariant:
        lines.append(
            "Its samples depend on the padded length: a sequence's output changes slightly with the padding of its batch."
        )
    if method.length_bound:
        lines.append(
            f"Its parameters are sized by the position table ({length} tokens): the input length cannot be "
            "extended without training new ones."
        )
    count = method_parameter_count(model)
    if count and not trained:
        lines.append(
            f"Its {count} parameters were newly initialised at conversion and no training is recorded: train them before use."
        )
    if model.config.model_type == "longformer":
        lines.append(
            "Longformer's sliding window and global attention are replaced: every token attends to every token "
            "through the method, and `global_attention_mask` has no effect."
        )
    return lines


def build_model_card(
    model: PreTrainedModel,
    *,
    repo_id: str,
    base_model: str | None,
    license: str | None,
    results_file: str | Path | None = None,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    trainer_state: dict[str, Any] | None = None,
    provenance: dict[str, Any] | None = None,
    template_path: str | Path = DEFAULT_TEMPLATE,
) -> ModelCard:
    """The README.md of ``model``'s upload (``model`` patched, i.e. ``config.attn_impl`` set).

    The training section lists the stages of ``provenance`` (``provenance.json``), else what
    ``trainer_state`` records; ``base_model`` and ``license`` left None are left out of the card."""
    config = model.config
    auto_class = auto_class_of(model)
    pipeline_tag = PIPELINE_TAGS[auto_class]
    metrics = read_metrics(results_file) if results_file else []
    if metrics and not dataset_name:
        raise ValueError("a results file needs --dataset_name (the Hub id of the evaluation dataset) for the model-index")
    if not Path(template_path).is_file():
        raise ValueError(f"model-card template not found: {template_path}")
    card_data = ModelCardData(
        model_name=repo_id.split("/")[-1],
        base_model=base_model,
        license=license,
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=[PACKAGE, "efficient-attention", config.attn_impl, config.model_type],
        datasets=hub_datasets(provenance, dataset_name) or None,
        eval_results=eval_results(metrics, pipeline_tag or "fill-mask", dataset_name, dataset_config_name) or None,
    )
    stages = stage_lines(provenance) if provenance else []
    trained = any(s.get("stage") != "conversion" for s in (provenance or {}).get("stages", [])) or bool(trainer_state)
    method = _method(model)
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        base_model=base_model,
        version=__version__,
        attn_impl=config.attn_impl,
        paper=type(method).paper,
        approximates_softmax=method.approximates_softmax,
        method_parameters=method_parameter_count(model),
        attn_config_json=json.dumps(config.attn_config, indent=2, sort_keys=True),
        architecture=model_classes(config.model_type)[auto_class],
        model_type=config.model_type,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        max_length=max_tokens(config),
        max_position_embeddings=config.max_position_embeddings,
        training=stages or training_lines(trainer_state),
        results=[(metric, split, f"{value:.4g}") for split, metric, value in metrics],
        results_file=Path(results_file).name if results_file else None,
        dataset=f"`{dataset_name}`" + (f" (`{dataset_config_name}`)" if dataset_config_name else "") if dataset_name else None,
        limitations=limitations(model, trained=trained),
        auto_class=auto_class,
    )
