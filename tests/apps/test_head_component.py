"""A head part of the user's own (docs/heads.md): a module outside src/ named by import path trains from the command
line with its folder on PYTHONPATH; biencoder-retrieve and biencoder-export use the run where the module is
importable, and say in one line what to install where it is not."""

import os
import subprocess
import sys

import pytest

from biencoder.retrieve import main as retrieve
from conftest import FAST, REPO

SCALE_NORM = """import torch


class ScaleNorm(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.g = torch.nn.Parameter(torch.tensor(float(width) ** 0.5))

    def forward(self, x):
        return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=1e-5)
"""
MISSING = (
    "model.head.norm='userheads_cli.norms:ScaleNorm' needs the module 'userheads_cli', which is not installed here: "
    "install the package that provides it, or put its folder on PYTHONPATH"
)


@pytest.mark.slow
def test_a_run_with_a_part_of_the_user_s_own_retrieves_and_exports_where_it_is_installed(
    tmp_path, capsys, monkeypatch
):
    package = tmp_path / "site" / "userheads_cli"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "norms.py").write_text(SCALE_NORM)
    logs = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), env.get("PYTHONPATH", "")])
    args = [*FAST, "trainer.max_epochs=1", "eval.tasks=false", f"paths.log_dir={logs}"]
    head = ["model.head.norm=userheads_cli.norms:ScaleNorm", "model.head.activation=gelu", "model.head.hidden=[16]"]
    proc = subprocess.run(
        [sys.executable, "-m", "biencoder.train", *args, *head], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (logs / "runs").iterdir()
    assert run.name.endswith("_h16_userheads_cli.norms.ScaleNorm_gelu_s0")
    query = ["--query", "Homework should be banned.", "--corpus", "demo", "-k", "2"]

    monkeypatch.syspath_prepend(str(tmp_path / "site"))  # where the package is installed
    assert retrieve([str(run), *query]) == 0
    assert "1." in capsys.readouterr().out
    st = pytest.importorskip("sentence_transformers", reason="pip install -e '.[export]'")
    del st
    from biencoder.export import main as export

    assert export([str(run), str(tmp_path / "st")]) == 0
    capsys.readouterr()

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path / "site")])  # where it is not
    for name in [m for m in sys.modules if m.startswith("userheads_cli")]:
        monkeypatch.delitem(sys.modules, name)
    assert retrieve([str(run), *query]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: run='{run / 'best.pt'}': {MISSING}"]
    assert export([str(run), str(tmp_path / "st2")]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: run='{run / 'best.pt'}': {MISSING}"]
    assert not (tmp_path / "st2").exists()
