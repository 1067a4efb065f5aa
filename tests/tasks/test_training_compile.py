"""``--torch_compile true`` in every training script (MLM, GLUE, WikiHop) with MRA-2, the method
with its own operators: the compiled run trains and evaluates as the eager run does (dropout off,
so that both runs take the same steps). Slow: Inductor compiles a forward, a backward and an
evaluation graph per script."""

import pytest
from glue_fixtures import write_task_files
from training_fixtures import save_tiny_mlm, write_news_files
from wikihop_fixtures import save_tiny_encoder
from wikihop_fixtures import write_files as write_wikihop_files

from hf_efficient_attn.tasks import glue
from hf_efficient_attn.tasks.mlm import pretrain as mlm
from hf_efficient_attn.tasks.wikihop import finetune as wikihop

pytestmark = pytest.mark.slow

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
#: 16-token blocks, 2 kept per row: at 64 tokens (4 blocks) MRA-2 approximates.
COMMON = ["--attn_impl", "mra2", "--attn_config", '{"block_size": 16, "block_per_row": 2}', "--do_train", "--do_eval",
          "--max_steps", "3", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
          "--learning_rate", "2e-3", "--report_to", "none", "--disable_tqdm", "true", "--seed", "7"]  # fmt: skip


def eager_and_compiled(main, tmp_path, *args) -> tuple[dict, dict]:
    eager = main([*args, *COMMON, "--output_dir", str(tmp_path / "eager")])
    compiled = main([*args, *COMMON, "--output_dir", str(tmp_path / "compiled"), "--torch_compile", "true"])
    return eager, compiled


def assert_same_run(eager: dict, compiled: dict) -> None:
    assert compiled["train_loss"] == pytest.approx(eager["train_loss"], rel=1e-4)
    assert compiled["eval_loss"] == pytest.approx(eager["eval_loss"], rel=1e-4)


def test_pretraining(tmp_path):
    train, validation = write_news_files(str(tmp_path), train_articles=20, validation_articles=4)
    model = save_tiny_mlm(str(tmp_path / "tiny"), **NO_DROPOUT)
    args = ["--model_name_or_path", model, "--train_file", train, "--validation_file", validation,
            "--max_seq_length", "64", "--max_eval_samples", "8"]  # fmt: skip
    assert_same_run(*eager_and_compiled(mlm.main, tmp_path, *args))


def test_glue(tmp_path):
    files = write_task_files(str(tmp_path / "mrpc"), "mrpc")
    model = save_tiny_mlm(str(tmp_path / "tiny"), **NO_DROPOUT)
    args = ["--model_name_or_path", model, "--task_name", "mrpc", "--train_file", files["train"],
            "--validation_file", files["validation"], "--max_seq_length", "64", "--max_eval_samples", "8"]  # fmt: skip
    assert_same_run(*eager_and_compiled(glue.main, tmp_path, *args))


def test_wikihop(tmp_path):
    train, dev = write_wikihop_files(str(tmp_path), train=8, dev=4, with_real=False)
    model = save_tiny_encoder(str(tmp_path / "tiny"), **NO_DROPOUT)
    args = ["--model_name_or_path", model, "--train_file", train, "--validation_file", dev,
            "--max_seq_length", "64"]  # fmt: skip
    assert_same_run(*eager_and_compiled(wikihop.main, tmp_path, *args))
