"""Finding run folders and grouping runs into cells (biencoder.report.runs), on hand-made run folders."""

import json

import numpy as np
import pytest
import yaml

from biencoder.report.runs import assign_cells, best_rows, find_runs, queries_label, recorded_baseline
from helpers import write_run


def test_runs_from_before_a_new_key_share_its_default(tmp_path):
    """A key added later (eval.retrieve) takes its schema default for older runs: no spurious cells, and an old
    run and a new one with the same settings are one cell; a run that sets it otherwise is its own cell."""
    from biencoder.engine.config.settings import run_settings

    assert run_settings({"eval": {"k": 10}})["eval.retrieve"] == "sim"
    assert run_settings({"eval": {"retrieve": "encoder"}})["eval.retrieve"] == "encoder"
    write_run(tmp_path / "old", "plain", 0, [0.1], [0.1])
    new = write_run(tmp_path / "new", "plain", 1, [0.2], [0.2])
    other = write_run(tmp_path / "other", "plain", 0, [0.3], [0.3])
    for folder, retrieve in ((new, "sim"), (other, "encoder")):
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        config["eval"] = {"retrieve": retrieve}
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = find_runs([tmp_path])
    assert assign_cells(runs) == ["eval.retrieve"]
    cells = {r.path.name: r.cell for r in runs}
    assert cells["old"] == cells["new"] == "plain retrieve=sim" and cells["other"] == "plain retrieve=encoder"


@pytest.mark.slow
def test_a_cell_s_name_says_its_head_and_the_card_s_cells_keep_theirs(tmp_path):
    """The card's cells keep their names, whether written with the flags (before the head keys) or with the keys; a
    run without +variant is named after its head; a variant whose head is not its name gets head=<head>, so runs of
    one variant with other heads never share a cell, and the comparison against plain still pairs them."""
    from biencoder.report.tables import paired_comparisons

    hits = [1, 0, 1, 1, 0, 0, 1, 0]
    for seed in (0, 1):
        write_run(tmp_path / f"ln{seed}", "ln", seed, [0.1], [0.1], hits=hits)
        write_run(tmp_path / f"plain{seed}", "plain", seed, [0.1], [0.1], hits=hits[::-1])
        keys = {"norm": "layernorm", "activation": "relu"}  # the ln_relu head, spelt with the keys
        write_run(tmp_path / f"ln_relu{seed}", "ln_relu", seed, [0.1], [0.1], head=keys, hits=hits)
        rms = {"norm": "rmsnorm", "activation": "gelu", "hidden": [16]}
        write_run(tmp_path / f"rms{seed}", "h16_rmsnorm_gelu", seed, [0.2], [0.2], head=rms, hits=hits)
        ln_gelu = {"use_layernorm": True, "use_relu": False, "activation": "gelu"}
        write_run(tmp_path / f"lngelu{seed}", "ln", seed, [0.3], [0.3], head=ln_gelu, hits=hits)
        mine = {"norm": "batchnorm", "dropout": 0.1}
        write_run(tmp_path / f"mine{seed}", "mine", seed, [0.3], [0.3], head=mine, hits=hits)
    runs = find_runs([tmp_path])
    assert assign_cells(runs) == []
    cells = {r.path.name[:-1]: r.cell for r in runs}
    assert cells == {
        "ln": "ln",
        "plain": "plain",
        "ln_relu": "ln_relu",
        "rms": "h16_rmsnorm_gelu",
        "lngelu": "ln head=ln_gelu",
        "mine": "mine head=batchnorm_drop0.1",
    }
    compared = paired_comparisons(runs, "plain", n_boot=200)
    assert sorted(compared["cell"]) == sorted(c for c in set(cells.values()) if c != "plain")
    assert set(compared["vs"]) == {"plain"}


def test_best_epoch_query_count_and_recorded_baselines(tmp_path):
    """The best val epoch is the first of a tie (as the runner picks it), the query count shows only when every run
    agrees, and a recorded baseline is drawn only when every finished run recorded the same one."""
    a = write_run(tmp_path / "a", "plain", 0, [0.1, 0.3, 0.3], [0.5, 0.2, 0.9])
    b = write_run(tmp_path / "b", "plain", 1, [0.4, 0.2, 0.1], [0.7, 0.1, 0.1])
    for folder, recorded in ((a, 0.25), (b, 0.25)):
        final = json.loads((folder / "final.json").read_text())
        final["baselines"] = {"test": {"encoder_cosine": {"top1": recorded}, "tfidf": {"top1": 0.5 - recorded}}}
        (folder / "final.json").write_text(json.dumps(final))
    runs = {r.path.name: r for r in find_runs([tmp_path])}
    epoch, val_row, test_row = best_rows(runs["a"], "top1")
    assert (epoch, val_row["top1"], test_row["top1"]) == (1, 0.3, 0.2)
    assert best_rows(runs["b"], "top1")[0] == 0
    assert queries_label(list(runs.values()), "val") == ""  # these runs logged no query counts
    for run, n in ((runs["a"], 30), (runs["b"], 30)):
        run.metrics["queries"] = n
    assert queries_label(list(runs.values()), "val") == " (30 queries)"
    runs["b"].metrics["queries"] = 31
    assert queries_label(list(runs.values()), "val") == ""
    assert recorded_baseline(list(runs.values()), "test") == 0.25
    assert recorded_baseline(list(runs.values()), "test", "tfidf") == 0.25 and recorded_baseline([], "test") is None
    runs["b"].final["baselines"]["test"]["encoder_cosine"]["top1"] = 0.3  # the runs disagree: no line to draw
    assert recorded_baseline(list(runs.values()), "test") is None


def test_a_repeated_seed_is_one_run_not_two_seeds(tmp_path, caplog):
    """The same variant, settings and seed twice (the folders differ only in a key that changes no result): one
    draw, so the summary counts 1 seed, keeps the first finished run by path (not by file times, which a copy
    resets), and names the ones it leaves out; a seed with no finished run keeps all of its runs."""
    from biencoder.report.tables import summary_table

    crashed = write_run(tmp_path / "a" / "relu_s0", "relu", 0, [0.2], complete=False, test=[0.3])
    kept = write_run(tmp_path / "b" / "relu_s0", "relu", 0, [0.2], [0.3], np.ones(10, bool))
    again = write_run(tmp_path / "c" / "relu_s0", "relu", 0, [0.2], [0.4], np.ones(10, bool))
    other = write_run(tmp_path / "c" / "relu_s1", "relu", 1, [0.4], [0.5], np.ones(10, bool))
    unfinished = [write_run(tmp_path / d / "relu_s2", "relu", 2, [0.1], [0.1], complete=False) for d in "ab"]
    config = yaml.safe_load((again / ".hydra" / "config.yaml").read_text())
    config["trainer"] = {"cache_dir": "/elsewhere"}  # a non-result key
    (again / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    with caplog.at_level("WARNING", logger="biencoder"):
        runs = find_runs([tmp_path])
    assert sorted(r.path for r in runs) == sorted([kept, other, *unfinished])
    for left in (crashed, again):
        assert f"{left}: left out, a repeat of variant relu seed 0 with the same settings as {kept}" in caplog.text
    assign_cells(runs)
    row = summary_table(runs, n_boot=100).iloc[0]
    assert (row["seeds"], row["incomplete"], row["test_top1_mean"]) == (2, 2, 0.4)  # seed 0 at 0.3, seed 1 at 0.5


def test_a_corrupt_run_is_left_out_with_one_line_and_the_others_are_read(tmp_path, caplog):
    """A bad line before the last of metrics.jsonl, a config that is not YAML, a test_hits.npy that cannot be loaded
    or that has another length than the test query count metrics.jsonl records: each folder is left out with one
    warning line naming it and the file, the others are read; with nothing left, the one error names the first."""
    import pytest

    from biencoder.report import SummaryError

    good = [write_run(tmp_path / "ok" / f"plain_s{s}", "plain", s, [0.2], [0.3], np.ones(10, bool)) for s in (0, 1)]
    torn_inside = write_run(tmp_path / "bad" / "a", "ln", 0, [0.1, 0.2], [0.1, 0.2], np.ones(10, bool))
    lines = (torn_inside / "metrics.jsonl").read_text().splitlines(keepends=True)
    (torn_inside / "metrics.jsonl").write_text(lines[0][:20] + "\n" + "".join(lines[1:]))
    not_yaml = write_run(tmp_path / "bad" / "b", "ln", 1, [0.1], [0.1], np.ones(10, bool))
    (not_yaml / ".hydra" / "config.yaml").write_text("model: [\n")
    cut = write_run(tmp_path / "bad" / "c", "ln", 2, [0.1], [0.1], np.ones(10, bool))
    (cut / "test_hits.npy").write_bytes((cut / "test_hits.npy").read_bytes()[:-4])
    other_length = write_run(tmp_path / "bad" / "d", "ln", 3, [0.1], [0.1], np.ones(7, bool))
    rows = [json.loads(line) for line in (other_length / "metrics.jsonl").read_text().splitlines()]
    (other_length / "metrics.jsonl").write_text("".join(json.dumps({**r, "queries": 10}) + "\n" for r in rows))
    with caplog.at_level("WARNING", logger="biencoder"):
        runs = find_runs([tmp_path])
    assert sorted(r.path for r in runs) == good
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 4 and all("\n" not in m for m in skipped)
    for folder, why in (
        (torn_inside, "metrics.jsonl line 1 is not JSON"),
        (not_yaml, "config.yaml is not YAML"),
        (cut, "test_hits.npy cannot be read"),
        (other_length, "test_hits.npy holds (7,) values where metrics.jsonl has [10] test queries"),
    ):
        assert sum(m.startswith(f"{folder}: skipped, ") and why in m for m in skipped) == 1, why
    with pytest.raises(SummaryError, match=r"4 skipped; the first: .*bad/a/metrics.jsonl line 1 is not JSON"):
        find_runs([tmp_path / "bad"])


def test_a_list_valued_setting_separates_cells_and_keys_them(tmp_path):
    """negatives.rank_range=[10,50] is a list in the saved config: it splits the cells like any key, and the paired
    comparisons can key cells by it (a list was unhashable there) and take null as the reference value."""
    from biencoder.report.tables import paired_comparisons

    for name, seed, ranks in (("a", 0, None), ("b", 1, None), ("c", 0, [10, 50]), ("d", 1, [10, 50])):
        folder = write_run(tmp_path / name, "plain", seed, [0.2, 0.3], [0.2, 0.3], hits=[True, False, True])
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        config["negatives"] = {"rank_range": ranks}
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = find_runs([tmp_path])
    assert assign_cells(runs) == ["negatives.rank_range"]
    assert {r.flat["negatives.rank_range"] for r in runs} == {None, (10, 50)}
    assert len({r.cell for r in runs}) == 2
    table = paired_comparisons(runs, ["negatives.rank_range=null"], 200, strict=True)  # null: the rule off
    assert len(table) == 1
