"""glibc malloc settings for CPU training (hf_efficient_attn.utils.cpu_allocator), measured by the page
faults of a process that allocates and frees tensors, and where the package applies them."""

import json
import os
import platform
import subprocess
import sys

import pytest
from transformers import TrainingArguments

from hf_efficient_attn.tasks.common import driver
from hf_efficient_attn.tools.benchmark import cli, processes
from hf_efficient_attn.utils import cpu_allocator

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

FAULTS_OF_REUSED_TENSORS = """
import json, resource, sys, torch
from hf_efficient_attn.utils import cpu_allocator
applied = cpu_allocator.keep_freed_memory() if sys.argv[1] == "keep" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = [0] * 20
for i in range(20):
    before = faults()
    torch.ones(64 * 2**20 // 4)  # 64 MiB, above glibc's largest dynamic mmap threshold (32 MiB)
    counts[i] = faults() - before
print(json.dumps({"applied": applied, "faults": counts}))
"""


def faults_of_reused_tensors(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in cpu_allocator.USER_SETTINGS}
    done = subprocess.run(
        [sys.executable, "-c", FAULTS_OF_REUSED_TENSORS, mode], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_kept_memory_is_reused_without_page_faults():
    """A 64 MiB tensor's pages (16384 of 4 KiB) are faulted in on every one of 20 allocations by
    default; when freed memory is kept, only while the heap grows to hold it (the first few times:
    small allocations in between may take the start of a freed block), none in the last 10."""
    default = faults_of_reused_tensors("default")
    assert min(default["faults"]) > 10_000
    kept = faults_of_reused_tensors("keep")
    assert kept["applied"] and sum(kept["faults"][10:]) < 16384


def test_a_users_own_allocator_setting_is_left_alone():
    """With MALLOC_MMAP_THRESHOLD_ in the environment (here: glibc's usual 128 KiB), nothing is
    changed, and 64 MiB tensors are faulted in every time as the user asked. Seconds: glibc reads
    the variable when a process starts, so a fresh one imports the package."""
    chosen = faults_of_reused_tensors("keep", MALLOC_MMAP_THRESHOLD_="131072")
    assert not chosen["applied"] and min(chosen["faults"]) > 10_000


def test_training_scripts_keep_freed_memory_on_cpu(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(driver, "keep_freed_memory", lambda: calls.append(1) or True)
    driver.start_run(TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"))
    assert calls == [1]


@pytest.mark.parametrize("kind", ["model", "attention"])
@pytest.mark.parametrize("glibc_malloc", [False, True])
def test_benchmark_times_with_the_training_scripts_allocator(monkeypatch, glibc_malloc, kind):
    """The --model and attention timing processes keep freed memory as the training scripts do,
    unless --glibc_malloc; the memory process always returns freed memory (its peak would count it)."""
    calls = []
    monkeypatch.setattr(processes, "keep_freed_memory", lambda: calls.append("keep"))
    monkeypatch.setattr(processes, "return_freed_memory", lambda: calls.append("return") or True)
    sizes = dict(layers=1, vocab_size=64) if kind == "model" else dict(backward=False, heads=2, head_dim=8)
    job = dict(
        kind=kind,
        method="vmean",
        seq_len=32,
        **sizes,
        threads=1,
        repeats=1,
        warmup=1,
        device="cpu",
        dtype="fp32",
        batch=1,
        glibc_malloc=glibc_malloc,
    )
    processes.measure_request({**job, "measure": "time"})
    processes.measure_request({**job, "measure": "memory"})
    assert calls == (["return"] if glibc_malloc else ["keep", "return"])


def test_glibc_malloc_flag_is_for_the_model_and_attention_benchmarks_on_cpu():
    for other in (["--onnx"], ["--compile"], ["--mixed_lengths"]):
        with pytest.raises(ValueError, match="--glibc_malloc applies to --model and the attention benchmark on CPU only"):
            cli.parse_args([*other, "--glibc_malloc"])
    assert cli.parse_args(["--model", "--glibc_malloc", "--device", "cpu"]).glibc_malloc
    assert cli.parse_args(["--glibc_malloc"]).glibc_malloc


@pytest.mark.parametrize("variable, value", [("MALLOC_MMAP_THRESHOLD_", "131072"), ("MALLOC_TRIM_THRESHOLD_", "0"),
                                             ("MALLOC_TOP_PAD_", "0"), ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0"),
                                             ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")])  # fmt: skip
def test_each_way_a_user_chooses_the_allocator_is_left_alone(monkeypatch, variable, value):
    """glibc's variables, its tunables, and another allocator preloaded (jemalloc, tcmalloc): nothing is
    set through mallopt, and the call says so."""
    for name in cpu_allocator.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    calls = []
    monkeypatch.setattr(cpu_allocator, "_mallopt", lambda option, value: calls.append(option) or True)
    monkeypatch.setenv(variable, value)
    assert cpu_allocator.keep_freed_memory() is False and calls == []
    monkeypatch.delenv(variable)
    assert cpu_allocator.keep_freed_memory() is True and len(calls) == 2
