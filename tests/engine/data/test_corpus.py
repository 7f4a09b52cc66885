import json
import time
import warnings

import numpy as np
import pytest

from biencoder.corpus import main
from biencoder.engine.config.packaged import demo_root
from biencoder.engine.data.arguana import CorpusError, CorpusWarning
from biencoder.engine.data.corpus import read_corpus
from conftest import grid_layout


def test_fixture_counts_and_tables(make_corpus):
    layout = grid_layout(themes=2, debates=2, per_side=2)
    # a point without a counter and a duplicated counter text in training
    layout["training"]["theme0"]["debate00"]["pro"].append(("lonely point\nno answer", None))
    layout["training"]["theme1"]["debate10"]["con"][0] = ("dup point", "training t0 d0 pro0 counter")
    root = make_corpus(layout)
    corpus = read_corpus(root)
    tr = corpus.counts["train"]
    assert tr == {
        "themes": 2,
        "debates": 4,
        "points": 17,
        "counters": 16,
        "pairs": 16,
        "points_without_counter": 1,
        "counters_without_point": 0,
        "duplicated_texts": 1,
    }
    assert corpus.counts["test"]["pairs"] == 16
    assert corpus.unpaired == ("training/theme0/debate00/pro03: point without a counter",)
    assert corpus.deduplicated().unpaired == corpus.unpaired  # what the run reads says what it left out
    arg = corpus.arguments.set_index("path").loc[str(root / "training/theme0/debate00/pro/pro01a-point.txt")]
    assert (arg["conclusion"], arg["premise"], arg["kind"], arg["number"]) == (
        "training t0 d0 pro0 point",
        "premise 0",
        "point",
        1,
    )
    assert arg["text"] == "training t0 d0 pro0 point\npremise 0"  # stripped of the trailing newline
    pairs = corpus.pairs[corpus.pairs["split"] == "training"]
    pair = pairs[pairs["pair_id"] == "theme0/debate00/pro01"].iloc[0]
    assert pair["counter_text"] == "training t0 d0 pro0 counter"
    assert "lonely point\nno answer" not in set(corpus.pairs["point_text"])


def test_paired_split_layout(make_corpus):
    corpus = read_corpus(make_corpus(grid_layout(per_side=3)))
    ps = corpus.paired("val")
    assert ps.n_pairs == 2 * 2 * 2 * 3
    table = ps.table
    assert (table.loc[ps.query, "kind"] == "point").all() and (table.loc[ps.counter, "kind"] == "counter").all()
    # a point and its counter share pair_id, debate and stance
    for col in ("pair_id", "debate", "stance", "theme"):
        assert np.array_equal(table.loc[ps.query, col].to_numpy(), table.loc[ps.counter, col].to_numpy())
    points = table.loc[ps.query, "text"].str.replace(" point\n.*", "", regex=True)
    counters = table.loc[ps.counter, "text"].str.replace(" counter", "")
    assert points.tolist() == counters.tolist()


def test_accepts_extracted_folder_or_root(make_corpus):
    root = make_corpus({}, name="x")  # empty: just create the folder
    write_dir = root / "02-extracted-arguments"
    from conftest import write_corpus

    write_corpus(write_dir, grid_layout())
    assert read_corpus(root).counts == read_corpus(write_dir).counts


def test_stray_files(make_corpus):
    root = make_corpus(grid_layout())
    side = root / "training/theme0/debate00/pro"
    (side / ".DS_Store").write_bytes(b"\x00\x01")
    (side / "notes.txt").write_text("x")
    (side / "pro09c-point.txt").write_text("bad name")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        corpus = read_corpus(root)
    messages = [str(w.message) for w in caught if issubclass(w.category, CorpusWarning)]
    assert len(messages) == 2 and any("notes.txt" in m for m in messages) and any("pro09c" in m for m in messages)
    assert corpus.counts["train"]["points"] == 16


@pytest.mark.parametrize("case", ["missing", "no_splits", "no_pairs", "not_utf8", "empty"])
def test_bad_input(make_corpus, tmp_path, capsys, case):
    layout = grid_layout()
    expect = {
        "missing": "does not exist",
        "no_splits": "no split folder",
        "no_pairs": "has no pairs",
        "not_utf8": "not UTF-8",
        "empty": "is empty",
    }[case]
    if case == "missing":
        root = tmp_path / "nowhere"
    elif case == "no_splits":
        root = make_corpus({"training": layout["training"]})
    elif case == "no_pairs":
        layout["test"] = {"theme0": {"debate00": {"pro": [("only a point", None)]}}}
        root = make_corpus(layout)
    else:
        root = make_corpus(layout)
        bad = root / "validation/theme1/debate11/con/con02b-counter.txt"
        bad.write_bytes(b"caf\xe9 au lait\n" if case == "not_utf8" else b"  \n\n")
        expect += ""
    with pytest.raises(CorpusError, match=expect):
        read_corpus(root)
    assert main(["stats", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0]
    if case in ("not_utf8", "empty"):
        assert "con02b-counter.txt" in err[0]


def test_demo_corpus_edge_cases():
    corpus = read_corpus(demo_root())
    # counted on the files of src/biencoder/data/demo/<split>/: 2 theme and 4 debate folders, 33 *a-point.txt and 32
    # *b-counter.txt files, one point (pro05 of an economy debate) without its counter file, and one text filed twice
    # (two files with equal contents, so 64 distinct texts among the 65 arguments)
    expected = {
        "themes": 2,
        "debates": 4,
        "points": 33,
        "counters": 32,
        "pairs": 32,
        "points_without_counter": 1,
        "counters_without_point": 0,
        "duplicated_texts": 1,
    }
    assert corpus.counts == {split: expected for split in ("train", "val", "test")}
    # conclusions and premises are real sentences, not placeholders
    points = corpus.arguments[corpus.arguments["kind"] == "point"]
    assert points["premise"].str.len().min() > 40 and points["conclusion"].str.len().min() > 15


def test_cli_json(capsys):
    assert main(["stats", "demo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["splits"]) == {"train", "val", "test"} and out["splits"]["test"]["pairs"] == 32
    assert out["dedup_dropped"] == {"train": 2, "val": 2, "test": 0} and out["overlap"]["test->train"]["texts"] == 1


@pytest.mark.slow
def test_real_corpus_counts(real_root, capsys):
    start = time.perf_counter()
    corpus = read_corpus(real_root)
    print(f"\nread the real corpus in {time.perf_counter() - start:.2f} s")
    expected = {
        "themes": (15, 15, 15),
        "debates": (644, 211, 214),
        "points": (4083, 1290, 1406),
        "counters": (4065, 1287, 1401),
        "pairs": (4065, 1287, 1401),
    }
    for key, values in expected.items():
        assert tuple(corpus.counts[s][key] for s in ("train", "val", "test")) == values, key
    capsys.readouterr()
    assert main(["stats", str(real_root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["splits"]["test"]["pairs"] == 1401 and out["overlap"]["test->train"]["pairs"] == 616


@pytest.mark.parametrize(
    "spelling, short",
    [("validation", "val"), ("val", "val"), ("training", "train"), ("train", "train"), ("test", "test")],
)
def test_both_split_spellings_are_accepted_and_one_is_printed(spelling, short):
    from biencoder.engine.data.corpus import split_name

    assert split_name(spelling) == short
    corpus = read_corpus(demo_root())
    assert corpus.paired(spelling).name == short and set(corpus.counts) == {"train", "val", "test"}
    with pytest.raises(CorpusError, match=r"val \(or validation\)"):
        split_name("valid")


def test_planted_cross_split_duplicates(make_corpus):
    """A debate filed twice (another theme, another split): exact overlap counts, exactly the planted pairs dropped
    (test untouched), and the seen/unseen split of the test queries."""
    from biencoder.engine.data.corpus import seen_queries
    from biencoder.engine.retrieval.metrics import Ranks, group_top1, query_groups

    layout = grid_layout()
    test_pro = layout["test"]["theme0"]["debate00"]["pro"]
    # training files test's pair pro01 verbatim under another theme (a whole pair seen in training)
    layout["training"]["theme1"]["debate10"]["pro"][0] = test_pro[0]
    # validation holds test's pro02 counter as a counter of another point (a text shared, not the pair)
    val_con = layout["validation"]["theme0"]["debate01"]["con"]
    val_con[1] = (val_con[1][0], test_pro[1][1])
    # training repeats a validation pair (val -> train overlap, dropped from train only)
    layout["training"]["theme0"]["debate00"]["con"][0] = layout["validation"]["theme1"]["debate11"]["pro"][0]
    root = make_corpus(layout)
    # the same debate URL in training and test
    (root / "training/theme1/debate10/metadata.txt").write_text("url\thttps://example.org/shared\n")
    (root / "test/theme0/debate00/metadata.txt").write_text("url\thttps://example.org/shared\n")
    for name in ("training/theme0/debate00", "validation/theme1/debate11"):
        (root / name / "metadata.txt").write_text(f"url\thttps://example.org/{name.split('/')[0]}\n")
    corpus = read_corpus(root)
    o = corpus.overlap()
    assert o["test->train"]["pairs"] == 1 and o["test->val"]["pairs"] == 0 and o["val->train"]["pairs"] == 1
    assert (
        o["test->train+val"]["pairs"] == 1 and o["test->train+val"]["texts"] == 3
    )  # pro01 point+counter, pro02 counter
    assert o["test->train"]["debates"] == 1 and o["val->test"]["debates"] == 0
    dedup = corpus.deduplicated()
    assert dedup.dropped == {"train": 2, "val": 1, "test": 0}
    dropped_train = set(corpus.split_pairs("train")["pair_id"]) - set(dedup.split_pairs("train")["pair_id"])
    assert dropped_train == {"theme1/debate10/pro01", "theme0/debate00/con01"}
    assert set(corpus.split_pairs("val")["pair_id"]) - set(dedup.split_pairs("val")["pair_id"]) == {
        "theme0/debate01/con02"
    }
    assert dedup.split_pairs("test").equals(corpus.split_pairs("test"))  # the official test pools
    # seen / unseen test queries, official splits: pro01 (whole pair) and pro02 (its counter) of test debate00
    test = corpus.paired("test")
    seen = seen_queries(test, [corpus.paired("train"), corpus.paired("val")])
    seen_ids = set(test.table.loc[test.query[seen], "pair_id"])
    assert seen_ids == {"theme0/debate00/pro01", "theme0/debate00/pro02"}
    assert not seen_queries(dedup.paired("test"), [dedup.paired("train"), dedup.paired("val")]).any()
    rank = np.full(test.n_pairs, 2)
    rank[np.flatnonzero(seen)] = 1  # a model that gets exactly the seen queries right
    rank[np.flatnonzero(~seen)[:3]] = 1  # and 3 of the 14 unseen ones
    assert group_top1(Ranks(rank), query_groups(seen), counts=True) == {
        "top1_unseen": 3 / 14,
        "queries_unseen": 14,
        "top1_seen": 1.0,
        "queries_seen": 2,
    }


@pytest.mark.slow
def test_real_corpus_overlap_and_dedup(real_corpus):
    """protocol.md's figures: 616 of 1401 test and 574 of 1287 val pairs occur verbatim as training pairs; 793
    test pairs in train or val; dedup keeps 2796 of 4065 training and 1060 of 1287 validation pairs."""
    from biencoder.engine.data.corpus import seen_queries

    o = real_corpus.overlap()
    assert (o["test->train"]["pairs"], o["val->train"]["pairs"], o["test->train+val"]["pairs"]) == (616, 574, 793)
    dedup = real_corpus.deduplicated()
    assert {s: len(dedup.split_pairs(s)) for s in ("train", "val", "test")} == {
        "train": 2796,
        "val": 1060,
        "test": 1401,
    }
    seen = seen_queries(real_corpus.paired("test"), [real_corpus.paired("train"), real_corpus.paired("val")])
    assert (~seen).sum() == 606  # test pairs with neither text anywhere in training or validation
