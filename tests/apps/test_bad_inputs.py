"""The bad-input matrix: every CLI entry point, run as a user would, against inputs that must be refused.

For each case: a non-zero exit, exactly one ``error:`` line on stderr naming the problem, no Python traceback
(unless HYDRA_FULL_ERROR=1), and no run folder left behind that claims to be finished.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, grid_layout, write_corpus
from helpers import finished_folders, run_python

FAST = ["model=tiny", "trainer.progress=false", "trainer.max_epochs=1", "trainer.batch_size=8", "eval.tasks=false"]
PLOT = [str(REPO / "scripts" / "plot_top1.py")]


def module(name):
    return ["-m", f"biencoder.{name}"]


def no_pairs(tmp):
    layout = grid_layout()
    for theme in layout["test"].values():
        for sides in theme.values():
            for stance in sides:
                sides[stance] = [(point, None) for point, _ in sides[stance]]
    return str(write_corpus(tmp / "nopairs", layout))


def non_utf8(tmp):
    root = write_corpus(tmp / "latin1", grid_layout())
    (root / "test/theme0/debate00/pro/pro01a-point.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    return str(root)


def empty_dir(tmp):
    (tmp / "empty").mkdir()
    return str(tmp / "empty")


def a_file(tmp):
    (tmp / "file").write_text("not a folder\n")
    return str(tmp / "file")


def corrupt_checkpoint(tmp):
    (tmp / "run").mkdir()
    (tmp / "run" / "best.pt").write_bytes(b"PK\x03\x04 this is not a checkpoint")
    return str(tmp / "run")


def corrupt_last(tmp):
    """A folder that looks like an interrupted run whose last.pt is garbage."""
    folder = tmp / "logs" / "interrupted"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"epoch": 0, "split": "train", "variant": "plain", "seed": 0}\n')
    (folder / "last.pt").write_bytes(b"\x00" * 64)
    return str(folder)


def logs_with(tmp, metrics_text):
    folder = tmp / "logs" / "runs" / "x_plain_s0"
    folder.mkdir(parents=True)
    (folder / "config_resolved.yaml").write_text("seed: 0\n")
    (folder / "metrics.jsonl").write_text(metrics_text)
    return str(tmp / "logs")


ROW = '{"epoch": 0, "split": "val", "variant": "plain", "seed": 0, "top1": 0.5}\n'

# (id, argv builder(tmp) -> list, env builder(tmp) -> dict, substring the error line must contain)
CASES = [
    (
        "missing corpus",
        lambda t: [*module("train"), *FAST, "data=arguana"],
        lambda t: {"ARGUANA_ROOT": str(t / "nowhere")},
        "does not exist",
    ),
    ("empty corpus", lambda t: [*module("train"), *FAST, f"data.root={empty_dir(t)}"], None, "no split folder"),
    ("split without pairs", lambda t: [*module("corpus"), "stats", no_pairs(t)], None, "has no pairs"),
    ("non-UTF-8 file", lambda t: [*module("tasks"), non_utf8(t), "--split", "test"], None, "is not UTF-8"),
    ("unknown variant", lambda t: [*module("train"), *FAST, "+variant=layernorm"], None, "variant/layernorm"),
    ("bad flag value", lambda t: [*module("train"), *FAST, "trainer.lr=fast"], None, "trainer.lr"),
    ("negative lr", lambda t: [*module("train"), *FAST, "trainer.lr=-0.1"], None, "trainer.lr=-0.1"),
    (
        "random rate above 1",
        lambda t: [*module("train"), *FAST, "negatives.random_rate.start=1.5"],
        None,
        "negatives.random_rate.start",
    ),
    # not Hydra's "use +trainer.epochs=3", which would only lead to the next line
    (
        "unknown key",
        lambda t: [*module("train"), *FAST, "trainer.epochs=3"],
        None,
        "unknown config key trainer.epochs (did you mean trainer.max_epochs?)",
    ),
    (
        "unknown key added with +",
        lambda t: [*module("train"), *FAST, "+trainer.max_epoch=2"],
        None,
        "did you mean trainer.max_epochs?",
    ),
    (
        "a key of the other loss",
        lambda t: [*module("train"), *FAST, "loss=triplet_ce", "loss.scale=10"],
        None,
        "loss.scale is a key of loss=infonce, not of loss=triplet_ce",
    ),
    ("a group without +", lambda t: [*module("train"), *FAST, "variant=ln"], None, "use +variant=ln"),
    (
        "a head flag against its key",
        lambda t: [*module("train"), *FAST, "+variant=ln", "model.head.norm=rmsnorm"],
        None,
        "model.head.use_layernorm=true and model.head.norm=rmsnorm contradict each other",
    ),
    (
        "a head part that is not installed",
        lambda t: [*module("train"), *FAST, "model.head.norm=no_such_pkg.norms:ScaleNorm"],
        None,
        "needs the module 'no_such_pkg', which is not installed here",
    ),
    (
        "a misspelt head part",
        lambda t: [*module("train"), *FAST, "model.head.norm=rmsnrom"],
        None,
        "did you mean rmsnorm?",
    ),
    (
        "a logger's key without the logger",
        lambda t: [*module("train"), *FAST, "+logger.mlflow.experiment=x"],
        None,
        "add logger=mlflow",
    ),
    (
        "a key inside a null node",
        lambda t: [*module("evaluate"), "model.encoder.random_init.hidden_size=8"],
        None,
        "model.encoder.random_init, which is null",
    ),
    ("a sweep value without -m", lambda t: [*module("train"), *FAST, "seed=0,1"], None, "add --multirun"),
    ("-m with --cfg job", lambda t: [*module("train"), "-m", "--cfg", "job", *FAST, "seed=0,1"], None, "drop -m"),
    (
        "resume at a folder that is not a run",
        lambda t: [*module("train"), *FAST, f"trainer.resume={empty_dir(t)}"],
        None,
        "is not a run folder",
    ),
    ("unknown split name", lambda t: [*module("tasks"), "demo", "--split", "valid"], None, "val (or validation)"),
    ("zero epochs", lambda t: [*module("train"), *FAST, "trainer.max_epochs=0"], None, "trainer.max_epochs=0"),
    (
        "max_length above the encoder's",
        lambda t: [*module("train"), *FAST, "model.max_length=4096"],
        None,
        "model.max_length=4096",
    ),
    (
        "unknown model path",
        lambda t: [*module("train"), *FAST, "model.encoder.name_or_path=/no/such/model"],
        None,
        "/no/such/model",
    ),
    (
        "corrupt checkpoint",
        lambda t: [*module("evaluate"), "trainer.progress=false", f"eval.checkpoint={corrupt_checkpoint(t)}"],
        None,
        "not a readable",
    ),
    ("missing checkpoint", lambda t: [*module("evaluate"), "eval.checkpoint=/no/run"], None, "does not exist"),
    ("checkpoint without best.pt", lambda t: [*module("evaluate"), f"eval.checkpoint={t}"], None, "has no best.pt"),
    (
        "corrupt last.pt on resume",
        lambda t: [*module("train"), *FAST, f"trainer.resume={corrupt_last(t)}"],
        None,
        "corrupt",
    ),
    (
        "unwritable cache dir",
        lambda t: [*module("train"), *FAST, "model.encoder.freeze=true", f"trainer.cache_dir={a_file(t)}"],
        None,
        "trainer.cache_dir",
    ),
    (
        "unwritable log dir",
        lambda t: [*module("train"), *FAST, f"paths.log_dir={a_file(t)}/logs"],
        None,
        "paths.log_dir",
    ),
    ("empty logs dir for the plot", lambda t: [*PLOT, empty_dir(t)], None, "no run folders"),
    (
        "only a torn metrics.jsonl for the plot",
        lambda t: [*PLOT, logs_with(t, ROW + '{"epoch": 1, "spl')],
        None,
        "no finished run",
    ),
    (
        "corrupt metrics.jsonl for the plot",
        lambda t: [*PLOT, logs_with(t, ROW + "garbage\n" + ROW)],
        None,
        "line 2 is not JSON",
    ),
]


#: the cases run as a process of their own, one per program (the others run in this process: the same code path,
#: from the command line's parsing to its exit, without importing torch again: :func:`helpers.run_in_process`)
IN_A_PROCESS = {
    "missing corpus",
    "split without pairs",
    "non-UTF-8 file",
    "corrupt checkpoint",
    "empty logs dir for the plot",
}


assert IN_A_PROCESS <= {case[0] for case in CASES}  # a misspelt name would drop its program's process case


def _case(case):
    return pytest.param(*case[1:], case[0] in IN_A_PROCESS, id=case[0])


@pytest.mark.slow
@pytest.mark.parametrize("argv, env, expect, own_process", [_case(c) for c in CASES])
def test_bad_input_is_refused_in_one_line(tmp_path, argv, env, expect, own_process):
    logs = tmp_path / "logs"
    args = argv(tmp_path)
    if args[:2] == ["-m", "biencoder.train"] or args[:2] == ["-m", "biencoder.evaluate"]:
        if not any(a.startswith("paths.log_dir=") for a in args):
            args.append(f"paths.log_dir={logs}")
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    environ.update(env(tmp_path) if env else {})
    proc = run_python(args, env=environ, cwd=tmp_path, own_process=own_process, timeout=300)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expect in errors[0], proc.stderr
    assert finished_folders(tmp_path) == []
    runs = logs / "runs"
    leftovers = [p for p in runs.iterdir()] if runs.is_dir() else []
    assert all((p / "metrics.jsonl").exists() for p in leftovers), f"empty run folders left: {leftovers}"


@pytest.mark.slow
def test_full_error_still_shows_the_traceback(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "biencoder.train", *FAST, "trainer.lr=fast", f"paths.log_dir={tmp_path}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.slow
def test_a_corrupt_cache_entry_is_recomputed_not_fatal(tmp_path):
    """Not an error: the damaged shard is named in a warning, deleted, recomputed; the numbers do not change."""
    cache = tmp_path / "cache"
    base = [sys.executable, "-m", "biencoder.train", *FAST, "model.encoder.freeze=true", f"trainer.cache_dir={cache}"]
    first = subprocess.run([*base, f"hydra.run.dir={tmp_path / 'a'}"], capture_output=True, text=True, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    for shard in cache.rglob("*.npz"):
        shard.write_bytes(shard.read_bytes()[: len(shard.read_bytes()) // 2])
    second = subprocess.run([*base, f"hydra.run.dir={tmp_path / 'b'}"], capture_output=True, text=True, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "cannot be read" in second.stderr + (tmp_path / "b" / "train.log").read_text()
    rows = [(tmp_path / d / "metrics.jsonl").read_text().splitlines() for d in "ab"]

    def strip(lines):
        return [{k: v for k, v in json.loads(x).items() if k != "epoch_time_s"} for x in lines]

    assert strip(rows[0]) == strip(rows[1])


def test_a_log_file_that_cannot_be_written_is_one_line(capsys, monkeypatch):
    """Hydra configures the job's log file before the app runs; in a folder that exists but is not writable (a
    read-only mount, or trainer.resume at one) logging raises "Unable to configure handler 'file'", a ValueError
    around the OSError. (As root no permission bit stops a write, so the failing open is made with a path under
    /proc; the error takes the same way.)"""
    import logging.config

    from biencoder.hydra_glue import hydra_cli

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(sys, "argv", ["biencoder.train"])

    def app():
        logging.config.dictConfig(
            {
                "version": 1,
                "handlers": {"file": {"class": "logging.FileHandler", "filename": "/proc/no-such-folder/train.log"}},
            }
        )

    with pytest.raises(SystemExit) as stop:
        hydra_cli(app)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "/proc/no-such-folder/train.log" in err[0] and "writable folder" in err[0]


@pytest.mark.slow
def test_an_eval_output_that_is_a_folder_is_refused_before_the_evaluation(tmp_path):
    """eval.output names the JSON file; a folder is one line before any work, and the evaluation's own folder
    (made by this process) is not left behind. The folder named stays as it was."""
    target = tmp_path / "results"
    target.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "biencoder.evaluate",
            "eval.score=tfidf",
            f"eval.output={target}",
            f"paths.log_dir={tmp_path / 'logs'}",
        ],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path,
        timeout=300,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert f"eval.output={target} is a folder" in errors[0] and f"{target / 'eval.json'}" in errors[0]
    assert list(target.iterdir()) == []
    evaluations = tmp_path / "logs" / "evaluations"
    assert not evaluations.exists() or list(evaluations.iterdir()) == []
