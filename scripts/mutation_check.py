"""Check that the tests catch plausible bugs: apply one-line mutations, one at a time, each to a
temporary copy of the repository, run the tests named for it there, and report which mutations
the tests caught and which survived. Exits 1 if any survived (or the unmutated tree fails).

    python scripts/mutation_check.py                   # every default-tier mutation
    python scripts/mutation_check.py --only glue.py    # the mutations of files matching a substring
    python scripts/mutation_check.py --list            # what would be mutated, and by which tests
    python scripts/mutation_check.py --slow            # also those only the slow tier can catch

A developer tool (a run takes tens of minutes on 2 cores), not part of CI: run it on a module
after changing it or its tests, and add a line to MUTATIONS for every promise a new test guards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What a copy needs to run the tests (no .git, no virtual environment, no outputs).
COPIED = ("hf_efficient_attn", "model_cards", "tests", "scripts", "configs", "setup.cfg", "pyproject.toml")


@dataclass(frozen=True)
class Mutation:
    """Replace ``original`` (a substring found exactly once in ``path``) by ``replacement``; the
    pytest node ids or ``file::-k expression`` in ``tests`` must then fail."""

    path: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    bug: str
    slow: bool = False


P = "hf_efficient_attn/"
T = "tests/"
MUTATIONS: list[Mutation] = [
    # ---- masked-LM pretraining ------------------------------------------------------------------
    Mutation(P + "tasks/mlm/pretrain.py", "DataCollatorForLanguageModeling(tokenizer, mlm_probability=data_args.mlm_probability)",
             "DataCollatorForLanguageModeling(tokenizer)", (T + "test_mlm.py::-k mlm_probability_sets",),
             "--mlm_probability ignored"),
    Mutation(P + "tasks/mlm/pretrain.py", "mask_seed = training_args.data_seed if training_args.data_seed is not None else "
             "training_args.seed", "mask_seed = training_args.seed", (T + "test_mlm.py::-k seeds_choose",),
             "--data_seed ignored by the masks"),
    Mutation(P + "tasks/mlm/pretrain.py", "DeterministicallyMaskedDataset(eval_examples, masker, data_args.eval_mask_seed)",
             "DeterministicallyMaskedDataset(eval_examples, masker, mask_seed)", (T + "test_mlm.py::-k seeds_choose",),
             "validation masks follow the training seed"),
    Mutation(P + "tasks/mlm/pretrain.py", "prepare = tokenize_lines if data_args.line_by_line else tokenize_in_blocks",
             "prepare = tokenize_in_blocks", (T + "test_mlm.py::-k line_by_line",), "--line_by_line ignored"),
    Mutation(P + "tasks/common/args.py", "return data_args.max_seq_length or min(tokenizer_limit, model_limit)",
             "return min(tokenizer_limit, model_limit)", (T + "test_mlm.py::-k max_seq_length_is",),
             "--max_seq_length ignored"),
    Mutation(P + "tasks/mlm/pretrain.py", 'first_rows(tokenized["train"], data_args.max_train_samples)',
             'first_rows(tokenized["train"], None)', (T + "test_mlm.py::-k sample_limits",),
             "--max_train_samples ignored"),
    Mutation(P + "tasks/mlm/pretrain.py", "else \"validation\"], data_args.text_column_name)",
             "else \"validation\"], None)", (T + "test_mlm.py::-k text_column_name",), "--text_column_name ignored"),
    Mutation(P + "tasks/mlm/pretrain.py", "        data_args.validation_split_percentage,\n", "        5,\n",
             (T + "test_mlm.py::-k carved",), "--validation_split_percentage ignored"),
    Mutation(P + "tasks/mlm/pretrain.py", "        data_args.dataset_config_name,\n", "        None,\n",
             (T + "test_mlm.py::-k dataset_name_and_config",), "--dataset_config_name ignored"),
    Mutation(P + "tasks/mlm/pretrain.py", "compute_loss_func=global_mean_loss,", "compute_loss_func=None,",
             (T + "test_mlm.py::-k gradient_accumulation",), "MLM loss scaled by accumulation (Trainer's default)"),
    Mutation(P + "tasks/common/data.py", "return train.select(range(count, len(train))), train.select(range(count))",
             "return train, train.select(range(count))", (T + "test_mlm.py::-k carved",),
             "carved validation rows left in the training set"),
    Mutation(P + "tasks/common/data.py", "truncation=True, max_length=max_length, return_special_tokens_mask=True",
             "truncation=True, max_length=max_length - 1, return_special_tokens_mask=True",
             (T + "test_mlm.py::-k line_by_line",), "lines truncated one token short"),
    Mutation(P + "tasks/common/masking.py", "example_seed(self.seed, self.epoch, int(index))",
             "example_seed(self.seed, self.epoch, 0)", (T + "test_mlm.py::-k masks_are_a_function",),
             "every example masked alike"),
    Mutation(P + "tasks/common/masking.py", "example_seed(self.seed, self.epoch, int(index))",
             'example_seed(self.seed + int(__import__("os").environ.get("RANK", "0")), self.epoch, int(index))',
             (T + "test_mlm_multiprocess.py::-k two_processes",), "masks differ between processes", slow=True),
    Mutation(P + "tasks/common/masking.py", "self.dataset.set_epoch(int(state.epoch or 0))", "self.dataset.set_epoch(0)",
             (T + "test_mlm.py::-k epoch_callback",), "the same masks every epoch"),
    Mutation(P + "tasks/common/loss.py", "    return total / num_items_in_batch", "    return total / count",
             (T + "test_glue_tasks.py::-k gradient_accumulation",), "loss divided by the micro-batch's own count"),
    # ---- GLUE --------------------------------------------------------------------------------------
    Mutation(P + "tasks/glue.py", '("entailment", "neutral", "contradiction"), "accuracy", True',
             '("entailment", "contradiction", "neutral"), "accuracy", True',
             (T + "test_glue_tasks.py::-k canonical",), "MNLI label order not the Hub's"),
    Mutation(P + "tasks/glue.py", '("not_duplicate", "duplicate")', '("duplicate", "not_duplicate")',
             (T + "test_glue_tasks.py::-k canonical",), "QQP label order not the Hub's"),
    Mutation(P + "tasks/glue.py", '("question", "sentence"), ("entailment", "not_entailment")',
             '("sentence", "question"), ("entailment", "not_entailment")', (T + "test_glue_tasks.py::-k canonical",),
             "QNLI's columns swapped"),
    Mutation(P + "tasks/glue.py", 'if str(getattr(train.features["label"], "dtype", "")).startswith("float"):',
             'if getattr(train.features["label"], "dtype", None) == "float32":',
             (T + "test_glue_tasks.py::-k labels_type or csv_file",), "float64 labels read as classes"),
    Mutation(P + "tasks/glue.py", 'metric = task.metric if task else ("mse" if regression else "accuracy")',
             'metric = task.metric if task else "accuracy"', (T + "test_glue_tasks.py::-k csv_file",),
             "regression without a task scored as classes"),
    Mutation(P + "tasks/glue.py", "compute_loss_func=global_mean_loss,", "compute_loss_func=None,",
             (T + "test_glue_tasks.py::-k gradient_accumulation",), "fine-tuning loss scaled by accumulation"),
    Mutation(P + "tasks/glue.py", "        collator = default_data_collator\n",
             "        collator = DataCollatorWithPadding(tokenizer)\n", (T + "test_glue_tasks.py::-k lengths_padding",),
             "--pad_to_max_length ignored"),
    Mutation(P + "tasks/glue.py", "padding=padding, max_length=max_length, truncation=True",
             "padding=padding, max_length=128, truncation=True", (T + "test_glue_tasks.py::-k lengths_padding",),
             "--max_seq_length ignored"),
    Mutation(P + "tasks/glue.py", "rows = first_rows(tokenized[split], data_args.max_predict_samples)",
             "rows = tokenized[split]", (T + "test_glue_tasks.py::-k gradient_accumulation",),
             "--max_predict_samples ignored"),
    Mutation(P + "tasks/common/metrics.py", '"f1": lambda: f1_score(labels, predictions),',
             '"f1": lambda: f1_score(labels, predictions, average="macro"),',
             (T + "test_glue.py::-k scores_equal",), "F1 averaged over both classes"),
    Mutation(P + "tasks/common/metrics.py", '"mse": lambda: mean_squared_error(labels, predictions),',
             '"mse": lambda: mean_squared_error(labels, predictions) ** 0.5,',
             (T + "test_glue_tasks.py::-k accuracy_mse",), "mse reported as its root"),
    Mutation(P + "tasks/common/metrics.py", "return logits[:, 0] if self.regression else logits.argmax(axis=-1)",
             "return logits.argmax(axis=-1)", (T + "test_glue_tasks.py::-k accuracy_mse",),
             "regression outputs read as classes"),
    Mutation(P + "tasks/common/metrics.py", "counted = labels != IGNORE_INDEX", "counted = labels == labels",
             (T + "test_mlm.py::-k masked_token_accuracy",), "accuracy counted over unmasked tokens"),
    # ---- WikiHop -------------------------------------------------------------------------------------
    Mutation(P + "tasks/wikihop/data.py", "for part in slices[: self.max_chunks]]", "for part in slices[:1]]",
             (T + "test_wikihop.py::-k long_examples_are_cut or summed",), "documents truncated, not chunked"),
    Mutation(P + "tasks/wikihop/data.py", "for part in slices[: self.max_chunks]]", "for part in slices]",
             (T + "test_wikihop.py::-k long_examples_are_cut or length_chunk",), "--max_chunks ignored"),
    Mutation(P + "tasks/wikihop/finetune.py", "ChunkEncoder(tokenizer, max_length, data_args.max_chunks)",
             "ChunkEncoder(tokenizer, max_length)", (T + "test_wikihop.py::-k length_chunk",),
             "--max_chunks not passed on"),
    Mutation(P + "tasks/wikihop/finetune.py", "max_length if data_args.pad_to_max_length else None",
             "None", (T + "test_wikihop.py::-k length_chunk",), "--pad_to_max_length ignored"),
    Mutation(P + "tasks/wikihop/heads.py", ".index_add(0, example_of_chunk, chunk_scores)",
             '.index_reduce(0, example_of_chunk, chunk_scores, "amax", include_self=False)',
             (T + "test_wikihop.py::-k summed",), "chunk scores maxed, not summed"),
    # ---- conversion to long positions ------------------------------------------------------------------
    Mutation(P + "integration/positions.py", '{"roberta", "xlm-roberta", "camembert", "longformer"}',
             '{"roberta", "xlm-roberta", "longformer"}', (T + "test_convert.py::-k offset_rows",),
             "CamemBERT's padding offset forgotten"),
    Mutation(P + "integration/positions.py", "new.weight[:offset] = old.weight[:offset]", "new.weight[:offset] = 0",
             (T + "test_convert.py::-k offset_rows",), "the leading rows lost"),
    Mutation(P + "integration/positions.py", "new.weight[offset:] = old.weight[offset:].repeat(repeats, 1)[:max_length]",
             "new.weight[offset:] = old.weight.repeat(repeats, 1)[:max_length]",
             (T + "test_convert.py::-k offset_rows",), "the leading rows copied with the positions"),
    Mutation(P + "tasks/convert.py", "tokenizer.model_max_length = max_tokens(model.config)",
             "tokenizer.model_max_length = model.config.max_position_embeddings",
             (T + "test_convert.py::-k offset_rows",), "the tokenizer allows the offset rows as tokens"),
    # ---- model card and export ---------------------------------------------------------------------------
    Mutation(P + "hub/card.py", 'results=[(metric, split, f"{value:.4g}") for split, metric, value in metrics],',
             'results=[(split, metric, f"{value:.4g}") for split, metric, value in metrics],',
             (T + "test_hub_card.py::-k without_the_hub",), "results table columns swapped"),
    Mutation(P + "hub/card.py", "num_layers=config.num_hidden_layers,", "num_layers=config.num_attention_heads,",
             (T + "test_hub_card.py::-k without_the_hub",), "wrong layer count in the card"),
    Mutation(P + "hub/card.py", "            dataset_split=split,\n", '            dataset_split="validation",\n',
             (T + "test_hub_card.py::-k without_the_hub",), "every model-index result called validation"),
    Mutation(P + "hub/card.py", "metric_value=value,", "metric_value=round(value, 2),",
             (T + "test_hub_card.py::-k without_the_hub",), "model-index values rounded"),
    Mutation(P + "hub/card.py", "        last = train_logs[-1]\n", "        last = train_logs[0]\n",
             (T + "test_hub_card.py::-k without_the_hub",), "the first logged loss called the last"),
    Mutation(P + "hub/card.py", "tags=[PACKAGE, \"efficient-attention\", config.attn_impl, config.model_type],",
             "tags=[PACKAGE, \"efficient-attention\", config.model_type],",
             (T + "test_hub_card.py::-k without_the_hub",), "the method missing from the tags"),
    Mutation(P + "hub/export.py", "    config.auto_map = write_remote_code(model, folder)\n",
             "    write_remote_code(model, folder)\n", (T + "test_hub_folder.py::-k config_weights",),
             "config.json without auto_map (remote code unreachable)"),
    Mutation(P + "tasks/common/driver.py", "args.per_device_train_batch_size * args.gradient_accumulation_steps * "
             "args.world_size", "args.per_device_train_batch_size * args.world_size",
             (T + "test_provenance.py::-k global_batch",), "accumulation left out of the recorded batch size"),
    # ---- methods and the benchmark on CUDA ---------------------------------------------------------------
    Mutation(P + "methods/base.py", 'target = torch.device("cpu") if target.type == "meta" else target',
             "target = target", (T + "test_methods_draws.py::-k follow_the_device",),
             "seeded draws of a method built on the meta device left on meta"),
    Mutation(P + "tools/benchmark/processes.py", 'return device == "cuda" and kind in ("attention", "model")',
             'return device == "cuda"', (T + "test_benchmark.py::-k measured_in_this_process",),
             "CUDA compile jobs share one process (and Inductor's caches)"),
    Mutation(P + "tools/benchmark/processes.py", "except RuntimeError as error:\n                failed.add(i)\n                results",
             "except ValueError as error:\n                failed.add(i)\n                results",
             (T + "test_benchmark.py::-k failed_timing_job",), "one failed compile job ends the whole benchmark"),
    # ---- the public API's side effects and error branches -------------------------------------------------
    Mutation(P + "integration/auto.py", "            config = copy.deepcopy(config)  # as Transformers' from_pretrained",
             "            pass  # as Transformers' from_pretrained", (T + "test_no_side_effects.py::-k leave_the_config",),
             "from_pretrained(config=...) writes the method into the caller's config"),
    Mutation(P + "integration/auto.py", "            config = copy.deepcopy(config)  # as Transformers' from_config",
             "            pass  # as Transformers' from_config", (T + "test_no_side_effects.py::-k leave_the_config",),
             "from_config writes the method into the caller's config"),
    Mutation(P + "utils/cli_errors.py", "USER_ERRORS = (ValueError, OSError, ModuleNotFoundError)",
             "USER_ERRORS = (ValueError, ModuleNotFoundError)", (T + "test_cli_errors.py::-k user_error_type",),
             "a model id that cannot be found shows a traceback"),
    # ---- packed rows (padding-free batches) ------------------------------------------------------------------
    Mutation(P + "integration/bridge.py", 'segments = packed_segments(kwargs, key_padding_mask, batch, seq_len)',
             'segments = None', (T + 'test_packing.py::-k roberta-mra2 or form',),
             'packed rows mix'),
    Mutation(P + "integration/packing.py", 'shifted = position_ids + offset * (start_value == 0)',
             'shifted = position_ids', (T + 'test_packing.py::-k offset_positions',),
             '0-based packed positions of RoBERTa kept'),
    Mutation(P + "integration/packing.py", 'flat[cu_seq_lens[:-1].long()] = True',
             'flat[0] = True', (T + 'test_packing.py::-k keywords',),
             'cu_seq_lens_q ignored'),
    Mutation(P + "integration/packing.py", 'runs = kwargs.get("seq_idx")',
             'runs = None', (T + 'test_packing.py::-k keywords',),
             'seq_idx ignored'),
    Mutation(P + "integration/packing.py", 'bad = start_value[real & (~allowed | (shifted < offset))]',
             'bad = start_value[:0]', (T + 'test_packing.py::-k offset_positions',),
             'a wrong position start accepted'),
    Mutation(P + "integration/patching.py", '            if packing:\n',
             '            if False:\n', (T + 'test_packing.py::-k longformer',),
             'Longformer mixes packed rows'),
    Mutation(P + "integration/packing.py", 'real_tokens = torch.ones_like(flat) if key_padding_mask is None else key_padding_mask.flatten()',
             'real_tokens = torch.ones_like(flat)', (T + 'test_packing.py::-k several_padded',),
             'padding inside packed rows attended'),
    Mutation(P + "integration/bridge.py", 'raise ValueError("output_attentions=True is not supported for packed rows',
             'print("', (T + 'test_packing.py::-k output_attentions',),
             'packed output_attentions silently None'),
    Mutation(P + "tasks/mlm/pretrain.py", '        if padding_free\n',
             '        if False\n', (T + 'test_packing.py::-k padding_free_mlm',),
             '--padding_free ignored'),
    Mutation(P + "tasks/mlm/pretrain.py", '    if padding_free and attn_impl is None:',
             '    if False:', (T + 'test_packing.py::-k needs_an_attention',),
             "--padding_free with Transformers' attention mixes sequences"),
    Mutation(P + "integration/packing.py", '        starts = starts & key_padding_mask\n',
             '', (T + 'test_packing.py::-k padding_never',),
             'each padded token its own sequence'),
    Mutation(P + "integration/packing.py", 'int(kwargs["max_length_q"])',
             'int(kwargs["max_length_q"]) + 1', (T + 'test_packing.py::-k draws_as',),
             "training draws of a packed row differ from a padded batch's"),
    Mutation(P + "tools/benchmark/cli.py", 'seq_lens = [max(args.seq_lens)] if args.mixed_lengths else args.seq_lens',
             'seq_lens = args.seq_lens', (T + 'test_packing.py::-k mixed_lengths_flag',),
             '--mixed_lengths measured at every --seq_lens instead of truncating at the longest'),
    Mutation(P + "tools/benchmark/report.py", 'speedup = _median_ratio(rounds, f"padded_{call}_s", rounds, f"packed_{call}_s")',
             'speedup = _median_ratio(rounds, f"packed_{call}_s", rounds, f"padded_{call}_s")', (T + 'test_packing.py::-k table_arithmetic',),
             'packed speed-up computed the wrong way round'),
    Mutation(P + "tools/benchmark/cli.py", '[MODEL_REFERENCE] if whole_model and not self.mixed_lengths else []',
             '[MODEL_REFERENCE] if whole_model else []', (T + 'test_packing.py::-k mixed_lengths_flag',),
             '--mixed_lengths accepts SDPA, which mixes packed sequences'),
    Mutation(P + "tools/benchmark/steps.py", 'labels[0] = -100  # the collator',
             'labels[0] = labels[0]  # the collator', (T + 'test_packing.py::-k hold_the_same',),
             'padded and packed batches label different tokens'),
    # ---- YOSO's hash bits -------------------------------------------------------------------------------------
    Mutation(P + "methods/yoso.py", "HASH_DTYPE = torch.float64", "HASH_DTYPE = torch.float32",
             (T + "test_yoso.py::-k signs_of_the_exact_projections",), "hash bits decided by fp32 rounding"),
]


def copy_repository(destination: str) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        source = os.path.join(REPO, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(destination, name), ignore=ignore)
        elif os.path.exists(source):
            shutil.copy2(source, os.path.join(destination, name))


def apply(root: str, mutation: Mutation) -> None:
    path = os.path.join(root, mutation.path)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    count = source.count(mutation.original)
    if count != 1:
        raise SystemExit(f"{mutation.path}: {mutation.original!r} occurs {count} times (needs exactly one)")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source.replace(mutation.original, mutation.replacement))


def pytest_arguments(tests: tuple[str, ...]) -> list[str]:
    """``file::-k expr`` -> ``file -k expr``; node ids stay as they are."""
    arguments = []
    for test in tests:
        path, _, selector = test.partition("::-k ")
        arguments += [path, "-k", selector] if selector else [test]
    return arguments


def run_tests(root: str, tests: tuple[str, ...], timeout: int) -> tuple[str, float]:
    """``passed``, ``failed``, ``timeout`` or ``error`` (nothing collected, bad usage) and the seconds."""
    env = {**os.environ, "PYTHONPATH": root, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *pytest_arguments(tests)]
    start = time.monotonic()
    try:
        result = subprocess.run(
            command, check=False, cwd=root, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start
    status = {0: "passed", 1: "failed"}.get(result.returncode, "error")
    if status == "error":
        print(result.stdout[-2000:], result.stderr[-2000:], sep="\n")
    return status, time.monotonic() - start


@dataclass
class MutationCheckArguments:
    only: str | None = field(default=None, metadata={"help": "Only the mutations of files whose path contains this."})
    slow: bool = field(default=False, metadata={"help": "Include mutations that only the slow tier catches."})
    list: bool = field(default=False, metadata={"help": "List the mutations and exit."})
    no_baseline: bool = field(default=False, metadata={"help": "Skip running the tests on the unmutated tree."})
    timeout: int = field(default=1200, metadata={"help": "Seconds per test run."})


def main(argv: list[str] | None = None) -> int:
    from hf_efficient_attn.tasks.common.args import check_positive_flags, parse_arguments

    (args,) = parse_arguments([MutationCheckArguments], argv, description=__doc__)
    check_positive_flags(args, "timeout")
    chosen = [m for m in MUTATIONS if (args.slow or not m.slow) and (args.only is None or args.only in m.path)]
    if args.list:
        for m in chosen:
            print(f"{m.path}: {m.bug}  [{' '.join(m.tests)}]{'  (slow)' if m.slow else ''}")
        return 0
    survived = []
    with tempfile.TemporaryDirectory(prefix="mutation-") as scratch:
        if not args.no_baseline:  # the tests must pass before a failure can mean anything
            baseline = os.path.join(scratch, "baseline")
            copy_repository(baseline)
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            status, seconds = run_tests(baseline, tests, args.timeout * 2)
            print(f"baseline (unmutated): {status} ({seconds:.0f} s)", flush=True)
            if status != "passed":
                return 1
        for number, mutation in enumerate(chosen):
            root = os.path.join(scratch, f"m{number}")
            copy_repository(root)
            apply(root, mutation)
            status, seconds = run_tests(root, mutation.tests, args.timeout)
            caught = status in ("failed", "timeout")
            print(f"{'caught  ' if caught else 'SURVIVED'} {mutation.path}: {mutation.bug} ({status}, {seconds:.0f} s)",
                  flush=True)  # fmt: skip
            if not caught:
                survived.append(mutation)
            shutil.rmtree(root)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations caught")
    return 1 if survived else 0


if __name__ == "__main__":
    from hf_efficient_attn.utils.cli_errors import run_cli

    sys.exit(run_cli(main))
