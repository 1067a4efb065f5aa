"""The seed papers' released checkpoints (saved by Transformers' Mra*, Yoso* and Nystromformer* classes)
through the plugin (integration/released.py, scripts/convert_checkpoint.py): loaded as BERT running the
method their config records, every weight mapped; equal to Transformers' models where those are right
(Nystromformer and YOSO-E unpadded; MRA with the plugin's attention inside Transformers' model, its
CUDA kernel unavailable here); and what Transformers' models do not do: padding, any length, packed
rows, one compiled graph. Tiny random models built with Transformers' own classes, no Hub."""

import json
import os
import shutil

import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file
from training_fixtures import read_json, small_tokenizer
from transformers.models.mra import modeling_mra

import hf_efficient_attn as hea
from hf_efficient_attn.integration import released as released_module
from hf_efficient_attn.integration.bridge import method_modules
from hf_efficient_attn.tasks.convert_released import main as convert_main
from hf_efficient_attn.utils.cli_errors import run_cli

COMMON = dict(
    vocab_size=800, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2,
)  # fmt: skip
#: Tiny configs of each format, and the method and options each must load as. MRA approximates
#: above 4 x 32 tokens (2 blocks per row here: above 64); Nystromformer's landmarks are means of
#: segment_means_seq_len / num_landmarks tokens.
RELEASED = {
    "mra": (T.MraConfig(**COMMON, max_position_embeddings=256, block_per_row=2), "mra2", {"block_per_row": 2}),
    "mra-sparse-priors": (
        T.MraConfig(
            **COMMON,
            max_position_embeddings=256,
            block_per_row=2,
            approx_mode="sparse",
            initial_prior_first_n_blocks=1,
            initial_prior_diagonal_n_blocks=3,
        ),  # fmt: skip
        "mra2_s",
        {"block_per_row": 2, "initial_prior_first_n_blocks": 1, "initial_prior_diagonal_n_blocks": 3},
    ),
    "yoso-e": (
        T.YosoConfig(**COMMON, max_position_embeddings=256, use_expectation=True, hash_code_len=7, conv_window=3),
        "yoso_e",
        {"hash_code_len": 7, "conv_window": 3, "gradient": "lower_bound"},
    ),
    "yoso": (
        T.YosoConfig(
            **COMMON, max_position_embeddings=128, use_expectation=False, num_hash=8, hash_code_len=6, use_fast_hash=False
        ),  # fmt: skip
        "yoso",
        {"hash_code_len": 6, "num_hash": 8, "use_fast_hash": False, "conv_window": None},
    ),
    "nystromformer": (
        T.NystromformerConfig(
            **COMMON, max_position_embeddings=64, segment_means_seq_len=64, num_landmarks=8, conv_kernel_size=5
        ),  # fmt: skip
        "nystromformer",
        {"num_landmarks": 8, "conv_kernel_size": 5, "pinv_coefficient": "heads"},
    ),
}
PREFIX = {"mra": "Mra", "yoso": "Yoso", "nystromformer": "Nystromformer"}
#: Transformers' heads that BERT computes the same way (the auto class, the head's class suffix).
HEADS = {
    "AutoModel": "Model",
    "AutoModelForMaskedLM": "ForMaskedLM",
    "AutoModelForTokenClassification": "ForTokenClassification",
    "AutoModelForQuestionAnswering": "ForQuestionAnswering",
}


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """``released(name, suffix="ForMaskedLM", **config) -> (folder, Transformers' model)``: a tiny
    checkpoint saved by Transformers' own class (random weights, seeded), with a tokenizer."""
    built = {}

    def build(name, suffix="ForMaskedLM", **overrides):
        key = (name, suffix, tuple(sorted(overrides.items())))
        if key not in built:
            config = T.AutoConfig.for_model(**{**RELEASED[name][0].to_dict(), **overrides})
            torch.manual_seed(0)
            model = getattr(T, PREFIX[config.model_type] + suffix)(config).eval()
            folder = tmp_path_factory.mktemp(name)
            model.save_pretrained(folder)
            small_tokenizer().save_pretrained(folder)
            built[key] = (str(folder), model)
        return built[key]

    return build


def outputs(model, **inputs):
    with torch.no_grad():
        result = model.eval()(**inputs)
    return [value for value in result.values() if torch.is_tensor(value) and value.is_floating_point()]


def assert_same_outputs(ours, theirs, **inputs):
    """Every output of Transformers' model (``theirs``) equals ours of that name (1e-4); BERT's base
    model also returns a pooler output, which the released models do not have."""
    with torch.no_grad():
        expected, actual = theirs.eval()(**inputs), ours.eval()(**inputs)
    assert [key for key in expected if torch.is_tensor(expected[key])], "nothing to compare"
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, atol=1e-4, rtol=1e-4, msg=key)


def ids(batch, length):
    return torch.randint(5, 800, (batch, length))


# ----------------------------------------------------------------------------- loaded as what they are


@pytest.mark.parametrize("name", RELEASED)
def test_loads_as_bert_running_the_recorded_method_with_every_weight_mapped(name, released):
    folder, _ = released(name)
    model, info = hea.AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True)
    _, method, options = RELEASED[name]
    assert model.config.model_type == "bert" and model.config.attn_impl == method
    assert {key: model.config.attn_config[key] for key in options} == options
    assert {type(m).name for m in method_modules(model)} == {method} and len(method_modules(model)) == 2
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert model.config.converted_from["model_type"] == RELEASED[name][0].model_type
    base, info = hea.AutoModel.from_pretrained(folder, output_loading_info=True)
    assert set(info["missing_keys"]) == {"pooler.dense.weight", "pooler.dense.bias"}  # BERT's, MraModel has none


def write_weights(state_dict, folder, name):
    """``state_dict`` saved in ``folder`` as ``name`` (one of released.WEIGHT_FILES): an ``.index.json``
    splits it into two shards, as ``save_pretrained(max_shard_size=...)`` does. Written here because
    Transformers 5's ``save_pretrained`` writes safetensors only, and released checkpoints come as both."""
    state_dict = {key: value.clone().contiguous() for key, value in state_dict.items()}  # tied weights apart
    save = save_file if ".safetensors" in name else torch.save
    if not name.endswith(".index.json"):
        return save(state_dict, os.path.join(folder, name))
    stem, suffix = name.removesuffix(".index.json").rsplit(".", 1)
    keys, weight_map = sorted(state_dict), {}
    for number, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :]), start=1):
        shard = f"{stem}-{number:05d}-of-00002.{suffix}"
        save({key: state_dict[key] for key in part}, os.path.join(folder, shard))
        weight_map.update(dict.fromkeys(part, shard))
    with open(os.path.join(folder, name), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


@pytest.mark.parametrize("weights", released_module.WEIGHT_FILES)
def test_every_weight_format_loads_the_same_weights(weights, released, tmp_path):
    """A released checkpoint saved as safetensors or pytorch_model.bin, whole or sharded (an index
    naming its shards), loads every weight it holds."""
    folder, original = released("mra")
    shutil.copy(os.path.join(folder, "config.json"), tmp_path)
    write_weights(original.state_dict(), str(tmp_path), weights)
    expected = hea.AutoModelForMaskedLM.from_pretrained(folder).state_dict()
    loaded = hea.AutoModelForMaskedLM.from_pretrained(str(tmp_path)).state_dict()
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(loaded[key], value, atol=0, rtol=0, msg=key)


@pytest.mark.parametrize("auto_class", ["AutoModelForSequenceClassification", "AutoModelForMultipleChoice"])
def test_a_released_masked_lm_gets_berts_new_task_heads(auto_class, released):
    """The released models are masked-LM checkpoints: a classifier or multiple-choice model built from
    one keeps every encoder weight and gets BERT's new head (and pooler); only the MLM head is unused."""
    folder, original = released("mra")
    model, info = getattr(hea, auto_class).from_pretrained(folder, output_loading_info=True)
    assert model.config.attn_impl == "mra2"
    assert set(info["missing_keys"]) == {
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
        "classifier.weight",
        "classifier.bias",
    }
    assert info["unexpected_keys"] and all(key.startswith("cls.predictions.") for key in info["unexpected_keys"])
    torch.testing.assert_close(model.bert.embeddings.word_embeddings.weight, original.mra.embeddings.word_embeddings.weight)


@pytest.mark.parametrize("auto_class", HEADS)
@pytest.mark.parametrize("name, length", [("nystromformer", 64), ("yoso-e", 100)])
def test_equals_transformers_where_transformers_is_right(name, length, auto_class, released):
    """Unpadded, one sequence (Transformers' Nystromformer takes the pseudo-inverse's coefficient over
    the whole batch) at the length Nystromformer's landmarks are cut for: every output equal (1e-4)."""
    folder, original = released(name, HEADS[auto_class])
    ours = getattr(hea, auto_class).from_pretrained(folder)
    assert_same_outputs(ours, original, input_ids=ids(1, length))


@pytest.mark.parametrize("auto_class", HEADS)
@pytest.mark.parametrize("name", ["mra", "mra-sparse-priors"])
def test_mra_equals_transformers_around_the_plugins_attention(name, auto_class, released, monkeypatch):
    """Transformers' MRA attention needs its CUDA kernel (without it the attention is zeros): with its
    self-attention computing the plugin's method on its own q, k, v, Transformers' embeddings,
    positions, layers and heads give the converted model's outputs."""
    folder, original = released(name, HEADS[auto_class])
    ours = getattr(hea, auto_class).from_pretrained(folder)
    method = method_modules(ours)[0]

    def plugin_attention(self, hidden_states, attention_mask=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
        q, k, v = (layer(hidden_states).view(shape).transpose(1, 2) for layer in (self.query, self.key, self.value))
        return (method(q, k, v).transpose(1, 2).reshape(*hidden_states.shape[:-1], -1),)

    monkeypatch.setattr(modeling_mra.MraSelfAttention, "forward", plugin_attention)
    assert_same_outputs(ours, original, input_ids=ids(2, 200))


# ----------------------------------------------------------------------------- better than the originals


@pytest.mark.parametrize("name", ["mra", "yoso-e", "nystromformer"])
def test_padded_batches_odd_lengths_and_packed_rows_give_each_sequence_its_own_outputs(name, released):
    """On CPU (MRA too), a padded batch and a packed row give each sequence its outputs alone, at
    lengths that are not multiples of MRA's blocks or of Nystromformer's landmarks; the method runs
    (the outputs differ from exact attention's)."""
    folder, _ = released(name)
    model = hea.AutoModel.from_pretrained(folder).eval()
    long, short = ids(1, 150 if name != "nystromformer" else 61)[0], ids(1, 97 if name != "nystromformer" else 43)[0]
    alone = [outputs(model, input_ids=s[None])[0][0] for s in (long, short)]
    batch = torch.stack([long, torch.cat([short, torch.ones(len(long) - len(short), dtype=torch.long)])])
    mask = torch.arange(len(long))[None] < torch.tensor([[len(long)], [len(short)]])
    padded = outputs(model, input_ids=batch, attention_mask=mask.long())[0]
    torch.testing.assert_close(padded[0], alone[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(padded[1, : len(short)], alone[1], atol=1e-4, rtol=1e-4)
    packed = T.DataCollatorWithFlattening()([{"input_ids": s.tolist()} for s in (long, short)])
    packed.pop("labels")
    torch.testing.assert_close(outputs(model, **packed)[0][0], torch.cat(alone), atol=1e-4, rtol=1e-4)
    exact = outputs(hea.patch_model(model, "softmax"), input_ids=long[None])[0][0]
    assert (exact - alone[0]).abs().max() > 1e-3, "the method cannot be told from exact attention"


@pytest.mark.slow  # 2 s; Nystromformer on BERT compiles in the default tier already (test_methods_compile)
def test_a_converted_model_compiles_in_one_graph(released):
    """Nystromformer with its convolution and the pseudo-inverse's coefficient over the heads, padded."""
    folder, _ = released("nystromformer")
    model = hea.AutoModel.from_pretrained(folder).eval()
    mask = torch.ones(2, 61, dtype=torch.long)
    mask[1, 40:] = 0
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(input_ids=ids(2, 61), attention_mask=mask)
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]


def test_another_method_runs_on_a_released_checkpoint(released):
    """attn_impl= names another method for a side-by-side: it runs; YOSO's convolution, which it has no
    place for, is reported left over."""
    folder, _ = released("yoso-e")
    model, info = hea.AutoModelForMaskedLM.from_pretrained(folder, attn_impl="mra2", output_loading_info=True)
    assert {type(m).name for m in method_modules(model)} == {"mra2"}
    assert info["unexpected_keys"] == {f"bert.encoder.layer.{i}.attention.self.efficient_attn.conv.weight" for i in range(2)}


# ----------------------------------------------------------------------------- what cannot be honoured


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("mra", {"approx_mode": "dense"}, r"^mra checkpoint: approx_mode='dense' is not one of MRA's \"full\""),
        ("yoso", {"lsh_backward": False}, r"^yoso checkpoint: lsh_backward=False \(hashed forward, backward through"),
        ("nystromformer", {"num_landmarks": 64}, r"^nystromformer checkpoint: num_landmarks=64 equals segment_means_seq_len"),
        ("mra", {"is_decoder": True}, r"^mra checkpoint: is_decoder=True makes a decoder"),
    ],
)
def test_a_setting_the_plugin_cannot_honour_is_one_error_naming_it(name, overrides, message, tmp_path):
    RELEASED[name][0].__class__(**{**RELEASED[name][0].to_dict(), **overrides}).save_pretrained(tmp_path)  # no weights needed
    with pytest.raises(ValueError, match=message):
        hea.AutoModelForMaskedLM.from_pretrained(str(tmp_path))


def test_an_unknown_weight_is_an_error_naming_it(released, tmp_path):
    folder, model = released("mra")
    weights = load_file(os.path.join(folder, "model.safetensors"))
    save_file({**weights, "mra.encoder.layer.0.attention.self.gate.weight": torch.ones(2)}, tmp_path / "model.safetensors")
    model.config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"weight 'mra.encoder.layer.0.attention.self.gate.weight' has no counterpart"):
        hea.AutoModelForMaskedLM.from_pretrained(str(tmp_path))


def test_a_trained_classification_head_is_refused_and_the_advice_works(released, tmp_path):
    """A fine-tuned MraForSequenceClassification's head (dense, gelu, projection) is not BERT's: refused
    for a classifier; the advice (load the encoder, save it, load that for a new head) gives one."""
    folder, original = released("mra", "ForSequenceClassification")
    with pytest.raises(ValueError, match="sequence classification head .* has no BERT counterpart"):
        hea.AutoModelForSequenceClassification.from_pretrained(folder)
    hea.AutoModel.from_pretrained(folder).save_pretrained(tmp_path)
    classifier, info = hea.AutoModelForSequenceClassification.from_pretrained(str(tmp_path), output_loading_info=True)
    assert classifier.config.attn_impl == "mra2" and "classifier.weight" in info["missing_keys"]
    encoder = original.mra.encoder.layer[1].output.dense.weight
    torch.testing.assert_close(classifier.bert.encoder.layer[1].output.dense.weight, encoder)


# ----------------------------------------------------------------------------- the conversion script


def test_convert_script_writes_a_variant_that_reloads_as_itself(released, tmp_path):
    folder, _ = released("nystromformer")
    out = tmp_path / "converted"
    report = convert_main(
        ["--model_name_or_path", folder, "--output_dir", str(out), "--base_model", "uw-madison/nystromformer-512"]
    )
    assert report.attn_impl == "nystromformer" and report.auto_class == "AutoModelForMaskedLM" and not report.new
    tokens = ids(1, 64)
    direct = outputs(hea.AutoModelForMaskedLM.from_pretrained(folder), input_ids=tokens)[0]
    for loaded in (hea.AutoModelForMaskedLM.from_pretrained(str(out)), T.AutoModelForMaskedLM.from_pretrained(str(out))):
        assert {type(m).name for m in method_modules(loaded)} == {"nystromformer"}
        torch.testing.assert_close(outputs(loaded, input_ids=tokens)[0], direct, atol=0, rtol=0)
    provenance = read_json(str(out), "provenance.json")
    assert provenance["base_model"] == "uw-madison/nystromformer-512"
    assert provenance["stages"][-1]["script"] == "convert_checkpoint.py"
    assert T.AutoTokenizer.from_pretrained(str(out)).vocab_size == 800


def test_convert_script_flags_choose_the_class_and_the_method(released, tmp_path):
    folder, _ = released("yoso-e")
    out = tmp_path / "base"
    report = convert_main(["--model_name_or_path", folder, "--output_dir", str(out), "--auto_class", "AutoModel",
                           "--attn_impl", "yoso_e", "--attn_config", '{"hash_code_len": 5}'])  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertModel"] and config["attn_config"]["hash_code_len"] == 5
    assert report.auto_class == "AutoModel" and set(report.new) == {"pooler.dense.weight", "pooler.dense.bias"}


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"--output_dir": "{nonempty}"}, "is not empty; give a new or empty folder"),
        ({"--auto_class": "AutoModelForCausalLM"}, "--auto_class 'AutoModelForCausalLM': allowed: AutoModel, "),
        ({"--attn_impl": "mra3"}, "unknown attention method 'mra3'"),
        ({"--model_name_or_path": "{bert}"}, "is a bert checkpoint; convert_checkpoint.py converts those saved by"),
    ],
)
def test_convert_script_refuses_bad_flags_in_one_line(flags, message, released, tmp_path, capsys):
    folder, _ = released("mra")
    (tmp_path / "nonempty").mkdir()
    (tmp_path / "nonempty" / "config.json").write_text("{}")
    T.BertConfig(**COMMON).save_pretrained(tmp_path / "bert")
    places = {"{nonempty}": str(tmp_path / "nonempty"), "{bert}": str(tmp_path / "bert")}
    given = {"--model_name_or_path": folder, "--output_dir": str(tmp_path / "out"), **flags}
    capsys.readouterr()  # what building the checkpoint printed
    with pytest.raises(SystemExit) as exit_:
        run_cli(convert_main, [part for flag, value in given.items() for part in (flag, places.get(value, value))])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and error.startswith("error: ") and error.count("\n") == 1 and message in error, error


# ----------------------------------------------------------------------------- everything a variant does


@pytest.mark.slow
def test_a_converted_checkpoint_fine_tunes_with_lora_and_exports_to_onnx_and_for_the_hub(released, tmp_path):
    """convert_checkpoint.py's folder, as any variant: finetune_glue.py trains a LoRA adapter on it with
    its method, export_onnx.py exports it equal to PyTorch, and push_to_hub.py's card names the released
    checkpoint as the base model."""
    from glue_fixtures import write_task_files

    from hf_efficient_attn.hub import cli as hub_cli
    from hf_efficient_attn.serving import cli as onnx_cli
    from hf_efficient_attn.tasks.common.provenance import card_metadata
    from hf_efficient_attn.tasks.glue import main as glue_main

    folder, _ = released("mra")
    converted = tmp_path / "converted"
    convert_main(["--model_name_or_path", folder, "--output_dir", str(converted), "--base_model", "uw-madison/mra-base-512-4"])
    files = write_task_files(str(tmp_path / "cola"), "cola")  # one sentence: the tiny MRA has one token type
    run = tmp_path / "lora"
    glue_main([
        "--model_name_or_path", str(converted), "--task_name", "cola", "--train_file", files["train"],
        "--validation_file", files["validation"], "--max_seq_length", "200", "--do_train", "--do_eval", "--max_steps", "2",
        "--per_device_train_batch_size", "4", "--peft", "lora", "--lora_r", "2", "--report_to", "none", "--use_cpu",
        "--output_dir", str(run),
    ])  # fmt: skip
    assert read_json(str(run), "eval_results.json")["eval_loss"] > 0
    assert json.loads((run / "adapter_config.json").read_text())["peft_type"] == "LORA"

    onnx_cli.main(["--model_dir", str(converted), "--output_dir", str(tmp_path / "onnx"), "--export_length", "200"])
    checks = json.loads((tmp_path / "onnx" / "onnx_validation.json").read_text())
    assert checks and all(diff <= 1e-4 for check in checks for diff in check["max_abs_diff"].values())

    hub_cli.main(["--model_dir", str(converted), "--repo_id", "someone", "--dry_run", str(tmp_path / "hub")])
    assert card_metadata(tmp_path / "hub")["base_model"] in ("uw-madison/mra-base-512-4", ["uw-madison/mra-base-512-4"])
    assert json.loads((tmp_path / "hub" / "config.json").read_text())["attn_impl"] == "mra2"
