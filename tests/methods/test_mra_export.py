"""MRA-2 and MRA-2-s exported (inference): the static block-sparse formulation that exported
programs run equals the eager kernel, torch.export takes dynamic batch and length, and ONNX
Runtime runs the exported method equal to eager PyTorch at the export length and at another."""

import math

import pytest
import torch
from test_mra import block_sparse_case
from tiny import tiny_config
from torch.export import Dim

import hf_efficient_attn as hea
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.methods.mra import gather, pairs
from hf_efficient_attn.methods.mra import method as mra_method
from hf_efficient_attn.registry import MethodChoice, build_method

METHODS = ["mra2", "mra2_s"]
DYNAMIC = {0: Dim.DYNAMIC, 1: Dim.DYNAMIC}


def padding_mask(batch, seq, real):
    return torch.arange(seq)[None, :] < torch.as_tensor(real)[:, None].expand(batch, 1)


@pytest.mark.parametrize("extra", [True, False], ids=["extra-key", "selected-only"])
@pytest.mark.parametrize("tight", [False, True], ids=["all-pairs", "tight"])
def test_static_formulation_equals_the_kernel(extra, tight):
    """Random selection with padded keys, an empty key block, a query block with no selected
    block and extra keys at -inf (:func:`test_mra.block_sparse_case`); the pair list holds all
    pairs, or exactly as many as the fullest head selects."""
    q, k, v, selected, bs, scaling, key_real, extra_value, extra_score = block_sparse_case(extra)
    blocks = [t.unflatten(2, (-1, bs)) for t in (q, k, v)]
    max_pairs = int(selected.flatten(2).sum(-1).max()) if tight else None
    expected = gather.block_sparse_attention(*blocks, selected, scaling, key_real, extra_value, extra_score)
    static = pairs.pair_attention(*blocks, selected, scaling, key_real, extra_value, extra_score, max_pairs)
    torch.testing.assert_close(static, expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("inputs", ["random", "tied"])
def test_method_takes_the_same_values_when_exporting(name, inputs, monkeypatch):
    """The whole method on the export path (static block-sparse formulation, extra padded block)
    against eager, with padding and priors; "tied": blocks with equal means tie every score, so
    the selection's tie-break decides."""
    method = build_method(
        MethodChoice.of(name, {"block_per_row": 2, "initial_prior_diagonal_n_blocks": 1}), AttentionShape(2, 8, max_seq_len=4096)
    ).eval()
    if inputs == "random":
        q, k, v = (torch.randn(3, 2, 150, 8, dtype=torch.float64) for _ in range(3))
    else:
        q, k, v = (torch.randn(1, 2, 32, 8, dtype=torch.float64).repeat(3, 1, 5, 1)[:, :, :150] for _ in range(3))
    mask = padding_mask(3, 150, [150, 70, 0])  # full, internal + key padding, padding only
    eager = method(q, k, v, mask)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    pair_lists = []

    def static_formulation(q, *args, max_pairs):
        pair_lists.append((max_pairs, q.shape[2]))  # (max_pairs, nb)
        return static(q, *args, max_pairs=max_pairs)

    static = pairs.pair_attention
    monkeypatch.setattr(mra_method, "pair_attention", static_formulation)
    torch.testing.assert_close(method(q, k, v, mask), eager, atol=1e-12, rtol=1e-10)
    assert pair_lists, "the exported method did not run the static formulation"
    # The pair list holds block_per_row x nb pairs (the largest budget), O(n), not all nb^2 pairs.
    assert [max_pairs for max_pairs, nb in pair_lists] == [2 * nb for _, nb in pair_lists]


class MethodModule(torch.nn.Module):
    """The attention method alone, with its padding mask: what a patched model exports per layer."""

    def __init__(self, name):
        super().__init__()
        self.method = build_method(MethodChoice.of(name, {"block_per_row": 2}), AttentionShape(2, 8, max_seq_len=4096))

    def forward(self, q, k, v, mask):
        return self.method(q, k, v, mask)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mra2", "mra2_s"])
def test_onnx_runtime_runs_the_exported_method_equal_to_eager(name, tmp_path):
    """Slow: an export traces the method for seconds. In the default tier, the exports that
    tests/serving/test_onnx_encode.py shares (a one-layer MRA-2 model, dynamic batch and length)
    are checked against eager PyTorch in ONNX Runtime at two lengths by the export script itself."""
    ort = pytest.importorskip("onnxruntime")
    module = MethodModule(name).eval()

    def inputs(batch, seq, real):
        return (*(torch.randn(batch, 2, seq, 8) for _ in range(3)), padding_mask(batch, seq, real))

    example = inputs(2, 150, [150, 70])  # 5 blocks, 2 exact per row
    program = torch.onnx.export(
        module, example, dynamo=True, verbose=False, dynamic_shapes=({0: Dim.DYNAMIC, 2: Dim.DYNAMIC},) * 3 + (DYNAMIC,)
    )
    program.save(str(tmp_path / "mra.onnx"))
    session = ort.InferenceSession(str(tmp_path / "mra.onnx"), providers=["CPUExecutionProvider"])
    for args in (example, inputs(3, 100, [100, 61, 1])):  # the export length and another batch and length
        with torch.no_grad():
            expected = module(*args)
        feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), args)}
        out = torch.from_numpy(session.run(None, feed)[0])
        torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name, arch", [("mra2", "bert"), ("mra2_s", "roberta")])  # each once: the module is the same in either
def test_exported_model_with_dynamic_batch_and_length_equals_eager_also_in_onnx_runtime(name, arch, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    config = tiny_config(arch, hidden_size=64, num_attention_heads=2)
    model = hea.AutoModel.from_config(config, attn_impl=name, attn_config={"block_per_row": 2}).eval()

    def batch(rows, seq):
        ids = torch.randint(5, config.vocab_size, (rows, seq))
        mask = padding_mask(rows, seq, [seq] + [math.ceil(seq * 0.6)] * (rows - 1)).long()
        return {"input_ids": ids, "attention_mask": mask}

    example = batch(2, 100)
    dynamic = {"input_ids": DYNAMIC, "attention_mask": DYNAMIC}
    exported = torch.export.export(model, (), example, dynamic_shapes=dynamic)
    program = torch.onnx.export(exported, dynamo=True, verbose=False)
    program.save(str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for inputs in (example, batch(3, 128), batch(1, 20)):
        real = inputs["attention_mask"][..., None]
        with torch.no_grad():
            expected = model(**inputs).last_hidden_state * real
        torch.testing.assert_close(exported.module()(**inputs).last_hidden_state * real, expected, atol=1e-5, rtol=1e-4)
        out = session.run(None, {name: t.numpy() for name, t in inputs.items()})[0]
        torch.testing.assert_close(torch.from_numpy(out) * real, expected, atol=1e-4, rtol=1e-4)
