"""What is measured: one attention call, one training step of an MLM encoder (``--arch``),
its compiled form and its ONNX Runtime form."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ...methods.base import AttentionShape
from ...registry import MethodChoice, build_method
from .timing import median_seconds, synchronize

ATTENTION_REFERENCE = "softmax"  # exact attention through SDPA, behind the method contract
MODEL_REFERENCE = "sdpa"  # Transformers' own SDPA attention
MODEL_FLOOR = "vmean"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: The encoders of ``--arch``: the checkpoint whose width each is built at, and that width (any other
#: tested architecture is built at roberta-base's). ESM-2 with its rotary positions; ModernBERT with its
#: default layer pattern (every third layer global, the others a 128-token window).
ARCH_WIDTHS: dict[str, tuple[str, dict[str, Any]]] = {
    "roberta": ("roberta-base", dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)),
    "modernbert": ("ModernBERT-base", dict(hidden_size=768, num_attention_heads=12, intermediate_size=1152)),
    "esm": (
        "ESM-2-150M",
        dict(hidden_size=640, num_attention_heads=20, intermediate_size=2560, position_embedding_type="rotary"),
    ),
}


def encoder_name(arch: str) -> str:
    """What the tables call the encoder of ``--arch``: e.g. "a ModernBERT-base-width modernbert encoder"."""
    checkpoint = ARCH_WIDTHS.get(arch, ARCH_WIDTHS["roberta"])[0]
    return f"{'an' if checkpoint[0] in 'AEIOUaeiou' else 'a'} {checkpoint}-width {arch} encoder"


def attention_step(
    method: str,
    seq_len: int,
    backward: bool,
    *,
    options: dict[str, Any] | None = None,
    batch: int = 1,
    heads: int = 12,
    head_dim: int = 64,
    device: str = "cpu",
    dtype: str = "fp32",
) -> Callable[[], None]:
    """One attention call of ``method`` (with ``options``) on random q, k, v (B, H, N, D), with
    backward (of a fixed random output gradient) if asked."""
    dev, torch_dtype = torch.device(device), DTYPES[dtype]
    shape = AttentionShape(heads, head_dim, max(seq_len, 4096))
    module = build_method(MethodChoice.of(method, options), shape).to(dev, torch_dtype)
    module.train(backward)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=dev, dtype=torch_dtype) for _ in range(3))
    for t in (q, k, v):
        t.requires_grad_(backward)
    grad_out = torch.randn_like(q)

    def step() -> None:
        with torch.set_grad_enabled(backward):
            out = module(q, k, v, None, head_dim**-0.5)
            if backward:
                out.backward(grad_out)

    return step


def build_mlm_model(
    method: str,
    seq_len: int,
    layers: int = 2,
    vocab_size: int = 1024,
    options: dict[str, Any] | None = None,
    arch: str = "roberta",
) -> torch.nn.Module:
    """A randomly initialised masked-LM encoder of model type ``arch`` at the width of
    :data:`ARCH_WIDTHS` for ``seq_len`` tokens, with attention ``method`` and its ``options`` (``"sdpa"``:
    Transformers' own) and attention dropout 0 (the approximations apply none)."""
    import transformers

    from ...integration.patching import patch_model

    special = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2, mask_token_id=3)
    config = transformers.AutoConfig.for_model(
        arch,
        vocab_size=vocab_size,
        num_hidden_layers=layers,
        max_position_embeddings=seq_len + 2,
        attention_probs_dropout_prob=0.0,
        attention_dropout=0.0,
        **special,
        **ARCH_WIDTHS.get(arch, ARCH_WIDTHS["roberta"])[1],
    )
    if method == MODEL_REFERENCE:
        return transformers.AutoModelForMaskedLM.from_config(config, attn_implementation="sdpa")
    return patch_model(transformers.AutoModelForMaskedLM.from_config(config), method, options)


def mlm_training_step(model: torch.nn.Module, batch: int, seq_len: int, dtype: str = "fp32") -> Callable[[], None]:
    """A closure doing one MLM training step of ``model`` (forward, backward, AdamW step, zero_grad)
    on fixed random tokens, 15% of them masked; bf16/fp16 through autocast, as Trainer's ``--bf16``."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    input_ids = torch.randint(3, model.config.vocab_size, (batch, seq_len), device=device)
    labels = torch.where(torch.rand(batch, seq_len, device=device) < 0.15, input_ids, -100)
    amp_dtype = DTYPES[dtype]

    def step() -> None:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def model_step(
    method: str,
    seq_len: int,
    *,
    options: dict[str, Any] | None = None,
    layers: int = 2,
    vocab_size: int = 1024,
    batch: int = 1,
    device: str = "cpu",
    dtype: str = "fp32",
    arch: str = "roberta",
) -> Callable[[], None]:
    """:func:`mlm_training_step` of :func:`build_mlm_model`."""
    torch.manual_seed(0)
    model = build_mlm_model(method, seq_len, layers, vocab_size, options, arch).to(device).train()
    return mlm_training_step(model, batch, seq_len, dtype)


def padded_batch(vocab_size: int, batch: int, seq_len: int, device: str) -> dict[str, torch.Tensor]:
    """Random tokens with an attention mask whose last row (of two or more) is a quarter padding."""
    input_ids = torch.randint(3, vocab_size, (batch, seq_len), device=device)
    attention_mask = torch.ones_like(input_ids)
    if batch > 1:
        attention_mask[-1, seq_len - seq_len // 4 :] = 0
    labels = torch.where(torch.rand(batch, seq_len, device=device) < 0.15, input_ids, -100).masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def compile_timings(
    method: str,
    seq_len: int,
    *,
    options: dict[str, Any] | None = None,
    train: bool = False,
    layers: int = 2,
    vocab_size: int = 1024,
    arch: str = "roberta",
    batch: int = 2,
    device: str = "cpu",
    dtype: str = "fp32",
    repeats: int = 3,
    warmup: int = 1,
) -> dict[str, float]:
    """Seconds of one call of the model eager (median of ``repeats`` after ``warmup``), of the first
    call of ``torch.compile(model)`` (compilation included) and of a steady-state compiled call
    (median); the call is an inference forward, or with ``train`` a training step (forward,
    backward, AdamW step) on :func:`padded_batch`."""
    torch.manual_seed(0)
    model = build_mlm_model(method, seq_len, layers, vocab_size, options, arch).to(device).train(train)
    inputs = padded_batch(vocab_size, batch, seq_len, device)
    amp_dtype, dev = DTYPES[dtype], torch.device(device)

    def make_step(module: torch.nn.Module) -> Callable[[], None]:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5) if train else None

        def step() -> None:
            with torch.set_grad_enabled(train), torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
                loss = module(**inputs).loss
            if optimizer is not None:
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        return step

    eager = median_seconds(make_step(model), dev, repeats, warmup)
    compiled_step = make_step(torch.compile(model))
    synchronize(dev)
    start = time.perf_counter()
    compiled_step()
    synchronize(dev)
    first_call = time.perf_counter() - start
    return {
        "eager_s": eager,
        "first_compiled_call_s": first_call,
        "compiled_s": median_seconds(compiled_step, dev, repeats, warmup),
    }


def onnx_timings(
    method: str,
    seq_len: int,
    *,
    options: dict[str, Any] | None = None,
    int8: bool = False,
    layers: int = 2,
    vocab_size: int = 1024,
    arch: str = "roberta",
    batch: int = 1,
    device: str = "cpu",
    dtype: str = "fp32",
    repeats: int = 3,
    warmup: int = 1,
) -> dict[str, float]:
    """Seconds of one inference forward of the model in eager PyTorch and in ONNX Runtime (its
    export by :func:`serving.onnx.export_onnx`; with ``int8`` also its int8 model, quantized as
    ``export_onnx.py --int8`` does), medians of ``repeats`` calls after ``warmup``."""
    import tempfile

    from ...serving.encoding import INT8_FILE, ONNX_FILE, open_session
    from ...serving.onnx import export_onnx, quantize_int8

    torch.manual_seed(0)
    model = build_mlm_model(method, seq_len, layers, vocab_size, options, arch).eval()
    input_ids = torch.randint(3, vocab_size, (batch, seq_len))
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    with torch.no_grad():
        timings = {"eager_s": median_seconds(lambda: model(**inputs), torch.device("cpu"), repeats, warmup)}
    feed = {name: tensor.numpy() for name, tensor in inputs.items()}

    def served(path: str) -> float:  # the session (and its buffers) gone before the next one
        session = open_session(path, torch.get_num_threads())
        return median_seconds(lambda: session.run(None, feed), torch.device("cpu"), repeats, warmup)

    with tempfile.TemporaryDirectory() as folder:
        export_onnx(model, f"{folder}/{ONNX_FILE}", min(seq_len, 128))
        timings["onnxruntime_s"] = served(f"{folder}/{ONNX_FILE}")
        if int8:
            quantize_int8(f"{folder}/{ONNX_FILE}", f"{folder}/{INT8_FILE}")
            timings["onnxruntime_int8_s"] = served(f"{folder}/{INT8_FILE}")
    return timings


#: Documents of the mixed-length benchmark: the first offline Wikipedia articles (their token counts).
MIXED_DOCUMENTS = 32


def document_lengths(count: int, max_len: int) -> list[int]:
    """Token counts of the first ``count`` offline Wikipedia articles (``corpus.wikipedia_articles``)
    under MiniLM's WordPiece tokenizer, special tokens included, truncated at ``max_len``."""
    from transformers import AutoTokenizer

    from ...tasks.common.corpus import wikipedia_articles
    from ..minilm import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    encoded = tokenizer(wikipedia_articles()[:count], truncation=True, max_length=max_len)
    return [len(ids) for ids in encoded["input_ids"]]


def mixed_length_batches(lengths: list[int], batch: int, vocab_size: int, pad_token_id: int) -> tuple[list, list]:
    """Random documents of ``lengths`` tokens (15% of tokens after the first labelled), ``batch`` per
    step: (padded batches, each padded to its longest; packed batches, each one row from
    ``DataCollatorWithFlattening`` with the flash-attention keywords)."""
    from transformers import DataCollatorWithFlattening

    features = []
    for n in lengths:
        ids = torch.randint(3, vocab_size, (n,))
        labels = torch.where(torch.rand(n) < 0.15, ids, -100)
        labels[0] = -100  # the collator separates packed sequences there
        features.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
    groups = [features[i : i + batch] for i in range(0, len(features), batch)]
    packer = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    padded = []
    for group in groups:
        width = max(len(f["input_ids"]) for f in group)
        shape = (len(group), width)
        rows = {
            "input_ids": torch.full(shape, pad_token_id),
            "labels": torch.full(shape, -100),
            "attention_mask": torch.zeros(shape, dtype=torch.long),
        }
        for row, f in enumerate(group):
            n = len(f["input_ids"])
            rows["input_ids"][row, :n], rows["labels"][row, :n] = torch.tensor(f["input_ids"]), torch.tensor(f["labels"])
            rows["attention_mask"][row, :n] = 1
        padded.append(rows)
    return padded, [packer(group) for group in groups]


def mixed_length_timings(
    method: str,
    seq_len: int,
    *,
    lengths: list[int],
    options: dict[str, Any] | None = None,
    layers: int = 2,
    vocab_size: int = 1024,
    arch: str = "roberta",
    batch: int = 4,
    device: str = "cpu",
    dtype: str = "fp32",
    repeats: int = 1,
    warmup: int = 0,
) -> dict[str, float]:
    """Seconds to take documents of ``lengths`` tokens through the model ``batch`` at a time, padded and
    packed (:func:`mixed_length_batches`), as inference forwards and as training steps (medians of
    ``repeats`` passes over all documents after ``warmup``); and the largest difference between the
    eval logits of the two forms at the real tokens of the first batch (packing must not change them)."""
    torch.manual_seed(0)
    model = build_mlm_model(method, seq_len, layers, vocab_size, options, arch).to(device)
    dev, amp_dtype = torch.device(device), DTYPES[dtype]
    padded, packed = mixed_length_batches(lengths, batch, vocab_size, model.config.pad_token_id)
    padded, packed = (
        [{k: v.to(dev) if torch.is_tensor(v) else v for k, v in b.items()} for b in batches] for batches in (padded, packed)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def passes(batches: list[dict[str, Any]], train: bool) -> Callable[[], None]:
        def run() -> None:
            model.train(train)
            for inputs in batches:
                with torch.set_grad_enabled(train), torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
                    loss = model(**inputs).loss
                if train:
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)

        return run

    model.eval()
    with torch.no_grad():
        real = padded[0]["attention_mask"].bool()
        difference = (model(**packed[0]).logits[0] - model(**padded[0]).logits[real]).abs().max().item()
    timings = {
        f"{form}_{call}_s": median_seconds(passes(batches, call == "train"), dev, repeats, warmup)
        for call in ("forward", "train")
        for form, batches in (("padded", padded), ("packed", packed))
    }
    return {**timings, "max_abs_logit_difference": difference}
