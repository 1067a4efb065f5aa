"""The tools' defaults as their --help states them (tests/project/defaults_table.py): each tool runs without the
flag (or in its default mode) and what its help says happens is checked, the help text read here where
it holds a value. The measuring, exporting and training are spied on; the tools' own tests run them."""

from __future__ import annotations

import json
import os
import re
import types

import pytest
import torch
from defaults_table import help_statement, script_defaults
from flag_table import script_main

import hf_efficient_attn as hea
from hf_efficient_attn.tools.benchmark import cli as bench_cli
from hf_efficient_attn.tools.benchmark import processes

# ---- benchmark -----------------------------------------------------------------------------------

#: The benchmarks, each named by the flag that chooses it ("" for the default, the attention call).
BENCHMARKS = ["", "--model", "--compile", "--onnx", "--mixed_lengths"]
#: The flags whose help states a value per benchmark, and how a value reads in the help.
PER_BENCHMARK = ("methods", "seq_lens", "batch", "repeats", "warmup", "rounds")


def stated_value(flag: str, statement: str):
    """The value a help statement gives: a method list, a list of lengths, or a number."""
    if flag == "methods":
        listed = re.search(r"\(([\w,]+)\)", statement) or re.match(r"\s*([\w,]+)", statement)
        return listed.group(1).split(",")
    numbers = [int(n) for n in re.findall(r"\d+", statement.split("(")[0])]
    return numbers if flag == "seq_lens" else numbers[0]


def statement_for(flag: str, benchmark: str) -> str:
    """The case of ``flag``'s help that applies to ``benchmark``: the one naming its flag, else the first."""
    cases = [key for key in script_defaults("benchmark") if key.startswith(f"{flag} with ")]
    named = [key for key in cases if benchmark and benchmark in re.findall(r"--\w+", key)]
    return help_statement("benchmark", named[0] if named else flag)


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_benchmark_values_per_benchmark_are_those_its_help_states(benchmark):
    args = bench_cli.parse_args([benchmark] if benchmark else [])
    used = {"methods": args.method_names, "seq_lens": args.seq_lens, "batch": args.batch, "repeats": args.repeats,
            "warmup": args.warmup, "rounds": args.rounds}  # fmt: skip
    assert {flag: stated_value(flag, statement_for(flag, benchmark)) for flag in PER_BENCHMARK} == used
    assert set(args.method_names) <= set(hea.list_methods())


@pytest.fixture
def jobs(monkeypatch):
    """The jobs a benchmark run would measure (nothing is measured: the run stops there)."""
    seen = []

    class Stop(Exception):
        pass

    def record(jobs, rounds):
        seen.extend(jobs)
        raise Stop

    monkeypatch.setattr(bench_cli, "measure_all", record)
    monkeypatch.setattr(bench_cli, "measure_timings", record)
    return seen, Stop


def test_benchmark_default_is_the_attention_call_of_each_method_forward_and_backward(jobs, tmp_path):
    seen, stop = jobs
    statement = help_statement("benchmark", "(mode) default")
    assert "one attention call per method, forward and forward+backward" in statement
    with pytest.raises(stop):
        bench_cli.main(["--output_dir", str(tmp_path)])
    assert {job["kind"] for job in seen} == {"attention"}
    assert {(job["method"], job["backward"]) for job in seen} == {
        (method, backward) for method in ["softmax", *hea.list_methods()] for backward in (False, True)
    }


def test_benchmark_threads_default_to_torchs_and_a_method_left_out_of_attn_config_runs_at_its_defaults(
    jobs, tmp_path, monkeypatch
):
    seen, stop = jobs
    assert help_statement("benchmark", "threads") == "torch's default."
    assert "a method left out runs at its defaults" in help_statement("benchmark", "attn_config")
    with pytest.raises(stop):
        bench_cli.main(["--methods", "mra2,yoso", "--attn_config", '{"yoso": {"num_hash": 2}}', "--output_dir", str(tmp_path)])
    assert {job["threads"] for job in seen} == {None}
    assert {job["method"]: job["options"] for job in seen} == {"softmax": {}, "mra2": {}, "yoso": {"num_hash": 2}}
    # what a measuring process does with them: torch's threads left alone, the method at its defaults
    set_threads, built = [], []
    monkeypatch.setattr(torch, "set_num_threads", set_threads.append)
    monkeypatch.setattr(processes, "median_seconds", lambda step, device, repeats, warmup: step() or 0.1)
    attention_step = processes.attention_step

    def spy(**request):
        built.append(request)
        return attention_step(**request)

    monkeypatch.setattr(processes, "attention_step", spy)
    mra2 = next(job for job in seen if job["method"] == "mra2" and not job["backward"])
    request = {key: value for key, value in mra2.items() if key != "busy"}  # measure_job's own argument
    processes.measure_request({**request, "measure": "time", "seq_len": 64, "repeats": 1, "warmup": 0})
    assert set_threads == [] and built[0]["options"] == {}


def test_a_method_called_without_options_runs_its_papers_defaults():
    """What "at its defaults" means: no options = every option at hea.method_options' default."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 8) for _ in range(3))
    defaults = {name: option.default for name, option in hea.method_options("mra2").items()}
    torch.testing.assert_close(
        hea.efficient_attention(q, k, v, method="mra2"), hea.efficient_attention(q, k, v, method="mra2", **defaults)
    )


# ---- quality -------------------------------------------------------------------------------------


def test_quality_default_is_the_error_study_of_every_method_on_minilm(tmp_path, monkeypatch):
    """No flag: the error study alone, every method at its defaults, at each default length, on
    all-MiniLM-L6-v2 from pip (loading, capture and timing are spied on)."""
    from hf_efficient_attn.tools.quality import cli as quality_cli

    assert help_statement("quality", "(mode) default").strip().startswith("the error study alone")
    assert help_statement("quality", "model_name_or_path") == "all-MiniLM-L6-v2 from pip."
    assert "A method left out runs at its defaults." in help_statement("quality", "attn_config")
    assert stated_value("methods", help_statement("quality", "methods")) == hea.list_methods()
    seen = types.SimpleNamespace(loaded=[], evaluated=[], lengths=[], embedded=[])

    class Loader:
        def from_pretrained(self, path):
            seen.loaded.append(path)
            return self

        def eval(self):
            return self

    monkeypatch.setattr(quality_cli, "transformers", types.SimpleNamespace(AutoTokenizer=Loader(), AutoModel=Loader()))
    monkeypatch.setattr(quality_cli, "long_articles", lambda tokenizer, n, count: [("title", "text")] * count)

    def capture(model, tokenizer, texts, seq_len):
        seen.lengths.append(seq_len)
        return [tuple(torch.randn(1, 2, 16, 8) for _ in range(3))]

    def evaluate(layers, methods, attn_configs, repeats, progress):
        seen.evaluated.append((list(methods), attn_configs))
        return []

    monkeypatch.setattr(quality_cli, "capture_qkv", capture)
    monkeypatch.setattr(quality_cli, "evaluate", evaluate)
    monkeypatch.setattr(quality_cli, "embedding_agreement", lambda *a, **k: seen.embedded.append(a))
    monkeypatch.setattr(quality_cli, "_write_csv", lambda path, records: None)
    monkeypatch.setattr(quality_cli, "plot", lambda results, path: None)
    monkeypatch.setattr(quality_cli, "markdown_table", lambda results: "")
    monkeypatch.setattr(quality_cli, "check_claims", lambda results: [])
    monkeypatch.chdir(tmp_path)
    quality_cli.main([])

    minilm = quality_cli.minilm_path()
    assert seen.loaded == [minilm, minilm] and not seen.embedded
    defaults = quality_cli.QualityArguments()
    assert seen.lengths == defaults.seq_lens
    assert seen.evaluated == [(hea.list_methods(), {})] * len(defaults.seq_lens)


# ---- quickstart ----------------------------------------------------------------------------------


def shown_defaults(script: str) -> dict[str, str]:
    """Each flag's ``(default: X)`` as ``script --help`` shows it."""
    from test_cli_help import flag_helps, script_help

    _, parser = script_help(script)
    shown = {flag: re.search(r"\(default: (.*)\)$", text) for flag, text in flag_helps(parser).items()}
    return {flag.lstrip("-"): found.group(1) for flag, found in shown.items() if found}


def test_quickstart_without_flags_runs_each_step_with_the_defaults_its_help_shows(tmp_path, monkeypatch):
    from hf_efficient_attn.tools import quickstart

    statement = help_statement("quickstart", "(mode) default")
    assert statement == "with no flags, every step runs with the defaults shown below."
    shown = shown_defaults("quickstart")
    calls = {}

    def trained(name):
        def main(argv, callbacks=()):
            calls[name] = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag.startswith("--")}
            os.makedirs(calls[name]["--output_dir"])
            with open(os.path.join(calls[name]["--output_dir"], "all_results.json"), "w") as f:
                json.dump({"eval_accuracy": 0.5, "perplexity": 2.0, "eval_samples": 4}, f)

        return main

    def convert_to_long(*args, **kwargs):
        calls["convert"] = args
        return None, None, types.SimpleNamespace(lines=list)

    monkeypatch.setattr(quickstart, "write_wikipedia_jsonl", lambda folder: None)
    monkeypatch.setattr(quickstart.glue, "write_offline_sample", lambda name, folder: None)
    monkeypatch.setattr(quickstart, "convert_to_long", convert_to_long)
    monkeypatch.setattr(quickstart.mlm, "main", trained("mlm"))
    monkeypatch.setattr(quickstart.glue, "main", trained("glue"))
    monkeypatch.setattr(quickstart, "push_variant", lambda *args, **kwargs: None)
    monkeypatch.chdir(tmp_path)
    quickstart.main([])

    assert calls["convert"][1:] == (int(shown["max_length"]), shown["attn_impl"], {})
    assert calls["mlm"]["--max_seq_length"] == shown["max_length"] and calls["mlm"]["--max_steps"] == shown["mlm_steps"]
    assert calls["glue"]["--max_seq_length"] == shown["finetune_length"]
    assert calls["glue"]["--num_train_epochs"] == shown["finetune_epochs"]
    assert calls["glue"]["--output_dir"] == os.path.join(shown["output_dir"], "3-newsgroups")


# ---- export_onnx and encode_onnx -----------------------------------------------------------------


@pytest.fixture
def exported(tmp_path, monkeypatch):
    """A tiny masked-LM folder, and what export_onnx.py does with it: the export and the checks spied on."""
    import transformers as T
    from hub_fixtures import bert_tokenizer, tiny_config

    from hf_efficient_attn.serving import onnx as serving

    T.AutoModelForMaskedLM.from_config(tiny_config("bert")).save_pretrained(tmp_path / "model")
    bert_tokenizer().save_pretrained(tmp_path / "model")
    seen = types.SimpleNamespace(exported=[], checked=[], texts=[])
    monkeypatch.setattr(torch.onnx, "export", lambda model, args, path, kwargs, opset_version, **_: seen.exported.append(
        (type(model).__name__, opset_version)))  # fmt: skip
    monkeypatch.setattr(
        serving, "validate", lambda model, path, n, seed=0: seen.checked.append(n) or serving.Validation(n, {"logits": 0.0})
    )

    def validate_texts(model, folder, texts, length, file):
        seen.texts.append(length)
        return serving.TextValidation(file, len(texts), length, 0.0, min_cosine=1.0, mean_cosine=1.0)

    monkeypatch.setattr(serving, "validate_texts", validate_texts)
    monkeypatch.setattr(serving, "eager_kind", lambda model: "embeddings")
    (tmp_path / "texts.txt").write_text("the cat\nthe dog\n")
    seen.model, seen.texts_file = str(tmp_path / "model"), str(tmp_path / "texts.txt")
    return seen


def test_export_without_its_optional_flags_does_what_their_help_says(exported, tmp_path):
    assert help_statement("export_onnx", "opset") == "torch.onnx's."
    assert help_statement("export_onnx", "validation_length") == "the model's position table."
    assert help_statement("export_onnx", "task").startswith("the model with the head its config.json records")
    statement = help_statement("export_onnx", "check_lengths")
    assert statement.startswith("one, 1.5x --export_length + 1 (half of it + 1 when that exceeds the position table)")
    table = 128  # the tiny BERT's positions
    for export_length, other in ((48, 48 + 24 + 1), (100, 50 + 1)):  # 151 exceeds the table: half + 1
        exported.checked.clear()
        script_main("export_onnx")(["--model_dir", exported.model, "--output_dir", str(tmp_path / f"onnx{export_length}"),
                                    "--export_length", str(export_length), "--validation_file", exported.texts_file])  # fmt: skip
        assert exported.checked == [export_length, other] and other <= table
    assert exported.exported == [("BertForMaskedLM", None)] * 2  # the head it was saved with; torch's opset
    assert exported.texts == [table, table]


def test_encode_max_length_defaults_to_the_recorded_one_else_the_position_table(tmp_path, monkeypatch):
    from hub_fixtures import bert_tokenizer, tiny_config

    from hf_efficient_attn.serving import encoding

    assert help_statement("encode_onnx", "max_length") == "the model's sentence-transformers max_seq_length"
    assert help_statement("encode_onnx", "max_length with no sentence-transformers files") == "its position table."
    used = []

    class Stop(Exception):
        pass

    def tokenize(tokenizer, texts, max_length):
        used.append(max_length)
        raise Stop

    monkeypatch.setattr(encoding, "output_kind", lambda outputs: "embeddings")
    monkeypatch.setattr(encoding, "tokenize_counting_truncated", tokenize)
    monkeypatch.setattr(encoding, "open_session", lambda path, threads: types.SimpleNamespace(get_outputs=list))
    for name, recorded in (("plain", None), ("sentence", 40)):
        folder = tmp_path / name
        tiny_config("bert").save_pretrained(folder)
        bert_tokenizer().save_pretrained(folder)
        (folder / "model.onnx").write_bytes(b"")
        if recorded:
            (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": recorded}))
        with pytest.raises(Stop):
            script_main("encode_onnx")(["--export_dir", str(folder), "--texts", "the cat", "--output_file",
                                        str(tmp_path / "rows.npy")])  # fmt: skip
    assert used == [128, 40]
