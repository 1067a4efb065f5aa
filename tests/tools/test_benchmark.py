"""scripts/benchmark.py: the command line, the whole-model training step and the tables it derives
from measurements."""

import csv
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import hf_efficient_attn as hea
from hf_efficient_attn.integration.bridge import method_modules
from hf_efficient_attn.tools.benchmark import cli, processes, report, steps, timing
from hf_efficient_attn.tools.benchmark.processes import Measurement
from hf_efficient_attn.utils.cli_errors import run_cli


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--methods", "mra3"], "--methods: unknown method 'mra3'; known methods: informer, "),
        (["--methods", "sdpa"], "--methods: unknown method 'sdpa'"),  # Transformers' SDPA: whole-model benchmarks only
        (["--methods", "mra2,mra2"], "each method once"),
        (
            ["--methods", "mra2", "--attn_config", '{"mra2": {"block_per_rows": 2}}'],
            r"--attn_config 'mra2': unknown option\(s\) \['block_per_rows'\] for method 'mra2'; its options are",
        ),
        (["--methods", "mra2", "--attn_config", '{"mra2": {"backend": "fused"}}'], "--attn_config 'mra2': .*backend"),
        (["--methods", "mra2", "--attn_config", "mra2:block_per_row=2"], "--attn_config must be a JSON object such as"),
        (
            ["--methods", "mra2", "--attn_config", '{"block_per_row": 2}'],
            "--attn_config: 'block_per_row' is not a method of this run; its keys are: softmax, mra2",
        ),
        (["--methods", "mra2", "--attn_config", '{"mra2": 2}'], "the options of 'mra2' must be a JSON object"),
        (["--model", "--forward_only"], "--forward_only"),
        (["--dtype", "fp8"], "--dtype 'fp8': allowed: fp32, bf16, fp16"),
        (["--device", "tpu"], "--device 'tpu': allowed: cpu, cuda"),
        (["--layers", "0"], "--layers"),
        (["--seq_lens", "0"], "--seq_lens"),
        (["--threads", "0"], "--threads"),
        (["--model", "--rounds", "0"], "--rounds"),
        (["--model", "--warmup", "-1"], "--warmup"),
        (["--model", "--compile"], "four benchmarks"),
        (["--onnx", "--compile"], "four benchmarks"),
        (["--onnx", "--dtype", "bf16"], "--onnx times ONNX Runtime's CPU provider in fp32"),
        (["--train"], "--train applies to --compile"),
        (["--model", "--int8"], "--int8 applies to --onnx only"),
        (["--compile", "--forward_only"], "--forward_only"),
        (["--onnx", "--glibc_malloc"], "--glibc_malloc applies to --model and the attention benchmark on CPU only"),
        (["--model", "--competing_process"], "--competing_process applies to the attention benchmark and --onnx on CPU only"),
        (["--out_dir", "x"], r"unknown flag --out_dir \(did you mean --output_dir\?\)"),
        (["--methods", "mra2:block_per_row=2"], "unknown method 'mra2:block_per_row=2'"),  # the old spelling is gone
    ],
)
def test_bad_command_lines_are_one_error_line_before_anything_runs(argv, match, capsys, monkeypatch):
    """Every bad command line is one ``error:`` line naming what is allowed, exit status 2, no
    traceback, and nothing is measured."""
    monkeypatch.setattr(cli, "run", lambda args: pytest.fail("the benchmark ran"))
    with pytest.raises(SystemExit) as exit_info:
        run_cli(cli.main, argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert re.search(match, lines[0]), lines[0]


def test_methods_and_their_options_reach_the_jobs(monkeypatch):
    """--methods picks the methods measured beside the references, --attn_config their options (the
    others at their defaults), and every job carries its method's options to the measuring process."""
    jobs = []
    monkeypatch.setattr(cli, "measure_all", lambda js, rounds: jobs.extend(js) or [])
    monkeypatch.setattr(cli, "write_outputs", lambda *a: None)
    cli.main(
        [
            "--model",
            "--methods",
            "sdpa,mra2,nystromformer",
            "--seq_lens",
            "32",
            "--attn_config",
            '{"mra2": {"block_per_row": 2}, "vmean": {}}',
        ]
    )
    assert [job["method"] for job in jobs] == ["sdpa", "vmean", "mra2", "nystromformer"]
    assert [job["options"] for job in jobs] == [{}, {}, {"block_per_row": 2}, {}]
    jobs.clear()
    cli.main(["--methods", " yoso , softmax", "--seq_lens", "32", "--forward_only"])
    assert [job["method"] for job in jobs] == ["softmax", "yoso"]


def test_a_json_configuration_is_the_whole_command_line(tmp_path):
    """A single .json argument holds the flags (a list of methods, the options as an object)."""
    path = tmp_path / "benchmark.json"
    path.write_text(
        json.dumps(
            {
                "model": True,
                "methods": ["mra2"],
                "seq_lens": [64],
                "attn_config": {"mra2": {"block_per_row": 2}},
                "output_dir": str(tmp_path),
            }
        )
    )
    args = cli.parse_args([str(path)])
    assert args.measured == ["sdpa", "vmean", "mra2"] and args.method_configs == {"mra2": {"block_per_row": 2}}
    assert (args.seq_lens, args.rounds) == ([64], 3)
    path.write_text(json.dumps({"methods": ["mra2"], "attn_config": {"mra2": {"blocks": 2}}}))
    with pytest.raises(ValueError, match="unknown option"):
        cli.parse_args([str(path)])


def test_defaults_follow_the_benchmark():
    model = cli.parse_args(["--model"])
    assert model.seq_lens == [1024, 2048, 4096, 8192, 16384] and model.method_names == ["mra2", "mra2_s"]
    assert (model.rounds, model.repeats, model.warmup) == (3, 1, 2)
    attention = cli.parse_args([])
    assert attention.measured == ["softmax"] + [m for m in hea.list_methods() if m != "softmax"]
    assert (attention.rounds, attention.repeats, attention.warmup) == (1, 3, 1)
    compiled = cli.parse_args(["--compile"])
    assert compiled.seq_lens == [1024] and compiled.batch == 2 and not compiled.train
    assert cli.parse_args(["--compile", "--batch", "1"]).batch == 1 and attention.batch == 1
    served = cli.parse_args(["--onnx"])
    assert served.seq_lens == [1024, 4096, 8192, 16384] and served.batch == 1 and not served.int8
    assert served.measured == ["sdpa", "vmean", "mra2", "mra2_s"]
    assert model.measured == ["sdpa", "vmean", "mra2", "mra2_s"] and model.output_dir == "outputs/benchmark"


def test_compile_inputs_are_a_padded_batch():
    inputs = steps.padded_batch(64, 2, 16, "cpu")
    assert inputs["attention_mask"][0].all() and inputs["attention_mask"][1].sum() == 12
    assert (inputs["labels"][1, 12:] == -100).all()


def test_the_timed_calls_follow_the_warm_up_calls():
    """Only calls after ``warmup`` untimed ones are timed: a step slow on its first two calls is
    timed slow after one warm-up call and fast after two."""

    def step_slow_at_first():
        calls.append(1)
        if len(calls) <= 2:
            time.sleep(0.2)

    for warmup, slow in ((1, True), (2, False)):
        calls = []
        seconds = timing.median_seconds(step_slow_at_first, torch.device("cpu"), repeats=1, warmup=warmup)
        assert len(calls) == warmup + 1 and (seconds >= 0.2) == slow


def test_the_warm_up_reaches_the_measuring_process(monkeypatch):
    """--warmup travels from the command line through the job to the worker's timing."""
    jobs, warmups = [], []
    monkeypatch.setattr(cli, "measure_all", lambda js, rounds: jobs.extend(js) or [])
    monkeypatch.setattr(cli, "write_outputs", lambda *a: None)
    cli.run(cli.parse_args(["--model", "--seq_lens", "32", "--methods", "vmean", "--warmup", "3"]))
    assert jobs and {job["warmup"] for job in jobs} == {3}
    monkeypatch.setattr(processes, "median_seconds", lambda step, device, repeats, warmup: warmups.append(warmup))
    job = {**jobs[0], "layers": 1, "vocab_size": 64, "threads": 1, "measure": "time"}
    processes.measure_request(job)
    assert warmups == [3]


def test_cuda_attention_and_model_steps_are_measured_in_this_process():
    """A fresh process per CPU measurement (its resident set is the peak) and per compile job (no
    shared Inductor caches); on CUDA the allocator's peak counter is reset per measurement instead."""
    assert processes.in_this_process("attention", "cuda") and processes.in_this_process("model", "cuda")
    assert not processes.in_this_process("compile", "cuda")
    assert not any(processes.in_this_process(kind, "cpu") for kind in ("attention", "model", "compile", "onnx"))


def test_a_failed_timing_job_is_skipped_and_the_others_are_kept(monkeypatch):
    def measure(what, **job):
        if job["method"] == "mra2":
            raise RuntimeError(
                "compile benchmark (time) of mra2 at n=64 failed: \nTraceback (most recent call "
                "last):\n  File ...\nMemoryError: cannot allocate\n"
            )
        return {"eager_s": 1.0}, 0

    monkeypatch.setattr(processes, "measure_job", measure)
    jobs = [{"method": m, "seq_len": 64, "kind": "compile"} for m in ("sdpa", "mra2", "nystromformer")]
    assert processes.measure_timings(jobs, rounds=2) == (
        [[{"eager_s": 1.0}] * 2, [], [{"eager_s": 1.0}] * 2],
        {1: "MemoryError: cannot allocate"},
    )


def test_a_process_that_runs_the_machine_out_of_memory_is_stopped(monkeypatch):
    """A measuring process is killed, and its job reported as out of memory, once the machine's
    available memory falls under the floor (here at once), before the kernel's OOM killer acts."""
    monkeypatch.setattr(processes, "memory_available_mb", lambda: processes.MEMORY_FLOOR_MB - 1)
    job = {
        "kind": "onnx",
        "measure": "time",
        "method": "sdpa",
        "seq_len": 64,
        "device": "cpu",
        "repeats": 1,
        "warmup": 0,
        "threads": 1,
        "layers": 1,
        "vocab_size": 64,
    }
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="onnx benchmark .* of sdpa at n=64 failed: out of memory") as failure:
        processes.measure_in_fresh_process(job)
    assert time.perf_counter() - start < 5
    assert processes.skip_reason(failure.value) == "out of memory: stopped with under 1024 MB left on the machine"


def test_the_available_memory_is_the_kernels_estimate():
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    free_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / 2**20  # MemFree <= MemAvailable
    assert 0.9 * free_mb <= processes.memory_available_mb() <= total_mb


def test_an_onnx_job_that_failed_keeps_its_row_with_the_reason():
    """SDPA's export at a length the memory cannot hold: its row says why; the methods at that length
    keep their times and floor, without a speed-up over a reference that was not measured."""
    times = {"sdpa": 0.8, "vmean": 0.1, "mra2": 0.2}
    jobs = [{"method": m, "seq_len": n} for n in (64, 128) for m in times]
    results = [[dict(eager_s=1.0, onnxruntime_s=times[j["method"]])] for j in jobs]
    results[3] = []
    rows = report.onnx_table(jobs, results, {3: "out of memory: stopped with under 1024 MB left"})
    assert rows[3] == {"method": "sdpa", "n": 128, "skipped": "out of memory: stopped with under 1024 MB left"}
    assert rows[2]["onnxruntime_speedup_vs_sdpa"] == 4.0 and "onnxruntime_speedup_vs_sdpa" not in rows[5]
    assert rows[5]["onnxruntime_ms"] == 200.0 and rows[5]["onnxruntime_over_vmean_floor"] == "+100%"
    assert [(r["method"], r["n"]) for r in rows] == [(j["method"], j["seq_len"]) for j in jobs]


@pytest.mark.parametrize("int8", [False, True])
def test_the_onnx_job_times_the_int8_model_the_exporter_quantizes(int8, monkeypatch):
    """--int8 times a second session, on the int8 model that serving's own quantization writes from
    the export (the exporter and ONNX Runtime spied on: the wiring, not their speed)."""
    from hf_efficient_attn.serving import encoding, onnx

    exported, quantized, opened = [], [], []
    monkeypatch.setattr(onnx, "export_onnx", lambda model, path, seq_len: exported.append(path))
    monkeypatch.setattr(onnx, "quantize_int8", lambda path, output: quantized.append((path, output)))

    class Session:
        def __init__(self, path, threads):
            opened.append((os.path.basename(path), threads))

        def run(self, names, feed):
            assert feed["input_ids"].shape == (1, 32) and names is None

    monkeypatch.setattr(encoding, "open_session", Session)
    timings = steps.onnx_timings("vmean", 32, int8=int8, layers=1, vocab_size=64, repeats=1, warmup=0)
    assert [os.path.basename(p) for p in exported] == ["model.onnx"]
    threads = torch.get_num_threads()
    if int8:
        assert quantized == [(exported[0], exported[0].replace("model.onnx", "model_quantized.onnx"))]
        assert opened == [("model.onnx", threads), ("model_quantized.onnx", threads)]
        assert set(timings) == {"eager_s", "onnxruntime_s", "onnxruntime_int8_s"}
    else:
        assert not quantized and opened == [("model.onnx", threads)] and set(timings) == {"eager_s", "onnxruntime_s"}


def test_the_attention_step_back_propagates_a_dense_gradient(monkeypatch):
    """A real model hands attention a dense output gradient; ``out.sum()`` would hand it a
    broadcast one (stride 0), which takes other (slower or faster) paths in some methods."""
    grads, build = [], steps.build_method

    def build_and_watch(*args):
        module = build(*args)
        module.register_full_backward_hook(lambda mod, grad_in, grad_out: grads.append(grad_out[0]))
        return module

    monkeypatch.setattr(steps, "build_method", build_and_watch)
    steps.attention_step("softmax", seq_len=64, backward=True, heads=2, head_dim=8)()
    (grad,) = grads
    assert 0 not in grad.stride() and grad.std() > 0.5


@pytest.mark.parametrize("method", ["sdpa", "mra2"])
def test_the_model_step_trains_the_model_with_the_chosen_attention(method):
    options = None if method == "sdpa" else {"block_per_row": 2}
    model = steps.build_mlm_model(method, seq_len=96, layers=1, vocab_size=50, options=options)
    assert model.config.hidden_size == 768 and model.config.num_attention_heads == 12
    assert model.config.intermediate_size == 3072 and model.config.attention_probs_dropout_prob == 0.0
    if method == "sdpa":
        assert model.config._attn_implementation == "sdpa"
    else:
        assert model.config.attn_impl == "mra2" and model.config.attn_config["block_per_row"] == 2
    calls = []
    for module in method_modules(model):
        module.register_forward_hook(lambda *args: calls.append(1))
    # The measured step is a real training step: it moves the weights and clears the gradients,
    # and runs the chosen method (no method module at all for Transformers' SDPA).
    query = model.roberta.encoder.layer[0].attention.self.query.weight
    before = query.detach().clone()
    steps.mlm_training_step(model.train(), batch=2, seq_len=96)()
    assert not torch.equal(before, query) and query.grad is None
    assert len(calls) == (0 if method == "sdpa" else 1)


def test_call_peak_is_the_memory_a_call_needs_on_top_of_what_is_live():
    """In a fresh process (as the benchmark's workers): a step that holds 64 MiB of tensors at
    once (16 of 4 MiB) on top of 256 MiB kept alive peaks at 64 MiB, also after 256 MiB of 4 MiB
    tensors were freed before it (which glibc's heap would otherwise keep and hand out again)."""
    code = """
import json, torch
from hf_efficient_attn.tools.benchmark import timing
from hf_efficient_attn.utils import cpu_allocator
cpu_allocator.return_freed_memory()
kept = torch.ones(4 * 2**20)  # 16 MiB: once freed, glibc would raise its mmap threshold to this
del kept
kept = torch.ones(64 * 2**20)
garbage = [torch.ones(2**20) for _ in range(64)]
pin = torch.ones(2**20)  # above the garbage in the heap, so that freeing it does not shrink the heap
del garbage
def step():
    held = [torch.ones(2**20) for _ in range(16)]
print(json.dumps(timing.call_peak_mb(step, torch.device("cpu"))))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 62 <= json.loads(done.stdout.strip().splitlines()[-1]) <= 70


def fake(method, n, seconds, peak, mode="train step"):
    return Measurement(method, n, mode, seconds, peak, pids=[0, 0])


def test_model_step_table_ratios():
    measurements = [
        fake("sdpa", 4096, 4.0, 400.0),
        fake("vmean", 4096, 2.0, 300.0),
        fake("mra2", 4096, 2.2, 200.0),
        fake("mra2", 8192, 5.0, 500.0),
    ]
    rows = {(r["method"], r["n"]): r for r in report.model_step_table(measurements, batch=2)}
    mra = rows["mra2", 4096]
    assert mra["tokens_per_s"] == round(2 * 4096 / 2.2)
    assert mra["speedup_vs_sdpa"] == round(4.0 / 2.2, 2)
    assert mra["time_over_vmean_floor"] == "+10%"
    assert mra["peak_vs_sdpa"] == 0.5
    assert "speedup_vs_sdpa" not in rows["mra2", 8192]  # no reference measured at 8192


def test_ratios_pair_the_rounds_so_that_drift_between_rounds_cancels():
    """Round 1 ran on a slow machine, round 2 on a fast one, and round 3 caught the method alone in a
    slow spell: per round it was 10% over the floor twice, so the median ratio is +10%, while the
    ratio of the median times (3.0 s over 1.0 s) would say +200%."""
    floor = Measurement("vmean", 4096, "train step", 1.0, 1.0, [0] * 4, [3.0, 1.0, 1.0])
    mine = Measurement("mra2", 4096, "train step", 3.0, 1.0, [0] * 4, [3.3, 1.1, 3.0])
    sdpa = Measurement("sdpa", 4096, "train step", 2.0, 1.0, [0] * 4, [6.6, 2.2, 2.0])
    rows = {r["method"]: r for r in report.model_step_table([sdpa, floor, mine])}
    assert rows["mra2"]["time_over_vmean_floor"] == "+10%"
    assert rows["mra2"]["speedup_vs_sdpa"] == 2.0  # rounds: 2.0, 2.0, 0.67
    assert rows["mra2"]["step_s"] == 3.0  # the time itself is the median over the rounds


def test_attention_table_ratios():
    measurements = [
        fake("softmax", 1024, 0.2, 100.0, "forward"),
        fake("mra2", 1024, 0.05, 50.0, "forward"),
        fake("mra2", 1024, 0.1, 80.0, "forward+backward"),
    ]
    rows = {r["method"]: r for r in report.attention_table(measurements)}
    assert rows["mra2"]["fwd_speedup"] == 4.0 and rows["mra2"]["fwd_mem_ratio"] == 2.0
    assert rows["mra2"]["fwdbwd_ms"] == 100.0 and "fwdbwd_speedup" not in rows["mra2"]


@pytest.mark.slow
def test_model_benchmark_command_line_end_to_end(tmp_path):
    """The README's command at a tiny size: every measurement in its own fresh process, the table
    (md, csv) consistent with the raw measurements, and a plot."""
    # One length and one method: every measurement is a fresh process (9 here), the test's cost.
    cli.main(
        [
            "--model",
            "--methods",
            "mra2",
            "--attn_config",
            '{"mra2": {"block_per_row": 2}}',
            "--seq_lens",
            "64",
            "--layers",
            "1",
            "--vocab_size",
            "64",
            "--rounds",
            "2",
            "--output_dir",
            str(tmp_path),
        ]
    )
    measurements = [Measurement(**m) for m in json.loads((tmp_path / "model_step.json").read_text())]
    assert sorted((m.method, m.seq_len) for m in measurements) == sorted((s, 64) for s in ["sdpa", "vmean", "mra2"])
    pids = {pid for m in measurements for pid in m.pids}  # time in each of 2 rounds, memory once
    assert len(pids) == 3 * len(measurements) and processes.os.getpid() not in pids
    for m in measurements:
        assert len(m.round_seconds) == 2 and m.seconds == pytest.approx(sum(m.round_seconds) / 2)
    with open(tmp_path / "model_step.csv") as f:
        rows = list(csv.DictReader(f))
    by_key = {(m.method, m.seq_len): m for m in measurements}
    for row in rows:
        mine, ref = by_key[row["method"], int(row["n"])], by_key["sdpa", int(row["n"])]
        assert int(row["tokens_per_s"]) == round(mine.seq_len / mine.seconds)
        per_round = sorted(r / m for r, m in zip(ref.round_seconds, mine.round_seconds))
        assert float(row["speedup_vs_sdpa"]) == round(sum(per_round) / 2, 2)
    assert (tmp_path / "model_step.md").read_text().count("\n| ") == len(rows) + 1  # header + rows
    assert 'mra2 {"block_per_row": 2}' in (tmp_path / "model_step.md").read_text()  # the options in the title
    assert (tmp_path / "model_step.png").stat().st_size > 10_000


@pytest.mark.slow
def test_compile_benchmark_command_line_end_to_end(tmp_path):
    """--compile at a tiny size: eager, first compiled call and compiled times for SDPA and a method,
    the first call including compilation, and the ratios derived from the times."""
    cli.main(
        [
            "--compile",
            "--methods",
            "softmax",
            "--seq_lens",
            "64",
            "--layers",
            "1",
            "--vocab_size",
            "64",
            "--repeats",
            "1",
            "--output_dir",
            str(tmp_path),
        ]
    )
    rows = json.loads((tmp_path / "compile.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["sdpa", "softmax"] and {r["call"] for r in rows} == {"forward"}
    for row in rows:
        assert row["first_compiled_call_s"] * 1000 > row["compiled_ms"] > 0 and row["eager_ms"] > 0
        assert row["compiled_speedup"] == pytest.approx(row["eager_ms"] / row["compiled_ms"], rel=0.05)
    assert rows[0]["first_call_vs_sdpa"] == 1.0
    assert (tmp_path / "compile.md").read_text().count("\n| ") == len(rows) + 1


@pytest.mark.slow
def test_onnx_benchmark_command_line_end_to_end(tmp_path):
    """--onnx --int8 at a tiny size: eager, ONNX Runtime and int8 times for SDPA and the vmean floor,
    in fresh processes."""
    cli.main(
        [
            "--onnx",
            "--int8",
            "--methods",
            "vmean",
            "--seq_lens",
            "64",
            "--layers",
            "1",
            "--vocab_size",
            "64",
            "--rounds",
            "2",
            "--output_dir",
            str(tmp_path),
        ]
    )
    saved = json.loads((tmp_path / "onnx.json").read_text())
    rows, rounds = saved["rows"], saved["rounds"]
    assert [r["method"] for r in rows] == ["sdpa", "vmean"] and all(len(r) == 2 for r in rounds)
    for row, measured in zip(rows, rounds):
        assert row["onnxruntime_ms"] > 0 and row["eager_ms"] > 0 and row["int8_ms"] > 0
        assert row["onnxruntime_ms"] == round(
            sorted(m["onnxruntime_s"] for m in measured)[0] * 500 + sorted(m["onnxruntime_s"] for m in measured)[1] * 500, 1
        )
    sdpa, mine = rounds
    per_round = sorted(s["onnxruntime_s"] / m["onnxruntime_s"] for s, m in zip(sdpa, mine))
    assert rows[1]["onnxruntime_speedup_vs_sdpa"] == round(sum(per_round) / 2, 2)


def test_the_competing_process_spins_while_it_is_active_and_is_gone_after():
    with processes.competing_process(False) as none:
        assert none is None
    with processes.competing_process(True) as spinner:
        time.sleep(1.0)
        with open(f"/proc/{spinner.pid}/stat") as stat:
            user_ticks = int(stat.read().rsplit(")", 1)[1].split()[11])  # utime, field 14
    assert user_ticks / os.sysconf("SC_CLK_TCK") > 0.3 and spinner.poll() is not None


@pytest.mark.parametrize(
    ("arch", "model_class", "width"),
    [
        ("roberta", "RobertaForMaskedLM", (768, 12, 3072)),
        ("modernbert", "ModernBertForMaskedLM", (768, 12, 1152)),
        ("esm", "EsmForMaskedLM", (640, 20, 2560)),
        ("albert", "AlbertForMaskedLM", (768, 12, 3072)),
    ],  # fmt: skip
)
def test_arch_builds_that_model_type_at_its_checkpoints_width(arch, model_class, width):
    """--arch's encoder: the model type asked for, at the width of the checkpoint its table names (a type
    without one at roberta-base's), with the method patched in (ModernBERT's full layers only, ALBERT's one layer)."""
    from hf_efficient_attn.integration.bridge import method_modules
    from hf_efficient_attn.tools.benchmark.steps import build_mlm_model

    model = build_mlm_model("mra2", 256, layers=3, arch=arch)
    config = model.config
    assert type(model).__name__ == model_class
    assert (config.hidden_size, config.num_attention_heads, config.intermediate_size) == width
    assert len(method_modules(model)) == (1 if arch in ("modernbert", "albert") else 3)  # ALBERT: one shared layer
    assert arch != "esm" or config.position_embedding_type == "rotary"
