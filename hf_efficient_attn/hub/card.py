"""The model card of a shared variant, built with huggingface_hub: ``ModelCardData`` for the Hub
metadata (``model-index`` from a Trainer ``*_results.json`` as ``EvalResult``s) and
``ModelCard.from_template`` rendering the Jinja template ``model_cards/template.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import PreTrainedModel

from .. import __version__
from ..integration.bridge import method_modules
from ..integration.positions import max_tokens
from ..methods.base import AttentionMethod
from ..tasks.common.data import BUILDERS
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


#: The local files (``provenance.json`` data flags) that each metric split is measured on.
SPLIT_FILES = {"validation": ("validation_file", "validation_mismatched_file"), "test": ("test_file", "test_mismatched_file")}

#: Heads whose outputs are classes (``config.id2label``).
CLASSIFIER_HEADS = ("AutoModelForSequenceClassification", "AutoModelForTokenClassification")


@dataclass(frozen=True)
class EvalData:
    """The data a split's metrics were measured on, as the model-index names it (``type`` the Hub id,
    or for local files the ``datasets`` builder that reads them, with ``args`` the ``data_files`` of
    ``load_dataset``) and as the results table's heading says it (``text``)."""

    type: str
    name: str
    text: str
    config: str | None = None
    args: dict[str, Any] | None = None


def evaluation_data(split: str, data: dict[str, Any]) -> EvalData:
    """The data ``split`` was measured on in a run whose data ``provenance.json`` records as ``data``
    (a Hub dataset, or local files: the split's own, else the part held out from the training file)."""
    if data.get("dataset_name"):
        hub_id, config = data["dataset_name"], data.get("dataset_config_name")
        return EvalData(hub_id, f"{hub_id} ({config})" if config else hub_id,
                        f"`{hub_id}`" + (f" (`{config}`)" if config else ""), config)  # fmt: skip
    files = data.get("files", {})
    own = [files[flag] for flag in SPLIT_FILES.get(split, ()) if files.get(flag)]
    builder = BUILDERS[Path((own or [files["train_file"]])[0]).suffix.lstrip(".")]
    if not own:
        held_out = files["train_file"]
        return EvalData(builder, f"local file {held_out}, held-out part (not on the Hub)",
                        f"the part of the local file `{held_out}` held out for evaluation (not on the Hub)")  # fmt: skip
    return EvalData(builder, f"local files: {', '.join(own)} (not on the Hub)",
                    f"local files ({', '.join(f'`{name}`' for name in own)}; not on the Hub)",
                    args={"data_files": own[0] if len(own) == 1 else own})  # fmt: skip


def eval_results(metrics: list[tuple[str, str, float]], task_type: str, data: dict[str, Any]) -> list[EvalResult]:
    """The ``model-index`` entries of ``metrics``, measured on ``data`` (as ``provenance.json`` records a
    run's data: ``dataset_name`` / ``dataset_config_name``, or local ``files``)."""
    results = []
    for split, metric, value in metrics:
        measured_on = evaluation_data(split, data)
        results.append(
            EvalResult(
                task_type=task_type,
                dataset_type=measured_on.type,
                dataset_name=measured_on.name,
                dataset_config=measured_on.config,
                dataset_split=split,
                dataset_args=measured_on.args,
                metric_type=metric,
                metric_name=metric,
                metric_value=value,
            )
        )
    return results


def measured_stage(results_file: str | Path, provenance: dict[str, Any] | None) -> dict[str, Any] | None:
    """The training stage of ``provenance`` that wrote ``results_file``: the last one whose recorded
    evaluation is there, every metric with its value; None when no stage's is."""
    found = json.loads(Path(results_file).read_text())
    stages = (provenance or {}).get("stages", [])
    matching = [s for s in stages if s.get("eval") and all(found.get(k) == v for k, v in s["eval"].items())]
    return matching[-1] if matching else None


def results_data(
    results_file: str | Path, dataset_name: str | None, dataset_config_name: str | None, provenance: dict[str, Any] | None
) -> dict[str, Any]:
    """The data ``results_file``'s metrics were measured on: the Hub dataset ``dataset_name`` when
    given, else the data ``provenance`` records for the run that wrote the file (local files too)."""
    if dataset_name:
        return {"dataset_name": dataset_name, "dataset_config_name": dataset_config_name}
    stage = measured_stage(results_file, provenance)
    if stage is None:
        raise ValueError(
            f"{results_file}: no training run recorded in the model folder's provenance.json wrote these results, so "
            "the data they were measured on is unknown; pass the all_results.json (or eval_results.json) of the "
            "training run that made --model_dir, or name a Hub dataset with --dataset_name"
        )
    return stage["data"]


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


def _count(number: Any, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _data_text(data: dict[str, Any], evaluated: bool) -> str:
    """A stage's data: a Hub dataset by id, local files by name and role (they are not on the Hub);
    files only predicted on (``--test_file``) are not the model's training data and are left out."""
    if data.get("dataset_name"):
        config = data.get("dataset_config_name")
        hub_id = data["dataset_name"]
        return f"[`{hub_id}`](https://huggingface.co/datasets/{hub_id})" + (f" (`{config}`)" if config else "")
    files = data.get("files", {})
    roles = [f"`{files['train_file']}` for training"] if files.get("train_file") else []
    if evaluated:
        evaluation = [f"`{files[flag]}` for evaluation" for flag in SPLIT_FILES["validation"] if files.get(flag)]
        roles += evaluation or ["a part of it held out for evaluation"]
    return f"local files ({', '.join(roles)}; not on the Hub)"


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
        examples = stage.get("train_samples")
        over = f" over {_count(examples, 'training example')}" if examples is not None else ""
        lines.append(
            f"{stage.get('stage', 'training')[:1].upper()}{stage.get('stage', 'training')[1:]} "
            f"(`{stage.get('script')}`, attention `{stage.get('attn_impl') or 'exact'}`): "
            f"{_count(stage.get('steps'), 'step')} of {_count(stage.get('global_batch_size'), 'example')} "
            f"({stage.get('epochs') or 0:.3g} epochs{over}), each example up to {stage.get('max_seq_length')} tokens, "
            f"learning rate {stage.get('learning_rate'):g}, on {_data_text(stage.get('data', {}), bool(stage.get('eval')))}"
            f"{_evaluation_text(stage.get('eval', {}))}."
        )
    return lines


def hub_datasets(provenance: dict[str, Any] | None, dataset_name: str | None) -> list[str]:
    """The Hub dataset ids of the card's ``datasets:``: the stages' Hub datasets and ``dataset_name``
    (local files are described in the text only)."""
    names = [stage.get("data", {}).get("dataset_name") for stage in (provenance or {}).get("stages", [])]
    return list(dict.fromkeys(name for name in [*names, dataset_name] if name))


def label_line(model: PreTrainedModel) -> str | None:
    """What a classifier's outputs are: its classes (``config.id2label``) or one regression score;
    None for other heads."""
    if auto_class_of(model) not in CLASSIFIER_HEADS:
        return None
    config = model.config
    if config.num_labels == 1:
        return "Output: one regression score (`num_labels` 1)."
    return "Labels (`config.id2label`): " + ", ".join(f"{i} `{name}`" for i, name in sorted(config.id2label.items())) + "."


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
    data = results_data(results_file, dataset_name, dataset_config_name, provenance) if metrics else {}
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
        eval_results=eval_results(metrics, pipeline_tag or "fill-mask", data) or None,
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
        labels=label_line(model),
        max_length=max_tokens(config),
        max_position_embeddings=config.max_position_embeddings,
        training=stages or training_lines(trainer_state),
        results=[(metric, split, f"{value:.4g}") for split, metric, value in metrics],
        results_file=Path(results_file).name if results_file else None,
        dataset="; ".join(dict.fromkeys(evaluation_data(split, data).text for split, _, _ in metrics)),
        limitations=limitations(model, trained=trained),
        auto_class=auto_class,
    )
