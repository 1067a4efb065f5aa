"""configs/accelerate: each file is read by accelerate's own launcher into the launch it names;
the FSDP file's wrap policy finds the encoder layers of a patched model."""

import os
from unittest import mock

import pytest
import transformers as T
from accelerate import FullyShardedDataParallelPlugin
from accelerate.commands.config.config_args import load_config_from_file

# `accelerate launch`'s own argument handling (no public API turns a config file into the
# environment a launched process sees; these are what the `accelerate launch` command runs).
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType
from accelerate.utils.launch import prepare_multi_gpu_env
from training_fixtures import REPO, tiny_config

import hf_efficient_attn as hea

CONFIGS = os.path.join(REPO, "configs", "accelerate")


@pytest.mark.parametrize(
    "name, kind, processes, cpu",
    [
        ("ddp.yaml", DistributedType.MULTI_GPU, 8, False),
        ("fsdp.yaml", DistributedType.FSDP, 8, False),
        # MULTI_GPU + use_cpu: `accelerate launch` starts two gloo processes (MULTI_CPU starts one).
        ("cpu-2proc.yaml", DistributedType.MULTI_GPU, 2, True),
    ],
)
def test_config_files_parse(name, kind, processes, cpu):
    config = load_config_from_file(os.path.join(CONFIGS, name))
    assert (config.distributed_type, config.num_processes, config.use_cpu) == (kind, processes, cpu)
    assert config.mixed_precision == "no"  # precision comes from the script's --bf16 / --fp16


def test_fsdp_config_wraps_the_encoder_layers_only_of_a_patched_model():
    args = launch_command_parser().parse_args(["--config_file", os.path.join(CONFIGS, "fsdp.yaml"), "train.py"])
    args, *_ = _validate_launch_command(args)
    environment = prepare_multi_gpu_env(args)
    assert environment["ACCELERATE_USE_FSDP"] == "true" and environment["FSDP_VERSION"] == "2"
    with mock.patch.dict(os.environ, environment):
        plugin = FullyShardedDataParallelPlugin()
    model = hea.patch_model(T.AutoModelForMaskedLM.from_config(tiny_config("roberta")), "linformer", {"k": 8})
    plugin.set_auto_wrap_policy(model)
    wrapped = {type(m).__name__ for m in model.modules() if plugin.auto_wrap_policy(module=m, recurse=False, nonwrapped_numel=0)}
    assert wrapped == {"RobertaLayer"}  # not RobertaEmbeddings too: Accelerate 1.15 would shard it twice
    assert "FULL_STATE_DICT" in str(plugin.state_dict_type)  # the saved model reloads without accelerate
