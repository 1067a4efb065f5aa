"""Every method but MRA traces, compiles and exports: a patched 1-layer BERT (and RoBERTa, with one
method) on a padded batch compiles in one graph (``fullgraph``: any graph break fails) in eval and training mode, the
compiled eval forward equals eager, so do the training gradients of methods without training-time
draws, and the ONNX export (dynamic batch and length) run by ONNX Runtime equals eager at the
export length and another. The default tier runs BERT in eval mode and the training steps of the
methods with their own autograd Function; the rest (RoBERTa, other training steps, ONNX, Inductor)
is slow: each case traces a whole model, a few seconds each."""

from pathlib import Path

import pytest
import torch
from compile_fixtures import (
    compiled,
    gradients,
    last_hidden,
    onnx_round_trip,
    padded_batch,
    tiny_model,
)

import hf_efficient_attn as hea
from hf_efficient_attn.integration.bridge import method_modules

METHODS = [name for name in hea.list_methods() if not name.startswith("mra")]
#: Methods that draw fresh randomness at every training forward (eval mode uses fixed draws).
TRAINING_DRAWS = {"yoso", "skyformer", "skeinformer", "informer"}
#: The method also run in RoBERTa (its own position ids from the padding), slow: every method's
#: module is the same inside either encoder (integration/bridge.py), so BERT runs them all.
ROBERTA_METHOD = "linformer"
#: Training steps in the default tier: the methods with their own autograd Function (their backward
#: is traced too); the other methods' training steps are slow tests.
DEFAULT_TRAINING = {"yoso", "yoso_e"}


def method_archs(slow: set[str] = frozenset()) -> list:
    """(method, arch) cases: every method in BERT (slow for those in ``slow``), ``ROBERTA_METHOD`` in
    RoBERTa too (slow)."""
    cases = []
    for method in METHODS:
        cases.append(pytest.param(method, "bert", marks=[pytest.mark.slow] if method in slow else []))
        if method == ROBERTA_METHOD:
            cases.append(pytest.param(method, "roberta", marks=pytest.mark.slow))
    return cases


@pytest.mark.parametrize("method, arch", method_archs())
def test_eval_compiles_in_one_graph_and_equals_eager(method, arch):
    model = tiny_model(method, arch)
    ids, mask = padded_batch(64)
    with torch.no_grad():
        want = last_hidden(model, ids, mask)
        torch.testing.assert_close(last_hidden(compiled(model), ids, mask), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method, arch", method_archs(slow=set(METHODS) - DEFAULT_TRAINING))
def test_training_step_compiles_in_one_graph(method, arch):
    """Gradients equal eager where training is deterministic; where it samples, the compiled
    model draws afresh at every call (draws baked into the graph would repeat) and its gradients
    are finite."""
    model = tiny_model(method, arch, train=True)
    ids, mask = padded_batch(64)
    compiled_model = compiled(model)
    got = gradients(model, compiled_model, ids, mask)
    if method in TRAINING_DRAWS:
        first, second = (last_hidden(compiled_model, ids, mask).detach() for _ in range(2))
        assert not torch.equal(first, second)
        assert all(torch.isfinite(grad).all() for grad in got.values())
    else:
        want = gradients(model, model, ids, mask)
        for name in want:
            torch.testing.assert_close(got[name], want[name], atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("method", METHODS)
def test_eval_output_is_the_same_after_save_and_reload(method, tmp_path):
    """Eval draws are non-persistent buffers: the checkpoint holds none of them, and a reload
    (where Transformers leaves such buffers uninitialised) draws the same ones."""
    model = tiny_model(method)
    ids, mask = padded_batch(64)
    model.save_pretrained(tmp_path)
    reloaded = hea.AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(last_hidden(reloaded, ids, mask), last_hidden(model, ids, mask), atol=0, rtol=0)
    draws = {key for m in method_modules(model) for key, _ in m.named_buffers()}
    assert not draws & {key.rsplit(".", 1)[-1] for key in model.state_dict()}


@pytest.mark.slow
@pytest.mark.parametrize("method, arch", method_archs())
def test_onnx_runtime_equals_eager_at_two_lengths(method, arch, tmp_path):
    model = tiny_model(method, arch)
    other = [t[:2] for t in padded_batch(96, seed=1)]  # another batch size and length
    differences = onnx_round_trip(model, [padded_batch(64), other], Path(tmp_path) / "model.onnx")
    assert max(differences) < 1e-4, differences


@pytest.mark.slow
@pytest.mark.parametrize("method", ["yoso", "informer"])
def test_inductor_eval_and_training_step(method):
    """Generated kernels (Inductor): YOSO (sorts, scatter-adds, a custom op in the backward) and
    Informer (top-k, a bound on symbolic sizes)."""
    model = tiny_model(method)
    ids, mask = padded_batch(64)
    with torch.no_grad():
        want = last_hidden(model, ids, mask)
        torch.testing.assert_close(last_hidden(compiled(model, "inductor"), ids, mask), want, atol=1e-4, rtol=1e-4)
    model.train()
    assert all(torch.isfinite(g).all() for g in gradients(model, compiled(model, "inductor"), ids, mask).values())
