"""scripts/make_synthetic_pairs.py: the synthetic pair files of the scale benchmark (docs/scaling-data.md)."""

import json
import runpy

import pytest

from conftest import REPO

SCRIPT = runpy.run_path(str(REPO / "scripts" / "make_synthetic_pairs.py"))


def read(folder):
    return {
        name: [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]
        for name in ("train", "val", "test")
    }


@pytest.mark.slow
def test_files_are_deterministic_by_seed_and_split_as_asked(tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        assert SCRIPT["main"](["--pairs", "200", "--out", str(tmp_path / name), "--seed", str(seed)]) == 0
    a, b, c = read(tmp_path / "a"), read(tmp_path / "b"), read(tmp_path / "c")
    assert a == b and a != c
    assert {name: len(rows) for name, rows in a.items()} == {"train": 120, "val": 40, "test": 40}
    rows = [row for split in a.values() for row in split]
    assert all(set(row) == {"anchor", "positive", "group"} for row in rows)
    assert all(len(row["anchor"].split()) == 24 and row["anchor"] != row["positive"] for row in rows)
    # the positive repeats half of its anchor's 6 own words (and shares topic and filler words besides)
    assert all(len(set(row["anchor"].split()) & set(row["positive"].split())) >= 3 for row in rows)
    assert len({row["anchor"] for row in rows}) == 200 and len({row["group"] for row in rows}) > 1


@pytest.mark.parametrize("args", [["--pairs", "5"], ["--pairs", "100", "--overlap", "0"]])
def test_bad_arguments_exit_2(tmp_path, args, capsys):
    assert SCRIPT["main"](args + ["--out", str(tmp_path)]) == 2
    assert "--" in capsys.readouterr().err
