"""Which test checks the effect of each flag of each script, and how the flags are found.

A flag is listed by the script that parses it. The flags are found, not typed: each script's
``main(["--help"])`` runs with ``HfArgumentParser`` recording the dataclasses it was given; every
field of the project's own dataclasses is a flag to cover, and of Transformers' ``TrainingArguments``
those the package reads itself (``training_args.<name>`` in its source); the rest of
TrainingArguments goes to Trainer untouched and is Transformers' to test.

``FLAG_TESTS[script][flag]`` names a test (``tests/<file>.py::<test name>``) that fails when the flag
is ignored or wired to the wrong place; ``tests/test_flag_table.py`` checks that every flag has one
and that each named test exists.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Each script and the module whose ``main`` parses its flags.
SCRIPT_MAINS = {
    "benchmark": "hf_efficient_attn.tools.benchmark.cli",
    "compare_methods": "hf_efficient_attn.tasks.mlm.compare",
    "convert_to_long": "hf_efficient_attn.tasks.convert",
    "demo": "hf_efficient_attn.tools.demo",
    "export_onnx": "hf_efficient_attn.serving.cli",
    "finetune_glue": "hf_efficient_attn.tasks.glue",
    "finetune_wikihop": "hf_efficient_attn.tasks.wikihop.finetune",
    "mutation_check": "scripts/mutation_check.py",
    "prepare_glue_sample": "scripts/prepare_glue_sample.py",
    "prepare_wikihop": "scripts/prepare_wikihop.py",
    "prepare_wikipedia": "scripts/prepare_wikipedia.py",
    "pretrain_mlm": "hf_efficient_attn.tasks.mlm.pretrain",
    "push_to_hub": "hf_efficient_attn.hub.cli",
    "quality": "hf_efficient_attn.tools.quality.cli",
    "quickstart": "hf_efficient_attn.tools.quickstart",
}


def script_main(script: str) -> Callable:
    """The ``main`` of ``script`` (a module of the package, or a file under scripts/)."""
    target = SCRIPT_MAINS[script]
    if target.endswith(".py"):
        path = os.path.join(REPO, target)
        spec = importlib.util.spec_from_file_location(f"_script_{script}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while being built
        spec.loader.exec_module(module)
        return module.main
    return importlib.import_module(target).main


def parsed_dataclasses(script: str) -> list[type]:
    """The dataclasses ``script`` parses, recorded from its ``--help``."""
    from hf_efficient_attn.tasks.common import args

    recorded: list[type] = []

    class RecordingParser(args.HfArgumentParser):
        def __init__(self, dataclass_types, **kwargs):
            recorded.extend(dataclass_types)
            super().__init__(dataclass_types, **kwargs)

    original, args.HfArgumentParser = args.HfArgumentParser, RecordingParser
    stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
    try:
        script_main(script)(["--help"])
    except SystemExit:
        pass
    finally:
        sys.stdout.close()
        sys.stdout, args.HfArgumentParser = stdout, original
    return recorded


def training_flags_read() -> set[str]:
    """The TrainingArguments fields the package reads itself."""
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    read = set()
    for root, _, files in os.walk(os.path.join(REPO, "hf_efficient_attn")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    read |= set(re.findall(r"training_args\.(\w+)", f.read()))
    return read & fields


def script_flags(script: str) -> list[str]:
    """The flags of ``script`` whose effect needs a test (see the module docstring)."""
    from transformers import TrainingArguments

    flags = []
    for cls in parsed_dataclasses(script):
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        if issubclass(cls, TrainingArguments):
            names = [name for name in names if name in training_flags_read()]
        flags += [name for name in names if name not in flags]
    return flags


FLAG_TESTS: dict[str, dict[str, str]] = {}


#: The public Python API whose keyword arguments need an effect test, as "module:attribute".
PUBLIC_FUNCTIONS = [
    *(f"hf_efficient_attn:{name}" for name in (
        "efficient_attention", "extend_position_embeddings", "load_preset", "method_options", "modules_to_save",
        "patch_model", "register_method", "unpatch_model",
    )),
    "hf_efficient_attn:AutoModel.from_pretrained",
    "hf_efficient_attn:AutoModel.from_config",
    *(f"hf_efficient_attn.hub:{name}" for name in (
        "build_model_card", "export_variant", "load_variant", "prepare_upload", "push_variant", "upload_variant",
        "variant_name", "write_remote_code",
    )),
    *(f"hf_efficient_attn.serving:{name}" for name in ("export_folder", "export_onnx", "validate")),
]


def api_keywords() -> list[str]:
    """``function.keyword`` for every named parameter of the public functions (``*args``/``**kwargs``
    and ``self``/``cls`` aside)."""
    import inspect

    keywords = []
    for target in PUBLIC_FUNCTIONS:
        module, _, attribute = target.partition(":")
        function = importlib.import_module(module)
        for part in attribute.split("."):
            function = getattr(function, part)
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                keywords.append(f"{attribute}.{parameter.name}")
    return keywords
