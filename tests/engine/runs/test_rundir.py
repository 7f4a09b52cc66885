"""Run-folder safety through the real CLI: an error never deletes or changes what this process did not create,
``trainer.resume`` takes only run folders, resumed runs stay in their cell, and a finished run is not "resumed"
with other settings."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from biencoder.engine.training.run import run
from biencoder.errors import ConfigError
from biencoder.report.runs import assign_cells, find_runs
from biencoder.report.tables import paired_comparisons, summary_table
from conftest import FAST, REPO, compose_cfg, hold

TINY = ["model=tiny", "trainer.progress=false", "trainer.batch_size=8", "trainer.max_epochs=1", "eval.tasks=false"]


def train(*args, cwd=REPO):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, "-m", "biencoder.train", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def snapshot(root: Path) -> dict[str, str]:
    """Every file below ``root`` (relative path -> SHA-256), folders included as entries."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """A real sweep folder holding four finished runs (2 cells x 2 seeds)."""
    sweep = tmp_path_factory.mktemp("logs") / "sweep"
    proc = train("-m", *TINY, "+variant=ln,plain", "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sweep


@pytest.mark.slow
def test_resume_at_a_sweep_folder_with_a_bad_value_touches_nothing(finished_sweep):
    before = snapshot(finished_sweep)
    error = one_error_line(train("+variant=ln", *TINY, f"trainer.resume={finished_sweep}", "trainer.lr=-1"))
    assert str(finished_sweep) in error and "not a run folder" in error and "config_resolved.yaml" in error
    assert snapshot(finished_sweep) == before  # every file still there, byte for byte; nothing added


@pytest.mark.slow
def test_resume_at_a_finished_run_with_a_bad_value_touches_nothing(finished_sweep):
    job = next(p for p in finished_sweep.iterdir() if p.name.endswith("_ln_s0"))
    before = snapshot(job)
    error = one_error_line(train("+variant=ln", *TINY, f"trainer.resume={job}", "trainer.lr=-1"))
    assert "trainer.lr=-1" in error
    assert snapshot(job) == before  # not even Hydra's .hydra/ is rewritten


@pytest.mark.slow
def test_resume_dot_in_a_folder_of_files_removes_nothing(tmp_path):
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "code.py").write_text("print(1)\n")
    before = snapshot(tmp_path)
    error = one_error_line(train("+variant=ln", *TINY, "trainer.resume=.", "trainer.lr=-1", cwd=tmp_path))
    assert "trainer.resume='.'" in error and "not a run folder" in error
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_a_fresh_run_with_a_bad_value_leaves_no_folder(tmp_path):
    error = one_error_line(train(*TINY, "trainer.lr=-1", f"paths.log_dir={tmp_path / 'logs'}"))
    assert "trainer.lr=-1" in error
    runs = tmp_path / "logs" / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []


@pytest.mark.slow
def test_an_existing_output_folder_is_never_removed(tmp_path):
    """hydra.run.dir pointing at a folder the user made: an error found before (a bad value) or after Hydra wrote
    into it (a corpus that does not exist) leaves the folder as it was: the user's file, and nothing added (Hydra's
    .hydra/ and train.log, made by this process, are removed)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious\n")
    before = snapshot(folder)
    one_error_line(train(*TINY, "trainer.lr=-1", f"hydra.run.dir={folder}"))
    assert snapshot(folder) == before
    error = one_error_line(train(*TINY, f"data.root={tmp_path / 'no-corpus'}", f"hydra.run.dir={folder}"))
    assert "no-corpus" in error
    assert snapshot(folder) == before


@pytest.mark.slow
def test_a_new_output_folder_named_on_the_command_line_is_removed_after_an_error(tmp_path):
    """The folder and the parents made for it go; the parent that was there stays."""
    folder = tmp_path / "new" / "deeper" / "run"
    error = one_error_line(train(*TINY, f"data.root={tmp_path / 'no-corpus'}", f"hydra.run.dir={folder}"))
    assert "no-corpus" in error and not (tmp_path / "new").exists() and tmp_path.is_dir()


def test_in_a_folder_that_existed_only_this_jobs_hydra_files_are_removed(tmp_path):
    """What appeared in an existing folder while the command ran, but was not written by it (another process's
    files, a new project folder), stays: only Hydra's files of this job, absent before, are removed."""
    from biencoder.engine.runs.folder import discard_if_ours, new_dir_resolver
    from biencoder.hydra_glue import HYDRA_FILES

    home = tmp_path / "home"
    home.mkdir()
    (home / "README.txt").write_text("mine\n")
    (home / "evaluate.log").write_text("an older log\n")
    new_dir_resolver(home)  # what Hydra resolves before it writes
    for name in HYDRA_FILES + ("train.log",):
        (home / name).parent.mkdir(exist_ok=True)
        (home / name).write_text("")
    (home / "other_project").mkdir()
    (home / "other_project" / "last.pt").write_bytes(b"x")
    (home / "tfidf.json").write_text("{}")
    (home / "evaluate.log").write_text("an older log, appended to\n")
    assert discard_if_ours(home, HYDRA_FILES + ("train.log", "evaluate.log"))
    assert sorted(p.name for p in home.iterdir()) == ["README.txt", "evaluate.log", "other_project", "tfidf.json"]
    assert (home / "other_project" / "last.pt").exists()


def test_job_files_outside_the_folder_or_behind_a_symlink_are_never_removed(tmp_path):
    """A job name with a path in it (hydra.job.name=../notes) or a .hydra that is a symlink elsewhere: the files
    named lie outside the folder, so nothing is removed, however new they are."""
    from biencoder.engine.runs.folder import discard_if_ours, new_dir_resolver

    folder, elsewhere = tmp_path / "proj" / "out", tmp_path / "elsewhere"
    folder.mkdir(parents=True)
    elsewhere.mkdir()
    new_dir_resolver(folder)
    (tmp_path / "proj" / "notes.log").write_text("the user's notes\n")
    (elsewhere / "config.yaml").write_text("someone else's\n")
    (folder / ".hydra").symlink_to(elsewhere)
    assert not discard_if_ours(folder, ("../notes.log", str(tmp_path / "proj" / "notes.log"), ".hydra/config.yaml"))
    assert (tmp_path / "proj" / "notes.log").exists() and (elsewhere / "config.yaml").exists()


def test_a_log_handler_in_a_removed_folder_is_detached(tmp_path):
    """Under torchrun a rank > 0 removes its own empty Hydra folder: a handler left on the logger would try to
    reopen a file in a folder that is gone at the next warning."""
    import logging

    from biencoder.engine.runs.folder import discard_if_ours, new_dir_resolver

    folder = tmp_path / "rank1"
    new_dir_resolver(folder)
    folder.mkdir()
    handler = logging.FileHandler(folder / "train.log")
    logger = logging.getLogger("biencoder")
    logger.addHandler(handler)
    try:
        assert discard_if_ours(folder) and not folder.exists()
        assert handler not in logger.handlers
    finally:
        logger.removeHandler(handler)


@pytest.mark.slow
def test_a_quoted_run_dir_is_removed_after_an_error_and_a_quoted_resume_path_expands_home(tmp_path):
    """hydra.run.dir='a b' (Hydra's quoting) is the folder a b; trainer.resume='~/r1' is $HOME/r1, not a new
    folder named ~ in the working directory."""
    home = tmp_path / "home"
    assert train(*TINY, f"hydra.run.dir={home / 'r1'}").returncode == 0
    folder = tmp_path / "with space"
    one_error_line(train(*TINY, f"data.root={tmp_path / 'no-corpus'}", f"hydra.run.dir='{folder}'", cwd=tmp_path))
    assert not folder.exists()
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "biencoder.train", *TINY, "trainer.resume='~/r1'"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0 and "already done" in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "~").exists()


@pytest.mark.slow
def test_resume_with_a_corrupt_last_pt_changes_nothing(tmp_path):
    """The unreadable checkpoint is refused before the folder is touched: no final.json 'failed', the same
    config_resolved.yaml, nothing written to train.log."""
    folder = tmp_path / "run"
    assert train(*TINY, f"hydra.run.dir={folder}", "trainer.keep_last=true").returncode == 0
    (folder / "final.json").unlink()  # an interrupted run, as far as resume can tell
    (folder / "last.pt").write_bytes(b"\x00" * 64)
    before = snapshot(folder)
    error = one_error_line(train(*TINY, f"trainer.resume={folder}"))
    assert "last.pt" in error and "corrupt" in error
    assert snapshot(folder) == before


@pytest.mark.slow
def test_resumed_jobs_stay_in_their_cell(finished_sweep, tmp_path):
    """One job of a 2x2 sweep dies; the sweep is resubmitted with trainer.resume=true (and other settings that
    change no result): the table and the paired test still see 2 cells x 2 seeds."""
    import shutil

    sweep = tmp_path / "sweep"
    shutil.copytree(finished_sweep, sweep)
    killed = next(p for p in sweep.iterdir() if p.name.endswith("_plain_s1"))
    for name in ("final.json", "best.pt", "test_hits.npy"):  # as a kill before the end leaves it
        (killed / name).unlink()
    proc = train(
        "-m",
        *TINY,
        "+variant=ln,plain",
        "seed=0,1",
        f"hydra.sweep.dir={sweep}",
        "trainer.resume=true",
        "trainer.keep_last=true",
        "trainer.num_workers=0",
        "trainer.eval_batch_size=16",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trainer" in (killed / "config_resolved.yaml").read_text()
    runs = find_runs([sweep])
    assert assign_cells(runs) == []  # nothing but the variant separates the cells
    table = summary_table(runs, n_boot=200).set_index("cell")
    assert sorted(table.index) == ["ln", "plain"] and table["seeds"].tolist() == [2, 2]
    paired = paired_comparisons(runs, n_boot=200)
    assert paired["seeds"].tolist() == [2] and paired["pairing"].tolist() == ["matched"]


@pytest.mark.slow
def test_a_sweep_resumed_while_one_job_is_held_refuses_at_that_job(finished_sweep, tmp_path):
    """A resumed sweep takes each job's folder as a single resume does: job 0 (done) is skipped as before, job 1,
    held by another process, ends the sweep in one line naming it and its holder, exit 2, before Hydra writes into
    it; jobs 1-3 byte for byte as they were."""
    import shutil
    import socket

    sweep = tmp_path / "sweep"
    shutil.copytree(finished_sweep, sweep)
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0_ln_s0", "1_ln_s1", "2_plain_s0", "3_plain_s1"]
    holder = hold(jobs[1])
    try:
        before = {job.name: snapshot(job) for job in jobs[1:]}
        error = one_error_line(
            train("-m", *TINY, "+variant=ln,plain", "seed=0,1", f"hydra.sweep.dir={sweep}", "trainer.resume=true")
        )
        assert f"{jobs[1]} is in use by pid {holder.pid} on {socket.gethostname()} since " in error
        assert {job.name: snapshot(job) for job in jobs[1:]} == before
        assert "already done" in (jobs[0] / "train.log").read_text()  # job 0 went as it goes without a holder
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_finished_run_is_not_resumed_with_other_settings(tmp_path):
    out = tmp_path / "run"
    run(compose_cfg(FAST + ["trainer.max_epochs=1", "eval.tasks=false"]), out)
    final = (out / "final.json").read_text()
    with pytest.raises(ConfigError, match=r"trainer\.lr.*trainer\.max_epochs|trainer\.max_epochs"):
        run(
            compose_cfg(FAST + ["trainer.max_epochs=12", "trainer.lr=0.5", "eval.tasks=false", "trainer.resume=true"]),
            out,
        )
    assert (out / "final.json").read_text() == final
    # the same settings: skipped, as before
    again = run(
        compose_cfg(
            FAST + ["trainer.max_epochs=1", "eval.tasks=false", "trainer.resume=true", "trainer.progress=true"]
        ),
        out,
    )
    assert again == json.loads(final)


@pytest.mark.slow
def test_unknown_keys_are_refused_even_with_plus():
    from biencoder.engine.config.validation import validate

    with pytest.raises(ConfigError, match=r"trainer\.max_epoch \(did you mean trainer\.max_epochs\?\)"):
        validate(compose_cfg(["+trainer.max_epoch=2"]))
    with pytest.raises(ConfigError, match=r"unknown config key trainer\.foo:"):
        validate(compose_cfg(["+trainer.foo=1"]))
    validate(compose_cfg(["model=tiny", "+model.encoder.random_init.hidden_dropout_prob=0.2"]))  # free-form


def as_before_the_record(folder: Path) -> None:
    """Rewrite a run's config_resolved.yaml as biencoder wrote it before it recorded the runtime: device and
    precision as configured (auto), no trainer.deterministic, no runtime section."""
    import yaml

    path = folder / "config_resolved.yaml"
    config = yaml.safe_load(path.read_text())
    config.pop("runtime")
    config["trainer"].pop("deterministic")
    config["trainer"].update(device="auto", precision="auto")
    path.write_text(yaml.safe_dump(config, sort_keys=False))


@pytest.mark.slow
def test_the_precision_actually_used_separates_cells_and_older_runs_group_as_before(finished_sweep, tmp_path):
    import shutil

    import yaml

    used = {
        yaml.safe_load((job / "config_resolved.yaml").read_text())["trainer"]["precision"]
        for job in finished_sweep.iterdir()
        if job.is_dir()
    }
    assert len(used) == 1 and used <= {"fp32", "bf16"}  # auto, resolved: fp32 on a CPU, bf16 on a recent GPU
    (same,), (other,) = used, {"fp32", "bf16"} - used
    run(compose_cfg(TINY + ["+variant=plain", f"trainer.precision={other}"]), tmp_path / "other")
    runs = find_runs([finished_sweep, tmp_path / "other"])
    assert assign_cells(runs) == ["trainer.precision"]
    assert sorted({r.cell for r in runs}) == [
        f"ln precision={same}",
        f"plain precision={other}",
        f"plain precision={same}",
    ]
    # runs from before the record (precision: auto, no runtime section) load and group as they did
    old = tmp_path / "old"
    shutil.copytree(finished_sweep, old)
    for job in old.iterdir():
        if job.is_dir():
            as_before_the_record(job)
    runs = find_runs([old])
    assert assign_cells(runs) == [] and sorted({r.cell for r in runs}) == ["ln", "plain"]


@pytest.mark.slow
def test_resuming_on_another_device_type_or_precision_is_refused(tmp_path):
    import yaml

    cfg = FAST + ["trainer.max_epochs=1", "eval.tasks=false", "trainer.device=cpu"]
    out = tmp_path / "run"
    run(compose_cfg(cfg), out)
    before = snapshot(out)
    with pytest.raises(ConfigError, match=r"trainer\.precision: 'fp32' -> 'bf16'"):
        run(compose_cfg(cfg + ["trainer.precision=bf16", "trainer.resume=true"]), out)
    # as a GPU run records itself; continued on the CPU
    config = yaml.safe_load((out / "config_resolved.yaml").read_text())
    config["trainer"].update(device="cuda", precision="bf16")
    (out / "config_resolved.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with pytest.raises(ConfigError, match="it ran on cuda, and this process would continue it on cpu") as err:
        run(compose_cfg(cfg + ["trainer.precision=bf16", "trainer.resume=true"]), out)
    assert "\n" not in str(err.value)
    assert {k: v for k, v in snapshot(out).items() if k != "config_resolved.yaml"} == {
        k: v for k, v in before.items() if k != "config_resolved.yaml"
    }
    # a run recorded before device and precision were resolved is not checked on them, as before
    as_before_the_record(out)
    assert run(compose_cfg(cfg + ["trainer.resume=true"]), out) == json.loads((out / "final.json").read_text())


@pytest.mark.slow
def test_starting_over_without_last_pt_says_how_many_rows_it_drops(tmp_path):
    """A resumed folder without last.pt (killed after logging epoch 0 but before its checkpoint, or last.pt
    deleted) starts over: metrics.jsonl is emptied first, and the log says so with the count of rows dropped."""
    from biencoder.engine.runs.records import read_metrics

    out = tmp_path / "run"
    overrides = FAST + ["trainer.max_epochs=1", "eval.tasks=false"]
    run(compose_cfg(overrides), out)
    rows = len(read_metrics(out / "metrics.jsonl")[0])
    (out / "final.json").unlink()  # unfinished again; a finished run keeps no last.pt (trainer.keep_last=false)
    assert rows > 0 and not (out / "last.pt").exists()
    run(compose_cfg(overrides + ["trainer.resume=true"]), out)
    assert f"no last.pt: {rows} rows of metrics.jsonl dropped, starting over" in (out / "train.log").read_text()
    assert len(read_metrics(out / "metrics.jsonl")[0]) == rows  # the epoch logged once, not twice


@pytest.mark.slow
def test_a_run_that_recorded_the_retired_head_stats_every_resumes_and_groups_with_new_runs(tmp_path):
    """trainer.head_stats_every became trainer.stats_every (it samples the gradient norms too). A run that recorded
    the old name is not refused on resume, and it shares its cell with a run made today."""
    cfg = FAST + ["trainer.max_epochs=1", "eval.tasks=false", "+variant=plain"]
    old, new = tmp_path / "old", tmp_path / "new"
    done = run(compose_cfg(cfg), old)
    saved = old / "config_resolved.yaml"
    saved.write_text(saved.read_text().replace("  stats_every: 8\n", "  head_stats_every: 8\n"))
    assert "  head_stats_every: 8\n" in saved.read_text()
    assert run(compose_cfg(cfg + ["trainer.resume=true"]), old) == done  # finished: skipped, not refused
    run(compose_cfg(cfg), new)
    runs = find_runs([old, new])
    assert assign_cells(runs) == [] and {r.cell for r in runs} == {"plain"}


@pytest.mark.slow
def test_a_run_made_with_balltree_resumes_and_groups_under_the_exact_default(tmp_path):
    """The index changed its default from balltree to exact; both find the same neighbours, so a run made with
    BallTree is not refused on resume and shares its cell with one made with exact search."""
    cfg = FAST + ["trainer.max_epochs=1", "eval.tasks=false", "+variant=plain"]
    old, new = tmp_path / "old", tmp_path / "new"
    done = run(compose_cfg(cfg + ["negatives.index=balltree", "eval.index=balltree"]), old)
    assert run(compose_cfg(cfg + ["trainer.resume=true"]), old) == done  # finished: skipped, not refused
    assert run(compose_cfg(cfg), new)["best"] == done["best"]  # the same numbers with exact search
    runs = find_runs([old, new])
    assert assign_cells(runs) == [] and {r.cell for r in runs} == {"plain"}


@pytest.mark.slow
def test_a_sweep_whose_glob_matches_nothing_is_an_error_and_leaves_no_folder(tmp_path):
    """`+variant=glob(x*)` matches no variant: Hydra launches 0 jobs and would exit 0 with an empty sweep folder.
    Into a sweep folder that holds earlier jobs it is the same error, and those jobs stay as they were."""
    sweep = tmp_path / "logs" / "sweep"
    error = one_error_line(train("-m", *TINY, "+variant=glob(x*)", f"hydra.sweep.dir={sweep}"))
    assert "launched 0 jobs" in error and "conf/variant/*.yaml" in error
    assert not sweep.exists()
    old_job = sweep / "0_ln_s0"
    old_job.mkdir(parents=True)
    (old_job / "metrics.jsonl").write_text("{}\n")
    os.utime(old_job / "metrics.jsonl", (1e9, 1e9))  # written long before this command
    error = one_error_line(train("-m", *TINY, "+variant=glob(x*)", f"hydra.sweep.dir={sweep}"))
    assert "launched 0 jobs" in error and (old_job / "metrics.jsonl").read_text() == "{}\n"
    mine = tmp_path / "my-empty-folder"  # a folder the user made: the error leaves it
    mine.mkdir()
    error = one_error_line(train("-m", *TINY, "+variant=glob(x*)", f"hydra.sweep.dir={mine}"))
    assert "launched 0 jobs" in error and mine.is_dir()
    new_default = tmp_path / "fresh-logs"  # the default sweep folder under a new log folder: nothing left
    one_error_line(train("-m", *TINY, "+variant=glob(x*)", f"paths.log_dir={new_default}"))
    assert not new_default.exists()


@pytest.mark.slow
def test_multirun_flag_after_an_override_is_understood(tmp_path):
    """`python -m biencoder.train model=tiny -m ...` was argparse's usage error ("unrecognized arguments"); the
    sweep starts (here with no job: the glob matches nothing, which is its own one-line error)."""
    sweep = tmp_path / "sweep"
    error = one_error_line(train(*TINY, "-m", "+variant=glob(x*)", f"hydra.sweep.dir={sweep}"))
    assert "launched 0 jobs" in error
