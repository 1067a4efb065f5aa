"""A sentence-transformers model stays one when stretched (convert_to_long), trained on (pretrain_mlm)
and exported for the Hub (push_to_hub): the pipeline of all-MiniLM-L6-v2 (Transformer -> mean Pooling
-> Normalize) is carried with the new max_seq_length (tasks/common/sentence_pipeline.py)."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file
from test_mlm import run as run_mlm
from test_mlm import workspace  # noqa: F401  (the MLM tests' fixture)
from tiny import KINDS, default_tier
from training_fixtures import small_tokenizer, tiny_config
from transformers import AutoModel, AutoTokenizer

import hf_efficient_attn as hea
from hf_efficient_attn.hub import push_variant
from hf_efficient_attn.integration.bridge import method_modules
from hf_efficient_attn.tasks.common.sentence_pipeline import copy_pipeline
from hf_efficient_attn.tasks.convert import convert_to_long
from hf_efficient_attn.tools.minilm import minilm_path

sentence_transformers = pytest.importorskip("sentence_transformers")

SHORT = ["The cat sat on the mat.", "Long documents need long models.", "Gensim ships real Wikipedia text."]


def encoder(folder):
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def stretched(tmp_path_factory):
    """all-MiniLM-L6-v2 stretched to 1024 tokens with exact attention and with mra2."""
    root = tmp_path_factory.mktemp("stretched")
    for method in ("softmax", "mra2"):
        convert_to_long(minilm_path(), 1024, method, output_dir=str(root / method))
    return root


def test_stretching_keeps_the_pipeline_and_its_embeddings(stretched):
    """Below the original length, with exact attention, the stretched folder encodes as the original
    (mean pooling, then unit length); its max_seq_length is the new length."""
    model = encoder(stretched / "softmax")
    assert [type(module).__name__ for module in model] == ["Transformer", "Pooling", "Normalize"]
    assert model.max_seq_length == 1024
    ours, original = model.encode(SHORT, convert_to_tensor=True), encoder(minilm_path()).encode(SHORT, convert_to_tensor=True)
    torch.testing.assert_close(ours, original, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(SHORT)))


def test_a_hub_id_keeps_the_pipeline(tmp_path):
    """Stretching by Hub id (what a user types: the pipeline's files and module folders come through the
    Hub cache, here a local one read offline) keeps the pipeline and its embeddings, as from a folder."""
    repo_id = "sentence-transformers/all-MiniLM-L6-v2"
    cache = tmp_path / "cache"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    shutil.copytree(minilm_path(), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    convert_to_long(repo_id, 1024, "softmax", output_dir=str(tmp_path / "long"), cache_dir=str(cache))
    model = encoder(tmp_path / "long")
    assert [type(module).__name__ for module in model] == ["Transformer", "Pooling", "Normalize"]
    assert model.max_seq_length == 1024 and (tmp_path / "long" / "1_Pooling" / "config.json").is_file()
    torch.testing.assert_close(model.encode(SHORT, convert_to_tensor=True),
                               encoder(minilm_path()).encode(SHORT, convert_to_tensor=True), atol=1e-5, rtol=1e-5)  # fmt: skip


def test_prompts_and_similarity_are_kept(tmp_path):
    """A sentence encoder whose config_sentence_transformers.json names prompts, a default prompt and a
    similarity function (as retrieval models do) keeps them stretched: the same encoder settings, the
    same embeddings of a query below the original length with exact attention."""
    source = tmp_path / "source"
    source.mkdir()
    for name in os.listdir(minilm_path()):
        (source / name).symlink_to(minilm_path() / name)
    (source / "config_sentence_transformers.json").unlink()
    settings = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query",
                "similarity_fn_name": "dot"}  # fmt: skip
    (source / "config_sentence_transformers.json").write_text(json.dumps(settings))
    convert_to_long(str(source), 1024, "softmax", output_dir=str(tmp_path / "long"))
    ours, original = encoder(tmp_path / "long"), encoder(source)
    assert (ours.prompts, ours.default_prompt_name, ours.similarity_fn_name) == (
        original.prompts, "query", "dot")  # fmt: skip
    assert original.prompts["query"] == "query: "
    torch.testing.assert_close(ours.encode(SHORT, convert_to_tensor=True), original.encode(SHORT, convert_to_tensor=True),
                               atol=1e-5, rtol=1e-5)  # fmt: skip


def test_a_long_document_runs_the_method(stretched):
    """A document of about 500 tokens: the mra2 folder's encoder runs mra2 in every layer and gives a
    unit-length embedding that differs from exact attention's."""
    text = " ".join(["The history of the region is long and its documents are longer still."] * 35)
    model = encoder(stretched / "mra2")
    calls = []
    for method in method_modules(model[0].auto_model):
        method.register_forward_hook(lambda *args: calls.append(1))
    embedding = model.encode([text], convert_to_tensor=True)[0]
    assert len(model.tokenize([text])["input_ids"][0]) > 400 and len(calls) == 6
    exact = encoder(stretched / "softmax").encode([text], convert_to_tensor=True)[0]
    assert float(embedding.norm()) == pytest.approx(1.0, abs=1e-5)
    assert 0.5 < float(embedding @ exact) < 1 - 1e-4


def test_the_hub_upload_folder_keeps_the_pipeline(stretched, tmp_path):
    push_variant(str(stretched / "mra2"), "someone", base_model="sentence-transformers/all-MiniLM-L6-v2",
                 dry_run=str(tmp_path / "upload"))  # fmt: skip
    upload = tmp_path / "upload"
    assert {"modules.json", "sentence_bert_config.json", "1_Pooling"} <= set(os.listdir(upload))
    assert json.loads((upload / "sentence_bert_config.json").read_text())["max_seq_length"] == 1024
    torch.testing.assert_close(encoder(upload).encode(SHORT), encoder(stretched / "mra2").encode(SHORT))


def test_a_bare_encoder_keeps_its_pooler_through_the_export(tmp_path):
    """A sentence encoder saved as the bare encoder (``hea.AutoModel``: a BertModel, whose keys have no
    prefix: ``pooler.dense.weight``) keeps its pooler through the Hub export: sentence-transformers builds
    the encoder with it, holding the saved weights."""
    variant = tmp_path / "variant"
    hea.AutoModel.from_pretrained(str(minilm_path()), attn_impl="mra2").save_pretrained(variant)
    AutoTokenizer.from_pretrained(str(minilm_path())).save_pretrained(variant)
    copy_pipeline(str(minilm_path()), str(variant))
    push_variant(str(variant), "someone", base_model="sentence-transformers/all-MiniLM-L6-v2",
                 dry_run=str(tmp_path / "upload"))  # fmt: skip
    saved = load_file(tmp_path / "upload" / "model.safetensors")
    pooler = encoder(tmp_path / "upload")[0].auto_model.pooler
    assert pooler is not None
    torch.testing.assert_close(pooler.dense.weight.detach(), saved["pooler.dense.weight"], atol=0, rtol=0)


def test_continued_pretraining_keeps_the_pipeline(workspace, tmp_path):  # noqa: F811
    """pretrain_mlm.py trains the same encoder: a folder with a pipeline gives one to its output; the
    masked-LM output has no pooler, and the pipeline builds its encoder without one."""
    source = tmp_path / "source"
    source.mkdir()
    for name in os.listdir(workspace["model"]):
        os.symlink(os.path.join(workspace["model"], name), source / name)
    minilm = minilm_path()
    for name in ("modules.json", "sentence_bert_config.json"):
        (source / name).write_text(open(os.path.join(minilm, name)).read())
    (source / "1_Pooling").mkdir()
    pooling = json.loads(open(os.path.join(minilm, "1_Pooling", "config.json")).read())
    (source / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 32}))
    run_mlm({**workspace, "model": str(source)}, tmp_path / "out", "--do_train", "--max_steps", "1")
    settings = json.loads((tmp_path / "out" / "sentence_bert_config.json").read_text())
    assert settings["max_seq_length"] == 256 and settings["model_args"] == {"add_pooling_layer": False}
    model = encoder(tmp_path / "out")
    assert [type(module).__name__ for module in model] == ["Transformer", "Pooling", "Normalize"]
    assert model.encode(SHORT).shape == (3, 32)


def test_a_folder_without_a_pipeline_stays_without_one(workspace, tmp_path):  # noqa: F811
    *_, report = convert_to_long(workspace["model"], 256, "mra2", output_dir=str(tmp_path / "long"))
    assert report.sentence_pipeline is None and not (tmp_path / "long" / "modules.json").exists()
    assert not any("sentence-transformers" in line for line in report.lines())


#: The pooling of the retrieval models built on the architectures of issue 55: GTE's [CLS], the mean of
#: nomic-embed (NomicBERT), jina-embeddings-v3, ModernBERT-embed and the others.
POOLING = {"gte": "cls"}


@pytest.mark.parametrize("model_type", default_tier(*KINDS))
def test_a_retrieval_pipeline_of_every_architecture_survives_stretching(model_type, tmp_path):
    """A sentence encoder of each architecture of issue 55 as retrieval models ship one (its pooling, then
    unit length; query and document prompts, a default prompt), stretched with mra2: the same modules,
    pooling and prompts, the new max_seq_length, the same embeddings below the original length (where
    mra2 is exact), and the stretched encoder runs mra2."""
    from sentence_transformers.sentence_transformer import modules

    folder = tmp_path / "encoder"
    torch.manual_seed(0)
    AutoModel.from_config(tiny_config(model_type, max_positions=64)).save_pretrained(folder)
    small_tokenizer().save_pretrained(folder)
    pooling = POOLING.get(model_type, "mean")
    pipeline = [modules.Transformer(str(folder), max_seq_length=64), modules.Pooling(32, pooling_mode=pooling),
                modules.Normalize()]  # fmt: skip
    prompts = {"query": "search_query: ", "document": "search_document: "}
    sentence_transformers.SentenceTransformer(modules=pipeline, prompts=prompts, default_prompt_name="query",
                                              device="cpu").save(str(tmp_path / "short"))  # fmt: skip
    convert_to_long(str(tmp_path / "short"), 256, "mra2", output_dir=str(tmp_path / "long"))
    ours, original = encoder(tmp_path / "long"), encoder(tmp_path / "short")
    assert [type(module).__name__ for module in ours] == ["Transformer", "Pooling", "Normalize"]
    assert (ours.max_seq_length, ours.prompts, ours.default_prompt_name) == (256, prompts, "query")
    assert ours[1].get_config_dict() == original[1].get_config_dict()
    for prompt_name in prompts:
        torch.testing.assert_close(ours.encode(SHORT, prompt_name=prompt_name, convert_to_tensor=True),
                                   original.encode(SHORT, prompt_name=prompt_name, convert_to_tensor=True),
                                   atol=1e-5, rtol=1e-5)  # fmt: skip
    assert ours[0].auto_model.config.attn_impl == "mra2" and method_modules(ours[0].auto_model)
