"""A non-editable install runs: the wheel ships conf/ (as biencoder/conf) and the demo corpus, and its console
scripts compose the config from any folder."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO


@pytest.mark.slow
def test_the_wheel_runs_from_another_folder(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    wheel = next(wheels.glob("biencoder-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # the dependencies come from this environment (a .pth), the package itself only from the wheel
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import biencoder, biencoder.engine.training.runner, biencoder.hydra_glue as c; "
            "print(biencoder.__file__); print(c.conf_dir())",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    ).stdout.split()
    assert where[0].startswith(str(site)) and where[1] == str(site / "biencoder" / "conf")
    for command in ([str(venv / "bin" / "biencoder-train")], [str(venv / "bin" / "python"), "-m", "biencoder.train"]):
        shown = subprocess.run(
            [*command, "model=tiny", "+variant=ln_relu", "--cfg", "job"],
            capture_output=True,
            text=True,
            cwd=elsewhere,
            env=env,
        )
        assert shown.returncode == 0, shown.stderr
        assert "use_layernorm: true" in shown.stdout and "name: tiny" in shown.stdout
    stats = subprocess.run(
        [str(venv / "bin" / "biencoder-corpus"), "stats", "demo"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    )
    assert stats.returncode == 0 and "pairs" in stats.stdout
    plot = subprocess.run(
        [str(venv / "bin" / "biencoder-plot"), str(elsewhere)], capture_output=True, text=True, cwd=elsewhere, env=env
    )  # biencoder.report ships in the wheel too
    assert plot.returncode == 2 and "no run folders" in plot.stderr, plot.stderr


@pytest.mark.slow
def test_console_script_tab_completion(tmp_path):
    """Hydra's completion answers for the installed command (it cannot for python -m)."""
    script = Path(sys.executable).parent / "biencoder-train"
    if not script.exists():
        pytest.skip("biencoder-train is not installed in this environment (pip install -e .)")
    install = subprocess.run([str(script), "-sc", "install=bash"], capture_output=True, text=True, cwd=tmp_path)
    assert install.returncode == 0 and "complete" in install.stdout
    env = {**os.environ, "COMP_LINE": "biencoder-train +variant=ln"}
    query = subprocess.run([str(script), "-sc", "query=bash"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert query.returncode == 0 and set(query.stdout.split()) == {"+variant=ln", "+variant=ln_relu"}


def test_omegaconf_is_held_to_the_versions_whose_resolver_api_the_package_uses():
    """OmegaConf 2.4 deprecates ``register_new_resolver`` (which engine/config/packaged.py and Hydra 1.3 call):
    importing the schema under it warns. The requirement admits 2.3 and not 2.4, as hydra-core's admits 1.3 only; and
    under the installed OmegaConf, importing the schema warns of nothing."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11 or later reads pyproject.toml")
    from importlib.metadata import version

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    requirements = {r.name: r.specifier for r in map(Requirement, pyproject["project"]["dependencies"])}
    omegaconf = requirements["omegaconf"]
    assert "2.3.0" in omegaconf and "2.4.0" not in omegaconf and version("omegaconf") in omegaconf
    assert "1.3.2" in requirements["hydra-core"] and "1.4.0" not in requirements["hydra-core"]
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import biencoder.engine.config.schema"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
