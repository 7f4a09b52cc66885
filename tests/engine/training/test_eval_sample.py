"""eval.train_queries / eval.val_queries / eval.test_queries: per-epoch metrics on a fixed sample of a split's queries,
the same for every seed and cell, and every number on the sample says so (metrics rows, test_hits.npy and its
test_seen.npy, the baselines, the summary)."""

import json

import numpy as np
import pytest

from biencoder.engine.config.validation import validate
from biencoder.engine.retrieval.rerank import query_sample
from biencoder.engine.training.run import run
from biencoder.errors import ConfigError
from biencoder.report.baselines import baseline_hits
from biencoder.report.run_summary import summary_text
from biencoder.report.runs import find_runs
from conftest import FAST, compose_cfg

TEST_SAMPLE = 12  # of the demo's 32 test queries


def test_query_sample_is_fixed_sorted_and_whole_when_large():
    assert query_sample(50, None) is None and query_sample(50, 50) is None and query_sample(50, 80) is None
    sample = query_sample(50, 7)
    assert sample.tolist() == sorted(set(sample.tolist())) and len(sample) == 7 and sample.max() < 50
    assert np.array_equal(sample, query_sample(50, 7))  # no seed but its own: the same for every run
    # what eval.train_queries drew before val and test had samples: train curves of older runs stay comparable
    assert np.array_equal(sample, np.sort(np.random.default_rng(0).choice(50, 7, replace=False)))


@pytest.mark.parametrize("key", ["eval.val_queries", "eval.test_queries"])
def test_a_sample_of_no_queries_is_refused(key):
    with pytest.raises(ConfigError, match=key):
        validate(compose_cfg([f"{key}=0"]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same demo run twice: every query, and test on a sample of 12 (val whole, so the best epoch is the same)."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, extra in (("whole", []), ("sample", [f"eval.test_queries={TEST_SAMPLE}"])):
        folder = root / name
        cfg = compose_cfg(FAST + ["+variant=ln", "eval.baselines=true", "trainer.max_epochs=1"] + extra)
        out[name] = folder, run(cfg, folder)
    return out


@pytest.mark.slow
def test_test_numbers_on_a_sample_are_the_whole_runs_on_those_queries(runs):
    (whole, final_whole), (sampled, final) = runs["whole"], runs["sample"]
    sample = query_sample(32, TEST_SAMPLE)
    assert final["best_epoch"] == final_whole["best_epoch"]
    hits, whole_hits = np.load(sampled / "test_hits.npy"), np.load(whole / "test_hits.npy")
    assert np.array_equal(hits, whole_hits[sample])
    assert np.array_equal(np.load(sampled / "test_queries.npy"), sample)
    assert np.array_equal(np.load(sampled / "test_seen.npy"), np.load(whole / "test_seen.npy")[sample])
    assert not (whole / "test_queries.npy").exists()
    rows = [json.loads(line) for line in (sampled / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"]: r["queries"] for r in rows} == {"train": 30, "val": 30, "test": TEST_SAMPLE}
    test = final["best"]["test"]
    assert test["queries"] == TEST_SAMPLE and test["queries_unseen"] + test["queries_seen"] == TEST_SAMPLE
    assert test["top1"] == pytest.approx(hits.mean())
    # the baselines are on the same test queries; val is whole in both runs
    for score in ("encoder_cosine", "tfidf"):
        assert final["baselines"]["test"][score]["queries"] == TEST_SAMPLE
        assert final["baselines"]["val"][score] == final_whole["baselines"]["val"][score]
    # the 8 tasks score every test query
    assert final["tasks"]["test"]["epa"]["queries"] == 32
    assert "test 12 of 32 (eval.test_queries)" in summary_text(final, sampled)
    assert "fixed sample" not in summary_text(final_whole, whole)


@pytest.mark.slow
def test_the_plot_baselines_take_the_runs_own_sample(runs):
    """biencoder-plot --baselines rebuilds a run's baselines from its config: on its eval.test_queries sample, the
    queries of its test_hits.npy, and the same hits the run recorded."""
    sampled, final = runs["sample"]
    [run_] = find_runs([sampled])
    hits = baseline_hits(run_)
    assert {score: len(h) for score, h in hits.items()} == {"encoder_cosine": TEST_SAMPLE, "tfidf": TEST_SAMPLE}
    for score, h in hits.items():
        assert h.mean() == pytest.approx(final["baselines"]["test"][score]["top1"])


@pytest.mark.slow
def test_a_sample_on_pair_files_with_groups(tmp_path):
    """The pair files' within-group top-1 on test is split into unseen and seen on the same test sample."""
    final = run(
        compose_cfg(
            FAST
            + ["data=pairs_demo", "+variant=ln", "trainer.max_epochs=1", "eval.test_queries=10", "eval.val_queries=7"]
        ),
        tmp_path / "run",
    )
    test, val = final["best"]["test"], final["best"]["val"]
    assert (test["queries"], val["queries"]) == (10, 7) and "top1_group" in test
    assert test["queries_unseen"] + test["queries_seen"] == 10
    assert (test["top1_group_unseen"] is None) == (test["queries_unseen"] == 0)
    assert len(np.load(tmp_path / "run" / "test_hits.npy")) == 10
