"""Mutations of --help texts, descriptions and each mode's defaults against its help."""

from .base import Mutation, P, T

HELP = T + "project/test_cli_help.py"
TOOLS = T + "project/test_defaults_tools.py"
TRAINING = T + "project/test_defaults_training.py"

MUTATIONS: list[Mutation] = [
    # ---- --help: description, defaults shown, --no_X, did you mean -----------------------------------
    Mutation(
        P + "tasks/glue.py",
        "PeftArguments, TrainingArguments), argv, __doc__)",
        "PeftArguments, TrainingArguments), argv)",
        (HELP + "::-k reads_and_writes and finetune_glue",),
        "finetune_glue.py --help opens with no description",
    ),
    Mutation(
        P + "tasks/common/args.py",
        "    unset = action.default in (None, argparse.SUPPRESS) or",
        "    unset = action.default is argparse.SUPPRESS or",
        (HELP + "::-k doubled_default",),
        "--help shows (default: None) for unset and required flags",
    ),
    Mutation(
        P + "tasks/common/args.py",
        ' or unset or STATES_DEFAULT.search(action.help or ""))',
        " or unset)",
        (HELP + "::-k doubled_default",),
        "a help that states its default gets the formatter's (default: X) too",
    ),
    Mutation(
        P + "tasks/common/args.py",
        "    describe_negative_flags(parser, dataclass_types)\n",
        "",
        (HELP + "::-k negative_flag",),
        "--no_X flags carry the positive flag's help",
    ),
    Mutation(
        P + "tasks/common/args.py",
        "    if other is not None and prefix + other in allowed:",
        "    if False:",
        (HELP + "::-k did_you_mean",),
        "another tool's name for a flag (--lr, --batch_size, --model) finds nothing or a wrong flag",
    ),
    Mutation(
        P + "tasks/common/args.py",
        "    if typed and all(any(_same_word(t, w) for w in words) for t in typed)",
        "    if typed and any(any(_same_word(t, w) for w in words) for t in typed)",
        (HELP + "::-k no_suggestion",),
        "did you mean proposes a flag sharing one word (--text_column -> --num_texts)",
    ),
    Mutation(
        P + "tasks/common/args.py",
        "        advice = flag_advice(flag, dataclass_types)\n",
        "        advice = None\n",
        (HELP + "::-k column_flag",),
        "finetune_glue.py --text_column gets no word on how the text columns are chosen",
    ),
    Mutation(
        P + "tasks/glue.py",
        '    if "sentence1" in columns and "sentence2" in columns:',
        "    if False:",
        (HELP + "::-k column_advice_works",),
        "without a task, sentence1/sentence2 are not the text when other string columns come first",
    ),
    # ---- each default as the help states it --------------------------------------------------------------
    Mutation(
        P + "tools/benchmark/cli.py",
        "            self.repeats = 1 if self.model or self.mixed_lengths else 3",
        "            self.repeats = 1 if self.model else 3",
        (TOOLS + "::-k values_per_benchmark",),
        "benchmark --mixed_lengths times 3 passes, its help says 1",
    ),
    Mutation(
        P + "tools/benchmark/cli.py",
        "repeats=args.repeats, warmup=args.warmup, threads=args.threads",
        "repeats=args.repeats, warmup=args.warmup, threads=args.threads or 1",
        (TOOLS + "::-k threads_default",),
        "benchmark without --threads runs one thread, not torch's default",
    ),
    Mutation(
        P + "tools/quality/cli.py",
        "self.method_names = parse_method_names(self.methods, list_methods(), list_methods())",
        "self.method_names = parse_method_names(self.methods, list_methods(), list_methods()[:2])",
        (TOOLS + "::-k quality_default",),
        "quality without --methods studies two methods, its help says every one",
    ),
    Mutation(
        P + "tools/quickstart.py",
        '    return run(**{**asdict(args), "attn_config": args.attn_options})',
        '    return run(**{**asdict(args), "attn_config": args.attn_options or {"block_per_row": 2}})',
        (TOOLS + "::-k quickstart_without_flags",),
        "the quickstart without flags converts with options its help does not show",
    ),
    Mutation(
        P + "serving/onnx.py",
        "    check_lengths = check_lengths or [longer if longer <= limit else seq_len // 2 + 1]",
        "    check_lengths = check_lengths or [longer]",
        (TOOLS + "::-k export_without",),
        "export_onnx's default check length can exceed the position table",
    ),
    Mutation(
        P + "serving/encoding.py",
        "    max_length = max_length or recorded_max_length(folder) or limit",
        "    max_length = max_length or limit",
        (TOOLS + "::-k encode_max_length",),
        "encode_onnx without --max_length ignores sentence-transformers' max_seq_length",
    ),
    Mutation(
        P + "tasks/common/driver.py",
        "        attn_impl=model_args.attn_impl,\n",
        '        attn_impl=model_args.attn_impl or "softmax",\n',
        (TRAINING + "::-k attn_impl_default",),
        "a training script without --attn_impl swaps a plain checkpoint's attention",
    ),
    Mutation(
        P + "tasks/common/args.py",
        '            "token": self.token,\n',
        '            "token": self.token or False,\n',
        (TRAINING + "::-k token_default",),
        "without --token no Hub token is sent, not the one hf auth login stored",
    ),
    Mutation(
        P + "tasks/common/args.py",
        "    return data_args.max_seq_length or min(tokenizer_limit, model_limit)",
        "    return data_args.max_seq_length or model_limit",
        (TRAINING + "::-k max_seq_length_default",),
        "without --max_seq_length the tokenizer's model_max_length is ignored",
    ),
    Mutation(
        P + "tasks/common/data.py",
        '    name = name or "text"',
        '    name = name or "title"',
        (TRAINING + "::-k text_column_default",),
        "without --text_column_name another column than text is read",
    ),
    Mutation(
        P + "tasks/glue.py",
        '    metric = task.metric if task else ("mse" if regression else "accuracy")',
        '    metric = task.metric if task else ("accuracy" if regression else "mse")',
        (TRAINING + "::-k without_a_task",),
        "GLUE without a task scores classes by mse and float labels by accuracy",
    ),
    Mutation(
        P + "tasks/glue.py",
        '    if peft_args.peft == "lora":',
        '    if peft_args.peft != "full":',
        (TRAINING + "::-k without_peft",),
        "GLUE without --peft trains a LoRA adapter",
    ),
    Mutation(
        P + "tasks/wikihop/finetune.py",
        "        ChunkEncoder(tokenizer, max_length, data_args.max_chunks),",
        "        ChunkEncoder(tokenizer, max_length, data_args.max_chunks or 1),",
        (TRAINING + "::-k max_chunks",),
        "WikiHop without --max_chunks reads the first chunk only",
    ),
    Mutation(
        P + "tasks/mlm/compare.py",
        "        warmup_steps = 100 if head_is_new(model_args.model_name_or_path, config) else 0",
        "        warmup_steps = 100",
        (TRAINING + "::-k head_warmup_default",),
        "compare_methods warms a trained head up too",
    ),
    Mutation(
        P + "tasks/mlm/compare.py",
        "    return {name: resolve_options(name, given.get(name)).to_dict() for name in methods}",
        "    return {name: given.get(name, {}) for name in methods}",
        (TRAINING + "::-k left_out_of_attn_config",),
        "a method left out of compare_methods' --attn_config is not run at its defaults",
    ),
    Mutation(
        P + "tasks/mlm/compare.py",
        "            write_wikipedia_jsonl(data_dir)",
        "            write_wikipedia_jsonl(data_dir, validation_articles=4)",
        (TRAINING + "::-k default_data",),
        "compare_methods' bundled data holds out 4 articles, its help says 8",
        slow=True,
    ),
]
