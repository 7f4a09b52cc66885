"""data=pairs end to end: the same numbers through both readers (the demo here; the real corpus with the frozen preset,
slow), the shipped example through the CLI, given negatives in the training batches, the data.pool choice, and a
changed file refused on resume."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from biencoder.engine.data.corpus import read_corpus, run_splits
from biencoder.engine.data.pair_files import export_pairs
from biencoder.engine.modeling.encoding import TextEncoder, pooled_vectors
from biencoder.engine.training.run import run
from biencoder.engine.training.runner import Runner
from biencoder.engine.training.triplets import triplet_rows
from biencoder.errors import ConfigError
from conftest import FAST, REPO, compose_cfg
from helpers import write_jsonl

VOLATILE = {"epoch_time_s"}
#: what metrics.jsonl rows hold only when the pair files have a group column
GROUP_KEYS = {"top1_group", "recall_at_k_group", "candidates_group", "top1_group_unseen", "top1_group_seen"}


def rows_of(folder, drop=VOLATILE):
    return [
        {k: v for k, v in json.loads(line).items() if k not in drop}
        for line in (folder / "metrics.jsonl").read_text().splitlines()
    ]


def pair_overrides(written: dict) -> list[str]:
    return ["data=pairs", *(f"data.{name}={path}" for name, path in written.items()), "data.pool=all"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return out, run(compose_cfg(FAST + ["+variant=ln"]), out)


@pytest.mark.slow
def test_the_demo_through_both_readers_gives_the_same_numbers(demo_run, demo_corpus, tmp_path):
    """export-pairs demo, then data=pairs: every metrics.jsonl row as data=demo's (times aside); the group column the
    export writes (group = debate) adds the within-group keys and changes nothing else."""
    demo_out, demo_final = demo_run
    written = export_pairs(demo_corpus, tmp_path / "pairs")
    plain = run(
        compose_cfg(FAST + ["+variant=ln", *pair_overrides(written), "data.columns.group=null"]), tmp_path / "a"
    )
    assert rows_of(tmp_path / "a") == rows_of(demo_out)
    assert plain["best"] == demo_final["best"] and plain["baselines"] == demo_final["baselines"]
    assert plain["overlap"] == demo_final["overlap"] and "tasks" in demo_final and "tasks" not in plain
    assert plain["tasks_skipped"].startswith("no 8-task table") and "tasks_skipped" not in demo_final
    grouped = run(compose_cfg(FAST + ["+variant=ln", *pair_overrides(written)]), tmp_path / "b")
    assert rows_of(tmp_path / "b", VOLATILE | GROUP_KEYS) == rows_of(demo_out)
    assert all({"top1_group", "recall_at_k_group", "candidates_group"} <= set(r) for r in rows_of(tmp_path / "b"))
    # group = debate: the within-group top-1 is the sda task (every argument of the query's debate) at the same
    # weights, the k nearest reranked: the same pools and the same accuracy
    for name in ("val", "test"):
        sda = demo_final["tasks"][name]["sda"]
        assert grouped["best"][name]["candidates_group"] == pytest.approx(sda["candidates"] / sda["queries"])
        assert grouped["best"][name]["top1_group"] == pytest.approx(sda["accuracy_at_1"])


@pytest.mark.slow
def test_the_shipped_example_trains_from_the_command_line(demo_run, tmp_path):
    """python -m biencoder.train data=pairs_demo: the demo's numbers, a summary that says what it is, and the files'
    provenance in final.json and config_resolved.yaml."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "biencoder.train",
            "data=pairs_demo",
            "+variant=ln",
            *FAST,
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "run"
    assert rows_of(out, VOLATILE | GROUP_KEYS) == rows_of(demo_run[0])
    final = json.loads((out / "final.json").read_text())
    resolved = yaml.safe_load((out / "config_resolved.yaml").read_text())
    shipped = REPO / "src" / "biencoder" / "data" / "pairs_demo" / "train.jsonl"
    assert final["data_files"]["train"]["bytes"] == shipped.stat().st_size
    assert resolved["data_files"] == final["data_files"] and final["pool"] == "all"
    log = proc.stderr + (out / "train.log").read_text()
    for said in (
        "no 8-task table",
        "within-group top1",
        "pool: every point/anchor and counter/positive of the split",
        f"sha256 {final['data_files']['test']['sha256']}",
        "the true positive ranks first",
    ):
        assert said in log, said
    assert "8 tasks, score=" not in log


@pytest.mark.slow
def test_given_negatives_are_trained_on_besides_the_mined_ones(tmp_path):
    """Each given negative is one more triplet per epoch (pair, its positive, the given text), gathered from the given
    text's own vectors (frozen) or tokens (trained encoder); the mined triplets are all still there."""
    data = write_jsonl(tmp_path / "data")
    overrides = ["data=pairs", *(f"data.{s}={data[s]}" for s in ("train", "val", "test")), "data.dedup=false"]
    frozen = Runner(
        compose_cfg(FAST + overrides + ["model.encoder.freeze=true", f"trainer.cache_dir={tmp_path / 'c'}"]),
        tmp_path / "frozen",
    )
    split = frozen.data.splits["train"]
    mined = frozen.trainer.mine(0, frozen.evaluation.embed("train").sim)
    rows = np.concatenate([r for r, _ in frozen.trainer.batches(0, mined)])
    expected = triplet_rows(split, mined)
    assert len(rows) == split.n_pairs + 2 and sorted(map(tuple, rows)) == sorted(map(tuple, expected))
    assert [tuple(r) for r in expected[-2:]] == [(0, 5, 10), (4, 9, 11)]  # "tn0" for pair 0, "tp0" for pair 4
    vectors = pooled_vectors(
        TextEncoder(frozen.model, frozen.tokenizer, frozen.text_encoder.max_length), split.extra_texts
    )
    assert np.allclose(frozen.trainer.pooled[10:].cpu().numpy(), vectors.numpy(), atol=1e-5)
    assert len(frozen.inputs.pooled["train"]) == 10  # the evaluation sees the table's rows only
    trained = Runner(compose_cfg(FAST + overrides), tmp_path / "trained")
    tokens = trained.trainer.tokens
    assert len(tokens) == 12 and len(trained.inputs.tokens["train"]) == 10
    assert tokens.ids[10].tolist() == trained.tokenizer("tn0", truncation=True, max_length=64)["input_ids"]


@pytest.mark.slow
def test_the_positives_pool_runs_and_is_named(tmp_path):
    data = write_jsonl(tmp_path / "data")
    final = run(
        compose_cfg(
            FAST
            + [
                "data=pairs",
                *(f"data.{s}={data[s]}" for s in ("train", "val", "test")),
                "data.pool=positives",
                "trainer.max_epochs=1",
            ]
        ),
        tmp_path / "run",
    )
    from biencoder.report.run_summary import summary_text

    assert final["pool"] == "positives" and final["best"]["test"]["queries"] == 3
    assert "pool: the counters/positives of the split only, data.pool=positives" in summary_text(final, tmp_path)


@pytest.mark.slow
def test_a_run_is_not_resumed_on_a_changed_file(tmp_path):
    data = write_jsonl(tmp_path / "data")
    overrides = FAST + [
        "data=pairs",
        *(f"data.{s}={data[s]}" for s in ("train", "val", "test")),
        "trainer.max_epochs=1",
    ]
    run(compose_cfg(overrides), tmp_path / "run")
    with open(data["test"], "a") as f:
        f.write(json.dumps({"anchor": "a new query", "positive": "its answer", "group": "g1"}) + "\n")
    with pytest.raises(ConfigError, match=r"other settings \(data_files\.test\.sha256"):
        run(compose_cfg(overrides + ["trainer.resume=true"]), tmp_path / "run")


@pytest.mark.slow
def test_the_real_corpus_through_both_readers_reads_the_same_pairs(real_corpus, real_root, tmp_path):
    """The whole corpus and its export, as a run reads them (deduplicated): the same texts, in the same order, the same
    (point, counter) rows and text identities in every split. What a run computes depends on nothing else, so the
    numbers are compared on a slice (next test)."""
    written = export_pairs(real_corpus, tmp_path / "pairs")
    _, corpus = run_splits(compose_cfg(["data=arguana", f"data.root={real_root}", "data.pool=all"]).data)
    _, pairs = run_splits(compose_cfg(pair_overrides(written) + ["data.columns.group=null"]).data)
    assert {n: s.n_pairs for n, s in pairs.items()} == {n: s.n_pairs for n, s in corpus.items()}
    assert {n: s.n_pairs for n, s in corpus.items()} == {"train": 2796, "val": 1060, "test": 1401}
    for name, split in corpus.items():
        other = pairs[name]
        assert other.texts == split.texts
        for field in ("query", "counter", "text_id"):
            assert np.array_equal(getattr(other, field), getattr(split, field)), (name, field)


def real_slice(real_root, folder, debates: int):
    """A copy of the corpus with the first ``debates`` debates (by theme/debate name) of each split: an ArguAna folder
    of its own (``max_debates`` slices after deduplication, this before it, as an export of it does)."""
    source = real_root / "02-extracted-arguments"
    for split in source.iterdir():
        kept = sorted(p for p in split.glob("*/*") if p.is_dir())[:debates]
        for debate in kept:
            shutil.copytree(debate, folder / "02-extracted-arguments" / split.name / debate.parent.name / debate.name)
    return folder


@pytest.mark.slow
def test_a_real_slice_through_both_readers_gives_the_same_numbers(real_root, tmp_path):
    """The frozen MiniLM preset, 3 epochs, on a slice of the real corpus and on its export (the embedding cache is
    keyed by text, so the second run reads every vector the first one wrote): every metrics.jsonl row, the best epoch
    and the baselines alike."""
    root = real_slice(real_root, tmp_path / "slice", debates=8)
    written = export_pairs(read_corpus(root), tmp_path / "pairs")
    common = [
        "+experiment=frozen_arguana",
        "+variant=ln",
        "trainer.max_epochs=3",
        "trainer.progress=false",
        f"trainer.cache_dir={tmp_path / 'cache'}",
    ]
    corpus_final = run(compose_cfg(common + [f"data.root={root}"]), tmp_path / "corpus")
    pairs_final = run(
        compose_cfg(common + pair_overrides(written) + ["data.columns.group=null"]), tmp_path / "pairs_run"
    )
    assert rows_of(tmp_path / "pairs_run") == rows_of(tmp_path / "corpus")
    assert pairs_final["best"] == corpus_final["best"] and pairs_final["baselines"] == corpus_final["baselines"]
    assert pairs_final["pairs"] == corpus_final["pairs"] and min(corpus_final["pairs"].values()) > 40
