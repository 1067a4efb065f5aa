import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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
def hub_variants(tmp_path_factory):
    """Dry-run upload folders of tiny variants and what a plugin-free process loaded from them
    (:func:`hub_fixtures.build_variants`), built once for all the hub tests."""
    from hub_fixtures import build_variants

    return build_variants(tmp_path_factory.mktemp("hub"))
