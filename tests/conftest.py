import gc
import os
import sys
from pathlib import Path

# pytest caches each test module's assert-rewritten code in __pycache__ unless bytecode writing is off;
# with PYTHONDONTWRITEBYTECODE set (as on this project's machines) every worker of every run rewrote all
# 120 modules again, seconds of each run. The tests' caches are written whatever the environment says.
sys.dont_write_bytecode = False

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="Device of the tests marked `device` (torch's default device while they run). With cuda, only "
        "those tests run: every method against its reference, dtypes, padding, gradients, mra2 backends.",
    )


def share_the_cores_between_workers() -> None:
    """Under pytest-xdist, each worker's torch (and each process a test starts, through OMP_NUM_THREADS)
    uses its share of the cores: with torch's default of one thread per core in every worker, the workers'
    OpenMP threads outnumber the cores and spin waiting for each other (the default tier took several
    times as long on 2 cores). A thread count the caller set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def pytest_configure(config):
    share_the_cores_between_workers()
    config.addinivalue_line("markers", "device: runs on the --device given (tensors created there by default)")
    if config.getoption("--device") == "cpu":
        # MRA-2's triton backend runs its kernels through Triton's interpreter (numpy) here; Triton reads
        # the variable when the kernels are defined, on the backend's first use (methods/mra/triton.py).
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """With ``--device cuda``, deselect the tests that are not device-parametrisable."""
    if config.getoption("--device") == "cpu":
        return
    deselected = [item for item in items if item.get_closest_marker("device") is None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker("device") is not None]


def pytest_collection_finish(session):
    """Freeze what the test modules imported (torch, Transformers, the datasets and serving stacks:
    about half a million objects) out of the cyclic garbage collector's reach: every Trainer.train()
    collects garbage (accelerate's ``free_memory``), which over that heap took a third of a second
    a call, hundreds of calls a run."""
    gc.freeze()


def pytest_unconfigure(config):
    gc.unfreeze()  # frozen objects are never freed; nanobind (Triton) reports them as leaks at exit


@pytest.fixture
def device(request) -> torch.device:
    """The ``--device`` of this run."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture
def repeat_tolerance(device) -> dict:
    """``assert_close`` tolerances between two runs of one computation: bitwise on the CPU; on CUDA
    the rounding of float atomics (``index_add_`` and scatter-adds sum in any order)."""
    return dict(atol=0, rtol=0) if device.type == "cpu" else dict(atol=1e-6, rtol=1e-5)


@pytest.fixture(autouse=True)
def _seed_and_device(request):
    """Seed every test; run the tests marked ``device`` with ``--device`` as torch's default device."""
    torch.manual_seed(0)
    name = request.config.getoption("--device")
    if name == "cpu" or request.node.get_closest_marker("device") is None:
        yield
        return
    if name == "cuda" and not torch.cuda.is_available():
        pytest.fail("--device cuda: no CUDA device is available")
    torch.cuda.manual_seed_all(0)
    with torch.device(name):
        yield


@pytest.fixture
def training_steps(monkeypatch):
    """A list that grows by one for every optimisation step Trainer runs (resume tests count the
    steps a resumed run trains, so that a silent restart fails them)."""
    from transformers import Trainer

    steps = []
    training_step = Trainer.training_step
    monkeypatch.setattr(Trainer, "training_step", lambda self, *a, **k: steps.append(1) or training_step(self, *a, **k))
    return steps


@pytest.fixture(scope="session")
def built_once(tmp_path_factory, worker_id):
    """``built_once(name, build) -> folder``: ``build(folder)`` runs once per test run, its folder
    shared read-only by every pytest-xdist worker (xdist's documented pattern: a file lock in the
    run's common temporary folder), so that workers do not each export the same models."""
    from filelock import FileLock

    def run(name: str, build) -> Path:
        if worker_id == "master":  # not distributed: the common folder would outlive the run
            folder = tmp_path_factory.mktemp(name)
            build(folder)
            return folder
        folder = tmp_path_factory.getbasetemp().parent / name
        with FileLock(f"{folder}.lock"):
            if not (folder / ".built").exists():
                folder.mkdir(exist_ok=True)
                build(folder)
                (folder / ".built").touch()
        return folder

    return run


@pytest.fixture(scope="session")
def hub_variants(tmp_path_factory):
    """Dry-run upload folders of tiny variants and what a plugin-free process loaded from them
    (:func:`hub_fixtures.build_variants`), built once for all the hub tests. Seconds: a variant of every
    method and architecture, and one plugin-free process that loads them all."""
    from hub_fixtures import build_variants

    return build_variants(tmp_path_factory.mktemp("hub"))
