"""biencoder.engine.files's JSON: every record the package writes is strict JSON (a non-finite number as null, named
with its reason), and every reader reads those records and the ones written with bare NaN before into the same
values."""

import gzip
import json
import math
import re

import pytest

from biencoder.engine.files import NON_FINITE, read_json, strict_json, write_json_atomic, write_text_atomic
from biencoder.engine.runs.records import append_rows, read_final, read_metrics, truncate_metrics
from conftest import FAST, REPO, compose_cfg

NAN, INF = float("nan"), float("inf")


def strict_loads(text: str):
    """What jq or JavaScript's JSON.parse accept: no NaN, Infinity or -Infinity."""

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def same(a, b) -> bool:
    """Equality in which NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


RECORD = {
    "status": "diverged",
    "epoch": 3,
    "loss_parts": {"loss": NAN, "ce_pos": 0.5, "a/b~c": INF},
    "curve": [0.1, -INF, None],
    "top1_seen": None,
}


def test_a_non_finite_value_is_null_and_named():
    text = strict_json(RECORD, indent=2)
    written = strict_loads(text)  # on the old writer: NaN / Infinity tokens, refused here
    assert written["loss_parts"] == {"loss": None, "ce_pos": 0.5, "a/b~c": None}
    assert written["curve"] == [0.1, None, None] and written["top1_seen"] is None  # a null that was None stays one
    # RFC 6901 pointers: "/" in a key is "~1", "~" is "~0"
    assert written[NON_FINITE] == {
        "/loss_parts/loss": "NaN",
        "/loss_parts/a~1b~0c": "Infinity",
        "/curve/1": "-Infinity",
    }
    assert same(read_json(text), RECORD)


def test_finite_records_are_written_as_json_dumps_writes_them():
    finite = {"epoch": 0, "split": "val", "top1": 0.25, "nested": {"x": [1, 2.5]}, "none": None}
    assert strict_json(finite) == json.dumps(finite)
    assert strict_json(finite, indent=2, sort_keys=True) == json.dumps(finite, indent=2, sort_keys=True)
    assert same(read_json(strict_json([finite, RECORD])), [finite, RECORD])  # a list: each record names its own


def test_what_cannot_be_said_is_refused():
    with pytest.raises(ValueError):
        strict_json([NAN])  # outside any record
    with pytest.raises(ValueError, match=NON_FINITE):
        strict_json({NON_FINITE: {}, "x": NAN})


def test_a_gz_file_is_gzipped_and_the_same_text_gives_the_same_bytes(tmp_path):
    """test.run.gz: gzip a tool reads, with no time in its header, so two runs that rank alike write equal files."""
    text = "q1 Q0 d1 1 100 tag\n" * 50
    write_text_atomic(tmp_path / "a.run.gz", text)
    first = (tmp_path / "a.run.gz").read_bytes()
    assert gzip.decompress(first).decode() == text and len(first) < len(text)
    write_text_atomic(tmp_path / "a.run.gz", text)  # a later write of the same text
    assert (tmp_path / "a.run.gz").read_bytes() == first and first[4:8] == bytes(4)  # gzip's MTIME field: 0
    assert first[3] == 0 and first[9] == 255  # FLG: no file name in the header; OS: unknown, on every Python
    write_text_atomic(tmp_path / "a.run", text)
    assert (tmp_path / "a.run").read_text() == text  # any other name: the text as it is


def test_records_written_before_read_the_same(tmp_path):
    """final.json and metrics.jsonl with bare NaN (the format before) and with null + non_finite (now): the same
    values through read_final and read_metrics."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    rows = [
        {"epoch": 0, "split": "train", "loss": 1.0, "neg_distance_hard": NAN},
        {"epoch": 1, "split": "train", "loss": 0.5, "neg_distance_hard": 2.0},
    ]
    (old / "final.json").write_text(json.dumps(RECORD, indent=2))
    (old / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "NaN" in (old / "final.json").read_text()
    write_json_atomic(new / "final.json", RECORD)
    append_rows(new / "metrics.jsonl", rows)
    for folder in (old, new):
        assert same(read_final(folder), RECORD)
        read, torn = read_metrics(folder / "metrics.jsonl")
        assert same(read, rows) and not torn
    strict_loads((new / "final.json").read_text())
    for line in (new / "metrics.jsonl").read_text().splitlines():
        strict_loads(line)
    # truncating an old file (a resume) rewrites its kept rows strictly
    assert truncate_metrics(old / "metrics.jsonl", 0) == 1
    [line] = (old / "metrics.jsonl").read_text().splitlines()
    assert strict_loads(line)[NON_FINITE] == {"/neg_distance_hard": "NaN"}


@pytest.mark.slow
def test_a_diverged_run_writes_strict_json_that_the_report_reads(tmp_path, monkeypatch):
    """The record of a run stopped by a NaN loss: strict JSON, loss parts null and named; the report reads it, and the
    same record written with bare NaN (before), as the same diverged run with NaN loss parts."""
    from biencoder.engine.training.epoch import Diverged
    from biencoder.engine.training.run import run
    from biencoder.report.runs import find_runs
    from conftest import poison_classifier

    poison_classifier(monkeypatch, at_epoch=1)
    new = tmp_path / "new"
    with pytest.raises(Diverged):
        run(compose_cfg(FAST + ["trainer.max_epochs=2", "eval.tasks=false"]), new)
    final = strict_loads((new / "final.json").read_text())
    assert final["status"] == "diverged" and set(final["loss_parts"].values()) == {None}
    assert final[NON_FINITE] == {f"/loss_parts/{k}": "NaN" for k in ("loss", "triplet", "ce_pos", "ce_neg")}
    old = tmp_path / "old"
    old.mkdir()
    for name in ("metrics.jsonl", "config_resolved.yaml"):
        (old / name).write_bytes((new / name).read_bytes())
    (old / "final.json").write_text(json.dumps(read_final(new), indent=2))  # the format before: bare NaN
    assert "NaN" in (old / "final.json").read_text()
    runs = {r.path.name: r for r in find_runs([tmp_path])}
    for name in ("old", "new"):
        assert runs[name].status == "diverged"
        assert all(math.isnan(v) for v in runs[name].final["loss_parts"].values())
        assert NON_FINITE not in runs[name].final
    assert same(runs["old"].final, runs["new"].final)


#: json.dumps calls in src/ that write no file and print no record: what they make is never stored or read as a record
NOT_RECORDS = {
    "engine/data/pair_records.py": "quotes a user's value in an error message",
    "bench/import_graph.py": "prints the import graph (names and counts, never a float) and imports nothing heavier",
    "report/baselines.py": "a grouping key (a dict key in memory)",
    "retrieve.py": "quotes a user's JSON value in an error message",
}


def test_every_json_text_the_package_writes_goes_through_strict_json():
    src = REPO / "src" / "biencoder"
    calls = {
        str(p.relative_to(src)): len(re.findall(r"\bjson\.dumps?\(", p.read_text()))
        for p in src.rglob("*.py")
        if p != src / "engine" / "files.py"  # strict_json itself
    }
    assert {name for name, n in calls.items() if n} == set(NOT_RECORDS)
    assert all(calls[name] == 1 for name in NOT_RECORDS)
