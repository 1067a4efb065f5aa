"""MRA-2's ``triton`` backend (methods/mra/triton.py): the same function as the ``pairs`` backend and
the dense formula, forward and every gradient, with padding, lengths that are not a multiple of the
block, priors, ties and query blocks without an exact block; half precision within the tolerances
docs/methods/mra.md states; one graph under torch.compile; its launches per call.

On CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1), a few programs a
second: small shapes, and 16-token blocks (Triton's smallest matrix tile) so that a hundred tokens
already make an approximation. ``pytest --device cuda`` runs the same tests on compiled kernels."""

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from test_mra import dense_mra_reference, real_rows
from tiny import tiny_config

import hf_efficient_attn as hea
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.methods.mra import MraOptions, selection
from hf_efficient_attn.methods.mra import triton as triton_backend
from hf_efficient_attn.methods.softmax import softmax_reference
from hf_efficient_attn.registry import MethodChoice, build_method

pytest.importorskip("triton")
pytestmark = pytest.mark.device

METHODS = ["mra2", "mra2_s"]
BS = 16
#: Priors that outnumber the budget: some query blocks get no exact block.
PRIORS = {"block_per_row": 1, "initial_prior_first_n_blocks": 1, "initial_prior_diagonal_n_blocks": 3}
#: Relative error (norm) of outputs and gradients against an fp64 computation, by input dtype: the
#: tolerances docs/methods/mra.md states for the triton backend.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def make(name, heads=2, dim=16, **options):
    options = {"backend": "triton", "block_size": BS, **options}
    return build_method(MethodChoice.of(name, options), AttentionShape(heads, dim, max_seq_len=4096)).eval()


def padded_case(batch=2, heads=1, seq=70, dim=16, dtype=torch.float32):
    """q, k, v and a key-padding mask: 70 tokens are 4 blocks of 16 and one of 6; row 1 is padded
    from inside its fourth block."""
    q, k, v = (torch.randn(batch, heads, seq, dim).to(dtype) for _ in range(3))
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[1, 57:] = False
    return q, k, v, mask


def outputs_and_gradients(method, tensors, mask, grad_out):
    """The real rows of the output, and the gradients of q, k, v for ``grad_out``."""
    tensors = [t.detach().clone().requires_grad_() for t in tensors]
    out = method(*tensors, mask)
    out.backward(grad_out.to(out.dtype))
    return [real_rows(out, mask), *(t.grad for t in tensors)]


def relative_error(ours, reference):
    ours, reference = ours.detach().double(), reference.detach().double()
    return float((ours - reference).norm() / reference.norm())


def reference_selection(q, k, mask, scaling, block_per_row, first_n=0, diagonal_n=0):
    """select_blocks' choice (B, H, nb, nb) and the block counts, from the plain-PyTorch block means."""
    nb = math.ceil(q.shape[2] / BS)
    real = torch.nn.functional.pad(mask, (0, nb * BS - mask.shape[1]))
    q, k = (torch.nn.functional.pad(t, (0, 0, 0, nb * BS - t.shape[2])).masked_fill(~real[:, None, :, None], 0) for t in (q, k))
    q, k = (t.unflatten(2, (nb, BS)) for t in (q, k))
    stats = selection.block_stats(q, k, k, real, scaling)
    return selection.select_blocks(stats.logits, stats.counts, block_per_row, first_n, diagonal_n), stats


def bitmap_pairs(bitmap):
    """(B * H, nb, words) int32 bitmaps -> bool (B * H, nb, nb): bit y of row x."""
    y = torch.arange(bitmap.shape[1], device=bitmap.device)
    return ((bitmap[..., y // 32] >> (y % 32)) & 1).bool()


# ----------------------------------------------------------------------------- the same function


@pytest.fixture(params=[None, pytest.param(2, marks=pytest.mark.slow)], ids=["whole-lists", "lists-in-pieces"])
def list_piece(request, monkeypatch):
    """The exact kernels' pieces: the default (these lists are never longer), or 2 entries, so that
    most blocks' lists are walked in several programs and merged (the default tier: one case of
    test_forward_and_gradients_equal_pairs_and_the_dense_formula)."""
    if request.param:
        monkeypatch.setattr(triton_backend, "LIST_PIECE", request.param)
    return request.param


@pytest.mark.parametrize(
    "name, options, list_piece",
    [(name, options, None) for name in METHODS for options in ({}, PRIORS)] + [("mra2", {}, 2)],
    ids=["mra2-budget", "mra2-priors", "mra2_s-budget", "mra2_s-priors", "mra2-budget-lists-in-pieces"],
    indirect=["list_piece"],
)
def test_forward_and_gradients_equal_pairs_and_the_dense_formula(name, options, list_piece):
    q, k, v, mask = padded_case()
    grad_out = torch.randn_like(q)
    ours = outputs_and_gradients(make(name, heads=1, **options), (q, k, v), mask, grad_out)
    # The pairs backend in fp64 on the same inputs: the same selection, every part computed another way.
    tensors64 = [t.double() for t in (q, k, v)]
    pairs = outputs_and_gradients(make(name, heads=1, backend="pairs", **options), tensors64, mask, grad_out.double())
    for part, ours_part, pairs_part in zip(("out", "dq", "dk", "dv"), ours, pairs):
        assert ours_part.dtype == torch.float32
        assert relative_error(ours_part, pairs_part) < TOLERANCE[torch.float32], part
    block_per_row, first_n, diagonal_n = (options.get(f"{key}", default) for key, default in (
        ("block_per_row", 4), ("initial_prior_first_n_blocks", 0), ("initial_prior_diagonal_n_blocks", 0)))  # fmt: skip
    expected = dense_mra_reference(*tensors64, mask, block_per_row, name == "mra2", first_n, diagonal_n, bs=BS)
    assert relative_error(ours[0], expected) < TOLERANCE[torch.float32]
    selected, stats = reference_selection(*tensors64[:2], mask, 16**-0.5, block_per_row, first_n, diagonal_n)
    real = stats.counts > 0
    assert not selected[(real[:, :, None] & real[:, None, :])[:, None].expand_as(selected)].all()  # an approximation
    if options:  # the case the priors make: a query block holding real tokens without an exact block
        assert (~selected.any(-1) & real[:, None, :]).any()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (pytest --device cuda on such a machine)")
def test_the_kernels_run_on_the_tensors_gpu_not_the_current_one():
    """Layers spread over GPUs: with cuda:0 current, a call on cuda:1 runs there, output and gradients
    equal to the same call on cuda:0."""
    q, k, v, mask = padded_case()
    grad_out = torch.randn_like(q)
    with torch.cuda.device(0):
        on = {
            index: outputs_and_gradients(
                make("mra2", heads=1).to(f"cuda:{index}"),
                [t.to(f"cuda:{index}") for t in (q, k, v)],
                mask.to(f"cuda:{index}"),
                grad_out.to(f"cuda:{index}"),
            )  # fmt: skip
            for index in (0, 1)
        }
    assert all(part.device == torch.device("cuda:1") for part in on[1])
    for first, second in zip(on[0], on[1]):
        torch.testing.assert_close(second.cpu(), first.cpu())


def test_an_input_shorter_than_a_rows_budget_of_blocks_runs():
    """20 tokens are 2 blocks of 16, fewer than the 4 a row may select: every pair is exact, as in pairs."""
    q, k, v = (torch.randn(1, 1, 20, 16) for _ in range(3))
    torch.testing.assert_close(
        make("mra2", heads=1, block_per_row=4)(q, k, v), make("mra2", heads=1, backend="pairs", block_per_row=4)(q, k, v)
    )


def test_full_budget_is_exact_softmax_with_a_sequence_of_padding_only(list_piece):
    """At a budget of every pair (5 blocks, 5 per row; 3 real blocks in row 1, whose budget caps at
    its 9 real pairs) the output and the gradients are exact softmax attention's (mra2: with no pair
    left at low resolution it is mra2_s)."""
    name = "mra2"
    q, k, v = (torch.randn(3, 1, 75, 16) for _ in range(3))
    mask = torch.ones(3, 75, dtype=torch.bool)
    mask[1, 40:] = False
    mask[2] = False
    grad_out = torch.randn_like(q)
    ours = outputs_and_gradients(make(name, heads=1, block_per_row=5), (q, k, v), mask, grad_out)

    def softmax(q, k, v, mask):
        real = mask[:, None, :, None]
        return softmax_reference(*(t.masked_fill(~real, 0) for t in (q, k, v)), mask).masked_fill(~real, 0)

    expected = outputs_and_gradients(softmax, (q, k, v), mask, grad_out)
    for part, ours_part, expected_part in zip(("out", "dq", "dk", "dv"), ours, expected):
        torch.testing.assert_close(ours_part, expected_part, atol=1e-5, rtol=1e-5, msg=part)
    assert not ours[0][2].any()


@pytest.mark.parametrize(
    "options",
    [{"block_per_row": 2}, PRIORS, {"block_per_row": 2, "initial_prior_first_n_blocks": 1, "initial_prior_diagonal_n_blocks": 7}],
    ids=["budget", "priors", "wide-priors"],  # wide: pairs with padding get two prior sets
)
def test_selection_bitmaps_equal_select_blocks_ties_included(options):
    """Blocks of equal small integers make the block means and their products exact in both
    computations, and tie many pairs: the pairs the kernels select equal select_blocks' choice bit
    for bit (the budget of each sequence, priors first, ties at the budget's cut to the lowest
    (query block, key block)), in both bitmaps and the pair lists; a sequence of padding only selects
    nothing."""
    batch, heads, seq, dim, scaling = 3, 2, 88, 16, 0.25  # 5 blocks of 16 and one of 8 tokens
    q, k, v = (torch.randint(-1, 2, (batch, heads, 6, dim)).float().repeat_interleave(BS, 2)[:, :, :seq] for _ in range(3))
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[1, 37:] = False
    mask[2] = False
    q, k, v = (t.masked_fill(~mask[:, None, :, None], 0) for t in (q, k, v))
    choice = [options.get(key, 0) for key in ("initial_prior_first_n_blocks", "initial_prior_diagonal_n_blocks")]
    arguments = (q, k, v, mask, scaling, BS, options["block_per_row"], *choice, True)
    _, _, _, counts, bitmaps, pairs, offsets = triton_backend.mra_forward(*arguments)
    expected, stats = reference_selection(q, k, mask, scaling, options["block_per_row"], *choice)
    assert stats.logits.unique().numel() < stats.logits.numel() // 4  # many ties
    assert torch.equal(counts, stats.counts.int())
    assert torch.equal(bitmap_pairs(bitmaps[0]), expected.flatten(0, 1))
    assert torch.equal(bitmap_pairs(bitmaps[1]), expected.transpose(-1, -2).flatten(0, 1))
    assert not expected[2].any()
    # The exact kernels' pair lists: each query block's key blocks, ascending, at its span.
    blocks = expected.shape[-1]
    listed = torch.zeros_like(expected).flatten(0, 1)
    for head, (head_pairs, head_offsets) in enumerate(zip(pairs, offsets)):
        for x in range(blocks):
            ys = head_pairs[head_offsets[x] : head_offsets[x + 1]] - x * blocks
            assert torch.equal(ys, ys.sort().values) and ys.unique().numel() == ys.numel()
            listed[head, x, ys.long()] = True
    assert torch.equal(listed, expected.flatten(0, 1))


def test_ties_across_a_rows_bitmap_words_keep_row_major_order():
    """40 blocks: a query block's row spans two int32 words, and a program of the selection 32 query
    blocks. Zero queries after the first block make all their pairs tie at the row maximum (0), so the
    budget (2 a row, 80 pairs) takes the first block's best pairs, row 1 whole, and row 2 up to where
    the budget runs out, as select_blocks does."""
    blocks, dim = 40, 16
    q = torch.zeros(1, 1, blocks * BS, dim)
    q[..., :BS, :] = torch.randint(-1, 2, (dim,)).float()
    k = torch.randint(-1, 2, (1, 1, blocks, dim)).float().repeat_interleave(BS, 2)
    mask = torch.ones(1, blocks * BS, dtype=torch.bool)
    _, _, _, _, bitmaps, _, _ = triton_backend.mra_forward(q, k, k, mask, 0.25, BS, 2, 0, 0, True)
    expected, _ = reference_selection(q, k, mask, 0.25, 2)
    assert expected[0, 0, 1].all() and 0 < expected[0, 0, 2].sum() < blocks and not expected[0, 0, 3:].any()
    assert torch.equal(bitmap_pairs(bitmaps[0]), expected.flatten(0, 1))
    assert torch.equal(bitmap_pairs(bitmaps[1]), expected.transpose(-1, -2).flatten(0, 1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_within_the_stated_tolerance(dtype, device):
    """fp16/bf16 enter the exact blocks' matrix products as they are, probabilities rounded to the
    dtype for their product with V: outputs and gradients within TOLERANCE of fp64 on the same
    (rounded) inputs, in the input dtype (mra2: its kernels are mra2_s's and the low-resolution part)."""
    name = "mra2"
    if dtype == torch.bfloat16 and device.type != "cuda":
        pytest.skip("Triton's interpreter multiplies bf16 matrix operands' raw bits (triton#11584)")
    q, k, v, mask = padded_case(dtype=dtype)
    grad_out = torch.randn(q.shape).to(dtype)
    ours = outputs_and_gradients(make(name, heads=1), (q, k, v), mask, grad_out)
    reference = outputs_and_gradients(
        make(name, heads=1, backend="pairs"), [t.double() for t in (q, k, v)], mask, grad_out.double()
    )
    for part, ours_part, reference_part in zip(("out", "dq", "dk", "dv"), ours, reference):
        assert ours_part.dtype == dtype, part
        assert torch.isfinite(ours_part).all(), part
        assert relative_error(ours_part, reference_part) < TOLERANCE[dtype], part


# ----------------------------------------------------------------------------- one graph, few launches


@pytest.mark.slow  # 5 s in the interpreter; the custom operators' fake implementations are what it checks
def test_a_model_compiles_in_one_graph_and_equals_eager():
    """torch.compile(fullgraph=True) traces a patched model through the custom operators (fake
    implementations and autograd, no graph break); the compiled training step equals eager's."""
    config = tiny_config("roberta", hidden_size=32, num_attention_heads=2, num_hidden_layers=1, hidden_dropout_prob=0.0)
    attn_config = {"backend": "triton", "block_size": BS, "block_per_row": 2}
    model = hea.AutoModel.from_config(config, attn_impl="mra2", attn_config=attn_config).train()
    ids = torch.randint(5, 120, (2, 70))
    mask = torch.ones(2, 70, dtype=torch.long)
    mask[1, 45:] = 0
    results = []
    for run in (model, torch.compile(model, fullgraph=True, backend="aot_eager")):
        model.zero_grad()
        out = run(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None]
        out.square().sum().backward()
        results.append((out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}))
    (eager_out, eager_grads), (compiled_out, compiled_grads) = results
    torch.testing.assert_close(compiled_out, eager_out, atol=1e-6, rtol=1e-5)
    assert any("attention.self.query" in name for name in eager_grads) and eager_grads.keys() <= compiled_grads.keys()
    for name, grad in compiled_grads.items():  # unused parameters (the pooler): None in eager, zero compiled
        torch.testing.assert_close(grad, eager_grads.get(name, torch.zeros_like(grad)), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name, forward, backward", [("mra2", 7, 7), ("mra2_s", 6, 5)])
def test_kernel_launches_per_call(name, forward, backward, monkeypatch):
    """The forward launches the means, selection-score, tally, pair-list, (low-resolution), exact and
    piece-merging kernels once each (besides one torch.topk of fp32 values), the backward the
    preprocess kernel and, once per axis (a compile-time one), the (low-resolution), exact and
    piece-merging backward kernels, whatever the length."""
    from hf_efficient_attn.methods.mra import triton_kernels as kernels

    launches = []
    for kernel_name in [n for n in dir(kernels) if n.endswith("_kernel")]:
        kernel = getattr(kernels, kernel_name)
        monkeypatch.setattr(
            kernel,
            "run",
            lambda *a, _run=kernel.run, _n=kernel_name, **kw: launches.append((_n, kw.get("AXIS"))) or _run(*a, **kw),
        )
    q, k, v = (torch.randn(1, 1, 70, 16, requires_grad=True) for _ in range(3))
    out = make(name, heads=1)(q, k, v)
    assert len(launches) == forward and len(set(launches)) == forward, launches
    out.sum().backward()
    assert len(launches) == forward + backward and len(set(launches)) == forward + backward, launches
    assert {axis for kernel, axis in launches if kernel.endswith("backward_kernel")} == {0, 1}
    assert {axis for kernel, axis in launches if kernel == "merge_gradient_pieces_kernel"} == {0, 1}


# ----------------------------------------------------------------------------- what it supports


def test_unsupported_inputs_are_refused_with_the_reason(monkeypatch, device):
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    with pytest.raises(ValueError, match=r"^mra2: backend='triton' needs block_size in \[16, 32, 64, 128\]"):
        make("mra2", block_size=7)(q, k, v)
    with pytest.raises(ValueError, match=r"backend='triton' supports dtypes .*got torch.float64"):
        make("mra2")(*(t.double() for t in (q, k, v)))
    with pytest.raises(ValueError, match=r"backend='triton' supports head sizes up to 256, got 320"):
        make("mra2", dim=320)(*(torch.randn(1, 2, 64, 320) for _ in range(3)))
    if device.type == "cpu":
        monkeypatch.setattr(triton_backend, "kernels_interpreted", lambda: False)
        with pytest.raises(ValueError, match=r"backend='triton' runs on CUDA \(on cpu only under Triton's interpreter"):
            make("mra2")(q, k, v)


def test_the_size_limits_refuse_one_past_what_the_kernels_index(monkeypatch):
    """The pair lists hold the pair index x * nb + y and the mark nb² in int32, so at most MAX_BLOCKS
    blocks; batch x heads is the launch grid's second axis (CUDA allows 65535). Exactly
    the most of each is accepted, one more refused (meta tensors: only the check runs)."""
    monkeypatch.setattr(triton_backend, "kernels_interpreted", lambda: True)
    options = MraOptions(block_size=16)

    def reason(batch_heads: int, length: int) -> str | None:
        q = torch.empty(batch_heads, 1, length, 16, device="meta")
        return triton_backend.triton_unavailable(q, q, q, options)

    most_blocks = triton_backend.MAX_BLOCKS
    assert reason(1, most_blocks * 16) is None
    one_more = reason(1, most_blocks * 16 + 1)
    assert re.fullmatch(rf"supports up to {most_blocks} blocks .*got {most_blocks * 16 + 1} tokens", one_more)
    assert reason(65535, 64) is None
    assert re.fullmatch(r"supports batch x heads up to 65535, got 65536", reason(65536, 64))


def test_head_sizes_dtypes_and_int32_offsets_are_checked_at_their_limits(monkeypatch):
    """Head sizes up to MAX_HEAD_DIM; k and v of q's head size and dtype (the kernels size v's tiles and the
    output by q's); offsets that fit int32: a sequence of tokens x heads x head size below 2**31 (the
    output's layout, (B, N, H, D)). Meta tensors: only the check runs."""
    monkeypatch.setattr(triton_backend, "kernels_interpreted", lambda: True)
    options = MraOptions(block_size=128)

    def reason(length=64, heads=1, dim=16, v_dim=None, v_dtype=torch.float32):
        q = torch.empty(1, heads, length, dim, device="meta")
        v = torch.empty(1, heads, length, v_dim or dim, device="meta", dtype=v_dtype)
        return triton_backend.triton_unavailable(q, q, v, options)

    assert reason(dim=256) is None
    assert reason(dim=257) == "supports head sizes up to 256, got 257"
    assert triton_backend.triton_unavailable(*[torch.empty(1, 1, 64, 16, device="meta")] * 3, MraOptions(block_size=256)) == (
        "needs block_size in [16, 32, 64, 128] (Triton's matrix tiles), got 256"
    )  # 128 above: the largest accepted
    assert reason(v_dim=32) == "needs k's and v's head size equal to q's (16), got 16 and 32"
    assert reason(v_dtype=torch.bfloat16) == "needs q, k and v of one dtype, got torch.float32, torch.float32 and torch.bfloat16"
    longest = 2**20  # tokens: with 8 heads of 256, 2**31 offsets
    assert reason(longest - 128, heads=8, dim=256) is None
    assert reason(longest, heads=8, dim=256).startswith("supports inputs whose offsets fit int32")


#: Each launch of one call (8192 tokens: length-derived integers divisible by 16) as the kernel tool compiles
#: it for sm_90, as JSON: its arguments (kind, value, and whether the source makes each a constant or marks
#: it divisible by 16), the options the launch sets and those the tool compiles with.
TOOL_SOURCES = """
import json, torch
from triton.backends.compiler import GPUTarget
from hf_efficient_attn.tools import triton_kernels as tool

launches = []
for kernel, args, kwargs in tool.recorded_launches(torch.bfloat16, 8192, 12, 64, 32):
    source, options = tool.compile_source(kernel, args, kwargs, GPUTarget("cuda", 90, 32))
    bound = {**dict(zip(kernel.arg_names, args)), **kwargs}
    arguments = []
    for index, param in enumerate(kernel.params):
        value = bound[param.name]
        kind = "constexpr" if param.is_constexpr else "tensor" if isinstance(value, torch.Tensor) else type(value).__name__
        arguments.append({
            "name": param.name, "kind": kind, "value": value if kind == "int" else None,
            "constant": (index,) in source.constants,
            "divisible": ["tt.divisibility", 16] in source.attrs.get((index,), []),
        })
    launches.append({
        "name": tool.launch_name(kernel, kwargs),
        "arguments": arguments,
        "launched": {key: kwargs[key] for key in ("num_warps", "num_stages", "enable_fp_fusion") if key in kwargs},
        "compiled": {key: getattr(options, key) for key in ("num_warps", "num_stages", "enable_fp_fusion")},
    })
print(json.dumps(launches))
"""


@pytest.mark.slow
def test_the_kernel_tool_compiles_each_launch_as_triton_does_at_run_time():
    """The tool's register and spill figures are those of the kernels a GPU runs: each launch compiled with
    its own warps, stages and fusion, pointers marked 16-byte aligned, integers equal to 1 made constants
    and those divisible by 16 marked so, as Triton's launcher does, except the length-derived integers
    (LENGTH_ARGUMENTS), which stay plain so that a new length compiles nothing new."""
    from hf_efficient_attn.methods.mra.triton_kernels import LENGTH_ARGUMENTS

    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", TOOL_SOURCES], capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    launches = json.loads(result.stdout.splitlines()[-1])
    assert {launch["name"] for launch in launches} >= {"exact_backward_kernel[AXIS=0]", "exact_backward_kernel[AXIS=1]"}
    assert any(launch["launched"] for launch in launches)
    length_arguments = 0
    for launch in launches:
        for key, value in launch["launched"].items():
            assert launch["compiled"][key] == value, (launch["name"], key)
        for argument in launch["arguments"]:
            where = (launch["name"], argument["name"])
            if argument["kind"] == "tensor":
                assert argument["divisible"], where
            elif argument["kind"] == "int" and argument["name"] in LENGTH_ARGUMENTS:
                length_arguments += argument["value"] % 16 == 0
                assert not argument["constant"] and not argument["divisible"], where
            elif argument["kind"] == "int":
                assert argument["constant"] == (argument["value"] == 1), where
                assert argument["divisible"] == (argument["value"] % 16 == 0 and argument["value"] != 1), where
    assert length_arguments > 0  # the case do_not_specialize changes


@pytest.mark.slow  # 20 s in the interpreter
def test_the_kernel_tool_times_each_launch_of_the_call(monkeypatch, capsys):
    """``--time`` (the GPU stage's per-launch timings) runs the call --repeats times after a warm-up, at
    --batch, and prints a time for each launch, the two top-ks, and the pair lists' skew (1 or more)."""
    from hf_efficient_attn.tools import triton_kernels as tool

    calls = []
    monkeypatch.setattr(tool, "run_call", lambda *a, _run=tool.run_call: calls.append(a) or _run(*a))
    tool.main(["--time", "--length", "70", "--block_size", "16", "--heads", "1", "--head_dim", "16", "--dtype", "fp32",
               "--batch", "2", "--repeats", "2"])  # fmt: skip
    assert len(calls) == 3 and all(call[-1] == 2 for call in calls)
    printed = dict(line.rsplit(": ", 1) for line in capsys.readouterr().out.splitlines()[1:])
    launched = {tool.launch_name(kernel, kwargs) for kernel, _, kwargs in tool.recorded_launches(torch.float32, 70, 1, 16, 16)}
    assert launched | {"torch.topk, fp32 values", "torch.topk, int64 keys (replaced)"} <= printed.keys()
    assert all(float(printed[name].removesuffix(" ms")) > 0 for name in launched)
    skews = [float(value) for name, value in printed.items() if name.startswith("longest")]
    assert len(skews) == 2 and min(skews) >= 1


#: Compiles the selection kernel for sm_90 with the options its launch sets (as Triton does at run time), then
#: with fusion on, and prints how many fp32 fused multiply-adds each PTX holds (its products run on tensor
#: cores: an fma.rn.f32 there is a contracted `product - row_max`).
SELECTION_PTX = """
import torch, triton
from triton.backends.compiler import GPUTarget
from hf_efficient_attn.tools import triton_kernels as tool

target = GPUTarget("cuda", 90, 32)
for kernel, args, kwargs in tool.recorded_launches(torch.float32, 1024, 2, 128, 32):
    if kernel.__name__ == "selection_scores_kernel":
        for launched in (kwargs, {**kwargs, "enable_fp_fusion": True}):
            source, options = tool.compile_source(kernel, args, launched, target)
            print(triton.compile(source, target=target, options=options.__dict__).asm["ptx"].count("fma.rn.f32"))
"""


@pytest.mark.slow
def test_the_selection_scores_are_not_fused_on_a_gpu():
    """On a GPU Triton contracts ``logit - row_max`` with the logit's product into one FMA, so that a
    row's best pair scores its rounding residual, not 0, and ties break by noise (head size 128: a scale
    that is not a power of two). The selection kernel's launch turns fusion off: its PTX for sm_90 holds
    fewer fused multiply-adds than the same kernel compiled with fusion on."""
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", SELECTION_PTX], capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    launched, fused = (int(count) for count in result.stdout.split()[-2:])
    assert launched < fused, (launched, fused)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_kernels_compile_for_hopper_without_a_gpu(dtype):
    """Triton's own compiler builds every kernel for sm_90 (the H100/H200) here, without a GPU: what
    the interpreter does not check (constexpr globals, layouts, register allocation by ptxas): each launch
    of a call once, the backward kernels once per axis."""
    from hf_efficient_attn.tools import triton_kernels as tool

    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "hf_efficient_attn.tools.triton_kernels", "--arch", "90", "--dtype", dtype]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    compiled = re.findall(r"^(\w+_kernel(?:\[AXIS=\d\])?): registers \d+", result.stdout, flags=re.MULTILINE)
    launched = [tool.launch_name(kernel, kwargs) for kernel, _, kwargs in tool.recorded_launches(torch.float32, 8192, 12, 64, 32)]
    assert sorted(compiled) == sorted(launched), result.stdout
