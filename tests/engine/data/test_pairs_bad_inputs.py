"""Every bad pair file the issue lists, through the real commands: ``biencoder-corpus stats`` (fast) and
``biencoder-train data=pairs`` (slow: a Python with torch per case). Each: exit 2, one ``error:`` line naming the file,
the line and the fix, no traceback, and no run folder left (finished-looking or empty). Duplicated pairs are no error:
they are counted."""

import json
import os
from pathlib import Path

import pytest

from helpers import finished_folders, run_python


def good(split: str) -> list[dict]:
    """Three pairs whose texts no other split shares (dedup keeps them all)."""
    return [{"anchor": f"{split} question {i}", "positive": f"{split} answer {i}"} for i in range(3)]


GOOD = good("test")
FAST = ["model=tiny", "trainer.progress=false", "trainer.max_epochs=1", "trainer.batch_size=8"]


def jsonl(path: Path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def pair_files(tmp: Path, train=None, val=None, test=None, suffix=".jsonl") -> dict[str, str]:
    """train/val/test files of these rows (JSON objects, or raw lines as strings; default :func:`good`)."""
    given = {"train": train, "val": val, "test": test}
    return {name: jsonl(tmp / f"{name}{suffix}", good(name) if rows is None else rows) for name, rows in given.items()}


def raw(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


def csv_files(tmp: Path, train_bytes: bytes) -> dict[str, str]:
    rows = {
        name: b"anchor,positive\n" + b"".join(f"{name} q{i},{name} a{i}\n".encode() for i in range(3))
        for name in ("val", "test")
    }
    return {
        "train": raw(tmp / "train.csv", train_bytes),
        "val": raw(tmp / "val.csv", rows["val"]),
        "test": raw(tmp / "test.csv", rows["test"]),
    }


# (id, files builder(tmp) -> {role: path}, the substrings the error line must hold; {option}: how the command
# spells a column override, data.columns.<role> for a run, --column <role> for biencoder-corpus stats)
CASES = [
    (
        "missing file",
        lambda t: {**pair_files(t), "val": str(t / "nowhere.jsonl")},
        ["nowhere.jsonl' does not exist: check the path"],
    ),
    (
        "unknown suffix",
        lambda t: {**pair_files(t), "train": jsonl(t / "train.txt", good("train"))},
        ["train.txt': unknown file type '.txt'", "data.format="],
    ),
    (
        "missing column",
        lambda t: pair_files(t, train=[{"question": "q", "positive": "p"}] * 2),
        ["train.jsonl' has no column 'anchor' (columns: question, positive)", "{option}anchor="],
    ),
    (
        "misspelled column",
        lambda t: pair_files(t, test=[{"anchor": f"a{i}", "positve": f"p{i}"} for i in range(3)]),
        ["test.jsonl' has no column 'positive'", "did you mean 'positve'?", "{option}positive=positve"],
    ),
    (
        "empty file",
        lambda t: pair_files(t, val=[]),
        ["val.jsonl' is empty (no records)"],
    ),
    (
        "empty text",
        lambda t: pair_files(t, train=good("train") + [{"anchor": "q", "positive": "   "}]),
        ["train.jsonl' line 4: 'positive' is empty"],
    ),
    (
        "non-string text",
        lambda t: pair_files(t, val=[{"anchor": 42, "positive": "p"}] + good("val")),
        ["val.jsonl' line 1: 'anchor' is 42, not a text"],
    ),
    (
        "null text",
        lambda t: pair_files(t, val=good("val") + [{"anchor": "q", "positive": None}]),
        ["val.jsonl' line 4: 'positive' is empty"],
    ),
    (
        "a split with fewer than 2 pairs",
        lambda t: pair_files(t, val=good("val")[:1]),
        ["val.jsonl': split 'val' has 1 pair", "at least 2"],
    ),
    (
        "not UTF-8",
        lambda t: csv_files(t, b"anchor,positive\nq,caf\xe9 au lait\n" + b"q2,p2\n"),
        ["train.csv' is not UTF-8", "line 2", "re-save it as UTF-8"],
    ),
    (
        "ragged CSV row",
        lambda t: csv_files(t, b"anchor,positive\nq1,p1\nq2,p2,extra\nq3,p3\n"),
        ["train.csv' line 3 has 3 fields, the header has 2", "quote"],
    ),
    (
        "a negative equal to its positive",
        lambda t: pair_files(t, train=good("train") + [{"anchor": "q", "positive": "p", "negative": " p "}]),
        ["train.jsonl' line 4: the negative equals its positive"],
    ),
    (
        "a line that is not JSON",
        lambda t: pair_files(t, test=[GOOD[0], '{"anchor": "q", "positive": ', GOOD[1]]),
        ["test.jsonl' line 2 is not JSON"],
    ),
    (
        "a JSON array",
        lambda t: pair_files(t, test=[json.dumps(GOOD)]),
        ["test.jsonl' holds a JSON array, not JSON Lines"],
    ),
    (
        "a group in one file only",
        lambda t: pair_files(t, val=[{**r, "group": "g"} for r in good("val")]),
        ["val.jsonl' has a group column and", "{option}group=null"],
    ),
    (
        "an unknown split in a split column",
        lambda t: {
            "file": jsonl(t / "all.jsonl", [{**r, "split": s} for s in ("train", "val", "dev") for r in good(s)])
        },
        ["all.jsonl' line 7: split 'dev' is not train, val or test"],
    ),
]


def run(args, cwd, own_process=False):
    """``python -m *args`` in ``cwd``, in a process of its own or in this one (:func:`helpers.run_python`)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return run_python(["-m", *args], env=env, cwd=cwd, own_process=own_process)


#: the case each command also meets in a process of its own
FIRST = CASES[0][0]


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("case, files, expect", CASES, ids=[c[0] for c in CASES])
def test_stats_refuses_a_bad_pair_file_in_one_line(tmp_path, case, files, expect):
    given = files(tmp_path)
    paths = [given["file"]] if "file" in given else [given[s] for s in ("train", "val", "test")]
    line = one_error_line(run(["biencoder.corpus", "stats", *paths], tmp_path, own_process=case == FIRST))
    for text in expect:
        assert text.format(option="--column ") in line, line
    assert "data.columns" not in line  # the training override means nothing to this command


@pytest.mark.slow
@pytest.mark.parametrize("case, files, expect", CASES, ids=[c[0] for c in CASES])
def test_train_refuses_a_bad_pair_file_in_one_line_and_leaves_no_run_folder(tmp_path, case, files, expect):
    given = files(tmp_path)
    logs = tmp_path / "logs"
    line = one_error_line(
        run(
            [
                "biencoder.train",
                *FAST,
                "data=pairs",
                *(f"data.{k}={v}" for k, v in given.items()),
                f"paths.log_dir={logs}",
            ],
            tmp_path,
            own_process=case == FIRST,
        )
    )
    for text in expect:
        assert text.format(option="data.columns.") in line, line
    assert finished_folders(tmp_path) == []
    assert not (logs / "runs").exists() or list((logs / "runs").iterdir()) == []


@pytest.mark.slow
def test_train_without_files_names_the_keys(tmp_path):
    line = one_error_line(
        run(["biencoder.train", *FAST, "data=pairs", f"paths.log_dir={tmp_path / 'logs'}"], tmp_path)
    )
    assert "data=pairs needs data.train, data.val, data.test" in line
    assert not (tmp_path / "logs" / "runs").exists() or list((tmp_path / "logs" / "runs").iterdir()) == []


@pytest.mark.slow
def test_duplicated_pairs_are_counted_not_refused(tmp_path):
    files = pair_files(tmp_path, train=good("train") + good("train")[:2])
    proc = run(["biencoder.corpus", "stats", "--json", files["train"], files["val"], files["test"]], tmp_path)
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout)["splits"]
    assert counts["train"]["pairs"] == 5 and counts["train"]["duplicated_pairs"] == 2
    assert counts["val"]["duplicated_pairs"] == 0


@pytest.mark.slow
def test_evaluate_says_the_8_tasks_need_arguana(tmp_path):
    line = one_error_line(
        run(
            ["biencoder.evaluate", "data=pairs_demo", "eval.score=tfidf", f"paths.log_dir={tmp_path / 'logs'}"],
            tmp_path,
        )
    )
    assert "biencoder-evaluate runs the 8 official tasks or the MTEB protocol, which need ArguAna's debates" in line


@pytest.mark.slow
def test_help_names_the_pair_files(tmp_path):
    proc = run(["biencoder.train", "--help"], tmp_path)
    assert proc.returncode == 0
    for said in (
        "data=pairs data.train=train.jsonl data.val=val.jsonl data.test=test.jsonl",
        "try data=pairs_demo",
        "docs/own-data.md",
        "data: arguana, beir, beir_demo, demo, pairs, pairs_demo",
    ):
        assert said in proc.stdout, said
