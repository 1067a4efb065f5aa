#!/usr/bin/env bash
# The CUDA checks of ../shared/gpu-checklist.md in one time-boxed run, for a lent GPU machine that
# cannot download anything (Transformers and datasets travel as wheels; the model is built there).
#
#   scripts/gpu_check.sh prepare DIR      # here: wheels, a roberta-base-sized MLM config with the
#                                         # offline MiniLM tokenizer, offline Wikipedia text
#   scripts/gpu_check.sh run DIR OUT      # there: each stage under its own time limit, logs and
#                                         # tables in OUT/results.tgz (refreshed after every stage)
#
# Stages: CUDA tests (pytest --device cuda), attention and whole-model benchmarks against flash SDPA
# (mra2 with both backends), torch.compile, and a Trainer MLM at 4096 tokens with and without FSDP.
# STAGES=triton runs the stages of MRA-2's triton backend alone (limits adding up to 8 minutes): its CUDA tests,
# each launch of one call timed alone (with the selection's top-k and the pair lists' skew), the
# attention call (forward, forward+backward) and the 2-layer training step at 4k-32k tokens, batch 1
# and 8, beside pairs, flash SDPA and the vmean floor, and a profile of one step at 8192.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:?prepare DIR or run DIR OUT}
dir=${2:?DIR}

if [[ $mode == prepare ]]; then
  mkdir -p "$dir/model" "$dir/whl"
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$dir/whl" \
    "transformers==$(python -c 'import transformers; print(transformers.__version__)')" \
    "datasets==$(python -c 'import datasets; print(datasets.__version__)')" dill==0.4.1 multiprocess==0.70.19
  python scripts/prepare_wikipedia.py --output_dir "$dir/wikipedia"
  python - "$dir/model" <<'EOF'
import sys
import transformers
from hf_efficient_attn.tools.minilm import minilm_path

tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path())
tokenizer.model_max_length = 4096
tokenizer.save_pretrained(sys.argv[1])
# roberta-base's shape (12 layers, 768 hidden, 12 heads) with the MiniLM WordPiece vocabulary.
transformers.RobertaConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=4096 + 2,
                           pad_token_id=tokenizer.pad_token_id).save_pretrained(sys.argv[1])
EOF
  exit 0
fi

out=${3:?OUT}
results=/tmp/gpu_results
mkdir -p "$results"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$dir"/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

triton_stages="triton_tests triton_launches triton_attention triton_attention_pairs triton_model triton_profile"
all_stages="$triton_stages tests attention attention_gather attention_flex model mlm_mra2 mlm_mra2_fsdp model_flex mlm_sdpa
compile compile_forward compile_parts profile"
stages=" $(echo ${STAGES:-$all_stages}) "  # a subset: STAGES="tests profile"
stages=${stages/ triton / $triton_stages }

stage() {  # stage NAME SECONDS COMMAND...: run under a time limit, log, pack the results
  local name=$1 limit=$2; shift 2
  [[ $stages == *" $name "* ]] || return 0
  local start=$SECONDS
  echo "=== $name (limit ${limit}s)"
  timeout "$limit" "$@" >"$results/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start))s"
  tail -n 25 "$results/$name.log"
  find "$results" \( -name "*.safetensors" -o -name "*.bin" \) -delete  # trained weights stay there
  tar czf "$out/results.tgz" -C "$results" .
}

{ nvidia-smi; python3 -c "import torch, transformers, triton, accelerate; print(torch.__version__, torch.version.cuda,
transformers.__version__, triton.__version__, accelerate.__version__, torch.cuda.get_device_name())"; } >"$results/versions.txt" 2>&1
cat "$results/versions.txt" | tail -n 3

# MRA-2's triton backend first: its tests on CUDA (compiled kernels against pairs and fp64), then it
# beside pairs, flash SDPA and the vmean floor (docs/gpu.md, "MRA-2's triton backend").
triton='{"mra2": {"backend": "triton"}}'
pairs='{"mra2": {"backend": "pairs"}}'
long="--seq_lens 4096 8192 16384 32768"
bf16="python3 scripts/benchmark.py --device cuda --dtype bf16"
stage triton_tests 120 python3 -m pytest --device cuda -q -n 4 -p no:cacheprovider -m "not slow" --durations=10 \
  tests/methods/test_mra_triton.py tests/methods/test_mra.py
# Each launch of one call timed alone, the selection's top-k beside the int64 one it replaced, the pair lists' skew.
stage triton_launches 45 bash -c "set -e
  for n in 4096 8192 16384 32768; do python3 -m hf_efficient_attn.tools.triton_kernels --time --dtype bf16 --length \$n; done
  python3 -m hf_efficient_attn.tools.triton_kernels --time --dtype bf16 --length 8192 --batch 8"
stage triton_attention 90 bash -c "set -e
  $bf16 --methods mra2,vmean --attn_config '$triton' $long --output_dir $results/attention_triton
  $bf16 --methods mra2,vmean --attn_config '$triton' $long --forward_only --output_dir $results/attention_triton_forward
  $bf16 --methods mra2,vmean --attn_config '$triton' --batch 8 --seq_lens 4096 8192 16384 --output_dir $results/attention_triton_b8"
stage triton_attention_pairs 60 bash -c "set -e
  $bf16 --methods mra2 --attn_config '$pairs' $long --output_dir $results/attention_pairs
  $bf16 --methods mra2 --attn_config '$pairs' $long --forward_only --output_dir $results/attention_pairs_forward"
stage triton_model 120 bash -c "set -e
  $bf16 --model --methods mra2,vmean --attn_config '$triton' --rounds 1 --repeats 3 $long --output_dir $results/model_triton
  $bf16 --model --methods mra2,vmean --attn_config '$triton' --rounds 1 --repeats 3 --batch 8 --seq_lens 4096 8192 \
    --output_dir $results/model_triton_b8
  $bf16 --model --methods mra2 --attn_config '$pairs' --rounds 1 --repeats 3 $long --output_dir $results/model_pairs"
stage triton_profile 45 python3 - <<'EOF'
import torch
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.registry import build_method
from hf_efficient_attn.tools.benchmark.steps import model_step


def profiled(label, step):
    """Kernels, launches and GPU time of one call of ``step`` (after three warm-up calls)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"=== {label}: {sum(e.count for e in kernels)} kernel launches, GPU time "
          f"{sum(e.self_device_time_total for e in kernels) / 1000:.2f} ms")
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70))


profiled("training step, 2 layers, 8192 tokens, triton",
         model_step("mra2", 8192, layers=2, device="cuda", dtype="bf16", options={"backend": "triton"}))
for n in (8192, 32768):  # the attention call alone, forward and backward, bf16
    q, k, v = (torch.randn(1, 12, n, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    method = build_method("mra2", {"backend": "triton"}, AttentionShape(12, 64, max_seq_len=n)).cuda()
    profiled(f"attention forward+backward, {n} tokens, triton", lambda: method(q, k, v).sum().backward())
EOF

# Only the modules with device tests: the others import packages that machine may lack.
stage tests 100 python3 -m pytest --device cuda -q -n 8 -p no:cacheprovider --durations=10 \
  $(grep -rl --include="test_*.py" "pytest.mark.device" tests)
bench="python3 scripts/benchmark.py --device cuda --dtype bf16"
stage attention 75 $bench --methods mra2,mra2_s,nystromformer,vmean --seq_lens 1024 4096 8192 16384 32768 \
  --output_dir "$results/attention"
stage attention_gather 45 $bench --methods mra2 --attn_config '{"mra2": {"backend": "gather"}}' --seq_lens 4096 32768 \
  --output_dir "$results/attention_gather"
stage attention_flex 80 $bench --methods mra2 --attn_config '{"mra2": {"backend": "flex"}}' \
  --seq_lens 4096 8192 32768 --output_dir "$results/attention_flex"
stage model 80 $bench --model --methods mra2 --rounds 1 --repeats 3 --seq_lens 4096 8192 16384 32768 \
  --output_dir "$results/model"
[[ $stages == *" mlm_"* ]] && python3 - "$dir/model" <<'EOF'
import sys
import torch
import transformers

torch.manual_seed(0)
config = transformers.AutoConfig.from_pretrained(sys.argv[1])
transformers.AutoModelForMaskedLM.from_config(config).save_pretrained(sys.argv[1])
EOF
mlm=(scripts/pretrain_mlm.py --model_name_or_path "$dir/model" --train_file "$dir/wikipedia/train.jsonl"
     --max_seq_length 4096 --do_train --max_steps 30 --per_device_train_batch_size 1 --bf16 --learning_rate 1e-4
     --logging_steps 1 --save_strategy no --report_to none --seed 0 --skip_memory_metrics False)
stage mlm_mra2 75 python3 "${mlm[@]}" --attn_impl mra2 --output_dir "$results/mlm_mra2"
stage mlm_mra2_fsdp 75 accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 1 \
  --fsdp_transformer_layer_cls_to_wrap RobertaLayer "${mlm[@]}" --attn_impl mra2 --output_dir "$results/mlm_mra2_fsdp"
stage model_flex 60 $bench --model --methods mra2 --attn_config '{"mra2": {"backend": "flex"}}' --rounds 1 \
  --repeats 3 --seq_lens 8192 32768 --output_dir "$results/model_flex"
stage mlm_sdpa 60 python3 "${mlm[@]}" --output_dir "$results/mlm_sdpa"
stage compile 80 $bench --compile --train --methods mra2 --seq_lens 4096 --repeats 3 --output_dir "$results/compile"
stage compile_forward 60 $bench --compile --methods mra2 --seq_lens 4096 --repeats 3 --output_dir "$results/compile_forward"
stage profile 40 python3 - <<'EOF'
import time
import torch
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.registry import build_method
from hf_efficient_attn.tools.benchmark.steps import model_step

for backend in ("pairs", "gather"):  # one roberta-base-width layer, its training step
    step = model_step("mra2", 4096, layers=1, device="cuda", dtype="bf16", options={"backend": backend})
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    print(f"=== {backend}: one step {1000 * (time.perf_counter() - start):.1f} ms")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"=== {backend}: {sum(e.count for e in kernels)} kernels, device time "
          f"{sum(e.self_device_time_total for e in kernels) / 1000:.1f} ms")
    print(events.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=60))
for n in (8192, 32768):  # the attention alone, forward and backward, bf16
    q, k, v = (torch.randn(1, 12, n, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    method = build_method("mra2", {}, AttentionShape(12, 64, max_seq_len=n)).cuda()
    for _ in range(3):
        method(q, k, v).sum().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        method(q, k, v).sum().backward()
        torch.cuda.synchronize()
    events = prof.key_averages()
    print(f"=== attention n={n}: device time {sum(e.self_device_time_total for e in events) / 1000:.1f} ms")
    print(events.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=70))
print(events.table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
EOF
stage compile_parts 100 python3 - <<'EOF'
# Which part of the mra2 method Inductor's CUDA code generation fails on (torch 2.11 raised
# "TypeError: list indices must be integers or slices, not NoneType" in get_block_shape for the
# compiled mra2 model), and whether a Triton setting avoids it.
import traceback
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from hf_efficient_attn.methods.mra import low_resolution, pairs, selection
from hf_efficient_attn.methods.base import AttentionShape
from hf_efficient_attn.registry import build_method

torch.manual_seed(0)
n, heads, dim = 4096, 12, 64
mask = torch.ones(2, n, dtype=torch.bool, device="cuda")
mask[1, 3000:] = False
q, k, v = (torch.randn(2, heads, n, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
blocks = [t.detach().float().unflatten(2, (-1, 32)) for t in (q, k, v)]
stats = selection.block_stats(*blocks, mask, dim**-0.5)
selected = selection.select_blocks(stats.logits, stats.counts, 4)
methods = {b: build_method("mra2", {"backend": b}, AttentionShape(heads, dim, max_seq_len=n)).cuda()
           for b in ("pairs", "gather")}
parts = {
    "method pairs forward": lambda: methods["pairs"](q.detach(), k.detach(), v.detach(), mask),
    "method pairs train": lambda: methods["pairs"](q, k, v, mask).float().sum().backward(),
    "method gather train": lambda: methods["gather"](q, k, v, mask).float().sum().backward(),
    "block_stats": lambda: selection.block_stats(*blocks, mask, dim**-0.5),
    "select_blocks": lambda: selection.select_blocks(stats.logits, stats.counts, 4),
    "low_resolution train": lambda: sum(t.sum() for t in low_resolution.low_resolution_attention(
        selection.BlockStats(stats.counts, *(t.clone().requires_grad_() for t in stats[1:4]), stats.logits), selected,
        dim**-0.5)).backward(),
    "pair_attention train": lambda: pairs.pair_attention(
        *(t.to(torch.bfloat16).requires_grad_() for t in blocks), selected, dim**-0.5, mask,
        max_pairs=4 * n // 32).float().sum().backward(),
}
settings = {"default": {}, "no nd tiling": {"triton.prefer_nd_tiling": False, "triton.use_block_ptr": False},
            "no tensor descriptors": {"triton.use_tensor_descriptor": False}}
for name, fn in parts.items():
    for setting, options in settings.items():
        torch._dynamo.reset()
        try:
            with inductor_config.patch(options):
                torch.compile(fn)()
            print(f"=== {name} [{setting}]: OK", flush=True)
            break
        except Exception as error:
            print(f"=== {name} [{setting}]: FAIL {type(error).__name__}: {str(error).splitlines()[0][:200]}", flush=True)
            if setting == "default":
                traceback.print_exc(limit=-3)
EOF
tar czf "$out/results.tgz" -C "$results" .
