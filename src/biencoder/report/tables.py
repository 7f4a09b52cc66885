"""The tables of a comparison: one row per cell (:func:`summary_table`), every cell against its reference
(:func:`paired_comparisons`), and both as Markdown (:func:`to_markdown`); the CSV files are these frames as
pandas writes them.

Per cell: the seeds, the val metric at each run's best epoch (mean ± std over seeds, ddof=1), the test metric at that
epoch with a 95 % bootstrap CI, the best epoch (counted from 0, as everywhere) and what picked it (each run's
``final.json`` ``selection``), test top-1 on unseen / seen queries, and the 8-task test accuracies. The paired
comparisons are on each run's ``test_hits.npy``: the per-query outcome of its selection metric.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..engine.config.selection import selection_label
from . import SummaryError
from .runs import Run, best_rows
from .statistics import ALPHA, MC_Z, MIN_SEEDS_FOR_SEED_LEVEL, N_BOOT, bootstrap_ci, p_text, paired_bootstrap, verdicts


def _selected_by(runs: list[Run]) -> str:
    """The selection metric(s) of ``runs`` as people read them: ``val retrieval top-1`` (joined when they differ)."""
    return " / ".join(sorted({selection_label(r.selection) for r in runs}))


def _hits_metric(runs: list[Run]) -> str | None:
    """The metric the runs' ``test_hits.npy`` hold (their selection metric), when they all hold the same one."""
    metrics = {r.selection["metric"] for r in runs}
    return metrics.pop() if len(metrics) == 1 else None


def _std(values: np.ndarray) -> float:
    """The std over seeds with ddof=1, NaNs left out; NaN for fewer than two finite values (no spread can be
    estimated)."""
    return float(np.nanstd(values, ddof=1)) if np.isfinite(values).sum() > 1 else np.nan


def summary_table(runs: list[Run], metric: str = "top1", n_boot: int = N_BOOT) -> pd.DataFrame:
    """One row per cell over its complete runs (see module docstring for the columns); ``metric``: the one shown,
    read at each run's best epoch (which its own selection metric picked)."""
    rows = []
    complete = [r for r in runs if r.complete]
    cells = sorted({r.cell for r in runs})
    for cell in cells:
        members = [r for r in complete if r.cell == cell]
        incomplete = sum(1 for r in runs if r.cell == cell and not r.complete)
        row = {"cell": cell, "seeds": len(members), "incomplete": incomplete}
        best = [b for b in (best_rows(r) for r in members) if b]
        if members:
            row["selected_by"] = _selected_by(members)
        if best:
            val = np.array([b[1][metric] for b in best])
            test = np.array([b[2].get(metric, np.nan) for b in best])
            row.update(
                {
                    f"val_{metric}_mean": val.mean(),
                    f"val_{metric}_std": _std(val),
                    f"test_{metric}_mean": np.nanmean(test),
                    f"test_{metric}_std": _std(test),
                    "best_epoch": float(np.mean([b[0] for b in best])),
                }
            )
            for group in ("unseen", "seen"):
                values = [b[2].get(f"top1_{group}") for b in best]
                if metric == "top1" and any(v is not None for v in values):
                    row[f"test_top1_{group}_mean"] = float(np.mean([v for v in values if v is not None]))
                    row[f"queries_{group}"] = int(best[0][2].get(f"queries_{group}", 0))
        hits = [r.hits for r in members if r.hits is not None]
        # test_hits.npy holds each run's selection metric per query: an interval of the metric shown when it is that
        if metric == _hits_metric(members) and hits and len({h.shape for h in hits}) == 1:
            _, low, high = bootstrap_ci(np.stack(hits).astype(float), n_boot)
            row.update(
                {
                    "test_ci_low": low,
                    "test_ci_high": high,
                    "ci_resamples": "seeds+queries" if len(hits) >= MIN_SEEDS_FOR_SEED_LEVEL else "queries",
                }
            )
        tasks = [r.final["tasks"]["test"] for r in members if r.final and "tasks" in r.final]
        if tasks:
            row["tasks_score"] = members[0].final["tasks"]["score"]
            for task in tasks[0]:
                row[f"{task}_acc1"] = float(np.mean([t[task]["accuracy_at_1"] for t in tasks]))
        rows.append(row)
    return pd.DataFrame(rows)


def paired_comparisons(
    runs: list[Run], reference: str | list[str] = "plain", n_boot: int = N_BOOT, strict: bool = False
) -> pd.DataFrame:
    """Test top-1 of each cell minus its reference cell, paired over test queries: each run's per-query outcome of
    its selection metric (``test_hits.npy``; column ``metric``, e.g. ``retrieval_top1`` for ``loss.ce_weight=0``).

    A reference is a variant (``plain``: every other variant against the ``plain`` cell with the same other
    settings), ``key=value`` (``eval.retrieve=sim``: every cell against the cell that differs only in that key being
    ``value``), or such pairs joined by commas for settings changed together (``loss.name=triplet_ce,trainer.head_lr=
    3e-4``: each loss at its own learning rate). Several references make one table, Holm-adjusted over all its rows.
    Per-query hits are matched by seed (pooled over seeds when the cells share none); queries (and, with 3+ matched
    seeds, seeds) are resampled jointly, ``n_boot`` times. Beside each p its Monte Carlo range (``p_low``, ``p_high``)
    and the Holm-adjusted p with its range; the verdict is :func:`~biencoder.report.statistics.verdict`'s ("at the
    line" when that range straddles α). ``strict``: a reference that pairs no two cells of ``runs`` (finished or not)
    is an error (the user named it); a pair whose runs have not finished yet gives no row.
    """
    references = [reference] if isinstance(reference, str) else list(reference)
    complete = [r for r in runs if r.complete and r.hits is not None]
    by_cell: dict[str, list[Run]] = {}
    for r in complete:
        by_cell.setdefault(r.cell, []).append(r)
    # a cell's identity: its name (variant, head) and the settings that separate cells (of every run: finished or not)
    identity = {r.cell: (r.name, tuple(sorted(r.settings.items()))) for r in runs}
    cell_of = {v: k for k, v in identity.items()}
    if strict:
        _check_references(references, identity, cell_of)
    rows = []
    for ref in references:
        for cell, members in sorted(by_cell.items()):
            ref_cell = _reference_cell(ref, identity[cell], cell_of)
            if ref_cell is None or ref_cell not in by_cell:  # no such cell, or none of its runs finished yet
                continue
            rows.append(_compare(cell, members, ref_cell, by_cell[ref_cell], n_boot))
    out = pd.DataFrame(rows)
    if len(out):  # several comparisons in one table: Holm-adjusted verdicts
        for column, values in verdicts(out["diff_test_top1"], out["p"], n_boot).items():
            out[column] = values
        out["resamples"] = n_boot
    return out


def _compare(cell: str, members: list[Run], ref_cell: str, ref_members: list[Run], n_boot: int) -> dict:
    """One row of :func:`paired_comparisons`: the finished runs ``members`` of ``cell`` against ``ref_members`` of
    ``ref_cell`` (before the Holm adjustment)."""
    ref_runs = {r.seed: r for r in ref_members}
    own = {r.seed: r for r in members}
    shared = sorted(set(ref_runs) & set(own))
    pairing = "matched" if shared else "pooled"
    a = np.stack([own[s].hits for s in (shared or own)]).astype(float)
    b = np.stack([ref_runs[s].hits for s in (shared or ref_runs)]).astype(float)
    diff, low, high, p = paired_bootstrap(a, b, n_boot)
    own_metric, ref_metric = _hits_metric(members) or "mixed", _hits_metric(ref_members) or "mixed"
    row = {
        "cell": cell,
        "vs": ref_cell,
        "seeds": len(shared) if shared else f"{len(own)}/{len(ref_runs)}",
        "pairing": pairing,
        "metric": own_metric if own_metric == ref_metric else f"{own_metric} vs {ref_metric}",
        "diff_test_top1": diff,
        "ci_low": low,
        "ci_high": high,
        "p": p,
        "ci_resamples": "seeds+queries" if len(shared) >= MIN_SEEDS_FOR_SEED_LEVEL else "queries",
    }
    seen = members[0].seen
    if seen is not None and seen.any() and (~seen).any() and len(seen) == a.shape[1]:
        for group, mask in (("unseen", ~seen), ("seen", seen)):  # the same test, per query group
            d, lo, hi, _ = paired_bootstrap(a[:, mask], b[:, mask], n_boot)
            row.update(
                {
                    f"diff_{group}": d,
                    f"ci_{group}_low": lo,
                    f"ci_{group}_high": hi,
                    f"queries_{group}": int(mask.sum()),
                }
            )
    return row


def _check_references(references: list[str], identity: dict, cell_of: dict) -> None:
    """Raise :class:`SummaryError` for a reference that pairs no two cells (``identity``: cell → (variant,
    settings))."""
    for ref in references:
        if not any(_reference_cell(ref, identity[cell], cell_of) for cell in identity):
            separate = sorted({key for _, settings in identity.values() for key, _ in settings})
            raise SummaryError(
                f"--reference {ref} pairs no two cells of these runs (cells: {', '.join(sorted(identity))}; they "
                f"differ in the variant{''.join(', ' + key for key in separate)}): name a variant or key=value, "
                "and join settings that changed together with commas, e.g. loss.name=triplet_ce,trainer.head_lr=3e-4"
            )


def _reference_cell(ref: str, identity: tuple, cell_of: dict) -> str | None:
    """The cell a cell of ``identity`` (variant, sorted settings) is compared with under the reference ``ref`` (a
    variant, ``key=value``, or ``key=value,key=value`` for settings that changed together); None when it is the
    reference itself, or when no such cell ran."""
    variant, settings = identity
    if "=" not in ref:
        return None if variant == ref else cell_of.get((ref, settings))
    current = dict(settings)
    wanted = dict(part.partition("=")[::2] for part in ref.split(","))
    if any(key not in current for key in wanted):
        return None
    wanted = {key: _typed(value, current[key]) for key, value in wanted.items()}
    if all(current[key] == value for key, value in wanted.items()):
        return None
    return cell_of.get((variant, tuple(sorted({**current, **wanted}.items()))))


def _typed(value: str, like):
    """``value`` (from the command line) as the type of a config value ``like``; ``null`` (or ``None``) is null, the
    value of a rule that is off (``--reference negatives.rank_range=null``)."""
    if value.lower() in ("null", "none"):
        return None
    if isinstance(like, bool):
        return value.lower() == "true"
    if isinstance(like, (int, float)):
        try:
            return type(like)(float(value))
        except ValueError:
            raise SummaryError(f"--reference value {value!r} is not a number, as the runs' {like!r} is") from None
    return value


def _pm(mean, std) -> str:
    if pd.isna(mean):
        return "–"
    return f"{mean:.3f}" + ("" if pd.isna(std) else f" ± {std:.3f}")


#: what the columns of :func:`to_markdown`'s summary table are
SUMMARY_LEGEND = (
    "\nmean ± std over seeds (ddof=1; no std for one seed). Best epoch: each run's first epoch with the "
    "highest value of its selection metric (final.json: val top-1 reranked, or val retrieval top-1 when "
    "the pair classifier is not trained); the val and test columns are read at that epoch. 95% CI: "
    f"bootstrap over seeds and test queries (two levels) with {MIN_SEEDS_FOR_SEED_LEVEL}+ seeds; with "
    "fewer, over test queries only, and no claim about seed-to-seed variation is made. unseen/seen: test "
    "queries whose point or counter text does not / does occur in a training or validation pair the "
    "run used."
)


def to_markdown(table: pd.DataFrame, comparisons: pd.DataFrame, metric: str) -> str:
    """The summary and comparison tables as Markdown (no extra dependency)."""
    task_cols = [c for c in table.columns if c.endswith("_acc1")]
    groups = [g for g in ("unseen", "seen") if f"test_top1_{g}_mean" in table]
    selected = sorted(set(table["selected_by"].dropna())) if "selected_by" in table else []
    by = f" by {selected[0]}" if len(selected) == 1 else " by"
    head = [
        "cell",
        "seeds",
        f"val {metric} @ best epoch",
        f"test {metric} @ best epoch",
        "95% CI",
        f"best epoch (from 0){by}",
    ]
    head += [f"test top1 {g} (queries)" for g in groups]
    head += [c.replace("_acc1", "") for c in task_cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in table.iterrows():
        cells = _summary_cells(r, metric, several_selections=len(selected) > 1)
        cells += [
            "–"
            if pd.isna(r.get(f"test_top1_{g}_mean"))
            else f"{r[f'test_top1_{g}_mean']:.3f} (n={int(r[f'queries_{g}'])})"
            for g in groups
        ]
        cells += ["–" if pd.isna(r[c]) else f"{r[c]:.3f}" for c in task_cols]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append(SUMMARY_LEGEND)
    if task_cols and "tasks_score" in table:
        lines.append(
            f"\n8-task columns: test accuracy@1 (score `{table['tasks_score'].dropna().iloc[0]}`), mean over seeds."
        )
    if len(comparisons):
        lines += ["", _comparisons_markdown(comparisons)]
    return "\n".join(lines)


def _summary_cells(r: pd.Series, metric: str, several_selections: bool) -> list:
    """The first six cells of a summary table row ``r``: cell, seeds, val and test ``metric``, its 95% CI, the
    best epoch (with what selected it when the cells were selected by ``several_selections`` metrics)."""
    seeds = f"{r['seeds']}" + (f" (+{r['incomplete']} incomplete)" if r["incomplete"] else "")
    ci = (
        f"[{r['test_ci_low']:.3f}, {r['test_ci_high']:.3f}]"
        if "test_ci_low" in r and not pd.isna(r.get("test_ci_low"))
        else "–"
    )
    epoch = "–" if pd.isna(r.get("best_epoch")) else f"{r['best_epoch']:.1f}"
    if several_selections and not pd.isna(r.get("selected_by")):
        epoch += f" ({r['selected_by']})"
    return [
        r["cell"],
        seeds,
        _pm(r.get(f"val_{metric}_mean"), r.get(f"val_{metric}_std")),
        _pm(r.get(f"test_{metric}_mean"), r.get(f"test_{metric}_std")),
        ci,
        epoch,
    ]


def _comparisons_markdown(comparisons: pd.DataFrame) -> str:
    """The paired comparisons of :func:`paired_comparisons` as Markdown, with what p, its range and the verdict are."""
    groups = [g for g in ("unseen", "seen") if f"diff_{g}" in comparisons]
    metrics = sorted(set(comparisons["metric"]))
    shown = metrics[0] if len(metrics) == 1 else "(metric)"
    extra = "".join(f" Δ {g} (n={int(comparisons[f'queries_{g}'].dropna().iloc[0])}) [95% CI] |" for g in groups)
    lines = [
        f"| cell | vs | seeds | Δ test {shown} | 95% CI (paired bootstrap) | p [MC range] | p (Holm, "
        f"{len(comparisons)} comparisons) [MC range] | verdict (Holm-adjusted, α={ALPHA:g}) |{extra}",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(groups),
    ]
    for _, c in comparisons.iterrows():
        cells = "".join(
            " – |"
            if pd.isna(c.get(f"diff_{g}"))
            else f" {c[f'diff_{g}']:+.3f} [{c[f'ci_{g}_low']:+.3f}, {c[f'ci_{g}_high']:+.3f}] |"
            for g in groups
        )
        diff = f"{c['diff_test_top1']:+.3f}" + ("" if len(metrics) == 1 else f" ({c['metric']})")
        lines.append(
            f"| {c['cell']} | {c['vs']} | {c['seeds']} ({c['pairing']}, {c['ci_resamples']}) | {diff} | "
            f"[{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] | {p_text(c['p'], c['p_low'], c['p_high'])} | "
            f"{p_text(c['p_holm'], c['p_holm_low'], c['p_holm_high'])} | {c['verdict']} |{cells}"
        )
    lines.append(
        f"\nΔ: each run's test hits at its best epoch (test_hits.npy, its selection metric), paired by seed. "
        f"p: paired bootstrap, {int(comparisons['resamples'].iloc[0]):,} resamples; [MC range]: what other "
        f"resamples could give (±{MC_Z:g} Monte Carlo standard errors), for the Holm-adjusted p the "
        "adjustment of those ranges. Verdict: better / worse when the whole adjusted range is below α, no "
        "significant difference when it is at or above α, at the line when it straddles α (the resampling, "
        "not the runs, would decide it)."
    )
    if groups:
        lines.append(
            "\nΔ unseen / seen: the same paired difference on the test queries whose texts do not / do "
            "occur in a training or validation pair (descriptive; the verdict is on all queries)."
        )
    return "\n".join(lines)
