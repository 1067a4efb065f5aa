"""Each error that advises an alternative, triggered, then the advice taken exactly: the advised call or
flags go on and do what they should (tests/project/advice_table.py lists every advice and its test). Advice
that needs what this machine lacks (a GPU, the Hub, the network) is taken as far as it can be, and
the test says where it stops: here the training and comparison scripts' flags,
data and folders, converting checkpoints, WikiHop, the quality tool and the benchmark."""

import json
import os
import re
import shutil

import paths
import pytest
import torch
import transformers as T
from advice_table import normalized, raises
from glue_fixtures import write_task_files
from test_compare import arguments, workspace  # noqa: F401  (workspace: a fixture)
from test_quickstart import SETTINGS as QUICKSTART_SETTINGS
from test_reruns_refused import Stopped, stop_before_training
from training_fixtures import VOCAB, Captured, capture_trainer, save_tiny_mlm, write_news_files

import hf_efficient_attn as hea
from hf_efficient_attn.tasks import convert, glue
from hf_efficient_attn.tasks.common.driver import checkpoint_to_resume, mark_complete
from hf_efficient_attn.tasks.glue import GlueDataArguments
from hf_efficient_attn.tasks.mlm import compare, pretrain
from hf_efficient_attn.tools import quickstart
from hf_efficient_attn.tools.minilm import minilm_path

REPO = str(paths.REPO)


# ---- the training scripts: flags, data and folders ---------------------------------------------------


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """A tiny masked-LM checkpoint (130 positions) and real news text, one article per line."""
    root = tmp_path_factory.mktemp("advice_mlm")
    train, validation = write_news_files(str(root), train_articles=12, validation_articles=3)
    return {"root": root, "model": save_tiny_mlm(str(root / "tiny")), "train": train, "validation": validation}


def pretrain_flags(mlm, output_dir, *extra):
    return ["--model_name_or_path", mlm["model"], "--train_file", mlm["train"], "--validation_file", mlm["validation"],
            "--max_seq_length", "64", "--do_train", "--output_dir", str(output_dir), "--report_to", "none",
            "--use_cpu", *extra]  # fmt: skip


def captured(monkeypatch, main, argv):
    """What ``main(argv)`` would give its Trainer (it stops there)."""
    capture_trainer(monkeypatch)
    with pytest.raises(Captured) as captured:
        main(argv)
    return captured.value.kwargs


def test_misspelled_flag_advice(mlm, tmp_path, monkeypatch):
    """'did you mean --max_seq_length?': that flag is read."""
    argv = pretrain_flags(mlm, tmp_path)
    misspelled = [flag.replace("--max_seq_length", "--max_seq_lenght") for flag in argv]
    with raises(ValueError, "(did you mean --max_seq_length?)"):
        pretrain.main(misspelled)
    assert {len(row["input_ids"]) for row in captured(monkeypatch, pretrain.main, argv)["train_dataset"]} == {64}


def test_use_fast_tokenizer_false_advice(mlm, tmp_path, monkeypatch):
    """'leave the flag out, or give --tokenizer_name for another tokenizer': each runs with the tokenizer it names."""
    with raises(ValueError, "leave the flag out, or give --tokenizer_name for another tokenizer"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--use_fast_tokenizer", "false"))
    assert captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path))["processing_class"].is_fast
    other = tmp_path / "other-tokenizer"
    T.AutoTokenizer.from_pretrained(mlm["model"]).save_pretrained(other)
    (other / "marker").write_text("")  # the folder the tokenizer comes from, told apart from the model's
    kwargs = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--tokenizer_name", str(other)))
    assert kwargs["processing_class"].name_or_path == str(other)


def test_max_seq_length_beyond_the_table_advice(mlm, tmp_path, monkeypatch):
    """'stretch the checkpoint first: scripts/convert_to_long.py --max_length 256': the command it names, run
    on the checkpoint, gives one that trains on blocks of 256 tokens."""
    with raises(ValueError, "stretch the checkpoint first: scripts/convert_to_long.py --max_length 256") as refused:
        pretrain.main(pretrain_flags(mlm, tmp_path / "run", "--max_seq_length", "256"))
    advised = str(refused.value).split("stretch the checkpoint first: ")[1].split()
    assert advised[:3] == ["scripts/convert_to_long.py", "--max_length", "256"]
    convert.main(["--model_name_or_path", mlm["model"], *advised[1:], "--output_dir", str(tmp_path / "long")])
    flags = pretrain_flags(mlm, tmp_path / "run", "--max_seq_length", "256")
    flags[flags.index("--model_name_or_path") + 1] = str(tmp_path / "long")
    assert {len(row["input_ids"]) for row in captured(monkeypatch, pretrain.main, flags)["train_dataset"]} == {256}


def test_model_path_is_a_file_advice(mlm, tmp_path, monkeypatch):
    """'give a model folder or a Hub model id': the folder runs."""
    flags = pretrain_flags(mlm, tmp_path)
    flags[flags.index("--model_name_or_path") + 1] = os.path.join(mlm["model"], "config.json")
    with raises(ValueError, "is a file; give a model folder or a Hub model id"):
        pretrain.main(flags)
    assert captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path))["model"].config.vocab_size == VOCAB


def test_fp16_on_cpu_advice(mlm, tmp_path, monkeypatch):
    """'use --bf16 (CPU autocast) or no flag': the same flags with --bf16 reach the Trainer as bf16, and
    without either as fp32."""
    with raises(ValueError, "use --bf16 (CPU autocast) or no flag"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--fp16"))
    bf16 = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--bf16"))["args"]
    plain = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path))["args"]
    assert (bf16.bf16, bf16.fp16, plain.bf16, plain.fp16) == (True, False, False, False)


#: The module each ``--report_to`` tracker's availability check imports, where it is not the tracker's name.
TRACKER_MODULES = {"azure_ml": "azureml", "comet_ml": "comet_ml", "flyte": "flytekit"}
#: Distributions (PyPI) whose name is not their module's.
DISTRIBUTIONS = {"azureml": "azureml-core"}


def test_report_to_uninstalled_tracker_advice(mlm, tmp_path, monkeypatch):
    """'pip install X (or pip install -e .[train]), or pass --report_to none': X is the distribution of the
    module Transformers' availability check imports (the train extra lists it for TensorBoard), and
    --report_to none runs with no tracker."""
    import configparser

    from hf_efficient_attn.tasks.common.driver import check_report_to

    extras = configparser.ConfigParser()
    extras.read(os.path.join(REPO, "setup.cfg"))
    refused = {}
    for name in ("tensorboard", "wandb", "mlflow", "azure_ml", "comet_ml", "flyte", "clearml", "dvclive", "codecarbon"):
        try:
            check_report_to(T.TrainingArguments(output_dir=str(tmp_path), report_to=[name], use_cpu=True))
        except ValueError as err:  # not installed here
            refused[name] = str(err)
    assert "tensorboard" in refused
    for name, message in refused.items():
        advised = re.search(r"pip install (\S+?)[ ,]", message).group(1)
        module = TRACKER_MODULES.get(name, name)
        assert normalized(advised) == normalized(DISTRIBUTIONS.get(module, module)), (name, advised)
        assert message.endswith(", or pass --report_to none")
    assert "(or pip install -e '.[train]')" in refused["tensorboard"]
    assert [normalized(line) for line in extras["options.extras_require"]["train"].split()] == ["tensorboard"]
    assert captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--report_to", "none"))["args"].report_to == []


@pytest.mark.parametrize("script", ["pretrain_mlm", "convert_to_long", "quickstart"])
def test_output_dir_is_a_file_advice(mlm, tmp_path, monkeypatch, script):
    """'--output_dir X is a file; give a folder': a folder runs."""
    (tmp_path / "file").write_text("")
    if script == "pretrain_mlm":
        with raises(ValueError, "is a file; give a folder (new, or this run's to resume it)"):
            pretrain.main(pretrain_flags(mlm, tmp_path / "file"))
        kwargs = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path / "new"))
        assert kwargs["args"].output_dir == str(tmp_path / "new")
    elif script == "convert_to_long":
        flags = ["--model_name_or_path", mlm["model"], "--max_length", "256", "--output_dir"]
        with raises(ValueError, "is a file; give a folder"):
            convert.main([*flags, str(tmp_path / "file")])
        convert.main([*flags, str(tmp_path / "new")])
        assert T.AutoConfig.from_pretrained(tmp_path / "new").max_position_embeddings == 256
    else:
        with raises(ValueError, "is a file; give a folder"):
            quickstart.reusable_steps(str(tmp_path / "file"), quickstart.step_records(QUICKSTART_SETTINGS))
        assert quickstart.reusable_steps(str(tmp_path / "new"), quickstart.step_records(QUICKSTART_SETTINGS))[0] == []


def test_nothing_to_do_advice(mlm, tmp_path, monkeypatch):
    """'nothing to do: pass --do_train and/or --do_eval': either stage then runs."""
    flags = [flag for flag in pretrain_flags(mlm, tmp_path) if flag != "--do_train"]
    with raises(ValueError, "nothing to do: pass --do_train and/or --do_eval"):
        pretrain.main(flags)
    assert captured(monkeypatch, pretrain.main, [*flags, "--do_train"])["train_dataset"] is not None
    assert captured(monkeypatch, pretrain.main, [*flags, "--do_eval"])["eval_dataset"] is not None


def test_a_stage_without_its_split_advice(tmp_path, monkeypatch):
    """'--do_eval needs a validation split: give --validation_file or a dataset that has one': with the file,
    the run evaluates on its rows."""
    files = write_task_files(str(tmp_path / "cola"), "cola")
    model = save_tiny_mlm(str(tmp_path / "tiny"))
    flags = ["--model_name_or_path", model, "--task_name", "cola", "--train_file", files["train"], "--do_eval",
             "--max_seq_length", "64", "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--use_cpu"]  # fmt: skip
    with raises(ValueError, "--do_eval needs a validation split: give --validation_file or a dataset that has one"):
        glue.main(flags)
    evaluated = captured(monkeypatch, glue.main, [*flags, "--validation_file", files["validation"]])["eval_dataset"]
    assert len(evaluated) == 50


def test_too_few_rows_to_carve_a_validation_split_advice(mlm, tmp_path, monkeypatch):
    """'give --validation_file FILE (or raise --validation_split_percentage)': each gives an evaluation set;
    without --do_eval none is carved nor needed, and the run trains on every row."""
    (tmp_path / "four.txt").write_text("\n".join(open(mlm["train"]).read().splitlines()[:4]) + "\n")
    flags = [f for f in pretrain_flags(mlm, tmp_path, "--do_eval") if f not in ("--validation_file", mlm["validation"])]
    flags[flags.index("--train_file") + 1] = str(tmp_path / "four.txt")
    capture_trainer(monkeypatch)  # a run that goes on stops before training
    with raises(ValueError, "give --validation_file FILE (or raise --validation_split_percentage)"):
        pretrain.main(flags)
    for advice in (["--validation_file", mlm["validation"]], ["--validation_split_percentage", "50"]):
        assert len(captured(monkeypatch, pretrain.main, [*flags, *advice])["eval_dataset"]) > 0
    trained = captured(monkeypatch, pretrain.main, [f for f in flags if f != "--do_eval"])
    assert trained["eval_dataset"] is None and len(trained["train_dataset"]) > 0


def test_no_text_column_advice(mlm, tmp_path, monkeypatch):
    """'pass --text_column_name COLUMN': the column named is the text trained on (the blocks of the same
    articles as a .txt file)."""
    articles = open(mlm["train"]).read().splitlines()
    rows = [json.dumps({"id": i, "review": text}) for i, text in enumerate(articles)]
    (tmp_path / "reviews.jsonl").write_text("\n".join(rows) + "\n")
    flags = [f for f in pretrain_flags(mlm, tmp_path / "out") if f not in ("--validation_file", mlm["validation"])]
    as_text = captured(monkeypatch, pretrain.main, flags)["train_dataset"]
    flags[flags.index("--train_file") + 1] = str(tmp_path / "reviews.jsonl")
    with raises(ValueError, "pass --text_column_name COLUMN"):
        pretrain.main(flags)
    trained = captured(monkeypatch, pretrain.main, [*flags, "--text_column_name", "review"])["train_dataset"]
    assert [row["input_ids"] for row in trained.examples] == [row["input_ids"] for row in as_text.examples]


def test_text_shorter_than_one_block_advice(mlm, tmp_path, monkeypatch):
    """'give more text or a smaller --max_seq_length': either makes blocks."""
    (tmp_path / "short.txt").write_text(open(mlm["validation"]).read().split(".")[0] + ".\n")
    flags = [f for f in pretrain_flags(mlm, tmp_path / "out") if f not in ("--validation_file", mlm["validation"])]
    short = list(flags)
    short[short.index("--train_file") + 1] = str(tmp_path / "short.txt")
    with raises(ValueError, "give more text or a smaller --max_seq_length"):
        pretrain.main(short)
    assert len(captured(monkeypatch, pretrain.main, flags)["train_dataset"]) > 0  # more text
    smaller = [*short[: short.index("--max_seq_length")], "--max_seq_length", "8", *short[short.index("--max_seq_length") + 2 :]]
    assert len(captured(monkeypatch, pretrain.main, smaller)["train_dataset"]) > 0


def test_persistent_workers_advice(mlm, tmp_path, monkeypatch):
    """'leave it off': the masks change between epochs (the epoch reaches the dataset the loader reads)."""
    with raises(ValueError, "leave it off"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--dataloader_persistent_workers", "--dataloader_num_workers", "1"))
    args = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--dataloader_num_workers", "1"))["args"]
    assert not args.dataloader_persistent_workers


def test_mismatched_files_without_mnli_advice(tmp_path):
    """'add --task_name mnli': the mismatched file is then read as MNLI's."""
    files = write_task_files(str(tmp_path / "mnli"), "mnli")
    flags = ["--validation_file", files["validation"], "--validation_mismatched_file", files["validation_mismatched"]]
    with raises(ValueError, "add --task_name mnli"):
        GlueDataArguments(**dict(zip([f[2:] for f in flags[::2]], flags[1::2])))
    data = GlueDataArguments(task_name="mnli", validation_file=files["validation"],
                             validation_mismatched_file=files["validation_mismatched"])  # fmt: skip
    assert data.local_files()["validation_mismatched"] == files["validation_mismatched"]


def test_convert_into_a_folder_holding_a_model_advice(mlm, tmp_path):
    """'give a new folder, or delete that one first': either converts."""
    flags = ["--model_name_or_path", mlm["model"], "--max_length", "256", "--output_dir"]
    convert.main([*flags, str(tmp_path / "a")])
    with raises(ValueError, "give a new folder, or delete that one first"):
        convert.main([*flags, str(tmp_path / "a")])
    convert.main([*flags, str(tmp_path / "b")])
    shutil.rmtree(tmp_path / "a")
    convert.main([*flags, str(tmp_path / "a")])
    for folder in "ab":
        assert T.AutoConfig.from_pretrained(tmp_path / folder).max_position_embeddings == 256


def test_quickstart_into_someone_elses_folder_advice(tmp_path):
    """'give a new or empty folder': both are written into."""
    records = quickstart.step_records(QUICKSTART_SETTINGS)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("")
    with raises(ValueError, "give a new or empty folder"):
        quickstart.reusable_steps(str(tmp_path / "theirs"), records)
    (tmp_path / "empty").mkdir()
    for folder in ("new", "empty"):
        assert quickstart.reusable_steps(str(tmp_path / folder), records) == ([], f"writing into {tmp_path / folder}")


# ---- compare_methods -------------------------------------------------------------------------------------


def test_comparison_flags_advice(workspace, tmp_path, monkeypatch):
    """'list the methods in --methods', 'give --max_steps N', 'run the comparison as one process ..., not under
    torchrun': each advised command gets to its first stage (nothing trains: the stages are stopped)."""
    argv = arguments(workspace, tmp_path / "out")
    stop_before_training(monkeypatch)
    with raises(ValueError, "--attn_impl does not apply to a comparison: list the methods in --methods"):
        compare.main([*argv, "--attn_impl", "mra2"])
    with pytest.raises(Stopped):
        compare.main([*argv, "--methods", "linformer,softmax"])
    without_steps = argv[: argv.index("--max_steps")] + argv[argv.index("--max_steps") + 2 :]
    with raises(ValueError, "give --max_steps N: every method trains the same number of steps"):
        compare.main(without_steps)
    with pytest.raises(Stopped):
        compare.main([*without_steps, "--max_steps", "4"])
    with monkeypatch.context() as distributed:
        distributed.setattr(T.TrainingArguments, "world_size", property(lambda self: 2))
        with raises(ValueError, "run the comparison as one process (each method gets its own), not under torchrun"):
            compare.main(argv)
    with pytest.raises(Stopped):  # one process
        compare.main(argv)


def test_comparison_resume_from_checkpoint_advice(workspace, tmp_path, monkeypatch):
    """'rerun the same command, and each method resumes from its own last complete checkpoint': without
    --resume_from_checkpoint, each method's run resumes from its own folder's last complete checkpoint."""
    out = tmp_path / "out"
    argv = arguments(workspace, out) + ["--head_warmup_steps", "0"]
    for method, step in (("softmax", 4), ("linformer", 2)):
        (out / method / f"checkpoint-{step}").mkdir(parents=True)
        mark_complete(str(out / method / f"checkpoint-{step}"), step)
    stop_before_training(monkeypatch)
    with raises(ValueError, "rerun the same command, and each method resumes from its own last complete checkpoint"):
        compare.main([*argv, "--resume_from_checkpoint", str(out / "softmax" / "checkpoint-4")])
    resumed = {}
    monkeypatch.setattr(compare, "run_or_skip", lambda stage, description: resumed.update(
        {stage.name: checkpoint_to_resume(stage.training_args)}))  # fmt: skip
    monkeypatch.setattr(compare, "read_rows", lambda path: [])
    monkeypatch.setattr(compare, "method_line", lambda rows: "")
    monkeypatch.setattr(compare, "check_same_start", lambda *args: (_ for _ in ()).throw(Stopped("all stages")))
    with pytest.raises(Stopped):
        compare.main(argv)
    assert resumed == {"softmax": str(out / "softmax" / "checkpoint-4"), "linformer": str(out / "linformer" / "checkpoint-2")}


# ---- converting released checkpoints ------------------------------------------------------------------------


def test_convert_checkpoint_advice(mlm, tmp_path):
    """A BERT checkpoint given to convert_checkpoint.py: 'load other checkpoints with hf_efficient_attn.AutoModel*
    or stretch them with convert_to_long.py': both give a variant. A folder that is not empty: 'give a new or
    empty folder', into which it converts."""
    from hf_efficient_attn.tasks import convert_released

    with raises(ValueError, "load other checkpoints with hf_efficient_attn.AutoModel* or stretch them with convert_to_long.py"):
        convert_released.main(["--model_name_or_path", mlm["model"], "--output_dir", str(tmp_path / "refused")])
    assert hea.AutoModelForMaskedLM.from_pretrained(mlm["model"], attn_impl="mra2").config.attn_impl == "mra2"
    convert.main(["--model_name_or_path", mlm["model"], "--max_length", "256", "--attn_impl", "mra2", "--output_dir",
                  str(tmp_path / "long")])  # fmt: skip
    assert T.AutoConfig.from_pretrained(tmp_path / "long").attn_impl == "mra2"
    mra = tmp_path / "mra"
    torch.manual_seed(0)
    T.MraForMaskedLM(T.MraConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                 intermediate_size=48, max_position_embeddings=130)).save_pretrained(mra)  # fmt: skip
    T.AutoTokenizer.from_pretrained(mlm["model"]).save_pretrained(mra)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("")
    with raises(ValueError, "is not empty; give a new or empty folder"):
        convert_released.main(["--model_name_or_path", str(mra), "--output_dir", str(tmp_path / "full")])
    (tmp_path / "empty").mkdir()
    for folder in ("new", "empty"):
        convert_released.main(["--model_name_or_path", str(mra), "--output_dir", str(tmp_path / folder)])
        assert T.AutoConfig.from_pretrained(tmp_path / folder).attn_impl == "mra2"


# ---- WikiHop ------------------------------------------------------------------------------------------------


def test_wikihop_encoder_advice():
    """'call add_markers(tokenizer) first', and for a question that fills the window 'raise --max_seq_length':
    each then encodes the example."""
    from hf_efficient_attn.tasks.wikihop.data import ChunkEncoder, add_markers
    from hf_efficient_attn.tasks.wikihop.qangaroo import synthetic_examples

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    with raises(ValueError, "call add_markers(tokenizer) first"):
        ChunkEncoder(tokenizer, 128)
    add_markers(tokenizer)
    (example,) = synthetic_examples(1, seed=0)
    batch = {key: [value] for key, value in example.items()}
    with raises(ValueError, "; raise --max_seq_length"):
        ChunkEncoder(tokenizer, 12)(batch)
    encoded = ChunkEncoder(tokenizer, 128)(batch)
    assert encoded["labels"] == [example["candidates"].index(example["answer"])]


def test_real_wikihop_examples_missing_advice(tmp_path, monkeypatch):
    """'get it once with: pip download allennlp==0.9.0 --no-deps -d DIR': the command is pip's, and it puts the
    wheel where the examples are read (downloading needs the network: the file it would write is made here)."""
    from hf_efficient_attn.tasks.wikihop import qangaroo

    with pytest.raises(FileNotFoundError, match="get it once with: ") as missing:
        qangaroo.real_examples(str(tmp_path))
    command = str(missing.value).split("get it once with: ")[1].split()
    assert command[:4] == ["pip", "download", "allennlp==0.9.0", "--no-deps"] and command[4] == "-d"
    import zipfile

    wheel = os.path.join(command[5], qangaroo.ALLENNLP_WHEEL)
    assert os.path.basename(wheel).startswith("allennlp-0.9.0-")  # the file `pip download allennlp==0.9.0` writes
    written = tmp_path / os.path.basename(wheel)
    with zipfile.ZipFile(written, "w") as archive:
        archive.writestr(qangaroo.QANGAROO_FIXTURE, json.dumps([{"id": "WH_dev_0"}]))
    assert qangaroo.real_examples(str(tmp_path)) == [{"id": "WH_dev_0"}]


# ---- the quality tool ---------------------------------------------------------------------------------------


@pytest.mark.slow  # reads and tokenises the Wikipedia articles (5 s)
def test_quality_texts_advice():
    """'lower --num_texts or --seq_lens' and 'pass longer texts (e.g. wikipedia_articles(2000))': each finds them."""
    from hf_efficient_attn.tasks.common.corpus import wikipedia_articles
    from hf_efficient_attn.tools.quality.capture import long_articles, tokenize_windows

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    with raises(ValueError, "; lower --num_texts or --seq_lens"):
        long_articles(tokenizer, 4096, 200)
    assert len(long_articles(tokenizer, 4096, 1)) == 1 and len(long_articles(tokenizer, 512, 4)) == 4
    with raises(ValueError, "pass longer texts (e.g. wikipedia_articles(2000))"):
        tokenize_windows(tokenizer, ["a short text"], 512)
    ids, used = tokenize_windows(tokenizer, wikipedia_articles(2000)[:2], 512)
    assert ids.shape == (2, 512) and used == [0, 1]


def test_benchmark_flags_advice():
    """'give one of them' (two whole-model benchmarks), 'leave --device and --dtype at cpu / fp32' (--onnx) and,
    without a GPU, 'use --device cpu': each advised command line parses to what it asks."""
    from hf_efficient_attn.tools.benchmark.cli import parse_args

    with raises(ValueError, "are four benchmarks: give one of them"):
        parse_args(["--model", "--onnx"])
    assert parse_args(["--model"]).model and parse_args(["--onnx"]).onnx
    with raises(ValueError, "leave --device and --dtype at cpu / fp32"):
        parse_args(["--onnx", "--dtype", "bf16"])
    assert (parse_args(["--onnx"]).device, parse_args(["--onnx"]).dtype) == ("cpu", "fp32")
    if not torch.cuda.is_available():  # with a GPU, --device cuda is accepted: nothing to advise
        with raises(ValueError, "no CUDA device is available; use --device cpu"):
            parse_args(["--device", "cuda"])
    assert parse_args(["--device", "cpu"]).device == "cpu"


def test_no_dataset_advice(mlm, tmp_path, monkeypatch):
    """'give a dataset: --dataset_name NAME, or --train_file / --validation_file': the local files are read (a Hub
    dataset needs the network: the name is checked as far as the loader, which offline mode stops)."""
    data = ("--train_file", mlm["train"], "--validation_file", mlm["validation"])
    flags = [f for f in pretrain_flags(mlm, tmp_path) if f not in data]
    with raises(ValueError, "give a dataset: --dataset_name NAME, or --train_file / --validation_file"):
        pretrain.main(flags)
    assert len(captured(monkeypatch, pretrain.main, [*flags, "--train_file", mlm["train"]])["train_dataset"]) > 0
    with pytest.raises(Exception, match="offline|Offline|connect|internet") as offline:
        pretrain.main([*flags, "--dataset_name", "wikitext"])
    assert "give a dataset" not in str(offline.value)


def test_dataset_flags_that_contradict_advice(mlm, tmp_path, monkeypatch):
    """'--dataset_name and local files both name the data: give one of them' and '--dataset_config_name is a
    configuration of --dataset_name: give that too, or leave it out': the local files alone train; with a Hub
    dataset named the flags pass their check and the Hub loader is reached (offline mode stops it here)."""
    local = pretrain_flags(mlm, tmp_path)
    with raises(ValueError, "both name the data: give one of them"):
        pretrain.main([*local, "--dataset_name", "wikitext"])
    with raises(ValueError, "is a configuration of --dataset_name: give that too, or leave it out"):
        pretrain.main([*local, "--dataset_config_name", "wikitext-2-raw-v1"])
    assert len(captured(monkeypatch, pretrain.main, local)["train_dataset"]) > 0
    data = ("--train_file", mlm["train"], "--validation_file", mlm["validation"])
    hub = [*[f for f in local if f not in data], "--dataset_name", "wikitext", "--dataset_config_name", "wikitext-2-raw-v1"]
    with pytest.raises(Exception, match="offline|Offline|connect|internet") as offline:
        pretrain.main(hub)
    assert "give one of them" not in str(offline.value) and "give that too" not in str(offline.value)


def test_wikihop_padding_flags_advice():
    """'--pad_to_max_length and --padding_free: ... give one of them': either alone parses."""
    from hf_efficient_attn.tasks.wikihop.finetune import WikiHopDataArguments

    with raises(ValueError, "packed chunks have no padding; give one of them"):
        WikiHopDataArguments(pad_to_max_length=True, padding_free=True, dataset_name="wiki_hop")
    assert WikiHopDataArguments(pad_to_max_length=True, dataset_name="wiki_hop").pad_to_max_length
    assert WikiHopDataArguments(padding_free=True, dataset_name="wiki_hop").padding_free


def test_flags_the_scripts_would_not_honour_advice(mlm, tmp_path, monkeypatch):
    """--label_smoothing_factor: 'leave it at 0'; --prediction_loss_only: 'leave it off': so left, the run
    goes on with the scripts' own loss and scores predictions."""
    with raises(ValueError, "which Trainer does not smooth; leave it at 0"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--label_smoothing_factor", "0.1"))
    with raises(ValueError, "would drop the predictions that the evaluation scores (accuracy) and writes; leave it off"):
        pretrain.main(pretrain_flags(mlm, tmp_path, "--prediction_loss_only", "true"))
    for left in (["--label_smoothing_factor", "0"], ["--prediction_loss_only", "false"]):
        kwargs = captured(monkeypatch, pretrain.main, pretrain_flags(mlm, tmp_path, "--do_eval", *left))
        assert kwargs["args"].label_smoothing_factor == 0 and not kwargs["args"].prediction_loss_only
        assert kwargs["compute_loss_func"] is not None and kwargs["compute_metrics"] is not None
