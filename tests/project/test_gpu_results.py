"""The GPU figures in RESULTS.md, README.md and BENCHMARKS.md are the committed GPU logs' figures.

``results/gpu-h100-2026-11-23/`` holds the run folders of the fine-tuning runs on one H100 (2026-11-23) and the
output of ``scripts/bench.py`` there; ``results/gpu-h200-2026-11-27/`` the bench's GPU items on one H200. These
tests re-derive the headline numbers from those folders with the project's own code (``biencoder.report``) and check
that every table row and sentence of the docs that quotes them holds exactly those numbers, so the text cannot drift
from the logs. Two kinds of number need more than the logs and are read from the tables the scripts wrote from them:
the 95 % intervals (10 000 bootstrap resamples per cell; the slow test recomputes them) and the paired tests against
zero-shot and TF-IDF (they need the corpus and the encoder: ``scripts/compare_baselines.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biencoder.report import statistics
from biencoder.report.runs import assign_cells, find_runs
from biencoder.report.stability import run_outcomes
from biencoder.report.tables import paired_comparisons, summary_table

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
GPU = RESULTS / "gpu-h100-2026-11-23"
H200 = RESULTS / "gpu-h200-2026-11-27"
H200_GRAPH = RESULTS / "gpu-h200-2026-11-28b"
CELLS = ("plain", "ln", "relu", "ln_relu")  # the row order of the docs' tables
TASKS = ("sdoc", "sdc", "sdoa", "sda", "stc", "sta", "epc", "epa")
N_BOOT = statistics.N_BOOT  # the one setting every table uses, with which the committed tables were made


# -- how the docs write numbers -----------------------------------------------------------------------------------
def num(value: float, digits: int = 3, sign: bool = False) -> str:
    """``value`` as the docs write it: fixed decimals, optional sign, U+2212 for minus."""
    return (f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}").replace("-", "−")


def points(value: float) -> str:
    """A top-1 difference in points (×100, one decimal, signed): 0.0455 → +4.6 (the digits of num(value))."""
    return num(100 * value, 1, sign=True)


def pvalue(p: float) -> str:
    return "<0.001" if round(p, 3) == 0 else f"{p:.3f}"


def span(values) -> str:
    """``min–max`` of three-decimal values, as the docs quote a range."""
    return f"{num(min(values))}–{num(max(values))}"


def lr(value: float) -> str:
    """2e-05 → 2e-5."""
    return re.sub(r"e-0*", "e-", f"{value:.0e}")


def normalise(text: str) -> str:
    """One space for any run of whitespace and no bold marks: a wrapped line or ** never hides a match."""
    return re.sub(r"\s+", " ", text.replace("**", ""))


def section(text: str, heading: str) -> str:
    """The Markdown section that starts with the line ``heading`` and ends at the next heading of its level or
    higher."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(heading + "\n") if heading + "\n" in text else text.index(heading)
    rest = text[start + len(heading) :]
    end = re.search(rf"^#{{1,{level}}} ", rest, flags=re.M)
    return text[start : start + len(heading) + (end.start() if end else len(rest))]


def baseline_tables(path: Path) -> dict[str, dict]:
    """``compare_baselines.py`` output (one or more tables) → {query group: {"zero-shot": top-1, "TF-IDF": top-1,
    (cell, baseline): row}}, each row {"mean", "diff", "low", "high", "p_holm", "verdict"}. A table's header names
    its query group (``test queries (unseen)``); each row the baseline's own top-1 (``vs top1``)."""
    out, group = {}, None
    for line in path.read_text().splitlines():
        cols = [c.strip() for c in line.strip("|").split("|")]
        head = re.fullmatch(r"test queries \((\w+)\)", cols[2]) if len(cols) == 11 else None
        if head:
            group = head[1]
            out[group] = {}
            continue
        if len(cols) == 11 and cols[0] in CELLS:
            low, high = (float(v) for v in cols[7].strip("[]").split(","))
            out[group][cols[4]] = float(cols[5])
            out[group][cols[0], cols[4]] = {
                "mean": float(cols[3]),
                "diff": float(cols[6]),
                "low": low,
                "high": high,
                "p_holm": float(cols[9].split()[0]),
                "verdict": cols[10],
            }
    return out


# -- the logs, read once -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dedup():
    """(summary table, paired comparisons vs plain) of the 20 fine-tuning runs on the deduplicated splits."""
    runs = find_runs([GPU / "finetune_dedup_5seeds"])
    assign_cells(runs)
    # the means, stds and best epochs do not depend on the resampling; the paired p-values do, so N_BOOT there
    return summary_table(runs, n_boot=1).set_index("cell"), paired_comparisons(runs, "plain", N_BOOT).set_index("cell")


@pytest.fixture(scope="module")
def official():
    runs = find_runs([GPU / "finetune_official_1seed"])
    assign_cells(runs)
    # point estimates only (a bootstrap of 1 resample): the intervals come from the committed tables
    return summary_table(runs, n_boot=1).set_index("cell"), paired_comparisons(runs, "plain", 1).set_index("cell")


@pytest.fixture(scope="module")
def docs() -> dict[str, str]:
    return {name: (REPO / name).read_text() for name in ("RESULTS.md", "README.md", "BENCHMARKS.md")}


def final(folder: str) -> dict:
    return json.loads((GPU / folder / "final.json").read_text())


def metrics(folder: str) -> pd.DataFrame:
    return pd.DataFrame([json.loads(line) for line in (GPU / folder / "metrics.jsonl").read_text().splitlines()])


def zero_shot(max_length: int) -> dict:
    return json.loads((GPU / "zeroshot" / f"zs_{max_length}.json").read_text())["tasks"]


# -- the headline numbers -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_fine_tuned_cells_at_the_best_val_epoch(dedup):
    table, paired = dedup
    assert table["test_top1_mean"].round(3).to_dict() == {"plain": 0.333, "relu": 0.338, "ln_relu": 0.323, "ln": 0.306}
    assert table["seeds"].eq(5).all() and table["incomplete"].eq(0).all()
    assert table["queries_unseen"].eq(1401).all()  # deduplicated: every test query unseen
    assert round(paired.loc["ln", "diff_test_top1"], 3) == -0.027
    assert paired["verdict"].to_dict() == {
        "ln": "worse",
        "ln_relu": "no significant difference",
        "relu": "no significant difference",
    }


def test_zero_shot_at_the_training_length():
    epa = zero_shot(128)["epa"]
    assert (epa["queries"], round(epa["accuracy_at_1"] * epa["queries"])) == (1401, 403)
    assert num(epa["accuracy_at_1"]) == "0.288"
    # compare_baselines.py recomputed it on the CPU in fp32: the same 403 of 1401
    assert baseline_tables(RESULTS / "finetune_gpu_vs_baselines_dedup.md")["all"]["zero-shot"] == 0.288


# -- what the docs must say, built from the logs ---------------------------------------------------------------------
def expected(dedup, official) -> dict[str, list[str]]:
    """{document: snippets it must contain verbatim (after :func:`normalise`)}."""
    table, paired = dedup
    off_table, off_paired = official
    committed = pd.read_csv(RESULTS / "finetune_gpu_top1.csv").set_index("cell")
    committed_off = pd.read_csv(RESULTS / "finetune_gpu_official_splits_top1.csv").set_index("cell")
    committed_off_paired = pd.read_csv(RESULTS / "finetune_gpu_official_splits_top1_paired.csv").set_index("cell")
    # the committed intervals belong to these runs: their point estimates are the ones derived here
    for mine, theirs in ((table, committed), (off_table, committed_off)):
        columns = ["val_top1_mean", "test_top1_mean", "best_epoch", "test_top1_unseen_mean"]
        assert np.allclose(mine.loc[list(CELLS), columns], theirs.loc[list(CELLS), columns])
    assert np.allclose(
        off_paired.loc[list(CELLS[1:]), ["diff_test_top1", "diff_unseen", "diff_seen"]],
        committed_off_paired.loc[list(CELLS[1:]), ["diff_test_top1", "diff_unseen", "diff_seen"]],
    )
    base = baseline_tables(RESULTS / "finetune_gpu_vs_baselines_dedup.md")["all"]
    base_off = baseline_tables(RESULTS / "finetune_gpu_vs_baselines_official.md")
    zs, tfidf = base["zero-shot"], base["TF-IDF"]
    mean = table["test_top1_mean"]
    results, readme = [], []

    # the ablation's tables
    for cell in CELLS:
        r, c = table.loc[cell], committed.loc[cell]
        results.append(
            f"| {cell} | 5 | {num(r.val_top1_mean)} ± {num(r.val_top1_std)} | {num(r.test_top1_mean)} ± "
            f"{num(r.test_top1_std)} | [{num(c.test_ci_low)}, {num(c.test_ci_high)}] | {r.best_epoch:.1f} |"
        )
    results += [
        f"| *zero-shot MiniLM cosine, 128 tokens* | – | – | *{num(zs)}* | | |",
        f"| *TF-IDF* | – | – | *{num(tfidf)}* | | |",
    ]
    for cell in CELLS[1:]:
        c = paired.loc[cell]
        results.append(
            f"| {cell} | plain | 5 matched | {num(c.diff_test_top1, sign=True)} | [{num(c.ci_low, sign=True)}, "
            f"{num(c.ci_high, sign=True)}] | {pvalue(c.p)} [{pvalue(c.p_low)}, {pvalue(c.p_high)}] | "
            f"{pvalue(c.p_holm)} [{pvalue(c.p_holm_low)}, {pvalue(c.p_holm_high)}] | {c.verdict} |"
        )
    for cell in CELLS:
        assert num(base[cell, "zero-shot"]["mean"]) == num(mean[cell])  # the script read the same runs
        rows = [base[cell, b] for b in ("zero-shot", "TF-IDF")]
        results.append(
            f"| {cell} | {num(mean[cell])} | "
            + " | ".join(
                f"{num(r['diff'], sign=True)} [{num(r['low'], sign=True)}, {num(r['high'], sign=True)}] | "
                f"{pvalue(r['p_holm'])} | {r['verdict']}"
                for r in rows
            )
            + " |"
        )

    # the 8 tasks: the cells' means over seeds and the zero-shot evaluations
    results.append(
        "| avg false candidates | "
        + " | ".join(f"{zero_shot(128)[t]['candidates'] / zero_shot(128)[t]['queries']:.1f}" for t in TASKS)
        + " |"
    )
    for tokens in (128, 256):
        results.append(
            f"| MiniLM cosine, zero-shot, {tokens} tokens | "
            + " | ".join(num(zero_shot(tokens)[t]["accuracy_at_1"]) for t in TASKS)
            + " |"
        )
    for cell in CELLS:
        results.append(f"| {cell} | " + " | ".join(num(table.loc[cell, f"{t}_acc1"]) for t in TASKS) + " |")

    # the official splits, one seed
    for cell in CELLS:
        r, c = off_table.loc[cell], committed_off.loc[cell]
        results.append(
            f"| {cell} | {num(r.val_top1_mean)} | {num(r.test_top1_mean)} | [{num(c.test_ci_low)}, "
            f"{num(c.test_ci_high)}] | {num(r.test_top1_unseen_mean)} | {num(r.test_top1_seen_mean)} | "
            f"{r.best_epoch:.0f} |"
        )
    results += [
        f"| *zero-shot MiniLM, 128 tokens* | – | *{num(base_off['all']['zero-shot'])}* | | "
        f"*{num(base_off['unseen']['zero-shot'])}* | *{num(base_off['seen']['zero-shot'])}* | |",
        f"| *TF-IDF* | – | *{num(base_off['all']['TF-IDF'])}* | | *{num(base_off['unseen']['TF-IDF'])}* | "
        f"*{num(base_off['seen']['TF-IDF'])}* | |",
    ]
    for cell in CELLS[1:]:
        d, c = off_paired.loc[cell], committed_off_paired.loc[cell]
        groups = " | ".join(
            f"{num(d[f'diff_{g}'], sign=True)} [{num(c[f'ci_{g}_low'], sign=True)}, "
            f"{num(c[f'ci_{g}_high'], sign=True)}]"
            for g in ("unseen", "seen")
        )
        results.append(
            f"| {cell} | {num(d.diff_test_top1, sign=True)} | [{num(c.ci_low, sign=True)}, "
            f"{num(c.ci_high, sign=True)}] | {pvalue(c.p_holm)} | {c.verdict} | {groups} |"
        )

    # lr × batch, one seed
    runs = find_runs([GPU / "lr_batch_ln_relu"])
    assign_cells(runs, also=("trainer.lr",))
    for run, o in zip(runs, run_outcomes(runs, "trainer.lr").itertuples(), strict=False):
        results.append(
            f"| {lr(o.x)} | {run.flat['trainer.batch_size']} | {num(o.best_val)} | {num(o.test_at_best)} | "
            f"{o.best_epoch} |"
        )

    # same seed, different numbers
    same = {}
    for folder in (
        "smoke_ln_relu_2epochs",
        "finetune_dedup_5seeds/3_ln_relu_s0",
        "lr_batch_ln_relu/0_ln_relu_s0",
        "deterministic_3epochs/nondet",
        "deterministic_3epochs/det1",
        "deterministic_3epochs/det2",
    ):
        m, f = metrics(folder), final(folder)
        test = m[m["split"] == "test"].set_index("epoch")["top1"]
        after = " | ".join(num(test[e]) if e in test else "–" for e in (1, 2, 3))
        loss = m[(m["split"] == "train") & (m["epoch"] == 0)]["loss"].iloc[0]
        results.append(f"| {loss:.4f} | {after} | {f['best_epoch']} | {num(f['best']['test']['top1'])} |")
        same[folder] = f
    a, b = same["finetune_dedup_5seeds/3_ln_relu_s0"], same["lr_batch_ln_relu/0_ln_relu_s0"]
    times = {
        k: metrics(f"deterministic_3epochs/{k}")["epoch_time_s"].dropna().to_numpy()
        for k in ("det1", "det2", "nondet")
    }
    slower = np.mean([times["det1"][1:], times["det2"][1:]]) / np.mean(times["nondet"][1:])

    # the sentences of "The answer" and of the section that quote the numbers
    ranked = sorted(CELLS, key=lambda c: -mean[c])
    results.append(
        "Test top-1: " + ", ".join(f"`{c}` {num(mean[c])}" for c in ranked) + f"; zero-shot MiniLM cosine {num(zs)}"
    )
    better = [c for c in ranked if base[c, "zero-shot"]["verdict"] == "better"]
    level = [c for c in ranked if base[c, "zero-shot"]["verdict"] != "better"]

    def vs_zs(c, unit=""):
        return (
            f"`{c}` {points(base[c, 'zero-shot']['diff'])}{unit} "
            f"[{points(base[c, 'zero-shot']['low'])}, {points(base[c, 'zero-shot']['high'])}]"
        )

    results.append(
        f"{vs_zs(better[0], ' points')}, "
        + ", ".join(vs_zs(c) for c in better[1:-1])
        + f" and {vs_zs(better[-1])}, better; "
        + "; ".join(vs_zs(c) for c in level)
        + ", no significant difference"
    )

    def vs_plain(c):
        return (
            f"`{c}` {points(paired.loc[c, 'diff_test_top1'])}",
            f"[{points(paired.loc[c, 'ci_low'])}, {points(paired.loc[c, 'ci_high'])}]",
        )

    results.append(
        f"{vs_plain('ln')[0]} points {vs_plain('ln')[1]} (p_holm {pvalue(paired.loc['ln', 'p_holm'])}), worse"
    )
    results.append(f"{' '.join(vs_plain('ln_relu'))} and {' '.join(vs_plain('relu'))}, no significant difference")
    frozen = pd.read_csv(RESULTS / "frozen_arguana_top1.csv").set_index("cell")["test_top1_mean"]
    results.append(", ".join(f"`{c}` {num(frozen[c])} → {num(mean[c])}" for c in CELLS))
    results.append(
        f"test top-1 {span(off_table['test_top1_mean'])} on all 1401 queries, "
        f"{span(off_table['test_top1_seen_mean'])} on the 795 seen in training and "
        f"{span(off_table['test_top1_unseen_mean'])} on the 606 unseen"
    )
    unseen = [base_off["unseen"][c, "zero-shot"]["diff"] for c in CELLS]
    results.append(
        f"above zero-shot ({num(base_off['unseen']['zero-shot'])} there) by {points(min(unseen))} to "
        f"{points(max(unseen))} points"
    )
    for group, baseline in (("unseen", "TF-IDF"), ("seen", "zero-shot")):
        diffs = [base_off[group][c, baseline]["diff"] for c in CELLS]
        results.append(f"{points(min(diffs))} to {points(max(diffs))}")
    results.append(
        f"differ by {num(b['best']['test']['top1'] - a['best']['test']['top1'])} test top-1, about the "
        f"seed-to-seed std of the `ln_relu` cell ({num(table.loc['ln_relu', 'test_top1_std'])})"
    )
    results.append(
        f"reached test top-1 {num(a['best']['test']['top1'])} and {num(b['best']['test']['top1'])} at their "
        f"best val epochs (epochs {a['best_epoch']} and {b['best_epoch']})"
    )
    results.append(f"at about {slower:.1f}× the epoch time")

    # the summary table's fine-tuned rows
    for cell in CELLS:
        c, z = committed.loc[cell], base[cell, "zero-shot"]
        vs = (
            "– | |"
            if cell == "plain"
            else (f"{' '.join(vs_plain(cell)).split(' ', 1)[1]} | {paired.loc[cell, 'verdict']} | GA")
        )
        results.append(
            f"| fine-tuned | triplet_ce | {cell} | {num(mean[cell])} [{num(c.test_ci_low)}, "
            f"{num(c.test_ci_high)}] | {vs} | {points(z['diff'])} [{points(z['low'])}, "
            f"{points(z['high'])}] | {z['verdict']} | GB |"
        )

    # the README's answer
    assert all(base[c, "zero-shot"]["verdict"] == "better" for c in ("relu", "plain", "ln_relu"))
    readme.append(f"{vs_plain('ln')[0].split()[1]} {vs_plain('ln')[1]} with it fine-tuned")
    readme.append(f"{vs_plain('relu')[0].split()[1]} {vs_plain('relu')[1]} fine-tuned (no significant difference)")
    readme.append(
        f"`relu` {num(mean['relu'])}, `plain` {num(mean['plain'])} and `ln_relu` {num(mean['ln_relu'])} "
        f"against zero-shot MiniLM's {num(zs)} (better)"
    )
    h200, h200_readme = h200_rows()
    return {"RESULTS.md": results, "README.md": readme + h200_readme, "BENCHMARKS.md": bench_rows(slower) + h200}


def bench_rows(slower: float) -> list[str]:
    """BENCHMARKS.md's rows of the H100 machine, from bench.txt, profile_3epochs and deterministic_3epochs (its GPU
    training rows gave way to the H200's: :func:`h200_rows`)."""
    text = (GPU / "bench.txt").read_text()

    def device(d):
        return "H100" if d.startswith("NVIDIA H100") else "CPU, 16 threads (H100 machine)"

    rows = []
    for m in re.finditer(
        r"^(CPU \(16 threads\)|NVIDIA H100 80GB HBM3) +ArguAna test .*?\) +([\d.]+) +([\d.]+) +"
        r"([\d.]+) +([\d.]+)x +([\d.]+)x$",
        text,
        flags=re.M,
    ):
        rows.append(f"| {device(m[1])} | {m[2]} s | {m[3]} s | {m[4]} s | {m[5]}× | {m[6]}× |")
    rows += throughput_rows(text, r"CPU \(16 threads\)", "CPU, 16 threads (H100 machine)")
    for m in re.finditer(
        r"^(CPU \(scikit-learn\)|CPU \(16 threads\)|NVIDIA H100 80GB HBM3) +(balltree|exact) +N=1k +"
        r"([\d.]+)s +N=4k +([\d.]+)s +N=16k +([\d.]+)s +b=([\d.]+)$",
        text,
        flags=re.M,
    ):
        index = (
            "BallTree (scikit-learn), CPU 16 threads (H100 machine)"
            if m[2] == "balltree"
            else "exact (float32 shortlist, float64 re-rank), " + device(m[1]).replace("CPU, 16", "CPU 16")
        )
        rows.append(f"| {index} | {m[3]} s | {m[4]} s | {m[5]} s | {m[6]} |")
    assert len(rows) == 2 + 2 + 3, "bench.txt: a row the docs quote is missing"
    for name in ("exact", "balltree", "compile", "b64"):
        epochs = " / ".join(f"{t:.1f}" for t in metrics(f"profile_3epochs/{name}")["epoch_time_s"].dropna())
        rows.append(f"| {epochs} s | {final(f'profile_3epochs/{name}')['wall_time_s']:.1f} s |")
    for name in ("det1", "det2", "nondet"):
        epochs = " / ".join(f"{t:.1f}" for t in metrics(f"deterministic_3epochs/{name}")["epoch_time_s"].dropna())
        rows.append(f"| {epochs} s | {final(f'deterministic_3epochs/{name}')['wall_time_s']:.1f} s |")
    rows.append(f"about {slower:.1f}× per epoch")
    return rows


def throughput_rows(text: str, device: str, label: str) -> list[str]:
    """BENCHMARKS.md's item-2 rows (training throughput) of the bench output ``text`` whose device column matches
    the pattern ``device``, that column written as ``label``."""
    models = {
        "tiny": "tiny (2 layers, 32 hidden)",
        "minilm": "MiniLM-sized (6 × 384)",
        "bert-base": "bert-base-sized (12 × 768)",
    }
    rows = []
    for m in re.finditer(
        rf"^{device} +(tiny|minilm|bert-base) +(\d+) triplets x (\d+) tok +(\w+) +(?:(eager|graph) +([\d.]+) +)?"
        r"([\d.]+) +(\d+) +([\d.]+) +(\S+)$",
        text,
        flags=re.M,
    ):
        step, ms = m[5] or "eager", m[6] or ""  # the older bench printed neither: its rows were eager
        tokens = f"{int(m[8]):,}".replace(",", " ")  # 1494974 → 1 494 974
        rows.append(
            f"| {label} | {models[m[1]]} | {m[2]} triplets × {m[3]} tok | {m[4]} | {step} | {ms} | {m[7]} | "
            f"{tokens} | {m[9]} | {m[10]} |"
        )
    return rows


def step_row(text: str, model: str, window: int) -> str:
    """``ops, host syncs, ms`` of item 5's line for ``model`` in ``text``: the host syncs less the profiler's own
    ``cudaDeviceSynchronize`` at its exit, which is one per profiled window of ``window`` steps (and no more: the
    check fails if a step made one)."""
    line = re.search(rf"^ +{model} +NVIDIA H200 .*$", text, flags=re.M)[0]
    ops, syncs, ms = re.search(
        r"ops/step +(\d+) +host syncs/step +[\d.]+ \((.*?)[;)].* ([\d.]+) ms/step", line
    ).groups()
    named = dict((k, float(v)) for k, v in re.findall(r"(cuda\w+) ([\d.]+)", syncs))
    assert named.pop("cudaDeviceSynchronize") * window == 1, line
    return f"{ops}, {sum(named.values()):g}, {ms} ms"


def phases_of(text: str) -> dict[str, str]:
    """Item 6's phase table in a bench output: {phase: wall ms as printed}."""
    return dict(re.findall(r"^   (\S.*?) {2,}([\d.]+)(?: +[\d.]+)?$", text, flags=re.M))


def h200_rows() -> tuple[list[str], list[str]]:
    """(BENCHMARKS.md's, README.md's) snippets of the H200 lease at 426e694 (items 2, 5, 6 with the CUDA-graph step
    and item 6 without it, the peer, the sweep's finished runs), with the operator counts of the lease at 7af1930
    and a9c05a4's item 5 on the same GPU kind (the "before" of the counts)."""
    text = (H200_GRAPH / "bench.txt").read_text()
    eager_text = (H200_GRAPH / "bench_eager.txt").read_text()
    before = (H200 / "a9c05a4_steps.txt").read_text()
    rows = throughput_rows(text, "NVIDIA H200", "H200")
    assert len(rows) == 8, "bench.txt: a training row the docs quote is missing"

    def step_ms(model: str, batch: str, mode: str) -> str:
        return re.search(rf"^NVIDIA H200 +{model} +{batch} +bf16 +{mode} +([\d.]+) ", text, flags=re.M)[1]

    bert = re.search(r"^NVIDIA H200 +bert-base +32 triplets x 256 tok +bf16 +eager .* ([\d.]+) +(\d+)%$", text, re.M)
    rows.append(f"| {bert[2]} % on the H200 ({bert[1]} TFLOP/s, eager)")
    # the windows: 8 (MiniLM-sized) and 32 (frozen) steps at 7af1930, 2 and 20 in a9c05a4's bench
    eager_counts = (H200 / "bench_gpu_only.txt").read_text()
    for name, model, windows in (
        ("frozen-encoder head", "MiniLM frozen head", (20, 32)),
        ("MiniLM-sized encoder", "MiniLM-sized", (2, 8)),
    ):
        rows.append(
            f"| {name}, H200 | {step_row(before, model, windows[0])} | {step_row(eager_counts, model, windows[1])} |"
        )
    graphed = re.search(
        r"^ +MiniLM-sized +NVIDIA H200 +batch +16 graph ops/step +(\d+) +host syncs/step +([\d.]+) "
        r".* ([\d.]+) ms/step",
        text,
        flags=re.M,
    )
    rows.append(
        f"| MiniLM-sized encoder as a CUDA graph (426e694), H200 | {step_row(before, 'MiniLM-sized', 2)} | "
        f"{graphed[1]}, {float(graphed[2]):g}, {graphed[3]} ms |"
    )
    g, e = phases_of(text), phases_of(eager_text)
    three = " / ".join
    per_step = {
        mode: re.search(rf"^   train: ([\d.]+) ms per step \({mode}\)", t, flags=re.M)[1]
        for mode, t in (("CUDA graph", text), ("eager", eager_text))
    }
    rows += [
        f"| mine the hard negatives | {g['mine']} | {e['mine']} |",
        f"| train (175 steps) | {g['train']} ({per_step['CUDA graph']} ms a step) | {e['train']} "
        f"({per_step['eager']} ms a step) |",
        *(
            f"| {label} train / val / test | {three(g[f'{key} {s}'] for s in ('train', 'val', 'test'))} | "
            f"{three(e[f'{key} {s}'] for s in ('train', 'val', 'test'))} |"
            for label, key in (("encode", "encode"), ("retrieve + rerank", "retrieve+rerank"))
        ),
        f"| keep the best weights, log, the rest | {three(g[k] for k in ('keep best', 'log', 'rest'))} | "
        f"{three(e[k] for k in ('keep best', 'log', 'rest'))} |",
        f"| `last.pt` (the copy; the write runs in the background) | {g['checkpoint']} | {e['checkpoint']} |",
        f"| **epoch** (`finetune_epoch_s`) | **{g['epoch']}** | **{e['epoch']}** |",
    ]
    epoch = float(re.search(r"^finetune_epoch_s: ([\d.]+)$", text, flags=re.M)[1])
    eager_epoch = float(re.search(r"^finetune_epoch_s: ([\d.]+)$", eager_text, flags=re.M)[1])
    peer = (H200_GRAPH / "peer.txt").read_text()
    ratio, ours, theirs = re.search(
        r"^ours_over_sentence_transformers: ([\d.]+)x \(ours ([\d.]+), "
        r"sentence-transformers ([\d.]+) triplets/s",
        peer,
        flags=re.M,
    ).groups()
    deadline = re.search(r"sweep_triplet \(deadline (\d+) s\)", (H200_GRAPH / "session_sweeps.txt").read_text())[1]
    finished = [
        f
        for f in (H200_GRAPH / "sweep_triplet_partial").glob("*/final.json")
        if json.loads(f.read_text())["status"] == "done"
    ]
    wall = [json.loads(f.read_text())["wall_time_s"] for f in finished]
    walls = f"{min(wall):.1f}–{max(wall):.1f} s"
    rows += [
        f"| {epoch:.3f} s on the H200 (the mean of 3; {eager_epoch:.3f} s with `trainer.cuda_graphs=false`) | yes |",
        f"| {per_step['CUDA graph']} ms in the ArguAna epoch with the CUDA graph ({per_step['eager']} ms eager); "
        f"{step_ms('minilm', '16 triplets x 128 tok', 'graph')} ms in item 2 (every row 128 tokens, dropout on; "
        f"{step_ms('minilm', '16 triplets x 128 tok', 'eager')} ms eager) | no |",
        f"| {ratio}× ({ours} against {theirs} triplets/s) | yes |",
        f"| {len(finished)} of 20 runs done at {deadline} s with 8 jobs (a run {walls}",
    ]
    readme = [
        f"| {epoch:.3f} s ({eager_epoch:.3f} s with `trainer.cuda_graphs=false`) | one H200 | 426e694 |",
        f"{len(finished)} of the 20 runs finished in {deadline} s (a run {walls}) | one H200 | 426e694 |",
    ]
    return rows, readme


def missing(docs: dict[str, str], wanted: dict[str, list[str]]) -> list[str]:
    """The snippets a document lacks (``document: snippet``)."""
    return [
        f"{name}: {snippet}"
        for name, snippets in wanted.items()
        for snippet in snippets
        if normalise(snippet) not in normalise(docs[name])
    ]


@pytest.fixture(scope="module")
def wanted(dedup, official) -> dict[str, list[str]]:
    return expected(dedup, official)


@pytest.mark.slow
def test_the_docs_quote_the_logs(wanted, docs):
    assert len(wanted["RESULTS.md"]) > 50  # every table row above, not an empty parse
    assert missing(docs, wanted) == []


@pytest.mark.slow
def test_a_changed_number_is_caught(wanted, docs):
    """Bump the last digit of the first number in each quoted snippet, in the document: the check must notice."""
    for name, snippets in wanted.items():
        for snippet in snippets:
            number = re.search(r"\d+\.\d+", snippet)
            assert number, snippet
            bumped = snippet[: number.end() - 1] + str((int(number[0][-1]) + 1) % 10) + snippet[number.end() :]
            text = normalise(docs[name])
            changed = {**docs, name: text.replace(normalise(snippet), normalise(bumped))}
            assert missing(changed, {name: [snippet]}), f"{name}: a change in '{snippet}' went unnoticed"


def decimals(text: str) -> set[str]:
    """The unsigned decimal numbers in ``text`` as written."""
    return {n.lstrip("+-−") for n in re.findall(r"[+\-−]?\d+\.\d+", text)}


@pytest.mark.slow
def test_every_decimal_of_the_gpu_section_has_a_source(docs):
    """Every decimal number in the fine-tuned parts of RESULTS.md occurs in a source: the logs' text files, the
    tables the scripts wrote, or the frozen part of RESULTS.md (which the fine-tuned part quotes for comparison),
    written there as here or rounded to fewer decimals."""
    results = docs["RESULTS.md"]
    gpu_text = section(results, "## Fine-tuned MiniLM on one GPU")
    frozen_text = results.replace(gpu_text, "")
    files = [f for f in GPU.rglob("*") if f.is_file() and f.suffix != ".npy"]
    files += [*RESULTS.glob("finetune_gpu_*.md"), *RESULTS.glob("finetune_gpu_*.csv"), *RESULTS.glob("frozen_*.md")]
    known = decimals(frozen_text)
    for file in files:
        for n in decimals(file.read_text()):
            known |= {n} | {f"{float(n):.{d}f}" for d in range(1, len(n.split(".")[1]))}
    # a difference in points has the digits of the three-decimal top-1 difference (0.046 → 4.6)
    known |= {f"{100 * float(k):.1f}" for k in list(known) if k.startswith("0.") and len(k) == 5}
    assert sorted(decimals(gpu_text) - known) == []


@pytest.mark.slow
def test_the_committed_tables_are_the_scripts_output():
    """plot_top1.py's tables for the GPU runs, recomputed from the logs with its 10 000 resamples."""
    for folder, stem in (
        ("finetune_dedup_5seeds", "finetune_gpu_top1"),
        ("finetune_official_1seed", "finetune_gpu_official_splits_top1"),
    ):
        runs = find_runs([GPU / folder])
        assign_cells(runs)
        table = summary_table(runs, n_boot=N_BOOT)
        paired = paired_comparisons(runs, "plain", N_BOOT)
        committed = pd.read_csv(RESULTS / f"{stem}.csv")
        committed_paired = pd.read_csv(RESULTS / f"{stem}_paired.csv")
        pd.testing.assert_frame_equal(table.reset_index(drop=True), committed, check_dtype=False)
        pd.testing.assert_frame_equal(paired.reset_index(drop=True), committed_paired, check_dtype=False)
