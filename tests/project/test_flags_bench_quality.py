"""Every flag of scripts/benchmark.py and scripts/quality.py reaches what it sets: the measuring and
loading functions are spied on (the shapes, threads, dtypes, repeats and texts they receive), nothing
is measured, and the tables are checked against the values the spies returned."""

import contextlib
import csv
import json
import statistics
from types import SimpleNamespace

import pytest
import torch

from hf_efficient_attn.tools.benchmark import cli as bench_cli
from hf_efficient_attn.tools.benchmark import processes, report
from hf_efficient_attn.tools.quality import cli as quality_cli
from hf_efficient_attn.tools.quality.embeddings import EmbeddingAgreement

# ----------------------------------------------------------------------------------- benchmark


@pytest.fixture
def measured(monkeypatch):
    """The benchmark with every measuring function spied on, in this process: records each step
    built (its kind and arguments), each timing (repeats, warm-up, device), each peak, the threads set
    and whether freed memory was kept; compile and ONNX timings are taken from ``seconds[method, n]``,
    one entry per round, in turn."""
    seen = SimpleNamespace(steps=[], timed=[], peaks=[], threads=[], kept=[], seconds={})

    def builder(kind):
        def build(method, seq_len, **kwargs):
            seen.steps.append(dict(kind=kind, method=method, seq_len=seq_len, **kwargs))
            return lambda: None

        return build

    def timings(kind):
        def measure(method, seq_len, **kwargs):
            seen.steps.append(dict(kind=kind, method=method, seq_len=seq_len, **kwargs))
            return seen.seconds[method, seq_len].pop(0)

        return measure

    monkeypatch.setattr(processes, "attention_step", builder("attention"))
    monkeypatch.setattr(processes, "model_step", builder("model"))
    for kind in processes.TIMINGS:
        monkeypatch.setitem(processes.TIMINGS, kind, timings(kind))
    monkeypatch.setattr(
        processes,
        "median_seconds",
        lambda step, device, repeats, warmup: seen.timed.append(dict(device=device, repeats=repeats, warmup=warmup)) or 0.5,
    )
    monkeypatch.setattr(processes, "call_peak_mb", lambda step, device: seen.peaks.append(device) or 10.0)
    monkeypatch.setattr(processes, "keep_freed_memory", lambda: seen.kept.append(True))
    monkeypatch.setattr(processes, "return_freed_memory", lambda: True)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.threads.append(n))
    monkeypatch.setattr(processes, "measure_in_fresh_process", lambda job: (processes.measure_request(job), 0))
    monkeypatch.setattr(report, "plot", lambda measurements, path, title: path.write_text("png"))
    return seen


def test_attention_benchmark_flags_reach_each_call(measured, tmp_path):
    """--methods, --attn_config, --seq_lens, --batch, --heads, --head_dim, --dtype, --repeats, --warmup,
    --rounds, --threads and --output_dir of the attention benchmark, all away from their defaults."""
    bench_cli.main(
        [
            "--methods",
            "mra2",
            "--attn_config",
            '{"mra2": {"block_per_row": 2}}',
            "--seq_lens",
            "32",
            "48",
            "--batch",
            "3",
            "--heads",
            "5",
            "--head_dim",
            "16",
            "--dtype",
            "bf16",
            "--repeats",
            "4",
            "--warmup",
            "2",
            "--rounds",
            "2",
            "--threads",
            "3",
            "--glibc_malloc",
            "--output_dir",
            str(tmp_path),
        ]
    )
    jobs = {(s["method"], s["seq_len"], s["backward"]) for s in measured.steps}
    assert jobs == {(m, n, b) for m in ("softmax", "mra2") for n in (32, 48) for b in (False, True)}
    for step in measured.steps:
        assert step["kind"] == "attention" and (step["batch"], step["heads"], step["head_dim"]) == (3, 5, 16)
        assert (step["dtype"], step["device"]) == ("bf16", "cpu")
        assert step["options"] == ({"block_per_row": 2} if step["method"] == "mra2" else {})
    assert len(measured.timed) == 8 * 2 and len(measured.peaks) == 8  # time in each round, memory once
    assert all((t["repeats"], t["warmup"]) == (4, 2) for t in measured.timed)
    assert set(measured.threads) == {3} and not measured.kept
    assert {p.name for p in tmp_path.iterdir()} == {f"attention.{e}" for e in ("md", "csv", "json", "png")}
    assert "batch 3, 5 heads, head_dim 16" in (tmp_path / "attention.md").read_text()
    assert "glibc's default malloc" in (tmp_path / "attention.md").read_text()


def test_forward_only_measures_no_backward(measured, tmp_path):
    bench_cli.main(["--methods", "mra2", "--seq_lens", "32", "--forward_only", "--output_dir", str(tmp_path)])
    assert {s["backward"] for s in measured.steps} == {False} and len(measured.timed) == 2
    assert len(measured.kept) == 2  # each timing process keeps freed memory (no --glibc_malloc), none measuring memory


def test_device_cuda_reaches_the_steps_and_their_timing(measured, tmp_path, monkeypatch):
    """--device cuda: the steps are built there and timed with its synchronisation (CUDA faked)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    bench_cli.main(["--device", "cuda", "--methods", "mra2", "--seq_lens", "32", "--forward_only", "--output_dir", str(tmp_path)])
    assert {s["device"] for s in measured.steps} == {"cuda"}
    assert {t["device"].type for t in measured.timed} == {"cuda"} and {p.type for p in measured.peaks} == {"cuda"}


@pytest.mark.parametrize("glibc_malloc", [False, True])
def test_model_benchmark_flags_reach_each_step(measured, tmp_path, glibc_malloc):
    """--model builds training steps of --arch, --layers layers, --vocab_size, --batch rows; its timing
    keeps freed memory unless --glibc_malloc."""
    bench_cli.main(
        [
            "--model",
            "--methods",
            "mra2",
            "--seq_lens",
            "64",
            "--layers",
            "3",
            "--arch",
            "esm",
            "--vocab_size",
            "77",
            "--batch",
            "2",
            "--dtype",
            "fp16",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--rounds",
            "2",
            "--threads",
            "2",
            "--output_dir",
            str(tmp_path),
        ]
        + (["--glibc_malloc"] if glibc_malloc else [])
    )
    assert sorted(s["method"] for s in measured.steps) == sorted(["mra2", "sdpa", "vmean"] * 3)  # 2 times, 1 peak each
    for step in measured.steps:
        assert step["kind"] == "model" and step["seq_len"] == 64
        assert (step["layers"], step["arch"], step["vocab_size"], step["batch"], step["dtype"]) == (3, "esm", 77, 2, "fp16")
    assert len(measured.timed) == 6 and all((t["repeats"], t["warmup"]) == (2, 1) for t in measured.timed)
    assert set(measured.threads) == {2}
    assert len(measured.kept) == (0 if glibc_malloc else 6)  # every timing process, none measuring memory
    assert "of an ESM-2-150M-width esm encoder, 3 layer(s)" in (tmp_path / "model_step.md").read_text()


def test_compile_benchmark_flags_and_table(measured, tmp_path):
    """--compile --train: every flag reaches compile_timings, and the table's ratios are the medians of
    the per-round ratios of the timings returned (compiled speed-up = eager / compiled; first call
    over SDPA's first call)."""
    sdpa = [dict(eager_s=1.0, first_compiled_call_s=10.0, compiled_s=0.5), dict(eager_s=1.2, first_compiled_call_s=12.0,
            compiled_s=0.4), dict(eager_s=0.9, first_compiled_call_s=30.0, compiled_s=0.3)]  # fmt: skip
    mra = [dict(eager_s=2.0, first_compiled_call_s=40.0, compiled_s=0.5), dict(eager_s=3.0, first_compiled_call_s=24.0,
           compiled_s=2.0), dict(eager_s=2.0, first_compiled_call_s=33.0, compiled_s=1.0)]  # fmt: skip
    measured.seconds.update({("sdpa", 40): list(sdpa), ("mra2", 40): list(mra)})
    bench_cli.main(
        [
            "--compile",
            "--train",
            "--methods",
            "mra2",
            "--attn_config",
            '{"mra2": {"block_per_row": 2}}',
            "--seq_lens",
            "40",
            "--layers",
            "3",
            "--vocab_size",
            "77",
            "--batch",
            "3",
            "--repeats",
            "2",
            "--warmup",
            "3",
            "--rounds",
            "3",
            "--threads",
            "2",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert [s["method"] for s in measured.steps] == ["sdpa", "mra2"] * 3
    for step in measured.steps:
        assert step["kind"] == "compile" and step["seq_len"] == 40 and step["train"] is True
        assert (step["layers"], step["vocab_size"], step["batch"], step["repeats"], step["warmup"]) == (3, 77, 3, 2, 3)
        assert step["options"] == ({"block_per_row": 2} if step["method"] == "mra2" else {})
    assert set(measured.threads) == {2}
    rows = {r["method"]: r for r in json.loads((tmp_path / "compile.json").read_text())["rows"]}
    mine = rows["mra2"]
    assert mine["call"] == "train step"
    assert mine["eager_ms"] == round(statistics.median(r["eager_s"] for r in mra) * 1000, 1) == 2000.0
    assert mine["compiled_ms"] == 1000.0 and mine["first_compiled_call_s"] == 33.0
    assert mine["compiled_speedup"] == statistics.median([2.0 / 0.5, 3.0 / 2.0, 2.0 / 1.0]) == 2.0
    assert mine["first_call_vs_sdpa"] == statistics.median([40 / 10, 24 / 12, 33 / 30]) == 2.0
    assert rows["sdpa"]["first_call_vs_sdpa"] == 1.0


def test_onnx_benchmark_flags_and_table(measured, tmp_path):
    """--onnx: every flag reaches onnx_timings (--int8 too), and ONNX Runtime's speed-up over SDPA is
    SDPA's time over the method's, its time over the vmean floor the method's over the floor's, each
    the median of the per-round ratios (>1 = the method is faster), for fp32 and for int8."""
    sdpa = [
        dict(eager_s=1.0, onnxruntime_s=0.8, onnxruntime_int8_s=0.6),
        dict(eager_s=1.0, onnxruntime_s=0.4, onnxruntime_int8_s=0.3),
    ]
    floor = [
        dict(eager_s=0.2, onnxruntime_s=0.1, onnxruntime_int8_s=0.05),
        dict(eager_s=0.2, onnxruntime_s=0.4, onnxruntime_int8_s=0.1),
    ]
    mra = [
        dict(eager_s=0.5, onnxruntime_s=0.2, onnxruntime_int8_s=0.1),
        dict(eager_s=0.7, onnxruntime_s=0.4, onnxruntime_int8_s=0.3),
    ]
    measured.seconds.update({("sdpa", 40): list(sdpa), ("vmean", 40): list(floor), ("mra2", 40): list(mra)})
    bench_cli.main(
        [
            "--onnx",
            "--methods",
            "mra2",
            "--seq_lens",
            "40",
            "--layers",
            "3",
            "--vocab_size",
            "77",
            "--batch",
            "2",
            "--repeats",
            "2",
            "--warmup",
            "3",
            "--rounds",
            "2",
            "--threads",
            "2",
            "--int8",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert [step["method"] for step in measured.steps] == ["sdpa", "vmean", "mra2"] * 2
    for step in measured.steps:
        assert step["kind"] == "onnx" and step["seq_len"] == 40 and step["int8"] is True
        assert (step["layers"], step["vocab_size"], step["batch"], step["repeats"], step["warmup"]) == (3, 77, 2, 2, 3)
    rows = {r["method"]: r for r in json.loads((tmp_path / "onnx.json").read_text())["rows"]}
    assert rows["mra2"]["eager_ms"] == 600.0 and rows["mra2"]["onnxruntime_ms"] == 300.0
    assert rows["mra2"]["onnxruntime_speedup_vs_sdpa"] == statistics.median([0.8 / 0.2, 0.4 / 0.4]) == 2.5
    assert rows["mra2"]["onnxruntime_over_vmean_floor"] == "+50%"  # median of 0.2 / 0.1 and 0.4 / 0.4
    assert rows["mra2"]["int8_ms"] == 200.0 and rows["mra2"]["int8_speedup_vs_sdpa"] == 3.5  # (6 + 1) / 2
    assert rows["mra2"]["int8_over_vmean_floor"] == "+150%"  # median of 0.1 / 0.05 and 0.3 / 0.1
    assert rows["sdpa"]["onnxruntime_speedup_vs_sdpa"] == rows["sdpa"]["int8_speedup_vs_sdpa"] == 1.0
    assert rows["vmean"]["onnxruntime_over_vmean_floor"] == rows["vmean"]["int8_over_vmean_floor"] == "+0%"
    text = (tmp_path / "onnx.md").read_text()
    assert "ONNX Runtime (CPU provider, 2 threads)" in text and "fp32 and int8" in text


def test_onnx_benchmark_without_int8_times_fp32_only(measured, tmp_path):
    """Without --int8 the jobs ask for no int8 model and the table has no int8 columns."""
    for method in ("sdpa", "vmean", "mra2"):
        measured.seconds[method, 40] = [dict(eager_s=1.0, onnxruntime_s=0.5)]
    bench_cli.main(["--onnx", "--methods", "mra2", "--seq_lens", "40", "--output_dir", str(tmp_path)])
    assert {step["int8"] for step in measured.steps} == {False}
    rows = json.loads((tmp_path / "onnx.json").read_text())["rows"]
    assert not any(key.startswith("int8") for row in rows for key in row)


@pytest.fixture
def busy_now(monkeypatch):
    """``[bool]``: whether the (faked) busy process of --competing_process is running now."""
    now = [False]

    @contextlib.contextmanager
    def competing(active):
        now[0] = active
        yield None
        now[0] = False

    monkeypatch.setattr(processes, "competing_process", competing)
    return now


def test_competing_process_times_each_onnx_job_again_beside_a_busy_process(measured, busy_now, tmp_path, monkeypatch):
    """--onnx --competing_process: each model's process runs a second time beside a busy process; its
    row gives the busy times and their ratio to the quiet ones (median of per-round ratios), and the
    speed-up over SDPA and the floor stay those of the quiet runs."""
    runs = []
    quiet = {"sdpa": (0.8, 0.4), "vmean": (0.1, 0.1), "mra2": (0.2, 0.4)}  # onnxruntime_s per round
    slowdown = {"sdpa": (1.5, 1.5), "vmean": (2.0, 2.0), "mra2": (3.0, 1.0)}
    for method in quiet:
        measured.seconds[method, 40] = [
            dict(eager_s=1.0, onnxruntime_s=quiet[method][r] * (slowdown[method][r] if busy else 1))
            for r in range(2)
            for busy in (False, True)
        ]
    original = processes.measure_request
    monkeypatch.setattr(processes, "measure_request", lambda job: runs.append(busy_now[0]) or original(job))
    argv = ["--onnx", "--methods", "mra2", "--seq_lens", "40", "--rounds", "2", "--output_dir", str(tmp_path)]
    bench_cli.main([*argv, "--competing_process"])
    assert runs == [False, True] * 6  # three models, quiet then busy, two rounds
    rows = {r["method"]: r for r in json.loads((tmp_path / "onnx.json").read_text())["rows"]}
    assert list(rows) == ["sdpa", "vmean", "mra2"]
    assert rows["mra2"]["onnxruntime_busy_ms"] == 500.0 and rows["mra2"]["onnxruntime_busy_slowdown"] == 2.0
    assert rows["sdpa"]["onnxruntime_busy_slowdown"] == 1.5 and rows["vmean"]["onnxruntime_busy_slowdown"] == 2.0
    assert rows["mra2"]["onnxruntime_speedup_vs_sdpa"] == 2.5 and rows["mra2"]["onnxruntime_over_vmean_floor"] == "+200%"
    assert "busy: beside one process spinning on a core" in (tmp_path / "onnx.md").read_text()


# ------------------------------------------------------------------------------------- quality


@pytest.fixture
def study(monkeypatch, tmp_path):
    """scripts/quality.py with the checkpoint, texts, capture and embedding comparison spied on: the
    error study runs for real on small random q, k, v; records what each function received."""
    seen = SimpleNamespace(loaded=[], articles=[], captured=[], evaluated=[], embedded=[], threads=[])

    class Loader:
        def __init__(self, kind):
            self.kind = kind

        def from_pretrained(self, path):
            seen.loaded.append((self.kind, path))
            return self

        def eval(self):
            return self

        def __call__(self, texts):  # a tokenizer: one token per word
            return {"input_ids": [text.split() for text in texts]}

    monkeypatch.setattr(
        quality_cli, "transformers", SimpleNamespace(AutoTokenizer=Loader("tokenizer"), AutoModel=Loader("model"))
    )

    def long_articles(tokenizer, seq_len, count):
        seen.articles.append((seq_len, count))
        return [(f"title {i}", f"text {i}") for i in range(count)]

    def capture(model, tokenizer, texts, seq_len):
        seen.captured.append((len(texts), seq_len))
        return [tuple(torch.randn(len(texts), 2, seq_len, 8) for _ in range(3))]

    evaluate = quality_cli.evaluate

    def evaluate_spy(layers, methods, **kwargs):
        seen.evaluated.append(dict(methods=list(methods), **{k: v for k, v in kwargs.items() if k != "progress"}))
        return evaluate(layers, methods, **kwargs)

    def agreement(methods, texts, *, model_path, attn_configs, batch_size, max_length):
        seen.embedded.append(dict(methods=list(methods), texts=len(texts), model_path=model_path, attn_configs=attn_configs))
        return [EmbeddingAgreement(m, 0.9, 0.8, 0.7, attn_configs.get(m, {})) for m in methods]

    monkeypatch.setattr(quality_cli, "long_articles", long_articles)
    monkeypatch.setattr(quality_cli, "capture_qkv", capture)
    monkeypatch.setattr(quality_cli, "evaluate", evaluate_spy)
    monkeypatch.setattr(quality_cli, "embedding_agreement", agreement)
    monkeypatch.setattr(quality_cli, "plot", lambda results, path: open(path, "w").close())
    corpus = [f"word {i} " * (i % 7 + 1) for i in range(100)]
    monkeypatch.setattr(quality_cli, "news_sentences", lambda: corpus)
    monkeypatch.setattr(quality_cli, "news_articles", lambda: corpus)
    monkeypatch.setattr(quality_cli, "wikipedia_articles", lambda min_words: corpus)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.threads.append(n))
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    seen.checkpoint, seen.out = str(checkpoint), tmp_path / "out"
    return seen


def test_quality_error_study_flags_reach_what_they_set(study):
    """--methods, --attn_config, --seq_lens, --model_name_or_path, --num_texts, --threads, --repeats,
    --output_dir of the error study; without --embeddings no embedding is compared."""
    quality_cli.main(
        [
            "--methods",
            "softmax,performer",
            "--attn_config",
            '{"performer": {"seed": 3}}',
            "--seq_lens",
            "32",
            "40",
            "--model_name_or_path",
            study.checkpoint,
            "--num_texts",
            "3",
            "--threads",
            "3",
            "--repeats",
            "2",
            "--output_dir",
            str(study.out),
        ]
    )
    assert study.loaded == [("tokenizer", study.checkpoint), ("model", study.checkpoint)]
    assert study.articles == [(32, 3), (40, 3)] and study.captured == [(3, 32), (3, 40)]
    assert study.evaluated == [dict(methods=["softmax", "performer"], attn_configs={"performer": {"seed": 3}}, repeats=2)] * 2
    assert study.threads == [3] and not study.embedded
    with open(study.out / "quality.csv") as f:
        assert {row["seq_len"] for row in csv.DictReader(f)} == {"32", "40"}
    assert {p.name for p in study.out.iterdir()} == {"quality.md", "quality.csv", "quality.png", "meta.json"}
    meta = json.loads((study.out / "meta.json").read_text())
    assert (meta["model"], meta["threads"], meta["attn_config"]) == (study.checkpoint, 3, {"performer": {"seed": 3}})


def test_quality_embedding_flags_reach_what_they_set(study):
    """--embeddings with --no_errors: no error study; --num_sentences news sentences, --num_articles
    news articles and 4 x --num_texts Wikipedia articles, each compared on --model_name_or_path with
    the --methods and their --attn_config."""
    quality_cli.main(
        [
            "--embeddings",
            "--no_errors",
            "--methods",
            "mra2,vmean",
            "--attn_config",
            '{"mra2": {"block_per_row": 2}}',
            "--model_name_or_path",
            study.checkpoint,
            "--num_sentences",
            "5",
            "--num_articles",
            "3",
            "--num_texts",
            "2",
            "--output_dir",
            str(study.out),
        ]
    )
    assert not study.evaluated and not study.captured
    assert [e["texts"] for e in study.embedded] == [5, 3, 8]
    for call in study.embedded:
        assert call["methods"] == ["mra2", "vmean"] and call["model_path"] == study.checkpoint
        assert call["attn_configs"] == {"mra2": {"block_per_row": 2}}
    assert {p.name for p in study.out.iterdir()} == {"quality.md", "embeddings.csv"}
    assert "block_per_row=2" in (study.out / "quality.md").read_text()


def test_quality_errors_on_by_default_and_embeddings_off(study):
    quality_cli.main(
        ["--methods", "softmax", "--seq_lens", "16", "--model_name_or_path", study.checkpoint, "--output_dir", str(study.out)]
    )
    assert len(study.evaluated) == 1 and not study.embedded
    assert study.evaluated[0]["repeats"] == 3 and study.articles == [(16, 4)] and study.threads == [2]


def test_competing_process_times_each_call_again_beside_a_busy_process(measured, busy_now, tmp_path, monkeypatch):
    """--competing_process: every call is timed quiet and beside a busy process (memory once, quiet);
    the table gives the busy time and its ratio to the quiet one."""
    timed_busy = []
    monkeypatch.setattr(
        processes,
        "median_seconds",
        lambda step, device, repeats, warmup: timed_busy.append(busy_now[0]) or (0.5 if busy_now[0] else 0.2),
    )
    argv = ["--methods", "mra2", "--seq_lens", "32", "--forward_only", "--output_dir", str(tmp_path)]
    rows = bench_cli.main([*argv, "--competing_process"])
    assert sorted(timed_busy) == [False, False, True, True]  # softmax and mra2, each quiet and busy
    assert len(measured.peaks) == 2
    assert [(row["fwd_ms"], row["fwd_busy_ms"], row["fwd_busy_slowdown"]) for row in rows] == [(200.0, 500.0, 2.5)] * 2
    timed_busy.clear()
    assert "fwd_busy_ms" not in bench_cli.main(argv)[0] and timed_busy == [False, False]
