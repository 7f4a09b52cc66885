"""Pair files (biencoder.engine.data.pair_files, data=pairs): the reader against hand-counted fixtures and against the
ArguAna reader, the pool and group rules, given negatives, the config checks, and the data hash that keeps runs
apart."""

import numpy as np
import pandas as pd
import pytest

from biencoder.engine.config.packaged import pairs_demo
from biencoder.engine.config.validation import validate
from biencoder.engine.data.corpus import run_splits
from biencoder.engine.data.pair_files import export_pairs, read_pairs
from biencoder.engine.data.pair_records import PairsError, data_files
from biencoder.engine.retrieval.groups import group_shortlists
from biencoder.engine.retrieval.order import NONE, retrieve
from biencoder.errors import ConfigError
from conftest import compose_cfg
from helpers import ROWS, records, write_jsonl


def test_hand_counted_counts_dedup_and_overlap(tmp_path):
    pairs = read_pairs(write_jsonl(tmp_path))
    assert pairs.counts["train"] == {
        "pairs": 5,
        "duplicated_pairs": 1,
        "distinct_texts": 8,
        "anchors": 4,
        "positives": 4,
        "with_negative": 2,
        "groups": 2,
    }
    assert pairs.counts["test"]["duplicated_pairs"] == 0 and pairs.counts["val"]["groups"] == 2
    # val drops (a2, vp2): a2 is a test text; train drops (va1, tp3): va1 is a val text; the duplicate stays
    dedup = pairs.deduplicated()
    assert dedup.dropped == {"train": 1, "val": 1, "test": 0}
    assert dedup.split_pairs("train")["anchor"].tolist() == ["ta0", "ta1", "ta1", "ta4"]
    assert pairs.overlap()["val->test"] == {"pairs": 0, "of_pairs": 3, "texts": 1, "of_texts": 6}
    assert pairs.overlap()["train->val"]["texts"] == 1


def test_the_paired_split_of_pair_files(tmp_path):
    split = read_pairs(write_jsonl(tmp_path)).paired("train")
    assert split.n_pairs == 5 and split.texts[:5] == ["ta0", "ta1", "ta1", "va1", "ta4"]
    assert split.texts[5:] == ["tp0", "tp1", "tp1", "tp3", "tp4"] and split.table["group"].tolist()[:5] == [
        "g1",
        "g1",
        "g2",
        "g2",
        "g2",
    ]
    assert split.text_id.tolist() == [0, 1, 1, 2, 3, 4, 5, 5, 6, 7]  # a repeated text shares its id
    assert not split.supports_tasks and split.table["pair_id"][0].endswith("train.jsonl:line 1")
    # given negatives: "tn0" is new (training row 10), "tp0" is pair 0's positive (its text id, 4)
    assert split.extra_texts == ["tn0", "tp0"]
    assert split.given_triplets.tolist() == [[0, 5, 10], [4, 9, 11]]
    assert split.training_text_id.tolist() == split.text_id.tolist() + [8, 4]


def test_every_format_and_a_split_column_read_the_same(tmp_path):
    """JSON Lines, CSV, TSV, Parquet, one file with a split column, other column names mapped with data.columns."""
    expected = read_pairs(write_jsonl(tmp_path / "jsonl")).pairs.drop(columns=["source", "where"])
    frames = {s: pd.DataFrame(records(s)).rename(columns={"anchor": "question"}) for s in ("train", "val", "test")}
    mapping = {"anchor": "question"}
    for fmt, write in (
        ("csv", lambda f, p: f.to_csv(p, index=False)),
        ("tsv", lambda f, p: f.to_csv(p, index=False, sep="\t")),
        ("parquet", lambda f, p: f.to_parquet(p, index=False)),
    ):
        paths = {s: tmp_path / f"{s}.{fmt}" for s in frames}
        for s, frame in frames.items():
            write(frame, paths[s])
        got = read_pairs({"layout": "pairs", "columns": mapping, **{s: str(p) for s, p in paths.items()}})
        assert got.pairs.drop(columns=["source", "where"]).equals(expected), fmt
    one = pd.concat([f.assign(part=s) for s, f in frames.items()])
    one.to_csv(tmp_path / "all.csv", index=False)
    got = read_pairs({"layout": "pairs", "file": str(tmp_path / "all.csv"), "columns": {**mapping, "split": "part"}})
    assert got.pairs.drop(columns=["source", "where"]).equals(expected)
    # data.format names the format of a file whose suffix does not
    (tmp_path / "train.txt").write_text((tmp_path / "jsonl" / "train.jsonl").read_text())
    data = {**write_jsonl(tmp_path / "jsonl"), "train": str(tmp_path / "train.txt"), "format": "jsonl"}
    assert read_pairs(data).counts["train"]["pairs"] == 5


def test_optional_columns_absent_or_switched_off(tmp_path):
    bare = {s: [{"anchor": a, "positive": p} for a, p, _, _ in ROWS[s]] for s in ROWS}
    pairs = read_pairs(write_jsonl(tmp_path / "bare", bare))
    assert not pairs.has_group and pairs.paired("test").groups is None and pairs.paired("train").extra_texts == []
    off = read_pairs({**write_jsonl(tmp_path / "off"), "columns": {"group": None, "negative": None}})
    assert not off.has_group and off.counts["train"]["with_negative"] == 0


@pytest.mark.parametrize(
    "rename, mapping, message",
    [
        (
            {},
            {"anchor": "question"},
            "has no column 'question' (columns: anchor, positive, group, negative): rename it, "
            "or map it with data.columns.anchor=<column>",
        ),
        (
            {"anchor": "anchr"},
            {},
            "has no column 'anchor' (columns: anchr, positive, group, negative): did you mean "
            "'anchr'? rename it, or map it with data.columns.anchor=anchr",
        ),
        ({}, {"group": "topic"}, "has no column 'topic'"),  # a mapped optional column must be there
    ],
)
def test_a_missing_column_lists_the_columns_found(tmp_path, rename, mapping, message):
    rows = {s: [{rename.get(k, k): v for k, v in r.items()} for r in records(s)] for s in ROWS}
    with pytest.raises(PairsError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        read_pairs({**write_jsonl(tmp_path, rows), "columns": mapping})


def test_export_then_read_gives_the_ArguAna_paired_splits(demo_corpus, tmp_path):
    """The two readers agree on the demo: the same texts in the same order, the same text ids, the same dedup."""
    written = export_pairs(demo_corpus, tmp_path)
    data = {"layout": "pairs", **{s: str(p) for s, p in written.items()}}
    pairs = read_pairs(data)
    for dedup in (False, True):
        a, b = demo_corpus.used(dedup), pairs.used(dedup)
        assert a.dropped == b.dropped
        for name in ("train", "val", "test"):
            x, y = a.paired(name), b.paired(name)
            assert x.texts == y.texts and x.text_id.tolist() == y.text_id.tolist()
            assert x.twins_of_true_counter().tolist() == y.twins_of_true_counter().tolist()
    # run_splits reads either, from the data config alone
    _, splits = run_splits({**data, "dedup": True, "pool": "all"})
    assert [s.n_pairs for s in splits.values()] == [30, 30, 32]


def test_the_shipped_example_is_the_demo_export(demo_corpus, tmp_path):
    written = export_pairs(demo_corpus, tmp_path)
    for name, path in written.items():
        assert (pairs_demo() / f"{name}.jsonl").read_bytes() == path.read_bytes(), name
    with pytest.raises(PairsError, match="exists: export into a new or empty folder"):
        export_pairs(demo_corpus, tmp_path)


def test_the_positives_pool_leaves_every_anchor_out(tmp_path):
    """Rows on a line: each query's nearest row is another anchor; data.pool=all finds it, positives never."""
    rows = {s: [{"anchor": f"{s}a{i}", "positive": f"{s}p{i}"} for i in range(4)] for s in ("train", "val", "test")}
    pairs = read_pairs(write_jsonl(tmp_path, rows))
    # anchors at 0, 10, 20, 30; positives 4 away from their anchor; anchor i + 1 is 10 away, positive i + 1 is 14
    sim = np.array([[0.0], [10.0], [20.0], [30.0], [4.0], [14.0], [24.0], [34.0]])
    every, _ = retrieve(sim, pairs.paired("test", "all"), k=3, index="exact")
    only, _ = retrieve(sim, pairs.paired("test", "positives"), k=3, index="exact")
    assert every[1].tolist() == [5, 4, 0] and only[1].tolist() == [5, 4, 6]  # query 1 at 10: p1 4, p0 6, a0 10
    assert (only >= 4).all() and (every < 4).any()
    mask = pairs.paired("test", "positives").is_candidate(np.tile(np.arange(8), (4, 1)))
    assert mask[:, :4].sum() == 0 and mask[:, 4:].all()


def test_within_group_shortlists_by_hand_and_against_a_dense_reference(tmp_path):
    # test: a0, a1 in g1 and a2 in g2 (ROWS); positions put a2's pair nearest to every query
    pairs = read_pairs(write_jsonl(tmp_path))
    split = pairs.paired("test")
    sim = np.array([[0.0], [1.0], [0.5], [3.0], [2.0], [0.6]])  # a0 a1 a2 | p0 p1 p2
    rows, false = group_shortlists(sim, split, k=5, index="exact")
    # a0 (g1): a1 at 1, p1 at 2, p0 at 3 (its true positive); g2's a2 and p2 never appear
    assert rows[0].tolist() == [1, 4, 3, NONE, NONE] and rows[2].tolist() == [5, NONE, NONE, NONE, NONE]
    assert false.tolist() == [2, 2, 0]
    # random vectors, several groups and duplicate texts: the same as a dense per-query sort of the group pool
    rng = np.random.default_rng(0)
    n = 40
    rows = {
        s: [{"anchor": f"a{i % 35}", "positive": f"p{i % 31}", "group": f"g{i % 4}"} for i in range(n)]
        for s in ("train", "val", "test")
    }
    for pool in ("all", "positives"):
        split = read_pairs(write_jsonl(tmp_path / f"random-{pool}", rows)).paired("test", pool)
        sim = rng.normal(size=(2 * n, 3))
        got, _ = group_shortlists(sim, split, k=6, index="balltree")
        every = np.tile(np.arange(2 * n), (n, 1))
        allowed = split.is_candidate(every) & (split.groups[None, :] == split.groups[:n, None])
        dist = np.where(allowed, np.linalg.norm(sim[:n, None, :] - sim[None, :, :], axis=2), np.inf)
        order = np.argsort(dist, axis=1, kind="stable")[:, :6]
        expected = np.where(np.take_along_axis(allowed, order, 1), order, NONE)
        assert got.tolist() == expected.tolist(), pool


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data=pairs"], "data=pairs needs data.train, data.val, data.test"),
        (["data=pairs", "data.train=a.jsonl"], "needs data.val, data.test"),
        (["data=pairs", "data.file=a.jsonl", "data.train=b.jsonl"], "data.file and data.train are both set"),
        (["data=pairs_demo", "data.max_debates=2"], "data.max_debates=2 slices ArguAna"),
        (["data=pairs_demo", "data.format=xlsx"], "data.format='xlsx' is not valid"),
        (["data=pairs_demo", "data.pool=nearest"], "data.pool='nearest' is not valid: use one of all, positives"),
        (
            ["data.train=a.jsonl"],
            "data.train=a.jsonl is read only from pair files, and data=demo is the ArguAna layout",
        ),
        (
            ["data=arguana", "data.columns.anchor=question"],
            "data.columns.anchor=question is read only from pair files",
        ),
    ],
)
def test_bad_data_configs_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(compose_cfg(overrides))


@pytest.mark.slow
def test_the_example_config_validates_and_records_its_files():
    cfg = compose_cfg(["data=pairs_demo"])
    validate(cfg)
    files = data_files(cfg.data)
    assert set(files) == {"train", "val", "test"} and files["test"]["path"] == str(pairs_demo() / "test.jsonl")
    assert (
        len(files["test"]["sha256"]) == 64 and files["test"]["bytes"] == (pairs_demo() / "test.jsonl").stat().st_size
    )
    assert data_files(compose_cfg().data) == {}  # the ArguAna layout records its root, not file hashes


def test_runs_on_other_file_contents_are_never_one_cell(tmp_path):
    """The data hash is a result key: the same settings on another version of a file are another cell; the same
    contents at another path are the same cell."""
    from biencoder.engine.config.settings import run_settings
    from biencoder.report.runs import Run, assign_cells

    def run(path, sha):
        config = {
            "seed": 0,
            "data": {"name": "pairs", "layout": "pairs", "train": path},
            "model": {"head": {"use_layernorm": True, "use_relu": False}},  # the ln cell's head, as its runs write it
            "data_files": {"train": {"path": path, "bytes": 10, "sha256": sha}},
        }
        return Run(
            path=tmp_path,
            config=config,
            metrics=pd.DataFrame(),
            final=None,
            hits=None,
            variant="ln",
            seed=0,
            flat=run_settings(config),
        )

    runs = [run("/a/train.jsonl", "a" * 64), run("/b/train.jsonl", "a" * 64), run("/a/train.jsonl", "b" * 64)]
    assign_cells(runs)
    assert runs[0].cell == runs[1].cell != runs[2].cell
    assert runs[2].cell == "ln train.sha256=bbbbbbbbbbbb"
