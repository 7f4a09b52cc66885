"""Results against a swept config key (``plot_top1.py logs/sweeps/<time> --x trainer.head_lr``): how wide is the
range of good settings per cell, and how well-behaved are the runs inside it?

Per run: its best val top-1 (the epoch model selection picks), the test top-1 at that epoch, and three
behaviours over the whole run, defined here once. "top-1" is the run's selection metric (``final.json``'s
``selection``: the reranked top-1, or the retrieval top-1 when the pair classifier is not trained); the tables and
the figure name it (column ``metric``).

- **diverged**: the run stopped at a non-finite loss or embedding (``final.json`` status ``diverged``);
- **collapsed late**: the mean val top-1 of its last :data:`TAIL_EPOCHS` epochs is at least
  :data:`COLLAPSE_DROP` (5 points) below its best -- about 4 standard errors of a top-1 near 0.2 (3.5 near 0.3) on
  the 1060 deduplicated val queries, so a drop this size is not noise;
- **post-best noise**: the standard deviation of the epoch-to-epoch change of val top-1 after the best epoch.

Per cell: the value of the key with the best mean (over seeds) best val top-1, and the contiguous range of
swept values around it whose mean stays within :data:`WITHIN` (1 point) of that best -- its width in decades
(log10 of max/min) for positive keys.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from .figures import MARKERS, cell_colors, draw_baselines, legend_below
from .runs import Run, best_rows, queries_label

WITHIN = 0.01
COLLAPSE_DROP = 0.05
TAIL_EPOCHS = 5


def run_outcomes(runs: list[Run], key: str) -> pd.DataFrame:
    """One row per finished or diverged run: cell, x (the value of ``key``), seed, metric (the run's selection
    metric), best val / test value of it, the epoch of the best, diverged, collapsed, post-best noise."""
    rows = []
    for r in runs:
        if r.status not in ("done", "diverged"):
            continue
        if key not in r.flat:
            raise KeyError(key)
        metric = r.selection["metric"]
        row = {
            "cell": r.cell,
            "x": r.flat[key],
            "seed": r.seed,
            "metric": metric,
            "diverged": r.status == "diverged",
            "best_val": np.nan,
            "test_at_best": np.nan,
            "best_epoch": np.nan,
            "collapsed": False,
            "post_best_noise": np.nan,
        }
        best = best_rows(r)
        if best is not None:
            epoch, val_row, test_row = best
            val = r.metrics[r.metrics["split"] == "val"].sort_values("epoch")[metric].to_numpy()
            after = val[int(np.argmax(val)) :]
            row.update(
                best_val=val_row[metric],
                test_at_best=test_row.get(metric, np.nan),
                best_epoch=epoch,
                collapsed=bool(val[-TAIL_EPOCHS:].mean() <= val.max() - COLLAPSE_DROP),
                post_best_noise=float(np.diff(after).std(ddof=1)) if len(after) >= 3 else np.nan,
            )
        rows.append(row)
    return pd.DataFrame(rows)


def _range(xs: np.ndarray, means: np.ndarray) -> tuple[float, float]:
    """The contiguous run of grid values around the best mean that stays within WITHIN of it."""
    best = int(np.nanargmax(means))
    ok = means >= means[best] - WITHIN
    lo = hi = best
    while lo > 0 and ok[lo - 1]:
        lo -= 1
    while hi < len(xs) - 1 and ok[hi + 1]:
        hi += 1
    return xs[lo], xs[hi]


def stability_tables(outcomes: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per cell and x, per cell) summaries of :func:`run_outcomes`."""
    per_x = (
        outcomes.groupby(["cell", "x"])
        .agg(
            seeds=("seed", "size"),
            best_val_mean=("best_val", "mean"),
            best_val_std=("best_val", "std"),
            test_mean=("test_at_best", "mean"),
            test_std=("test_at_best", "std"),
            best_epoch_mean=("best_epoch", "mean"),
            diverged=("diverged", "sum"),
            collapsed=("collapsed", "sum"),
            post_best_noise=("post_best_noise", "mean"),
        )
        .reset_index()
        .sort_values(["cell", "x"])
    )
    rows = []
    for cell, g in per_x.groupby("cell", sort=True):
        xs, means = g["x"].to_numpy(), g["best_val_mean"].fillna(-np.inf).to_numpy()
        best = g.iloc[int(np.argmax(means))]
        lo, hi = _range(xs, means)
        runs = outcomes[outcomes["cell"] == cell]
        positive = all(isinstance(v, (int, float)) and v > 0 for v in (lo, hi))
        rows.append(
            {
                "cell": cell,
                "best_x": best["x"],
                "best_val_mean": best["best_val_mean"],
                "best_val_std": best["best_val_std"],
                "test_mean": best["test_mean"],
                "test_std": best["test_std"],
                "within_1pt_low": lo,
                "within_1pt_high": hi,
                "width_decades": math.log10(hi / lo) if positive else np.nan,
                "runs": len(runs),
                "diverged_share": runs["diverged"].mean(),
                "collapsed_share": runs["collapsed"].mean(),
                "post_best_noise": runs["post_best_noise"].mean(),
            }
        )
    return per_x, pd.DataFrame(rows)


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def outcome_metric(outcomes: pd.DataFrame) -> str:
    """The selection metric(s) of :func:`run_outcomes`' runs, as the tables and the figure name them."""
    return " / ".join(sorted(set(outcomes["metric"]))) if len(outcomes) else "top1"


def stability_markdown(per_x: pd.DataFrame, per_cell: pd.DataFrame, key: str, metric: str = "top1") -> str:
    """The tables of :func:`stability_tables` as Markdown; ``metric``: the runs' selection metric
    (:func:`outcome_metric`)."""

    def pm(m, s) -> str:
        return "–" if pd.isna(m) else f"{m:.3f}" + ("" if pd.isna(s) else f" ± {s:.3f}")

    lines = [
        f"| cell | best {key} | best val {metric} | test {metric} @ best val | {key} within 1 pt of best | width "
        "(decades) | diverged | collapsed late | post-best val noise |",
        "|" + "---|" * 9,
    ]
    for _, r in per_cell.iterrows():
        width = "–" if pd.isna(r["width_decades"]) else f"{r['width_decades']:.1f}"
        lines.append(
            f"| {r['cell']} | {_num(r['best_x'])} | {pm(r['best_val_mean'], r['best_val_std'])} | "
            f"{pm(r['test_mean'], r['test_std'])} | {_num(r['within_1pt_low'])} – {_num(r['within_1pt_high'])} | "
            f"{width} | {r['diverged_share']:.0%} of {r['runs']} | {r['collapsed_share']:.0%} of {r['runs']} | "
            f"{100 * r['post_best_noise']:.1f} pt |"
        )
    lines.append(
        f"\nmean ± std (ddof=1) over the seeds at the best {key}. Within 1 pt: the contiguous swept values "
        f"around the best whose mean best val {metric} is at most 1 point lower (with 3 seeds a mean is "
        "itself uncertain by about a point: read widths to the grid's half-decade, no finer). Diverged: "
        f"non-finite loss. Collapsed late: mean val {metric} of the last {TAIL_EPOCHS} epochs ≥ "
        f"{100 * COLLAPSE_DROP:.0f} points below the run's best. Post-best noise: std of the epoch-to-epoch "
        f"change of val {metric} after the best epoch, mean over runs. {metric}: the runs' selection metric."
    )
    lines += [
        "",
        f"| cell | {key} | seeds | best val {metric} | test {metric} @ best val | best epoch (0-based) | "
        "diverged | collapsed late |",
        "|" + "---|" * 8,
    ]
    for _, r in per_x.iterrows():
        lines.append(
            f"| {r['cell']} | {_num(r['x'])} | {r['seeds']} | {pm(r['best_val_mean'], r['best_val_std'])} | "
            f"{pm(r['test_mean'], r['test_std'])} | {r['best_epoch_mean']:.1f} | {r['diverged']} | "
            f"{r['collapsed']} |"
        )
    return "\n".join(lines)


def plot_against(outcomes: pd.DataFrame, key: str, out: Path, runs: list[Run] | None = None) -> Path:
    """PNG: best val top-1 and test top-1 at best val against ``key``, per cell: mean over seeds with a min–max
    band; a log x-axis when every value is positive and they span more than a factor of 10."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted(outcomes["cell"].unique())
    colors = cell_colors(cells)
    xs = pd.to_numeric(outcomes["x"], errors="coerce")
    log_x = bool(xs.notna().all() and (xs > 0).all() and xs.max() / xs.min() > 10)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), squeeze=False)
    metric = outcome_metric(outcomes)
    panels = (
        ("best_val", "val", f"best val {metric}"),
        ("test_at_best", "test", f"test {metric} at the best val epoch"),
    )
    for ax, (column, split, title) in zip(axes[0], panels, strict=True):
        for i, cell in enumerate(cells):
            g = outcomes[outcomes["cell"] == cell].groupby("x")[column]
            n = int(g.size().max())
            ax.plot(
                g.mean().index,
                g.mean(),
                marker=MARKERS[i % len(MARKERS)],
                color=colors[cell],
                linewidth=2,
                label=f"{cell} ({n} seed{'' if n == 1 else 's'})",
            )
            ax.fill_between(g.min().index, g.min(), g.max(), color=colors[cell], alpha=0.15, linewidth=0)
        if runs is not None:  # the zero-shot / TF-IDF top-1 the runs recorded, as reference lines
            draw_baselines(ax, runs, split)
            title += queries_label(runs, split)
        if log_x:
            ax.set_xscale("log")
            ax.minorticks_off()
        if xs.notna().all():  # ticks at the swept values: a linear axis' own labels of 2e-5…1e-4 run together
            ticks = sorted(xs.unique())
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_title(title)
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{metric} against {key} (mean over seeds, band = min–max)")
    legend_below(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
