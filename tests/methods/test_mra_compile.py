"""MRA-2 and MRA-2-s under torch.compile: a whole BERT/RoBERTa model traces in one graph (eval and
training), the compiled model equals eager (outputs and gradients), and new lengths share one
recompilation (dynamic shapes). Each case traces a model (seconds): the default tier traces each
encoder once in eval mode and MRA-2's training step with either backend; MRA-2-s (MRA-2 less one
term) and the other combinations are slow."""

import pytest
import torch
import torch._dynamo
from tiny import tiny_config
from torch._dynamo.testing import CompileCounterWithBackend  # PyTorch's own compile counter (no public one)

import hf_efficient_attn as hea
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.registry import MethodChoice, build_method

METHODS = ["mra2", "mra2_s"]
SEQ = 128  # 4 blocks of 32, 2 exact per row: an approximation, not exact attention


def tiny_model(name, arch="roberta", training=False, layers=2, backend="auto"):
    config = tiny_config(
        arch,
        hidden_size=64,
        num_attention_heads=2,
        num_hidden_layers=layers,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return hea.AutoModel.from_config(config, attn_impl=name, attn_config={"block_per_row": 2, "backend": backend}).train(training)


def padded_batch(seq=SEQ, vocab=120):
    """Two rows, the second padded from the middle of a block (internal and key padding)."""
    ids = torch.randint(5, vocab, (2, seq))
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, seq // 2 + 3 :] = 0
    return ids, mask


#: (method, arch, training) traced in the default tier; the rest of the matrix is slow.
DEFAULT_TRACES = {("mra2", "bert", False), ("mra2_s", "roberta", False)}


@pytest.mark.parametrize(
    "name, arch, training",
    [
        pytest.param(name, arch, training, id=f"{name}-{arch}-{'train' if training else 'eval'}",
                     marks=[] if (name, arch, training) in DEFAULT_TRACES else [pytest.mark.slow])
        for name in METHODS for arch in ("bert", "roberta") for training in (False, True)
    ],
)  # fmt: skip
def test_whole_model_traces_in_one_graph(name, arch, training):
    model = tiny_model(name, arch, training)
    ids, mask = padded_batch()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(input_ids=ids, attention_mask=mask)
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]
    assert explanation.graph_count == 1


def training_step(model, ids, mask, weights):
    """Outputs and parameter gradients of a step with a loss that weights every real output."""
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    (out * mask[..., None] * weights).sum().backward()
    grads = {name.removeprefix("_orig_mod."): p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.detach() * mask[..., None], grads


def assert_same_gradients(grads, eager_grads):
    """Equal gradients; a parameter outside the loss (the pooler) has none in eager, zeros compiled."""
    assert eager_grads.keys() <= grads.keys()
    for key, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads.get(key, torch.zeros_like(grad)), atol=1e-5, rtol=1e-4, msg=key)


def compiled_equals_eager(model, compiled, lengths):
    for seq in lengths:
        ids, mask = padded_batch(seq)
        weights = torch.randn(2, seq, 64) / seq
        (eager_out, eager_grads), (out, grads) = (training_step(m, ids, mask, weights) for m in (model, compiled))
        torch.testing.assert_close(out, eager_out, atol=1e-5, rtol=1e-4)
        assert_same_gradients(grads, eager_grads)


@pytest.mark.parametrize("backend", ["gather", "pairs"])
@pytest.mark.parametrize("name", ["mra2", pytest.param("mra2_s", marks=pytest.mark.slow)])
def test_compiled_training_step_equals_eager(name, backend):
    """fullgraph=True: a graph break fails. AOTAutograd traces forward and backward (the custom
    operators' fake kernels and autograd registration included); Inductor's code generation is
    covered by the slow test below. One layer: the second adds nothing new to trace."""
    model = tiny_model(name, training=True, layers=1, backend=backend)
    torch._dynamo.reset()
    compiled_equals_eager(model, torch.compile(model, backend="aot_eager", fullgraph=True), [SEQ])


@pytest.mark.parametrize(
    "name, backend",
    [("mra2", "gather"), *(pytest.param(*case, marks=pytest.mark.slow) for case in [("mra2", "pairs"), ("mra2_s", "gather")])],
)
def test_new_lengths_share_one_recompilation(name, backend):
    """Dynamic shapes, on the method alone (the model around it adds no length guard of its own):
    the first length compiles, the second recompiles with a symbolic length, which every later
    length reuses (no guard on the length's remainder or block count, also in the backward). Seconds:
    two compilations, forward and backward, of the method alone; fewer lengths would not show reuse."""
    choice = MethodChoice.of(name, {"block_per_row": 2, "backend": backend})
    method = build_method(choice, AttentionShape(2, 16, max_seq_len=4096))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(method, backend=counter, fullgraph=True)
    torch._dynamo.reset()
    for seq in (SEQ, 100, 64, 37):
        inputs = [torch.randn(2, 2, seq, 16) for _ in range(3)]
        mask = torch.arange(seq) < torch.tensor([[seq], [seq // 2 + 3]])
        grad_out = torch.randn(2, 2, seq, 16)
        results = []
        for fn in (method, compiled):
            q, k, v = (t.clone().requires_grad_() for t in inputs)
            out = fn(q, k, v, mask)
            results.append([out, *torch.autograd.grad(out, (q, k, v), grad_out)])
        for ours, expected in zip(*results):
            torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)
    assert counter.frame_count == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, arch, backend",
    # Each method, arch and backend once (an MRA module is the same inside either encoder).
    [("mra2", "bert", "gather"), ("mra2_s", "roberta", "gather"), ("mra2", "roberta", "pairs")],
)
def test_inductor_compiled_model_equals_eager(name, arch, backend):
    """torch.compile's default backend (Inductor): a training step and an inference forward."""
    model = tiny_model(name, arch, training=True, backend=backend)
    compiled = torch.compile(model, fullgraph=True)
    torch._dynamo.reset()
    compiled_equals_eager(model, compiled, [SEQ])
    model.eval()
    ids, mask = padded_batch()
    with torch.no_grad():
        out, expected = (m(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None] for m in (compiled, model))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
