"""Compare runs: find run folders, group them into cells, aggregate seeds, bootstrap the differences, plot.

``python scripts/plot_top1.py logs/`` (or ``python -m biencoder.summary logs/``) writes a PNG of the chosen metric
per epoch (one colour per cell, mean line and min–max band across seeds, training loss beside it), and prints and
saves a Markdown/CSV table: per cell the seeds, best val metric, test metric at the best-val epoch with a 95 %
bootstrap CI, the best epoch (counted from 0, as everywhere), the 8-task test accuracies, and a paired bootstrap comparison against ``plain``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .config import is_non_result_key, run_settings
from .state import RunFolderError, read_final, read_metrics

SPLITS = ("train", "val", "test")
METRICS = ("top1", "retrieval_top1", "mrr", "recall_at_k")
#: config keys that never separate cells beyond the settings that change no result (NON_RESULT_KEYS, shared with
#: the resume check): the seed is aggregated over, and the head flags are what the variant label already says
GROUPED_OVER = ("seed", "model.head.")
INTERNALS = (("head_pre_sample_var", "head_post_sample_var", "per-sample variance of the head input"),
             ("head_pre_sample_mean", "head_post_sample_mean", "per-sample mean of the head input"),
             ("head_pre_feature_var_std", "head_post_feature_var_std", "spread (std) of per-feature variances"),
             (None, "head_post_zero_share", "share of zeros after LN/ReLU"),
             (None, "grad_norm_encoder", "gradient norm: encoder"),
             (None, "grad_norm_head", "gradient norm: sim head + classifier"))


class SummaryError(ValueError):
    """Nothing to summarise, or logs that cannot be read; the message says what to do."""


@dataclass
class Run:
    path: Path
    config: dict
    metrics: pd.DataFrame
    final: dict | None
    hits: np.ndarray | None
    variant: str
    seed: int
    cell: str = ""
    flat: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)  # the keys that separate cells (set by assign_cells)
    seen: np.ndarray | None = None  # test queries whose texts occur in the run's train/val pairs (test_seen.npy)

    @property
    def complete(self) -> bool:
        return self.final is not None and self.final.get("status") == "done"

    @property
    def status(self) -> str:
        """``done``, ``failed``, ``diverged`` (from final.json) or ``unfinished`` (running, or killed)."""
        return "unfinished" if self.final is None else str(self.final.get("status", "unfinished"))


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Every run folder (``metrics.jsonl`` beside its config) under ``paths``, recursively.

    The config is the runner's ``config_resolved.yaml`` or, failing that, Hydra's ``.hydra/config.yaml``.
    """
    runs = []
    for root in map(Path, paths):
        if not root.exists():
            raise SummaryError(f"'{root}' does not exist: pass the logs folder (e.g. logs/) or run folders")
        candidates = [root / "metrics.jsonl"] if (root / "metrics.jsonl").is_file() else sorted(root.rglob("metrics.jsonl"))
        for metrics_file in candidates:
            folder = metrics_file.parent
            config_file = next((f for f in (folder / "config_resolved.yaml", folder / ".hydra" / "config.yaml")
                                if f.is_file()), None)
            if config_file is None:
                continue
            try:
                lines, _ = read_metrics(metrics_file)  # a torn last line (killed run) is skipped with a warning
            except RunFolderError as err:
                raise SummaryError(str(err)) from None
            if not lines:
                continue
            hits_file, seen_file = folder / "test_hits.npy", folder / "test_seen.npy"
            config = yaml.safe_load(config_file.read_text())
            metrics = pd.DataFrame(lines)
            runs.append(Run(path=folder, config=config, metrics=metrics,
                            final=read_final(folder),
                            hits=np.load(hits_file) if hits_file.is_file() else None,
                            seen=np.load(seen_file) if seen_file.is_file() else None,
                            variant=str(metrics["variant"].iloc[0]), seed=int(metrics["seed"].iloc[0]),
                            flat=run_settings(config)))
    if not runs:
        raise SummaryError(f"no run folders (metrics.jsonl + config) under {', '.join(map(str, paths))}: "
                           "train some with python -m biencoder.train")
    return runs


def assign_cells(runs: list[Run], also: tuple[str, ...] = ()) -> list[str]:
    """Label each run by its variant plus every config key that differs between runs (seed excepted, and the
    keys in ``also``, e.g. the key a stability plot puts on its x-axis).

    Runs whose corpus, model or any other setting differs therefore never share a cell. Returns the keys used.
    """
    keys = sorted({k for r in runs for k in r.flat})
    varying = [k for k in keys if not k.startswith(GROUPED_OVER + tuple(also)) and not is_non_result_key(k)
               and len({repr(r.flat.get(k)) for r in runs}) > 1]
    # labels stay short: a config group whose name differs (model=tiny) stands for the keys under it
    named = {k[:-len(".name")] for k in varying if k.endswith(".name")}
    shown = [k for k in varying if not any(k.startswith(g + ".") and k != g + ".name" for g in named)]
    for run in runs:
        run.cell = " ".join([run.variant] + [f"{_label_key(k, shown)}={_label_value(run.flat.get(k))}" for k in shown])
        run.settings = {k: run.flat.get(k) for k in varying}
    return varying


def _label_key(key: str, keys: list[str]) -> str:
    if key.endswith(".name"):
        return key[:-len(".name")]
    return key.split(".")[-1] if _unique_leaf(key, keys) else key


def _label_value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _unique_leaf(key: str, keys: list[str]) -> bool:
    leaf = key.split(".")[-1]
    return sum(k.split(".")[-1] == leaf for k in keys) == 1


#: fewer seeds than this: intervals resample test queries only, and no claim about training randomness is made
MIN_SEEDS_FOR_SEED_LEVEL = 3


def _bootstrap_stats(values: np.ndarray, n_boot: int, seed: int, two_level: bool) -> np.ndarray:
    """[n_boot] resampled means of ``values`` [S, Q]. One level: queries resampled, seeds averaged. Two levels:
    seeds resampled (with replacement), then queries, so the spread includes training randomness."""
    rng = np.random.default_rng(seed)
    n_seeds, q = values.shape
    # query resampling as multinomial counts: per resample, each seed's mean over the drawn queries
    counts = rng.multinomial(q, np.full(q, 1.0 / q), size=n_boot)  # [n_boot, Q]
    per_seed = counts @ values.T / q  # [n_boot, S]
    if not two_level:
        return per_seed.mean(axis=1)
    seeds = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    return np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)


def wilson(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion ``hits``/``n`` (one run's top-1 over its queries)."""
    if n == 0:
        return float("nan"), float("nan")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(centre - half), float(centre + half)


def bootstrap_ci(values: np.ndarray, n_boot: int = 10000, seed: int = 0, level: float = 0.95,
                 two_level: bool | None = None) -> tuple[float, float, float]:
    """(mean, low, high) of ``values`` [Q] or [S, Q] (seeds × queries).

    ``two_level`` (default: when there are at least :data:`MIN_SEEDS_FOR_SEED_LEVEL` seeds) resamples seeds and
    then queries; otherwise queries only, with the seeds averaged (an interval over test queries for fixed models).
    """
    values = np.atleast_2d(np.asarray(values, dtype=float))
    if two_level is None:
        two_level = values.shape[0] >= MIN_SEEDS_FOR_SEED_LEVEL
    stats = _bootstrap_stats(values, n_boot, seed, two_level)
    alpha = (1 - level) / 2
    return float(values.mean()), float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int = 10000, seed: int = 0,
                     two_level: bool | None = None) -> tuple[float, float, float, float]:
    """Difference of means a − b: (diff, low, high, p). ``a``, ``b``: [Q] or [S, Q] per-query hits with seeds
    matched row by row; queries (and, with ``two_level``, seeds) are resampled jointly for both. ``p`` is the
    two-sided bootstrap p-value of "no difference": twice the smaller share of resampled differences on either
    side of 0 (capped at 1)."""
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    if a.shape[1] != b.shape[1]:
        raise SummaryError(f"cannot pair {a.shape[1]} with {b.shape[1]} queries: the runs used different test splits")
    if a.shape[0] != b.shape[0]:  # unmatched seeds: compare the seed means
        a, b = a.mean(axis=0, keepdims=True), b.mean(axis=0, keepdims=True)
    d = a - b
    if two_level is None:
        two_level = d.shape[0] >= MIN_SEEDS_FOR_SEED_LEVEL
    stats = _bootstrap_stats(d, n_boot, seed, two_level)
    p = min(1.0, 2 * min((stats <= 0).mean(), (stats >= 0).mean()))
    return float(d.mean()), float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975)), float(p)


def holm(p_values) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values (same order as given): step-down, monotone, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order])
    out = np.empty_like(p)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def verdict(diff: float, p_adjusted: float, alpha: float = 0.05) -> str:
    """Plain words: better / worse when the adjusted p is below ``alpha``, else no significant difference."""
    if p_adjusted >= alpha:
        return "no significant difference"
    return "better" if diff > 0 else "worse"


def _best_rows(run: Run, metric: str) -> tuple[int, dict, dict] | None:
    """(best epoch by val metric, its val row, its test row) or None if the run has no val rows."""
    m = run.metrics
    val = m[m["split"] == "val"]
    if val.empty:
        return None
    best = val.loc[val[metric].idxmax()]  # first epoch with the maximum, as the runner picks it
    epoch = int(best["epoch"])
    test = m[(m["split"] == "test") & (m["epoch"] == epoch)]
    return epoch, best.to_dict(), test.iloc[0].to_dict() if len(test) else {}


def summary_table(runs: list[Run], metric: str = "top1", n_boot: int = 10000) -> pd.DataFrame:
    """One row per cell over its complete runs (see module docstring for the columns)."""
    rows = []
    complete = [r for r in runs if r.complete]
    cells = sorted({r.cell for r in runs})
    for cell in cells:
        members = [r for r in complete if r.cell == cell]
        incomplete = sum(1 for r in runs if r.cell == cell and not r.complete)
        row = {"cell": cell, "seeds": len(members), "incomplete": incomplete}
        best = [b for b in (_best_rows(r, metric) for r in members) if b]
        if best:
            val = np.array([b[1][metric] for b in best])
            test = np.array([b[2].get(metric, np.nan) for b in best])
            # std over seeds with ddof=1 (NaN for one seed: no spread can be estimated)
            std = lambda x: float(np.nanstd(x, ddof=1)) if np.isfinite(x).sum() > 1 else np.nan
            row.update({f"val_{metric}_mean": val.mean(), f"val_{metric}_std": std(val),
                        f"test_{metric}_mean": np.nanmean(test), f"test_{metric}_std": std(test),
                        "best_epoch": float(np.mean([b[0] for b in best]))})
            for group in ("unseen", "seen"):
                values = [b[2].get(f"top1_{group}") for b in best]
                if metric == "top1" and any(v is not None for v in values):
                    row[f"test_top1_{group}_mean"] = float(np.mean([v for v in values if v is not None]))
                    row[f"queries_{group}"] = int(best[0][2].get(f"queries_{group}", 0))
        hits = [r.hits for r in members if r.hits is not None]
        if metric == "top1" and hits and len({h.shape for h in hits}) == 1:
            _, low, high = bootstrap_ci(np.stack(hits).astype(float), n_boot)
            row.update({"test_ci_low": low, "test_ci_high": high,
                        "ci_resamples": "seeds+queries" if len(hits) >= MIN_SEEDS_FOR_SEED_LEVEL else "queries"})
        tasks = [r.final["tasks"]["test"] for r in members if r.final and "tasks" in r.final]
        if tasks:
            row["tasks_score"] = members[0].final["tasks"]["score"]
            for task in tasks[0]:
                row[f"{task}_acc1"] = float(np.mean([t[task]["accuracy_at_1"] for t in tasks]))
        rows.append(row)
    return pd.DataFrame(rows)


def paired_comparisons(runs: list[Run], reference: str | list[str] = "plain", n_boot: int = 10000) -> pd.DataFrame:
    """Test top-1 of each cell minus its reference cell, paired over test queries.

    A reference is a variant (``plain``: every other variant against the ``plain`` cell with the same other
    settings) or ``key=value`` (``eval.retrieve=sim``: every cell against the cell that differs only in that key
    being ``value``). Several references make one table, and its Holm adjustment covers all its comparisons.
    Per-query hits are matched by seed (pooled over seeds when the cells share none); queries (and, with 3+
    matched seeds, seeds) are resampled jointly.
    """
    references = [reference] if isinstance(reference, str) else list(reference)
    complete = [r for r in runs if r.complete and r.hits is not None]
    by_cell: dict[str, list[Run]] = {}
    for r in complete:
        by_cell.setdefault(r.cell, []).append(r)
    # a cell's identity: its variant and the settings that separate cells
    identity = {cell: (members[0].variant, tuple(sorted(members[0].settings.items())))
                for cell, members in by_cell.items()}
    cell_of = {v: k for k, v in identity.items()}
    rows = []
    for ref in references:
        for cell, members in sorted(by_cell.items()):
            variant, settings = identity[cell]
            if "=" in ref:
                key, _, value = ref.partition("=")
                current = dict(settings)
                if key not in current or str(current[key]) == value:
                    continue
                ref_cell = cell_of.get((variant, tuple(sorted({**current, key: _typed(value, current[key])}.items()))))
            else:
                if variant == ref:
                    continue
                ref_cell = cell_of.get((ref, settings))
            if ref_cell is None:
                continue
            ref_runs = {r.seed: r for r in by_cell[ref_cell]}
            own = {r.seed: r for r in members}
            shared = sorted(set(ref_runs) & set(own))
            pairing = "matched" if shared else "pooled"
            a = np.stack([own[s].hits for s in (shared or own)]).astype(float)
            b = np.stack([ref_runs[s].hits for s in (shared or ref_runs)]).astype(float)
            diff, low, high, p = paired_bootstrap(a, b, n_boot)
            row = {"cell": cell, "vs": ref_cell, "seeds": len(shared) if shared else f"{len(own)}/{len(ref_runs)}",
                   "pairing": pairing, "diff_test_top1": diff, "ci_low": low, "ci_high": high, "p": p,
                   "ci_resamples": "seeds+queries" if len(shared) >= MIN_SEEDS_FOR_SEED_LEVEL else "queries"}
            seen = members[0].seen
            if seen is not None and seen.any() and (~seen).any() and len(seen) == a.shape[1]:
                for group, mask in (("unseen", ~seen), ("seen", seen)):  # the same test, per query group
                    d, lo, hi, _ = paired_bootstrap(a[:, mask], b[:, mask], n_boot)
                    row.update({f"diff_{group}": d, f"ci_{group}_low": lo, f"ci_{group}_high": hi,
                                f"queries_{group}": int(mask.sum())})
            rows.append(row)
    out = pd.DataFrame(rows)
    if len(out):  # several comparisons in one table: Holm-adjusted verdicts
        out["p_holm"] = holm(out["p"])
        out["verdict"] = [verdict(d, p) for d, p in zip(out["diff_test_top1"], out["p_holm"])]
    return out


def _typed(value: str, like):
    """``value`` (from the command line) as the type of a config value ``like``."""
    if isinstance(like, bool):
        return value.lower() == "true"
    if isinstance(like, (int, float)):
        return type(like)(float(value))
    return value


def _pm(mean, std) -> str:
    if pd.isna(mean):
        return "–"
    return f"{mean:.3f}" + ("" if pd.isna(std) else f" ± {std:.3f}")


def to_markdown(table: pd.DataFrame, comparisons: pd.DataFrame, metric: str) -> str:
    """The summary and comparison tables as Markdown (no extra dependency)."""
    task_cols = [c for c in table.columns if c.endswith("_acc1")]
    groups = [g for g in ("unseen", "seen") if f"test_top1_{g}_mean" in table]
    head = ["cell", "seeds", f"best val {metric}", f"test {metric} @ best val", "95% CI", "best epoch (from 0)"]
    head += [f"test top1 {g} (queries)" for g in groups]
    head += [c.replace("_acc1", "") for c in task_cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in table.iterrows():
        seeds = f"{r['seeds']}" + (f" (+{r['incomplete']} incomplete)" if r["incomplete"] else "")
        ci = f"[{r['test_ci_low']:.3f}, {r['test_ci_high']:.3f}]" if "test_ci_low" in r and not pd.isna(r.get("test_ci_low")) else "–"
        cells = [r["cell"], seeds, _pm(r.get(f"val_{metric}_mean"), r.get(f"val_{metric}_std")),
                 _pm(r.get(f"test_{metric}_mean"), r.get(f"test_{metric}_std")), ci,
                 "–" if pd.isna(r.get("best_epoch")) else f"{r['best_epoch']:.1f}"]
        cells += ["–" if pd.isna(r.get(f"test_top1_{g}_mean"))
                  else f"{r[f'test_top1_{g}_mean']:.3f} (n={int(r[f'queries_{g}'])})" for g in groups]
        cells += ["–" if pd.isna(r[c]) else f"{r[c]:.3f}" for c in task_cols]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append("\nmean ± std over seeds (ddof=1; no std for one seed). 95% CI: bootstrap over seeds and test queries "
                 f"(two levels) with {MIN_SEEDS_FOR_SEED_LEVEL}+ seeds; with fewer, over test queries only, and no "
                 "claim about seed-to-seed variation is made. unseen/seen: test queries whose point or counter text "
                 "does not / does occur in a training or validation pair the run used.")
    if task_cols and "tasks_score" in table:
        lines.append(f"\n8-task columns: test accuracy@1 (score `{table['tasks_score'].dropna().iloc[0]}`), mean over seeds.")
    if len(comparisons):
        groups = [g for g in ("unseen", "seen") if f"diff_{g}" in comparisons]
        extra = "".join(f" Δ {g} (n={int(comparisons[f'queries_{g}'].dropna().iloc[0])}) [95% CI] |" for g in groups)
        lines += ["", f"| cell | vs | seeds | Δ test top1 | 95% CI (paired bootstrap) | p | p (Holm, "
                      f"{len(comparisons)} comparisons) | verdict (Holm-adjusted, α=0.05) |{extra}",
                  "|---|---|---|---|---|---|---|---|" + "---|" * len(groups)]
        for _, c in comparisons.iterrows():
            cells = "".join(" – |" if pd.isna(c.get(f"diff_{g}")) else
                            f" {c[f'diff_{g}']:+.3f} [{c[f'ci_{g}_low']:+.3f}, {c[f'ci_{g}_high']:+.3f}] |" for g in groups)
            lines.append(f"| {c['cell']} | {c['vs']} | {c['seeds']} ({c['pairing']}, {c['ci_resamples']}) | "
                         f"{c['diff_test_top1']:+.3f} | [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] | {c['p']:.3f} | "
                         f"{c['p_holm']:.3f} | {c['verdict']} |{cells}")
        if groups:
            lines.append("\nΔ unseen / seen: the same paired difference on the test queries whose texts do not / do "
                         "occur in a training or validation pair (descriptive; the verdict is on all queries).")
    return "\n".join(lines)


def _curves(runs: list[Run], split: str, key: str) -> pd.DataFrame:
    """Rows epoch × run of ``key`` on ``split``."""
    frames = []
    for r in runs:
        m = r.metrics[r.metrics["split"] == split]
        if key in m:
            frames.append(m[["epoch", key]].assign(run=str(r.path)))
    return pd.concat(frames) if frames else pd.DataFrame(columns=["epoch", key, "run"])


def cell_colors(cells: list[str]) -> dict:
    """One colour per cell: tab10 up to 10 cells, tab20 (paired light/dark) up to 20, then repeating."""
    import matplotlib.pyplot as plt

    cmap, n = (plt.get_cmap("tab10"), 10) if len(cells) <= 10 else (plt.get_cmap("tab20"), 20)
    return {c: cmap(i % n) for i, c in enumerate(cells)}


#: markers cycled over cells, drawn every few epochs: cells whose curves coincide stay distinguishable
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def legend_below(fig, handles=None, labels=None) -> None:
    """A legend under the panels that never clips: labels wrapped, as many columns as fit the width, and the figure
    made taller by the legend's height so the panels keep theirs. Without ``handles``: every labelled line of every
    panel, each label once (a baseline drawn on the val/test panels only joins too)."""
    import textwrap

    if handles is None:
        found = {}
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                found.setdefault(label, handle)
        labels, handles = list(found), list(found.values())

    labels = [textwrap.fill(label, 36) for label in labels]
    ncol = max(1, min(len(labels), int(fig.get_figwidth() // 3.3)))
    legend = fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False, fontsize=8,
                        bbox_to_anchor=(0.5, 0.005))
    fig.canvas.draw()
    legend_in = legend.get_window_extent().height / fig.dpi + 0.15
    fig.set_figheight(fig.get_figheight() + legend_in)
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))


def baseline(runs: list[Run], split: str, score: str = "encoder_cosine") -> float | None:
    """The zero-shot (or TF-IDF) top-1 on ``split`` that the runs' final.json record, when they all agree."""
    values = {round(r.final["baselines"][split][score]["top1"], 6) for r in runs
              if r.complete and split in r.final.get("baselines", {})}
    return values.pop() if len(values) == 1 else None


def draw_baselines(ax, runs: list[Run], split: str) -> None:
    for score, name, style in (("encoder_cosine", "zero-shot encoder", "--"), ("tfidf", "TF-IDF", ":")):
        value = baseline(runs, split, score)
        if value is not None:
            ax.axhline(value, color="0.35", linestyle=style, linewidth=1.2, label=f"{name} (same queries)")


def _style(ax, title: str, ylabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _draw(ax, runs: list[Run], split: str, key: str, colors: dict[str, str]) -> None:
    for i, cell in enumerate(sorted(colors)):
        members = [r for r in runs if r.cell == cell]
        done = _curves([r for r in members if r.complete], split, key)
        if len(done):
            g = done.groupby("epoch")[key]
            n = done["run"].nunique()
            every = max(1, len(g.mean()) // 8)
            ax.plot(g.mean().index, g.mean(), color=colors[cell], label=f"{cell} (n={n})", linewidth=2,
                    marker=MARKERS[i % len(MARKERS)], markersize=5, markevery=(i % every, every))
            ax.fill_between(g.min().index, g.min(), g.max(), color=colors[cell], alpha=0.2, linewidth=0)
        for r in members:
            if not r.complete:  # in progress or crashed: drawn on its own, dashed, never averaged in
                c = _curves([r], split, key)
                ax.plot(c["epoch"], c[key], color=colors[cell], linestyle="--", linewidth=1,
                        label=f"{cell} s{r.seed} (incomplete)")


def plot(runs: list[Run], out: Path, metric: str = "top1", splits=SPLITS) -> Path:
    """PNG: ``metric`` per epoch for each split and the training loss; band = min–max across seeds."""
    import matplotlib.pyplot as plt

    fig = figure(runs, metric, splits)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _queries(runs: list[Run], split: str) -> str:
    """`` (N queries)`` when every run evaluated ``split`` on the same number of queries (a train sample shows)."""
    counts = {int(q) for r in runs for q in r.metrics.loc[r.metrics["split"] == split, "queries"].dropna().unique()} \
        if all("queries" in r.metrics for r in runs) else set()
    return f" ({counts.pop()} queries)" if len(counts) == 1 else ""


def figure(runs: list[Run], metric: str = "top1", splits=SPLITS):
    """The Matplotlib figure :func:`plot` saves (one panel per split, then the training loss; legend below)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({r.cell for r in runs})
    colors = cell_colors(cells)
    panels = [(s, metric, f"{s}: {metric}{_queries(runs, s)}") for s in splits] + [("train", "loss", "training loss")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    for ax, (split, key, title) in zip(axes[0], panels):
        _draw(ax, runs, split, key, colors)
        if key == "top1":
            draw_baselines(ax, runs, split)
        _style(ax, title, key)
    fig.suptitle(f"{metric} per epoch (mean over seeds, band = min–max)")
    legend_below(fig)
    return fig


def plot_internals(runs: list[Run], out: Path) -> Path:
    """PNG: head-input statistics before (dotted) / after (solid) LN/ReLU and gradient norms, per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    cells = sorted({r.cell for r in runs})
    colors = cell_colors(cells)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, (pre, post, title) in zip(axes.ravel(), INTERNALS):
        for cell in cells:
            members = [r for r in runs if r.cell == cell and r.complete]
            for key, style in ((pre, ":"), (post, "-")):
                if key is None:
                    continue
                curves = _curves(members, "train", key)
                if len(curves):
                    g = curves.groupby("epoch")[key]
                    ax.plot(g.mean().index, g.mean(), color=colors[cell], linestyle=style, linewidth=2)
                    ax.fill_between(g.min().index, g.min(), g.max(), color=colors[cell], alpha=0.15, linewidth=0)
        _style(ax, title, "")
        has_positive = any((line.get_ydata() > 0).any() for line in ax.get_lines())
        if ("variance" in title or "gradient" in title) and has_positive:  # a frozen encoder's gradient is 0
            ax.set_yscale("log")
    handles = [Line2D([], [], color=colors[c], linewidth=2, label=c) for c in cells]
    handles += [Line2D([], [], color="grey", linestyle=":", label="before LN/ReLU"),
                Line2D([], [], color="grey", linestyle="-", label="after LN/ReLU")]
    fig.suptitle("Inside the pair head (training split, mean over seeds)")
    legend_below(fig, handles, [h.get_label() for h in handles])
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plot_top1.py", description="Compare biencoder runs: figure + tables.")
    parser.add_argument("paths", nargs="+", help="logs folder(s) or run folders, searched recursively")
    parser.add_argument("--out", type=Path, help="PNG path (default: <first path>/top1.png); tables go beside it")
    parser.add_argument("--metric", default="top1", choices=METRICS)
    parser.add_argument("--split", nargs="+", default=list(SPLITS), choices=SPLITS, help="splits to draw")
    parser.add_argument("--internals", action="store_true", help="also draw the head statistics (<out>_internals.png)")
    parser.add_argument("--reference", action="append", metavar="VARIANT|KEY=VALUE",
                        help="what cells are compared against: a variant (default plain) or key=value, e.g. "
                             "eval.retrieve=sim; repeat it for one table with one Holm adjustment over all")
    parser.add_argument("--n-boot", type=int, default=10000)
    parser.add_argument("--x", metavar="KEY", help="a swept config key (e.g. trainer.head_lr): plot best val and test "
                        "top-1 against it per cell, and tabulate the range of good values (<out stem>_vs_<key>.png/.md/.csv)")
    parser.add_argument("--allow-unfinished", action="store_true",
                        help="draw the curves even when no run has finished (e.g. during the first sweep)")
    args = parser.parse_args(argv)
    try:
        runs = find_runs(args.paths)
        statuses = pd.Series([r.status for r in runs]).value_counts().to_dict()
        if not any(r.complete for r in runs) and not args.allow_unfinished:
            raise SummaryError(f"no finished run under {', '.join(args.paths)} "
                               f"({', '.join(f'{n} {s}' for s, n in statuses.items())}): wait for the runs, resume "
                               "them with trainer.resume=true, or pass --allow-unfinished to draw them anyway")
    except SummaryError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = args.out or Path(args.paths[0]) / f"{args.metric}.png"
    if args.x:
        return _main_against(runs, args.x, out, statuses)
    varying = assign_cells(runs)
    plot(runs, out, args.metric, args.split)
    table = summary_table(runs, args.metric, args.n_boot)
    references = args.reference or ["plain"]
    comparisons = paired_comparisons(runs, references, args.n_boot) if args.metric == "top1" else pd.DataFrame()
    markdown = to_markdown(table, comparisons, args.metric)
    out.with_suffix(".md").write_text(markdown + "\n")
    table.to_csv(out.with_suffix(".csv"), index=False)
    if len(comparisons):
        comparisons.to_csv(out.with_name(out.stem + "_paired.csv"), index=False)
    print(f"{len(runs)} runs ({', '.join(f'{n} {s}' for s, n in statuses.items())}) in {table.shape[0]} cells"
          + (f"; cells also differ in: {', '.join(varying)}" if varying else ""))
    print(markdown)
    files = [out, out.with_suffix(".md"), out.with_suffix(".csv")]
    if len(comparisons):
        files.append(out.with_name(out.stem + "_paired.csv"))
    if args.internals:
        files.append(plot_internals(runs, out.with_name(out.stem + "_internals.png")))
    print(f"\nfigure: {files[0]}\ntables: {', '.join(map(str, files[1:]))}")
    _log_to_trackers(runs, files)
    return 0


def _log_to_trackers(runs: list[Run], files: list[Path]) -> None:
    """Runs tracked with logger=mlflow: the figure and tables go to their experiment too (a run named summary)."""
    from .tracking import log_summary

    try:
        names = log_summary([r.path for r in runs], files)
    except ImportError:
        print("note: these runs were tracked with MLflow, which is not installed here: the figure stays local "
              "(pip install -e '.[tracking]')", file=sys.stderr)
        return
    if names:
        print(f"mlflow: figure and tables attached to experiment(s) {', '.join(names)} (run 'summary')")


def _main_against(runs: list[Run], key: str, out: Path, statuses: dict) -> int:
    from .stability import plot_against, run_outcomes, stability_markdown, stability_tables

    varying = assign_cells(runs, also=(key,))
    try:
        outcomes = run_outcomes(runs, key)
    except KeyError:
        known = sorted({k for r in runs for k in r.flat if not is_non_result_key(k)})
        close = [k for k in known if k.split(".")[-1] == key.split(".")[-1]]
        print(f"error: --x {key} is not a config key of these runs"
              + (f" (did you mean {close[0]}?)" if close else ": pass a dotted key such as trainer.head_lr"),
              file=sys.stderr)
        return 2
    if outcomes.empty:
        print("error: no finished run to plot: wait for the sweep, or resume it with trainer.resume=true", file=sys.stderr)
        return 2
    per_x, per_cell = stability_tables(outcomes)
    stem = out.with_name(f"{out.stem}_vs_{key.split('.')[-1]}")
    figure = plot_against(outcomes, key, stem.with_suffix(".png"), runs)
    markdown = stability_markdown(per_x, per_cell, key)
    stem.with_suffix(".md").write_text(markdown + "\n")
    per_cell.to_csv(stem.with_suffix(".csv"), index=False)
    per_x.to_csv(stem.with_name(stem.name + "_per_value.csv"), index=False)
    outcomes.to_csv(stem.with_name(stem.name + "_runs.csv"), index=False)
    print(f"{len(runs)} runs ({', '.join(f'{n} {s}' for s, n in statuses.items())}) in {per_cell.shape[0]} cells "
          f"against {key}" + (f"; cells also differ in: {', '.join(varying)}" if varying else ""))
    print(markdown)
    files = [figure, stem.with_suffix(".md"), stem.with_suffix(".csv"), stem.with_name(stem.name + "_per_value.csv"),
             stem.with_name(stem.name + "_runs.csv")]
    print(f"\nfigure: {figure}\ntables: {', '.join(map(str, files[1:]))}")
    _log_to_trackers(runs, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
