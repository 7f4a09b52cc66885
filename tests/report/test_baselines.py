"""Cells against zero-shot and TF-IDF (``plot_top1.py --baselines``, biencoder.report.baselines): each cell's
baseline comes from its own config, and finished runs are required, in one line."""

import json
import os

import numpy as np
import pytest
import torch
import yaml

from biencoder.engine.config.packaged import demo_root, packaged_minilm_path
from biencoder.engine.data.corpus import read_corpus
from biencoder.engine.machine.runtime import set_seed_everywhere
from biencoder.engine.modeling.encoding import Encoding, TokenizedTexts, encode_pooled
from biencoder.engine.modeling.model import Embeddings, build_model
from biencoder.engine.retrieval.official_tasks import evaluate_tasks
from biencoder.report.baselines import baseline_markdown, baseline_table
from biencoder.report.runs import assign_cells, find_runs
from biencoder.report.statistics import holm
from biencoder.summary import main
from conftest import REPO
from helpers import run_python, write_run

TINY = {
    "name": "tiny",
    "pooling": "mean",
    "max_length": 64,
    "sim_dim": 16,
    "fusion": "concat",
    "sim_init": "random",
    "encoder": {
        "name_or_path": packaged_minilm_path(),
        "freeze": True,
        "random_init": {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64},
    },
    "head": {"use_layernorm": False, "use_relu": False},
}


def demo_run(folder, variant, seed, max_debates, cache, hits, seen=None):
    """A finished run on the demo corpus with the tiny frozen encoder, ``data.max_debates`` as given."""
    write_run(folder, variant, seed, [0.1], [float(np.mean(hits))], hits)
    config = {
        "seed": seed,
        "data": {"name": "demo", "root": str(demo_root()), "dedup": True, "max_debates": max_debates},
        "model": {**TINY, "head": {"use_layernorm": "ln" in variant, "use_relu": "relu" in variant}},
        "trainer": {"cache_dir": str(cache)},
    }
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    if seen is not None:
        np.save(folder / "test_seen.npy", seen)
    return folder


def expected(seed, max_debates, groups=None):
    """Zero-shot and TF-IDF epa top-1 of one seed's untrained tiny encoder, by the 8-task evaluation (another code
    path than the baselines' own): {"zero-shot": top1, "TF-IDF": top1} (or per group)."""
    split = read_corpus("demo").used(True).paired("test", max_debates)
    set_seed_everywhere(seed)
    model, tokenizer = build_model(TINY, progress=False)
    pooled = encode_pooled(model, TokenizedTexts(split.texts, tokenizer, 64), Encoding(64, "cpu"))
    emb = Embeddings(torch.zeros(len(split.texts), 1), pooled)
    out = {}
    for score, name in (("encoder_cosine", "zero-shot"), ("tfidf", "TF-IDF")):
        epa = evaluate_tasks(split, score, emb=emb, groups=groups)["epa"]
        out[name] = epa["accuracy_at_1"] if groups is None else epa["groups"]["unseen"]["accuracy_at_1"]
    return out


@pytest.mark.slow
def test_each_cell_is_compared_with_the_baseline_of_its_own_config(tmp_path):
    """Two cells on different test splits (all 32 demo test queries; the first 2 debates: 16) and two seeds of a
    randomly initialised encoder each: every row holds the mean over the cell's seeds of that cell's own
    baselines (one baseline for every cell, as compare_baselines.py computed from runs[0], is wrong here)."""
    cache = tmp_path / "cache"
    rng = np.random.default_rng(0)
    for seed in (0, 1):
        demo_run(tmp_path / f"all_s{seed}", "plain", seed, None, cache, rng.random(32) < 0.3)
        demo_run(tmp_path / f"two_s{seed}", "plain", seed, 2, cache, rng.random(16) < 0.3)
    runs = find_runs([tmp_path])
    assert assign_cells(runs) == ["data.max_debates"]
    table = baseline_table(runs, "all", n_boot=200)
    got = {(c, v): t for c, v, t in zip(table["cell"], table["vs"], table["vs_top1"], strict=True)}
    for cell, max_debates in (("plain max_debates=None", None), ("plain max_debates=2", 2)):
        per_seed = [expected(seed, max_debates) for seed in (0, 1)]
        for name in ("zero-shot", "TF-IDF"):
            assert got[(cell, name)] == pytest.approx(np.mean([e[name] for e in per_seed]), abs=1e-12), (cell, name)
    assert got[("plain max_debates=None", "TF-IDF")] != got[("plain max_debates=2", "TF-IDF")]
    assert table.set_index(["cell", "vs"]).loc[("plain max_debates=2", "TF-IDF"), "queries"] == 16
    assert np.allclose(table["p_holm"], holm(table["p"]))  # one family over the 4 rows


@pytest.mark.slow
def test_unseen_queries_and_a_recorded_baseline_that_disagrees(tmp_path):
    """--baselines unseen keeps the queries test_seen.npy marks unseen; a run whose final.json recorded another
    baseline value gets it shown beside the one computed here."""
    seen = np.zeros(32, bool)
    seen[::2] = True
    hits = np.zeros(32, bool)
    hits[:8] = True  # 4 unseen (odd rows) and 4 seen hits
    folder = demo_run(tmp_path / "r", "relu", 0, None, tmp_path / "cache", hits, seen)
    final = json.loads((folder / "final.json").read_text())
    final["baselines"] = {"test": {"tfidf": {"top1": 0.5, "top1_unseen": 0.999}}}
    (folder / "final.json").write_text(json.dumps(final))
    runs = find_runs([tmp_path])
    assign_cells(runs)
    table = baseline_table(runs, "unseen", n_boot=200).set_index("vs")
    want = expected(0, None, groups={"unseen": ~seen})
    assert table.loc["TF-IDF", "vs_top1"] == pytest.approx(want["TF-IDF"], abs=1e-12)
    assert table.loc["zero-shot", "vs_top1"] == pytest.approx(want["zero-shot"], abs=1e-12)
    assert table.loc["TF-IDF", "queries"] == 16 and table.loc["TF-IDF", "test_top1"] == pytest.approx(4 / 16)
    markdown = baseline_markdown(table.reset_index(), "unseen")
    assert "(runs recorded 0.999)" in markdown and markdown.count("runs recorded") == 1


def run_script(*args):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return run_python([*map(str, args)], env=env, own_process=True, timeout=300)


@pytest.mark.slow
def test_no_finished_run_with_hits_is_one_line_not_an_index_error(tmp_path, capsys):
    """Finished runs without test_hits.npy: one line from compare_baselines.py, never an IndexError."""
    write_run(tmp_path / "a", "plain", 0, [0.1], [0.1])
    proc = run_script(REPO / "scripts" / "compare_baselines.py", tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no finished run with test_hits.npy" in errors[0], proc.stderr
    assert main([str(tmp_path), "--baselines"]) == 2
    assert "no finished run with test_hits.npy" in capsys.readouterr().err
    assert main([str(tmp_path), "--baselines", "seen", "--x", "trainer.lr"]) == 2  # one table or the other


@pytest.mark.slow
def test_the_plot_option_writes_the_table_beside_the_figure(tmp_path, capsys):
    seen = np.zeros(32, bool)
    seen[:10] = True
    demo_run(tmp_path / "logs" / "a", "plain", 0, None, tmp_path / "cache", np.ones(32, bool), seen)
    assert main([str(tmp_path / "logs"), "--baselines", "seen", "--n-boot", "200"]) == 0
    out = capsys.readouterr().out
    assert "| plain | 1 (queries) | 10 of 32 | 1.000 | zero-shot |" in out
    csv = (tmp_path / "logs" / "top1_baselines.csv").read_text()
    assert csv.splitlines()[0].startswith("cell,seeds,queries,of,test_top1,vs,vs_top1")
    assert (tmp_path / "logs" / "top1_baselines.md").read_text().strip() in out
    assert "top1_baselines.md" in out.splitlines()[-1]  # listed with the other tables
    proc = run_script(
        REPO / "scripts" / "compare_baselines.py", tmp_path / "logs", "--queries", "seen", "--n-boot", "200"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (tmp_path / "logs" / "top1_baselines.md").read_text().strip()
