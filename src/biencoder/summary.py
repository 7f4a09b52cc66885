"""Compare runs (``biencoder-plot``, ``python scripts/plot_top1.py logs/``, ``python -m biencoder.summary logs/``).

Writes a PNG of the chosen metric per epoch (one colour per cell, mean line and min–max band across seeds, training
loss beside it), and prints and saves a Markdown/CSV table: per cell the seeds, val and test metric at each run's best
epoch (picked by the run's own selection metric, ``final.json``'s ``selection``) with a 95 % bootstrap CI, the best
epoch (counted from 0, as everywhere), the 8-task test accuracies, and a paired bootstrap comparison against ``plain``
(p with its Monte Carlo range; :data:`biencoder.report.statistics.N_BOOT` resamples unless ``--n-boot`` says).
``top1.md`` goes on with every cell against zero-shot and TF-IDF (``--no-baselines``: not), and, when the cells
cross two or more factors, their main effects and interactions (``--factors``: which keys). ``--x KEY``: results
against a swept key instead. The work is done in :mod:`biencoder.report`; this module is the command line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import pandas as pd

from .engine.config.settings import is_non_result_key
from .errors import BiencoderError, command
from .report import SummaryError
from .report.design import Design, find_design
from .report.factorial import factorial_markdown, factorial_table
from .report.figures import plot, plot_internals
from .report.runs import METRICS, QUERY_GROUPS, SPLITS, Run, assign_cells, find_runs
from .report.stability import outcome_metric, plot_against, run_outcomes, stability_markdown, stability_tables
from .report.statistics import N_BOOT
from .report.tables import paired_comparisons, summary_table, to_markdown
from .report.trackers import attach

log = logging.getLogger("biencoder")

#: the metrics whose per-query test outcome a run keeps (test_hits.npy: the top-1 of the ranking its selection
#: reads), so the only ones the paired tables and the factorial reading compare
PAIRED_METRICS = ("top1", "retrieval_top1")


def parser() -> argparse.ArgumentParser:
    """The command line of ``biencoder-plot`` (and ``scripts/plot_top1.py``, ``python -m biencoder.summary``)."""
    parser = argparse.ArgumentParser(prog="biencoder-plot", description="Compare biencoder runs: figure + tables.")
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
        "--x",
        metavar="KEY",
        help="a swept config key (e.g. trainer.head_lr): plot best val and test "
        "top-1 against it per cell, and tabulate the range of good values (<out stem>_vs_<key>.png/.md/.csv)",
    )
    parser.add_argument(
        "--allow-unfinished",
        action="store_true",
        help="draw the curves even when no run has finished (e.g. during the first sweep)",
    )
    _comparison_options(parser)
    _baseline_options(parser)
    return parser


def _comparison_options(parser: argparse.ArgumentParser) -> None:
    """The options of the tables that pair each run's test_hits.npy (references, factors, resamples), as one group
    of ``parser``'s help."""
    group = parser.add_argument_group("comparisons (test top-1, paired per query)")
    group.add_argument(
        "--reference",
        action="append",
        metavar="VARIANT|KEY=VALUE[,KEY=VALUE]",
        help="what cells are compared against: a variant (default plain) or key=value, e.g. "
        "eval.retrieve=sim, or key=value pairs joined by commas for settings changed together "
        "(loss.name=triplet_ce,trainer.head_lr=3e-4); repeat it for one table with one Holm "
        "adjustment over all",
    )
    group.add_argument(
        "--n-boot",
        type=int,
        default=N_BOOT,
        help=f"bootstrap resamples (default {N_BOOT}, the setting of every table, the sweep-end one included)",
    )
    group.add_argument(
        "--factors",
        nargs="+",
        metavar="KEY[=REFERENCE]",
        help="read the cells as a factorial design of these config keys (default: every key that separates the "
        "cells, when two or more do); =REFERENCE sets a factor's reference level. Writes <out stem>_factorial.csv "
        "and a section of <out stem>.md",
    )


def _baseline_options(parser: argparse.ArgumentParser) -> None:
    """The options of the section of cells against the baselines (on by default), as one group of ``parser``'s
    help."""
    group = parser.add_argument_group("baselines (zero-shot and TF-IDF on the same test queries)")
    group.add_argument(
        "--baselines",
        nargs="?",
        const="all",
        choices=QUERY_GROUPS,
        metavar="all|unseen|seen",
        help="test every cell against zero-shot and TF-IDF on the same test queries (all, or those unseen / seen "
        "in training), each from the cell's own config: a section of <out stem>.md, and <out stem>_baselines.md/"
        ".csv. On by default on all test queries, where a baseline that cannot be computed is a warning; asked "
        "for, it is an error",
    )
    group.add_argument("--no-baselines", action="store_true", help="leave the baselines out (no encoder is loaded)")
    group.add_argument("--data-root", help="the baselines' corpus folder, when the runs' data.root is not here")
    group.add_argument(
        "--encoder",
        help="the baselines' untrained encoder (folder or Hugging Face id), when the runs' "
        "model.encoder.name_or_path is not here",
    )


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
    _check_args(args, runs, statuses)
    out = _figure_path(args.out) if args.out else Path(args.paths[0]) / f"{args.metric}.png"
    if args.x:
        return _main_against(runs, args.x, out, statuses)
    varying = assign_cells(runs)
    paired = args.metric in PAIRED_METRICS  # the tables that pair each run's test_hits.npy
    # before anything is written: a --reference or --factors that reads nothing stops here
    comparisons = (
        paired_comparisons(runs, args.reference or ["plain"], args.n_boot, strict=bool(args.reference))
        if paired
        else pd.DataFrame()
    )
    design, note = find_design(runs, args.factors) if paired else (None, "")
    plot(runs, out, args.metric, args.split)
    table = summary_table(runs, args.metric, args.n_boot)
    files = [out, out.with_suffix(".md"), out.with_suffix(".csv")]
    if len(comparisons):
        comparisons.to_csv(out.with_name(out.stem + "_paired.csv"), index=False)
        files.append(out.with_name(out.stem + "_paired.csv"))
    sections = [to_markdown(table, comparisons, args.metric)]
    for section, written in (_baseline_section(runs, args, out), _factorial_section(runs, design, note, args, out)):
        sections += [section] if section else []
        files += written
    markdown = "\n\n".join(sections)
    out.with_suffix(".md").write_text(markdown + "\n")
    table.to_csv(out.with_suffix(".csv"), index=False)
    print(
        f"{len(runs)} runs ({_counts(statuses)}) in {table.shape[0]} cells"
        + (f"; cells also differ in: {', '.join(varying)}" if varying else "")
    )
    print(markdown)
    if args.internals:
        files.append(plot_internals(runs, out.with_name(out.stem + "_internals.png")))
    print(f"\nfigure: {files[0]}\ntables: {', '.join(map(str, files[1:]))}")
    attach(runs, files)
    return 0


def _check_args(args: argparse.Namespace, runs: list[Run], statuses: dict) -> None:
    """Raise :class:`SummaryError` for options that cannot work together or on these runs, before any work."""
    if not any(r.complete for r in runs) and not args.allow_unfinished:
        raise SummaryError(
            f"no finished run under {', '.join(args.paths)} ({_counts(statuses)}): wait for the runs, "
            "resume them with trainer.resume=true, or pass --allow-unfinished to draw them anyway"
        )
    if args.baselines and args.no_baselines:
        raise SummaryError("--baselines and --no-baselines ask for opposite things: pass one of them")
    for option, given in (("--baselines", args.baselines), ("--factors", args.factors)):
        if args.x and given:
            raise SummaryError(f"{option} goes with the per-cell table: run it without --x")
    if (args.reference or args.factors) and (args.x or args.metric not in PAIRED_METRICS):
        raise SummaryError(
            f"{'--reference' if args.reference else '--factors'} pairs test top-1 per query (each run's "
            "test_hits.npy): use it without --x and with --metric top1 or retrieval_top1"
        )


def _baseline_section(runs: list[Run], args: argparse.Namespace, out: Path) -> tuple[str, list[Path]]:
    """The section of every cell against zero-shot and TF-IDF (``<out stem>_baselines.md/.csv`` too), and its files.

    On by default; ``--no-baselines`` leaves it out. Asked for with ``--baselines``, a baseline that cannot be
    computed (no corpus or encoder at the runs' paths) is an error; by default it is a warning line, and the
    section says why it is missing."""
    if args.no_baselines:
        return "", []
    # imported here: only the baselines load the encoder (transformers), which the rest of a plot does not need
    from .report.baselines import baseline_markdown, baseline_table

    queries = args.baselines or "all"
    heading = f"### Against zero-shot and TF-IDF ({queries} test queries)\n\n"
    try:
        table = baseline_table(runs, queries, args.n_boot, args.data_root, args.encoder)
    except BiencoderError as err:
        if args.baselines:
            raise
        log.warning("baselines not computed: %s (--no-baselines leaves them out)", err)
        return heading + f"Not computed: {err}", []
    markdown = baseline_markdown(table, queries)
    stem = out.with_name(f"{out.stem}_baselines")
    stem.with_suffix(".md").write_text(markdown + "\n")
    table.to_csv(stem.with_suffix(".csv"), index=False)
    return heading + markdown, [stem.with_suffix(".md"), stem.with_suffix(".csv")]


def _factorial_section(
    runs: list[Run], design: Design | None, note: str, args: argparse.Namespace, out: Path
) -> tuple[str, list[Path]]:
    """The factorial section (``<out stem>_factorial.csv`` too) when the cells cross two or more factors, the note
    that says why not when they differ in two or more without crossing them, else nothing."""
    if design is None:
        return (f"### Factorial effects\n\n{note}" if note else ""), []
    table = factorial_table(runs, design, args.n_boot)
    if table.empty:
        return factorial_markdown(table, design), []
    path = out.with_name(f"{out.stem}_factorial.csv")
    table.to_csv(path, index=False)
    return factorial_markdown(table, design), [path]


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
