"""Tiny variants shared as dry-run upload folders, for the hub tests (issue 9).

:func:`build_variants` exports tiny BERT / RoBERTa variants (patched, converted from a plain
checkpoint, Linformer trained by a real Trainer run, a 4096-token one), every method and every
architecture, and loads them all with ``transformers.AutoModel*(..., trust_remote_code=True)`` in
one fresh process where ``import hf_efficient_attn`` raises ImportError; conftest.py builds them once
per test session (fixture ``hub_variants``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import paths
import torch
import transformers as T

import hf_efficient_attn as hea
from hf_efficient_attn.hub import cli, export_variant, push_variant

REPO = paths.REPO
BERT_BASE, ROBERTA_BASE = "google-bert/bert-base-uncased", "FacebookAI/roberta-base"
BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a of to and in is was for on with as by at it an be this that from he she they we you not but or"
).split()
ROBERTA_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] + list("abcdefghijklmnopqrstuvwxyz") + ["Ġ", "Ġt", "he", "Ġthe"]
TEXT = "the cat was on the mat, and she was not"

#: Runs in a fresh process: the plugin cannot be imported there; each folder is loaded by plain
#: Transformers from its shipped code and its outputs are saved for the parent to compare.
PLUGIN_FREE_LOADER = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_efficient_attn"] = None  # `import hf_efficient_attn` now raises ImportError
    try:
        import hf_efficient_attn
    except ImportError as err:
        print("hf_efficient_attn: ImportError raised:", err)
    else:
        raise SystemExit("hf_efficient_attn is importable")
    import torch, transformers
    for job in json.load(open(sys.argv[1])):
        inputs = torch.load(job["inputs"])
        model = getattr(transformers, job["auto_class"]).from_pretrained(job["folder"], trust_remote_code=True).eval()
        with torch.no_grad():
            result = model(**inputs, output_hidden_states=True)
        attn = model.config._attn_implementation
        info = {"class": type(model).__name__, "module": type(model).__module__, "attn": attn}
        torch.save({"output": result[0], "hidden": result.hidden_states[-1], **info}, job["output"])
    print("plugin modules:", sorted(m for m in sys.modules if m.startswith("hf_efficient_attn") and sys.modules[m]))
    """
)


def bert_tokenizer() -> T.PreTrainedTokenizerBase:
    return T.BertTokenizer(vocab={w: i for i, w in enumerate(BERT_WORDS)})


def roberta_tokenizer() -> T.PreTrainedTokenizerBase:
    return T.RobertaTokenizer(vocab={t: i for i, t in enumerate(ROBERTA_TOKENS)}, merges=[("Ġ", "t"), ("h", "e"), ("Ġt", "he")])


BERT_VOCAB_TYPES = ("bert", "electra")  # WordPiece; the others take the byte-level BPE tokenizer


def tokenizer_for(model_type: str) -> T.PreTrainedTokenizerBase:
    return bert_tokenizer() if model_type in BERT_VOCAB_TYPES else roberta_tokenizer()


def tiny_config(model_type: str, **overrides) -> T.PretrainedConfig:
    vocab = len(BERT_WORDS) if model_type in BERT_VOCAB_TYPES else len(ROBERTA_TOKENS)
    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    common["max_position_embeddings"] = 128 if model_type in BERT_VOCAB_TYPES else 130
    if model_type == "longformer":
        common.update(attention_window=[128, 128], max_position_embeddings=132, pad_token_id=1)
    return T.AutoConfig.for_model(model_type, **{**common, **overrides})


def padded_batch(config: T.PretrainedConfig, length: int, real: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, real:] = 0
    ids[1, real:] = config.pad_token_id
    return {"input_ids": ids, "attention_mask": mask}


def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's first output (logits / last hidden state) and its last hidden state, in eval mode."""
    with torch.no_grad():
        result = model.eval()(**inputs, output_hidden_states=True)
    return result[0], result.hidden_states[-1]


def train_linformer_classifier(run_dir: Path) -> None:
    """A real Trainer run: trainer_state.json, eval_results.json and the model in ``run_dir``."""
    torch.manual_seed(0)
    model = hea.AutoModelForSequenceClassification.from_config(
        tiny_config("bert", num_labels=2), attn_impl="linformer", attn_config={"k": 16}
    )
    inputs = padded_batch(model.config, 32, 20)
    rows = {k: v.repeat(4, 1).tolist() for k, v in inputs.items()}
    data = datasets.Dataset.from_dict({**rows, "labels": [0, 1] * 4})
    args = T.TrainingArguments(
        output_dir=str(run_dir),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=3,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
    )

    def accuracy(prediction):
        return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}

    trainer = T.Trainer(model=model, args=args, train_dataset=data, eval_dataset=data, compute_metrics=accuracy)
    trainer.train()
    trainer.save_metrics("eval", trainer.evaluate())
    trainer.save_state()
    trainer.save_model()
    bert_tokenizer().save_pretrained(run_dir)


def load_without_plugin(jobs: dict[str, tuple[Path, str, dict]], tmp: Path) -> dict[str, dict]:
    """Run PLUGIN_FREE_LOADER on ``{key: (folder, auto class, inputs)}`` in one fresh process
    (its own Transformers module cache); returns what it saw per key."""
    manifest = []
    for key, (folder, auto_class, inputs) in jobs.items():
        torch.save(inputs, tmp / f"{key}.inputs.pt")
        manifest.append(
            {
                "folder": str(folder),
                "auto_class": auto_class,
                "inputs": str(tmp / f"{key}.inputs.pt"),
                "output": str(tmp / f"{key}.remote.pt"),
            }
        )
    (tmp / "jobs.json").write_text(json.dumps(manifest))
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_MODULES_CACHE": str(tmp / "modules")}
    run = subprocess.run(
        [sys.executable, "-c", PLUGIN_FREE_LOADER, str(tmp / "jobs.json")],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "hf_efficient_attn: ImportError raised" in run.stdout and "plugin modules: []" in run.stdout, run.stdout
    return {key: torch.load(tmp / f"{key}.remote.pt") for key in jobs}


@dataclass
class Shared:
    """One dry-run upload folder, the model it must reproduce, and what the fresh process saw."""

    folder: Path
    author: torch.nn.Module
    auto_class: str
    inputs: dict[str, torch.Tensor]
    remote: dict | None = None

    def __post_init__(self) -> None:
        self.expected = forward(self.author, self.inputs)


ARCHITECTURES = ["roberta", "xlm-roberta", "electra", "camembert", "longformer"]
#: Small budgets, so that every method approximates on tiny inputs.
SMALL_BUDGETS = {"k": 16, "num_features": 16, "num_samples": 8, "num_landmarks": 8, "block_size": 8, "block_per_row": 1}


def small_options(name: str, **extra) -> dict:
    """The options of ``SMALL_BUDGETS`` (and ``extra``) that method ``name`` has."""
    return {o: v for o, v in {**SMALL_BUDGETS, **extra}.items() if o in hea.method_options(name)}


CASES = ["bert-mra2-patched", "roberta-performer-converted", "bert-linformer-trained", "roberta-mra2-4096"]


def build_variants(tmp: Path) -> dict[str, Shared]:
    """The four cases of issue 9 (keys ``CASES``), every method on a tiny BERT (``method-NAME``) and
    every other architecture (``arch-TYPE``) exported to dry-run upload folders under ``tmp``, and
    all of them loaded in one fresh process without the plugin."""
    made: dict[str, Shared] = {}
    licence = dict(license="apache-2.0")

    torch.manual_seed(0)  # a patched tiny BERT, fill-mask head; 1 of 8 key blocks per query block
    model = hea.patch_model(T.BertForMaskedLM(tiny_config("bert")), "mra2", {"block_size": 8, "block_per_row": 1})
    model.save_pretrained(tmp / "bert-src")
    bert_tokenizer().save_pretrained(tmp / "bert-src")
    folder = push_variant(str(tmp / "bert-src"), "someone", base_model=BERT_BASE, dry_run=tmp / CASES[0], **licence)
    made[CASES[0]] = Shared(Path(folder), model, "AutoModelForMaskedLM", padded_batch(model.config, 64, 45))

    torch.manual_seed(0)  # a plain tiny RoBERTa checkpoint converted by --attn_impl / --attn_config
    T.RobertaForSequenceClassification(tiny_config("roberta", num_labels=3)).save_pretrained(tmp / "roberta-src")
    roberta_tokenizer().save_pretrained(tmp / "roberta-src")
    options = {"num_features": 16}
    folder = push_variant(
        str(tmp / "roberta-src"),
        "someone/roberta-performer",
        attn_impl="performer",
        attn_config=options,
        base_model=ROBERTA_BASE,
        dry_run=tmp / CASES[1],
        license="mit",
    )
    author = hea.AutoModelForSequenceClassification.from_pretrained(
        tmp / "roberta-src", attn_impl="performer", attn_config=options
    )
    made[CASES[1]] = Shared(Path(folder), author, "AutoModelForSequenceClassification", padded_batch(author.config, 40, 27))

    run_dir = tmp / "linformer-run"  # Linformer's learnable projections, trained; through the CLI
    train_linformer_classifier(run_dir)
    cli.main(
        f"--model_dir {run_dir} --repo_id someone --base_model {BERT_BASE} --license apache-2.0 --dataset_name glue "
        f"--results_file {run_dir / 'eval_results.json'} --dataset_config_name sst2 --dry_run {tmp / CASES[2]}".split()
    )
    author = hea.AutoModelForSequenceClassification.from_pretrained(run_dir)
    made[CASES[2]] = Shared(tmp / CASES[2], author, "AutoModelForSequenceClassification", padded_batch(author.config, 32, 20))

    torch.manual_seed(0)  # RoBERTa stretched to 4096 tokens (extend first, then patch), gather backend
    model = hea.extend_position_embeddings(T.RobertaForMaskedLM(tiny_config("roberta")), max_length=4096)
    hea.patch_model(model, "mra2", {"backend": "gather"})
    model.save_pretrained(tmp / "long-src")
    roberta_tokenizer().save_pretrained(tmp / "long-src")
    folder = push_variant(str(tmp / "long-src"), "someone", base_model=ROBERTA_BASE, dry_run=tmp / CASES[3], **licence)
    made[CASES[3]] = Shared(Path(folder), model, "AutoModelForMaskedLM", padded_batch(model.config, 4096, 3000))

    for name in hea.list_methods():  # every method, small budgets so that they approximate
        torch.manual_seed(0)
        config = tiny_config("bert")
        options = small_options(name)
        model = hea.patch_model(T.BertModel(config), name, options)
        folder = export_variant(
            model, bert_tokenizer(), tmp / f"method-{name}", repo_id=f"someone/{name}", base_model=BERT_BASE, **licence
        )
        made[f"method-{name}"] = Shared(folder, model, "AutoModel", padded_batch(config, 64, 45))

    for model_type in ARCHITECTURES:  # every supported architecture, BERT excepted (above)
        torch.manual_seed(0)
        model = hea.patch_model(T.AutoModel.from_config(tiny_config(model_type)), "mra2", {"block_size": 8, "block_per_row": 1})
        folder = export_variant(
            model,
            tokenizer_for(model_type),
            tmp / f"arch-{model_type}",
            repo_id="someone/x",
            base_model=ROBERTA_BASE,
            **licence,
        )
        made[f"arch-{model_type}"] = Shared(folder, model, "AutoModel", padded_batch(model.config, 64, 45))

    jobs = {key: (case.folder, case.auto_class, case.inputs) for key, case in made.items()}
    jobs["base-of-mlm"] = (made[CASES[0]].folder, "AutoModel", made[CASES[0]].inputs)
    remote = load_without_plugin(jobs, tmp)
    for key, case in made.items():
        case.remote = remote[key]
    made["base-of-mlm"] = Shared(
        made[CASES[0]].folder,
        made[CASES[0]].author.base_model,
        "AutoModel",
        made[CASES[0]].inputs,
        remote["base-of-mlm"],
    )
    return made
