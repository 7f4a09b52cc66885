"""``trainer.compile=true``: the training step through torch.compile.

A file of its own, outside the mutation run's test files (docs/mutation.md): the compiled and the eager step run the
same code, so a mutant of it changes both alike, and under mutmut's tracing the test took 80 s per mutant.
"""

import pytest

from biencoder.engine.training.run import run
from conftest import FAST, compose_cfg
from helpers import read_rows


@pytest.mark.slow
def test_compiled_training_step_matches_eager(tmp_path):
    """trainer.compile=true runs the same step through torch.compile (inductor; CPU here): the same losses up to
    dropout, whose random masks the compiled graph draws differently from eager mode."""
    base = FAST + ["trainer.max_epochs=1", "eval.tasks=false"]
    eager = run(compose_cfg(base), tmp_path / "eager")
    compiled = run(compose_cfg(base + ["trainer.compile=true"]), tmp_path / "compiled")
    assert compiled["status"] == "done"
    rows = [read_rows(tmp_path / name / "metrics.jsonl")[0] for name in ("eager", "compiled")]
    assert rows[1]["loss"] == pytest.approx(rows[0]["loss"], rel=2e-2)
    assert compiled["best"]["val"]["queries"] == eager["best"]["val"]["queries"]
