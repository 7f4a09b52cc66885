"""The figures of a comparison (Matplotlib, Agg backend): the metric per epoch per cell (:func:`plot`), the head
internals (:func:`plot_internals`), and the pieces :mod:`biencoder.report.stability` draws with too (colours,
markers, the legend below the panels, the recorded baselines as reference lines).

One colour per cell, mean over seeds with a min–max band; runs without ``final.json`` status done are drawn dashed
on their own, never averaged in.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .runs import SPLITS, Run, queries_label, recorded_baseline

INTERNALS = (
    ("head_pre_sample_var", "head_post_sample_var", "per-sample variance of the output layer's input"),
    ("head_pre_sample_mean", "head_post_sample_mean", "per-sample mean of the output layer's input"),
    ("head_pre_feature_var_std", "head_post_feature_var_std", "spread (std) of per-feature variances"),
    (None, "head_post_zero_share", "share of zeros after the norm/activation"),
    (None, "grad_norm_encoder", "gradient norm: encoder"),
    (None, "grad_norm_head", "gradient norm: sim head + classifier"),
)


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
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                found.setdefault(label, handle)
        labels, handles = list(found), list(found.values())

    labels = [textwrap.fill(label, 36) for label in labels]
    ncol = max(1, min(len(labels), int(fig.get_figwidth() // 3.3)))
    legend = fig.legend(
        handles, labels, loc="lower center", ncol=ncol, frameon=False, fontsize=8, bbox_to_anchor=(0.5, 0.005)
    )
    fig.canvas.draw()
    legend_in = legend.get_window_extent().height / fig.dpi + 0.15
    fig.set_figheight(fig.get_figheight() + legend_in)
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))


def draw_baselines(ax, runs: list[Run], split: str) -> None:
    for score, name, style in (("encoder_cosine", "zero-shot encoder", "--"), ("tfidf", "TF-IDF", ":")):
        value = recorded_baseline(runs, split, score)
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
            ax.plot(
                g.mean().index,
                g.mean(),
                color=colors[cell],
                label=f"{cell} (n={n})",
                linewidth=2,
                marker=MARKERS[i % len(MARKERS)],
                markersize=5,
                markevery=(i % every, every),
            )
            ax.fill_between(g.min().index, g.min(), g.max(), color=colors[cell], alpha=0.2, linewidth=0)
        for r in members:
            if not r.complete:  # in progress or crashed: drawn on its own, dashed, never averaged in
                c = _curves([r], split, key)
                ax.plot(
                    c["epoch"],
                    c[key],
                    color=colors[cell],
                    linestyle="--",
                    linewidth=1,
                    label=f"{cell} s{r.seed} (incomplete)",
                )


def plot(runs: list[Run], out: Path, metric: str = "top1", splits=SPLITS) -> Path:
    """PNG: ``metric`` per epoch for each split and the training loss; band = min–max across seeds."""
    import matplotlib.pyplot as plt

    fig = figure(runs, metric, splits)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def figure(runs: list[Run], metric: str = "top1", splits=SPLITS):
    """The Matplotlib figure :func:`plot` saves (one panel per split, then the training loss; legend below)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({r.cell for r in runs})
    colors = cell_colors(cells)
    panels = [(s, metric, f"{s}: {metric}{queries_label(runs, s)}") for s in splits] + [
        ("train", "loss", "training loss")
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    for ax, (split, key, title) in zip(axes[0], panels, strict=True):
        _draw(ax, runs, split, key, colors)
        if key == "top1":
            draw_baselines(ax, runs, split)
        _style(ax, title, key)
    fig.suptitle(f"{metric} per epoch (mean over seeds, band = min–max)")
    legend_below(fig)
    return fig


def plot_internals(runs: list[Run], out: Path) -> Path:
    """PNG: the statistics of the output layer's input before (dotted) / after (solid) its norm and activation
    (docs/heads.md: ``head_pre_*``, ``head_post_*``) and gradient norms, per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    cells = sorted({r.cell for r in runs})
    colors = cell_colors(cells)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, (pre, post, title) in zip(axes.ravel(), INTERNALS, strict=True):
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
    handles += [
        Line2D([], [], color="grey", linestyle=":", label="before norm/activation"),
        Line2D([], [], color="grey", linestyle="-", label="after norm/activation"),
    ]
    fig.suptitle("Inside the pair head (training split, mean over seeds)")
    legend_below(fig, handles, [h.get_label() for h in handles])
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
