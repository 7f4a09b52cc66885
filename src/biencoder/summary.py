"""Compare runs (``biencoder-plot``, ``python scripts/plot_top1.py logs/``, ``python -m biencoder.summary logs/``).

Writes a PNG of the chosen metric per epoch (one colour per cell, mean line and min–max band across seeds, training
loss beside it), and prints and saves a Markdown/CSV table: per cell the seeds, val and test metric at each run's best
epoch (picked by the run's own selection metric, ``final.json``'s ``selection``) with a 95 % bootstrap CI, the best
epoch (counted from 0, as everywhere), the 8-task test accuracies, and a paired bootstrap comparison against ``plain``
(p with its Monte Carlo range; :data:`biencoder.report.statistics.N_BOOT` resamples unless ``--n-boot`` says).
``--x KEY``: results against a swept key instead; ``--baselines``: every cell against zero-shot and TF-IDF too. The
work is done in :mod:`biencoder.report`; this module is the command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from .engine.config.schema import METRIC_LABELS
from .engine.config.settings import is_non_result_key
from .errors import command
from .report import SummaryError
from .report.figures import plot, plot_internals
from .report.runs import METRICS, QUERY_GROUPS, SPLITS, Run, assign_cells, find_runs
from .report.stability import outcome_metric, plot_against, run_outcomes, stability_markdown, stability_tables
from .report.statistics import N_BOOT
from .report.tables import paired_comparisons, summary_table, to_markdown
from .report.trackers import attach


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plot_top1.py", description="Compare biencoder runs: figure + tables.")
    parser.add_argument("paths", nargs="+", help="logs folder(s) or run folders, searched recursively")
    parser.add_argument("--out", type=Path, help="PNG path (default: <first path>/<metric>.png); tables go beside it")
    parser.add_argument(
        "--metric",
        choices=METRICS,
        help="the metric drawn and tabulated (default: the one that "
        "selected the runs' best epochs, final.json's selection: top1, or retrieval_top1 for runs "
        "whose pair classifier was not trained; top1 when they differ)",
    )
    parser.add_argument("--split", nargs="+", default=list(SPLITS), choices=SPLITS, help="splits to draw")
    parser.add_argument("--internals", action="store_true", help="also draw the head statistics (<out>_internals.png)")
    parser.add_argument(
        "--reference",
        action="append",
        metavar="VARIANT|KEY=VALUE[,KEY=VALUE]",
        help="what cells are compared against: a variant (default plain) or key=value, e.g. "
        "eval.retrieve=sim, or key=value pairs joined by commas for settings changed together "
        "(loss.name=triplet_ce,trainer.head_lr=3e-4); repeat it for one table with one Holm "
        "adjustment over all",
    )
    parser.add_argument(
        "--n-boot",
        type=int,
        default=N_BOOT,
        help=f"bootstrap resamples (default {N_BOOT}, the setting of every table, the sweep-end one included)",
    )
    parser.add_argument(
        "--x",
        metavar="KEY",
        help="a swept config key (e.g. trainer.head_lr): plot best val and test "
        "top-1 against it per cell, and tabulate the range of good values (<out stem>_vs_<key>.png/.md/.csv)",
    )
    parser.add_argument(
        "--baselines",
        nargs="?",
        const="all",
        choices=QUERY_GROUPS,
        metavar="all|unseen|seen",
        help="also test every cell against zero-shot and TF-IDF on the same test queries (all, or "
        "those unseen / seen in training), each from the cell's own config "
        "(<out stem>_baselines.md/.csv)",
    )
    parser.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="draw the curves even when no run has finished (e.g. during the first sweep)",
    )
    return parser


#: the figure formats --out takes (matplotlib writes them all; the tables go beside the figure as .md and .csv)
FIGURE_FORMATS = (".png", ".pdf", ".svg")


def _figure_path(out: Path) -> Path:
    """``--out`` as the figure's path: .png added to a path without an extension; another extension is an error."""
    if not out.suffix:
        return out.with_suffix(".png")
    if out.suffix.lower() not in FIGURE_FORMATS:
        raise SummaryError(
            f"--out {out}: the figure's format comes from its extension, one of "
            f"{', '.join(FIGURE_FORMATS)} (the tables go beside it as .md and .csv)"
        )
    return out


def _selection_metric(runs: list[Run]) -> str:
    """The metric that selected the best epochs of ``runs`` (:attr:`Run.selection`) when they share one, else top1."""
    metrics = {r.selection["metric"] for r in runs}
    return metrics.pop() if len(metrics) == 1 else "top1"


def _counts(statuses: dict) -> str:
    return ", ".join(f"{n} {s}" for s, n in statuses.items())


@command
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    runs = find_runs(args.paths)
    args.metric = args.metric or _selection_metric(runs)
    statuses = pd.Series([r.status for r in runs]).value_counts().to_dict()
    if not any(r.complete for r in runs) and not args.allow_unfinished:
        raise SummaryError(
            f"no finished run under {', '.join(args.paths)} ({_counts(statuses)}): wait for the runs, "
            "resume them with trainer.resume=true, or pass --allow-unfinished to draw them anyway"
        )
    if args.x and args.baselines:
        raise SummaryError("--baselines goes with the per-cell table: run it without --x")
    if args.reference and (args.x or args.metric not in METRIC_LABELS):
        raise SummaryError(
            "--reference pairs test top-1 per query (each run's test_hits.npy): use it without --x "
            "and with --metric top1 or retrieval_top1"
        )
    out = _figure_path(args.out) if args.out else Path(args.paths[0]) / f"{args.metric}.png"
    if args.x:
        return _main_against(runs, args.x, out, statuses)
    varying = assign_cells(runs)
    # before anything is written: a --reference that pairs nothing stops here
    comparisons = (
        paired_comparisons(runs, args.reference or ["plain"], args.n_boot, strict=bool(args.reference))
        if args.metric in METRIC_LABELS
        else pd.DataFrame()
    )
    plot(runs, out, args.metric, args.split)
    table = summary_table(runs, args.metric, args.n_boot)
    markdown = to_markdown(table, comparisons, args.metric)
    out.with_suffix(".md").write_text(markdown + "\n")
    table.to_csv(out.with_suffix(".csv"), index=False)
    if len(comparisons):
        comparisons.to_csv(out.with_name(out.stem + "_paired.csv"), index=False)
    print(
        f"{len(runs)} runs ({_counts(statuses)}) in {table.shape[0]} cells"
        + (f"; cells also differ in: {', '.join(varying)}" if varying else "")
    )
    print(markdown)
    files = [out, out.with_suffix(".md"), out.with_suffix(".csv")]
    if len(comparisons):
        files.append(out.with_name(out.stem + "_paired.csv"))
    if args.internals:
        files.append(plot_internals(runs, out.with_name(out.stem + "_internals.png")))
    if args.baselines:
        files += _baselines(runs, args.baselines, out, args.n_boot)
    print(f"\nfigure: {files[0]}\ntables: {', '.join(map(str, files[1:]))}")
    attach(runs, files)
    return 0


def _baselines(runs: list[Run], queries: str, out: Path, n_boot: int) -> list[Path]:
    """``--baselines``: the table of every cell against zero-shot and TF-IDF, printed and saved; returns its files."""
    # imported here: only this option loads the encoder (transformers), which a plot does not otherwise need
    from .report.baselines import baseline_markdown, baseline_table

    table = baseline_table(runs, queries, n_boot)
    markdown = baseline_markdown(table, queries)
    stem = out.with_name(f"{out.stem}_baselines")
    stem.with_suffix(".md").write_text(markdown + "\n")
    table.to_csv(stem.with_suffix(".csv"), index=False)
    print(f"\n{markdown}")
    return [stem.with_suffix(".md"), stem.with_suffix(".csv")]


def _main_against(runs: list[Run], key: str, out: Path, statuses: dict) -> int:
    varying = assign_cells(runs, also=(key,))
    try:
        outcomes = run_outcomes(runs, key)
    except KeyError:
        known = sorted({k for r in runs for k in r.flat if not is_non_result_key(k)})
        close = [k for k in known if k.split(".")[-1] == key.split(".")[-1]]
        raise SummaryError(
            f"--x {key} is not a config key of these runs"
            + (f" (did you mean {close[0]}?)" if close else ": pass a dotted key such as trainer.head_lr")
        ) from None
    if outcomes.empty:
        raise SummaryError("no finished run to plot: wait for the sweep, or resume it with trainer.resume=true")
    per_x, per_cell = stability_tables(outcomes)
    stem = out.with_name(f"{out.stem}_vs_{key.split('.')[-1]}")
    figure = plot_against(outcomes, key, stem.with_suffix(".png"), runs)
    markdown = stability_markdown(per_x, per_cell, key, outcome_metric(outcomes))
    stem.with_suffix(".md").write_text(markdown + "\n")
    per_cell.to_csv(stem.with_suffix(".csv"), index=False)
    per_x.to_csv(stem.with_name(stem.name + "_per_value.csv"), index=False)
    outcomes.to_csv(stem.with_name(stem.name + "_runs.csv"), index=False)
    print(
        f"{len(runs)} runs ({_counts(statuses)}) in {per_cell.shape[0]} cells "
        f"against {key}" + (f"; cells also differ in: {', '.join(varying)}" if varying else "")
    )
    print(markdown)
    files = [
        figure,
        stem.with_suffix(".md"),
        stem.with_suffix(".csv"),
        stem.with_name(stem.name + "_per_value.csv"),
        stem.with_name(stem.name + "_runs.csv"),
    ]
    print(f"\nfigure: {figure}\ntables: {', '.join(map(str, files[1:]))}")
    attach(runs, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
