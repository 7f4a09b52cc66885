"""Shared fixtures: a hand-countable corpus builder, the real corpus when present, a tiny model."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from biencoder.engine.data.arguana import arguana_root

REPO = Path(__file__).resolve().parents[1]
# the real corpus: $ARGUANA_ROOT, else a checkout's neighbour ../shared/data/arguana-counterargs-corpus (as CI lays
# it out); set for the whole session so the command lines the tests start read the same folder
_SHARED = REPO.parent / "shared" / "data" / "arguana-counterargs-corpus"
if "ARGUANA_ROOT" not in os.environ and _SHARED.is_dir():
    os.environ["ARGUANA_ROOT"] = str(_SHARED)
#: the real corpus where data=arguana reads it (absolute: subprocesses run elsewhere)
REAL_ROOT = arguana_root().absolute()


# No test reads or writes the user's files. The session gets a home of its own (so "~/.cache/biencoder", or any other
# "~" path, resolves inside it) and every test an embedding cache of its own (tmp_embedding_cache); command lines the
# tests start inherit both.
SESSION_HOME: Path | None = None
_USER_ENV: dict[str, str | None] = {}


def pytest_configure(config):
    """Before any test module imports biencoder (biencoder.retrieve reads BIENCODER_CACHE_DIR when imported)."""
    global SESSION_HOME
    SESSION_HOME = Path(tempfile.mkdtemp(prefix="biencoder-tests-home-"))
    own = {
        "HOME": str(SESSION_HOME),
        "XDG_CACHE_HOME": str(SESSION_HOME / ".cache"),
        "BIENCODER_CACHE_DIR": str(SESSION_HOME / "embedding-cache"),
    }
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # a worker of pytest -n N: one intra-op thread, in it and in the commands it starts, so that N workers share
        # the cores instead of N x (cores) threads spinning on them (OpenMP threads wait by spinning)
        own["OMP_NUM_THREADS"] = "1"
    _USER_ENV.update({key: os.environ.get(key) for key in own})
    os.environ.update(own)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_unconfigure(config):
    """The session's home goes, whatever the outcome (a collection alone, a failed check); the user's env returns."""
    for key, value in _USER_ENV.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if SESSION_HOME is not None:
        shutil.rmtree(SESSION_HOME, ignore_errors=True)


def user_cache_writes(home: Path | None = None) -> list[str]:
    """Files under ``home``'s (default: the session's) ``.cache/biencoder``: what a test wrote to the default
    embedding cache instead of its own."""
    folder = (home or SESSION_HOME) / ".cache" / "biencoder"
    return sorted(str(p.relative_to(folder.parents[1])) for p in folder.rglob("*")) if folder.exists() else []


@pytest.fixture(scope="session", autouse=True)
def no_writes_to_the_user_cache():
    """Fails the session (an error at its last test's teardown) when a test wrote ``~/.cache/biencoder``."""
    yield
    written = user_cache_writes()
    assert written == [], f"the tests wrote the default embedding cache ~/.cache/biencoder: {written[:5]}"


@pytest.fixture(autouse=True)
def tmp_embedding_cache(tmp_path_factory, monkeypatch) -> Path:
    """The embedding cache of this test (``BIENCODER_CACHE_DIR``, the default of ``trainer.cache_dir``): empty at its
    start, never the user's, never another test's."""
    folder = tmp_path_factory.mktemp("embedding-cache")
    monkeypatch.setenv("BIENCODER_CACHE_DIR", str(folder))
    return folder


def write_corpus(root: Path, layout: dict) -> Path:
    """Write ``{split: {theme: {debate: {"pro": [(point, counter|None), ...], "con": [...]}}}}`` under root.

    Texts are written as "<text>\\n"; a counter of None leaves the point without a counter.
    """
    for split, themes in layout.items():
        for theme, debates in themes.items():
            for debate, sides in debates.items():
                folder = root / split / theme / debate
                folder.mkdir(parents=True)
                (folder / "thesis.txt").write_text(f"thesis of {debate}\n")
                (folder / "metadata.txt").write_text(f"url\thttps://example.org/{split}/{theme}/{debate}\n")
                for stance, pairs in sides.items():
                    (folder / stance).mkdir()
                    for i, (point, counter) in enumerate(pairs, 1):
                        (folder / stance / f"{stance}{i:02d}a-point.txt").write_text(point + "\n")
                        if counter is not None:
                            (folder / stance / f"{stance}{i:02d}b-counter.txt").write_text(counter + "\n")
    return root


def grid_layout(splits=("training", "validation", "test"), themes=2, debates=2, per_side=2) -> dict:
    """Every split: ``themes`` × ``debates`` debates, ``per_side`` pairs on each side, all texts distinct."""

    def side(split, t, d, stance):
        return [
            (f"{split} t{t} d{d} {stance}{i} point\npremise {i}", f"{split} t{t} d{d} {stance}{i} counter")
            for i in range(per_side)
        ]

    return {
        s: {
            f"theme{t}": {f"debate{t}{d}": {st: side(s, t, d, st) for st in ("pro", "con")} for d in range(debates)}
            for t in range(themes)
        }
        for s in splits
    }


@pytest.fixture
def make_corpus(tmp_path):
    """Build a corpus from a layout dict (see :func:`write_corpus`) and return its root."""

    def make(layout: dict, name: str = "corpus") -> Path:
        return write_corpus(tmp_path / name, layout)

    return make


@pytest.fixture(scope="session")
def real_root() -> Path:
    if not (REAL_ROOT / "02-extracted-arguments").is_dir() and not (REAL_ROOT / "training").is_dir():
        pytest.skip(f"real ArguAna corpus not found at {REAL_ROOT} (set ARGUANA_ROOT)")
    return REAL_ROOT


@pytest.fixture(scope="session")
def real_corpus(real_root):
    from biencoder.engine.data.corpus import read_corpus

    return read_corpus(real_root)


CONF = REPO / "conf"
FAST = ["model=tiny", "trainer.progress=false", "trainer.max_epochs=2", "trainer.batch_size=8"]


def compose_cfg(overrides=(), config_name="config", **kwargs):
    """Compose the real configs of conf/ (as the CLI would, without a run folder):
    :func:`biencoder.hydra_glue.compose_config`, imported when a test composes."""
    from biencoder.hydra_glue import compose_config

    return compose_config(overrides, config_name, **kwargs)


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer():
    """A randomly initialised 2-layer BERT (seed 0) inside a BiModel, and MiniLM's tokenizer."""
    import torch

    from biencoder.engine.modeling.model import build_model

    torch.manual_seed(0)
    return build_model(compose_cfg(["model=tiny"]).model)


@pytest.fixture(scope="session")
def demo_corpus():
    from biencoder.engine.config.packaged import demo_root
    from biencoder.engine.data.corpus import read_corpus

    return read_corpus(demo_root())


@pytest.fixture
def torch_precision():
    """Torch's float32 matmul precision settings, both kinds (``torch.set_float32_matmul_precision`` and, since torch
    2.9, each backend's ``fp32_precision``), put back after the test as they were, and checked to be: the legacy one
    first, since setting it sets the backends' too."""
    import torch

    holders = (torch.backends, torch.backends.cuda.matmul, getattr(torch.backends.mkldnn, "matmul", None))

    def settings() -> tuple:
        return (torch.get_float32_matmul_precision(), *(getattr(h, "fp32_precision", None) for h in holders))

    before = settings()
    yield
    torch.set_float32_matmul_precision(before[0])
    for holder, value in zip(holders, before[1:], strict=True):
        if value is not None:
            holder.fp32_precision = value
    assert settings() == before


@pytest.fixture
def encoder_calls(monkeypatch):
    """A list that grows by one for every forward call of a HF BertModel (the encoder) from now on."""
    import torch

    calls = []
    original = torch.nn.Module.__call__

    def spy(module, *args, **kwargs):
        if type(module).__name__ == "BertModel":
            calls.append(1)
        return original(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "__call__", spy)
    return calls


@pytest.fixture
def global_determinism(monkeypatch):
    """Restores torch's determinism switches and CUBLAS_WORKSPACE_CONFIG after the test (``trainer.deterministic``
    sets them for the whole process)."""
    import torch

    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # monkeypatch puts back what was there
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1:]


#: a process that holds the run folder named by its argument (engine/runs/folder.claim) until it is killed
HOLD = (
    "import sys, time\nfrom biencoder.engine.runs.lock import claim\nclaim(sys.argv[1])\nprint('held', flush=True)\n"
    "time.sleep(600)\n"
)


def hold(folder: Path):
    """Another process, holding the run folder ``folder`` (it has said so when this returns); kill it when done."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "held", "the holder could not take the folder"
    return proc


def poison_classifier(monkeypatch, at_epoch: int = 1) -> None:
    """A run that diverges: the pair classifier's output weights turn NaN when epoch ``at_epoch`` starts."""
    import torch

    from biencoder.engine.training.epoch import EpochTrainer

    original = EpochTrainer.train_epoch

    def poisoned(self, epoch, negatives):
        if epoch == at_epoch:
            with torch.no_grad():
                self.model.head.out.weight.fill_(float("nan"))
        return original(self, epoch, negatives)

    monkeypatch.setattr(EpochTrainer, "train_epoch", poisoned)
