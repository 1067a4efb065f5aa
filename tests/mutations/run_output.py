"""Mutations of shared flags in every script, what a run prints, interruptions and offline messages."""

from .base import Mutation, P, T

MUTATIONS: list[Mutation] = [
    # ---- flags several tool scripts share ----------------------------------------------------------------
    Mutation(
        P + "tools/demo.py",
        "AutoModel.from_pretrained(path, attn_impl=method, attn_config=attn_config)",
        'AutoModel.from_pretrained(path, attn_impl="mra2", attn_config=None)',
        (T + "test_flags_tools.py::-k method_flags and demo",),
        "demo --attn_impl / --attn_config ignored",
    ),
    Mutation(
        P + "tools/quickstart.py",
        "convert_to_long(minilm_path(), max_length, attn_impl, attn_config,",
        "convert_to_long(minilm_path(), max_length, attn_impl, None,",
        (T + "test_flags_tools.py::-k method_flags and quickstart",),
        "quickstart --attn_config ignored",
    ),
    # ---- what a run prints ------------------------------------------------------------------------------------
    Mutation(
        P + "tasks/common/driver.py",
        "    level = training_args.get_process_log_level()  # passive: the libraries' current level\n",
        "    transformers.utils.logging.set_verbosity_info()\n    level = training_args.get_process_log_level()\n",
        (T + "test_run_output.py::-k short_run and None",),
        "the default log level prints Transformers' and datasets' info lines (170 lines for 10 steps)",
    ),
    Mutation(
        P + "tasks/common/driver.py",
        "    if training_args.world_size > 1:\n        logger.warning(",
        "    if True:\n        logger.warning(",
        (T + "test_run_output.py::-k short_run and None",),
        "a one-process run prints its process rank",
    ),
    Mutation(
        P + "tasks/common/driver.py",
        '    parts.append(f"files in {output_dir}")\n',
        "",
        (T + "test_run_output.py::-k short_run and None",),
        "the summary line does not say where the files went",
    ),
    Mutation(
        P + "tasks/common/driver.py",
        "    datasets_logging.disable_propagation()",
        "    datasets_logging.enable_propagation()",
        (T + "test_run_output.py::-k short_run and info",),
        "--log_level info prints each datasets line twice",
        slow=True,
    ),
    # ---- Ctrl-C ------------------------------------------------------------------------------------------------
    Mutation(
        P + "tasks/common/driver.py",
        "        raise KeyboardInterrupt(resume_advice(trainer.args)) from None",
        "        raise",
        (T + "test_run_output.py::-k ctrl_c_in_training",),
        "Ctrl-C in training does not say that rerunning resumes",
    ),
    Mutation(
        P + "tasks/common/driver.py",
        "        close_progress_bars(trainer)\n",
        "",
        (T + "test_run_output.py::-k ctrl_c_in_training",),
        "after Ctrl-C the interrupted progress bar draws itself again below the one-line message",
    ),
    Mutation(
        P + "tasks/common/driver.py",
        "    if training_args.resume_from_checkpoint is not None:  # the same command",
        "    if False:  # the same command",
        (T + "test_run_output.py::-k ctrl_c_with_an_explicit",),
        "after Ctrl-C, rerunning with --resume_from_checkpoint is advised (it would resume from that older checkpoint)",
    ),
    Mutation(
        P + "utils/cli_errors.py",
        "INTERRUPTED_STATUS = 130",
        "INTERRUPTED_STATUS = 1",
        (T + "test_run_output.py::-k ctrl_c_in_training",),
        "Ctrl-C exits with status 1, not 130",
    ),
    Mutation(
        P + "utils/cli_errors.py",
        "    except KeyboardInterrupt as interrupt:",
        "    except ZeroDivisionError as interrupt:",
        (T + "test_run_output.py::-k ctrl_c_outside",),
        "Ctrl-C prints a traceback",
    ),
    # ---- what is left out, truncated or not downloadable -----------------------------------------------------
    Mutation(
        P + "tasks/common/data.py",
        "        if dropped:\n",
        "        if False:\n",
        (T + "test_run_output.py::-k how_many_tokens",),
        "MLM leaves out the text that does not fill a block without a word",
    ),
    Mutation(
        P + "serving/encoding.py",
        "    if truncated:\n",
        "    if False:\n",
        (T + "test_run_output.py::-k texts_it_truncates",),
        "encode_onnx truncates long texts without counting them",
    ),
    Mutation(
        P + "tasks/common/args.py",
        "    if hub_constants.HF_HUB_OFFLINE and not os.path.isdir(cached):",
        "    if False:",
        (T + "test_run_output.py::-k offline_hub_id",),
        "offline, a Hub id not in the cache gets Transformers' 'couldn't connect' error",
    ),
    Mutation(
        P + "tasks/common/args.py",
        'cached = os.path.join(cache_dir or hub_constants.HF_HUB_CACHE, "models--"',
        'cached = os.path.join(hub_constants.HF_HUB_CACHE, "models--"',
        (T + "test_flags_model_training.py::-k revision_cache_dir_and_token and pretrain",),
        "offline, a Hub id cached in --cache_dir is refused",
    ),
    Mutation(
        P + "tasks/common/driver.py",
        "        if isinstance(err.__cause__, LocalEntryNotFoundError):",
        "        if False:",
        (T + "test_run_output.py::-k unreachable_hub",),
        "without a network, a Hub id gets Transformers' 'couldn't connect' error",
    ),
    # ---- data flags that would be ignored ------------------------------------------------------------------
    Mutation(
        P + "tasks/common/args.py",
        "        if self.dataset_name is not None and any(local):",
        "        if False:",
        (T + "test_flags_data.py::-k would_be_ignored and dataset_name and glue",),
        "--dataset_name beside local files: the files are silently ignored",
    ),
    Mutation(
        P + "tasks/common/args.py",
        "        if self.dataset_config_name is not None and self.dataset_name is None:",
        "        if False:",
        (T + "test_flags_data.py::-k would_be_ignored and dataset_config_name and pretrain",),
        "--dataset_config_name without --dataset_name silently ignored",
    ),
    Mutation(
        P + "tasks/wikihop/finetune.py",
        "        if self.pad_to_max_length and self.padding_free:",
        "        if False:",
        (T + "test_flags_data.py::-k would_be_ignored and wikihop",),
        "WikiHop --pad_to_max_length silently ignored with --padding_free",
    ),
]
