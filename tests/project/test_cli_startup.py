"""Every script answers ``--help`` and a flag error as soon as its flags are parsed: nothing heavy
(the data libraries, Trainer, sentence-transformers, ONNX, more model classes) is imported first.

One subprocess imports ``hf_efficient_attn`` (what every script needs: registering the methods with
Transformers imports Transformers' modeling code, and with it torch._dynamo), records what that
imported, then forks a child per
script and invocation; each child runs the script as ``__main__`` and reports the modules it
imported beyond that. Where a script's flags include Transformers' ``TrainingArguments``, what
``from transformers import TrainingArguments`` imports (measured in a child too: peft, and a
model class that peft imports) is the script's floor and allowed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from training_fixtures import REPO

SCRIPTS = sorted(name for name in os.listdir(os.path.join(REPO, "scripts")) if name.endswith(".py"))
#: Invocations: a help request (exit 0) and a misspelled flag (exit 2, one ``error:`` line).
INVOCATIONS = {"help": (["--help"], 0), "unknown flag": (["--no_such_flag", "3"], 2)}
#: Modules a script must not import before its flags are checked (the module or any submodule).
HEAVY = (
    "datasets",
    "evaluate",
    "sentence_transformers",
    "transformers.trainer",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "tensorboard",
    "pyarrow",
    "pandas",
    "sklearn",
    "matplotlib",
    "gensim",
)
#: Model classes: Transformers' modeling modules (``import hf_efficient_attn`` imports those it supports).
MODEL_CLASSES = re.compile(r"transformers\.models\.[^.]+\.modeling_")

DRIVER = r"""
import io, json, os, runpy, sys
import hf_efficient_attn  # noqa: F401  (what every script imports; the children inherit it)

cases, out = json.loads(sys.argv[1]), sys.argv[2]
before = set(sys.modules)
results = {"import hf_efficient_attn": {"modules": sorted(before)}}
for script, argv in [(None, [])] + cases:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run the script, report its exit status, new modules and stderr
        os.close(read)
        sys.argv, sys.stdout, sys.stderr = [script, *argv], io.StringIO(), io.StringIO()
        try:
            if script is None:  # the floor of the scripts that parse TrainingArguments
                from transformers import TrainingArguments  # noqa: F401
            else:
                runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException as err:  # noqa: BLE001  (reported, not raised: the parent must go on)
            code, sys.stderr = -1, io.StringIO(repr(err))
        report = {"code": code, "new": sorted(set(sys.modules) - before), "stderr": sys.stderr.getvalue()}
        with os.fdopen(write, "w") as f:
            json.dump(report, f)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        results[" ".join([script or "TrainingArguments", *argv])] = json.load(f)
    os.waitpid(pid, 0)
with open(out, "w") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def startups(tmp_path_factory) -> dict:
    """What each script invocation imported and printed (:data:`DRIVER`). Seconds: one fresh interpreter
    imports the package; the invocations, forked from it, cost a fraction of a second each."""
    out = tmp_path_factory.mktemp("startup") / "startups.json"
    cases = [(os.path.join("scripts", s), argv) for s in SCRIPTS for argv, _ in INVOCATIONS.values()]
    env = {**os.environ, "PYTHONPATH": REPO}
    subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cases), str(out)], cwd=REPO, env=env, check=True, timeout=600)
    return json.loads(out.read_text())


def heavy_imports(new: list[str], floor: list[str] = ()) -> list[str]:
    """The modules of ``new`` that a script must not import before checking its flags; with
    ``transformers.training_args`` among them, those of ``floor`` are allowed."""
    allowed = set(floor) if "transformers.training_args" in new else set()
    return [
        m
        for m in new
        if m not in allowed and (any(m == h or m.startswith(h + ".") for h in HEAVY + ("peft",)) or MODEL_CLASSES.match(m))
    ]


@pytest.mark.parametrize("invocation", list(INVOCATIONS))
@pytest.mark.parametrize("script", SCRIPTS)
def test_flags_answered_before_heavy_imports(startups, script, invocation):
    argv, status = INVOCATIONS[invocation]
    report = startups[os.path.join("scripts", script) + " " + " ".join(argv)]
    assert report["code"] == status, report["stderr"]
    if status:
        assert report["stderr"].startswith("error: ") and report["stderr"].count("\n") == 1, report["stderr"]
    assert heavy_imports(report["new"], startups["TrainingArguments"]["new"]) == []


def test_heavy_imports_are_detected(startups):
    """The check itself: each kind of heavy module is caught; TrainingArguments' own imports (peft
    among them) only where the script parses TrainingArguments."""
    assert heavy_imports(["datasets", "pyarrow.lib", "transformers.trainer", "transformers.trainer_utils"]) == [
        "datasets",
        "pyarrow.lib",
        "transformers.trainer",
    ]
    assert heavy_imports(["transformers.models.bert.modeling_bert", "transformers.models.bert"]) == [
        "transformers.models.bert.modeling_bert"
    ]
    floor = startups["TrainingArguments"]["new"]
    assert "peft" in floor and heavy_imports(floor) != []
    assert heavy_imports(floor, floor) == [] and heavy_imports(floor + ["datasets"], floor) == ["datasets"]


def test_package_import_is_light(startups):
    """``import hf_efficient_attn`` (in the fresh process the script runs fork from) imports none of
    the optional machinery."""
    modules = startups["import hf_efficient_attn"]["modules"]
    assert [m for m in heavy_imports(modules) if not MODEL_CLASSES.match(m)] == []
    assert "peft" not in modules
