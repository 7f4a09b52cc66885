"""The factorial reading of a comparison whose cells cross two or more factors (:mod:`biencoder.report.design`):
main effects, each level against the reference level, and two-way interactions, in points of test top-1, with the
intervals, p-values and verdicts of every other table (:func:`factorial_table`), and as Markdown
(:func:`factorial_markdown`).

Every effect is a contrast of cell means, each cell's mean over its seeds' per-query outcomes (``test_hits.npy``)
counted once whatever its number of seeds, and averaged with equal weight over the combinations of the levels of
the factors it does not involve (μ(a, c): the mean of the cell at level a of factor A and combination c of the
others; r_A: A's reference level):

- the effect of level a of A: mean over c of μ(a, c) − μ(r_A, c). For a two-level factor this is its main effect
  (the mean of its simple effects); with more levels there is one row per level, against the reference;
- the interaction of level a of A with level b of B: mean over c of [μ(a, b, c) − μ(r_A, b, c)] − [μ(a, r_B, c) −
  μ(r_A, r_B, c)], the difference of A's simple effects where B is at b and where B is at its reference (symmetric
  in A and B, not halved). Positive: the two together do better than the sum of their effects alone.

Both are one definition: the product over the factors involved of (+1 at the level, −1 at the reference), averaged
over the rest. Each is estimated on the seeds that every cell of its contrast ran (paired, as in
:func:`~biencoder.report.tables.paired_comparisons`; with 3+ of them seeds and queries are resampled, else queries
only); with no seed common to all of them, on each cell's mean over its own seeds (queries only). Interval and p:
:func:`~biencoder.report.statistics.contrast_bootstrap`, the paired bootstrap of every table; one Holm family over
the rows of one table (every effect, in every stratum), with the verdicts of
:func:`~biencoder.report.statistics.verdicts`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from .design import Design
from .runs import Run
from .statistics import ALPHA, MC_Z, MIN_SEEDS_FOR_SEED_LEVEL, N_BOOT, contrast_bootstrap, p_text, verdicts


@dataclass(frozen=True)
class Contrast:
    """One effect of a design: the ``factors`` it involves (indices into :attr:`Design.factors`) with the level of
    each compared with its reference, and its weight on every combination of levels (zero ones left out)."""

    factors: tuple[int, ...]
    levels: tuple[tuple, ...]
    weights: dict[int, Fraction]  # index into Design.combinations() → weight


def contrasts(design: Design) -> list[Contrast]:
    """Every effect of ``design``: each non-reference level of each factor, then each pair of factors at each pair
    of non-reference levels (module docstring)."""
    out = []
    for order in (1, 2):
        for involved in itertools.combinations(range(len(design.factors)), order):
            for levels in itertools.product(*(design.factors[i].levels[1:] for i in involved)):
                out.append(Contrast(involved, levels, _weights(design, involved, levels)))
    return out


def _weights(design: Design, involved: tuple[int, ...], levels: tuple[tuple, ...]) -> dict[int, Fraction]:
    """The weight of each combination of levels: the product over the ``involved`` factors of +1 at its level in
    ``levels`` and −1 at its reference (0 at any other level), divided by the number of combinations of the other
    factors' levels."""
    rest = int(np.prod([len(f.levels) for i, f in enumerate(design.factors) if i not in involved]))
    weights = {}
    for index, combo in enumerate(design.combinations()):
        sign = 1
        for i, level in zip(involved, levels, strict=True):
            factor = design.factors[i]
            sign *= 1 if repr(combo[i]) == repr(level) else -1 if repr(combo[i]) == repr(factor.reference) else 0
        if sign:
            weights[index] = Fraction(sign, rest)
    return weights


def factorial_table(runs: list[Run], design: Design, n_boot: int = N_BOOT) -> pd.DataFrame:
    """One row per effect (:func:`contrasts`) in each stratum of ``design``, over the finished runs of ``runs`` with
    ``test_hits.npy``; empty when a cell of an effect has no such run yet.

    Columns: ``within`` (the stratum; only with strata), ``effect`` (main effect, level vs reference, interaction),
    ``factor``, ``contrast`` (in words), ``cells``, ``seeds``, ``pairing`` (matched or pooled), ``metric`` (what
    the hits hold), ``effect_pt`` with ``ci_low_pt`` / ``ci_high_pt`` (points: ×100), ``p``, ``ci_resamples``, then
    the Holm family's ``p_low`` … ``verdict`` (:func:`~biencoder.report.statistics.verdicts`) and ``resamples``.
    """
    finished: dict[str, list[Run]] = {}
    for run in runs:
        if run.complete and run.hits is not None:
            finished.setdefault(run.cell, []).append(run)
    combos = design.combinations()
    rows = []
    for stratum in design.stratum_levels:
        cells = [design.cell(stratum, combo) for combo in combos]
        if not all(cell in finished for cell in cells):
            return pd.DataFrame()
        for contrast in contrasts(design):
            row = _estimate([finished[cells[i]] for i in contrast.weights], list(contrast.weights.values()), n_boot)
            within = {"within": _stratum_text(design, stratum)} if design.strata else {}
            rows.append({**within, **_describe(design, contrast), "cells": len(contrast.weights), **row})
    out = pd.DataFrame(rows)
    for column, values in verdicts(out["effect_pt"], out["p"], n_boot).items():
        out[column] = values
    out["resamples"] = n_boot
    return out


def _estimate(members: list[list[Run]], weights: list[Fraction], n_boot: int) -> dict:
    """The estimate of one contrast over the finished runs ``members`` of each of its cells (module docstring)."""
    shared = sorted(set.intersection(*({r.seed for r in runs} for runs in members)))
    if shared:
        values = [np.stack([next(r for r in runs if r.seed == s).hits for s in shared]) for runs in members]
        seeds, pairing = len(shared), "matched"
    else:
        values = [np.stack([r.hits for r in runs]).mean(axis=0) for runs in members]
        counts = sorted({len(runs) for runs in members})
        seeds = counts[0] if len(counts) == 1 else f"{counts[0]}-{counts[-1]} per cell"
        pairing = "pooled"
    effect, low, high, p = contrast_bootstrap(values, weights, n_boot)
    metrics = sorted({r.selection["metric"] for runs in members for r in runs})
    return {
        "seeds": seeds,
        "pairing": pairing,
        "metric": " / ".join(metrics),
        "effect_pt": 100 * effect,
        "ci_low_pt": 100 * low,
        "ci_high_pt": 100 * high,
        "p": p,
        "ci_resamples": "seeds+queries" if shared and len(shared) >= MIN_SEEDS_FOR_SEED_LEVEL else "queries",
    }


def _describe(design: Design, contrast: Contrast) -> dict:
    """The effect, factor and contrast columns of one row, in words."""
    involved = [design.factors[i] for i in contrast.factors]
    others = [f.label for i, f in enumerate(design.factors) if i not in contrast.factors]
    over = f", mean over {', '.join(others)}" if others else ""
    differences = [
        f"{f.text(level)} − {f.text(f.reference)}" for f, level in zip(involved, contrast.levels, strict=True)
    ]
    if len(involved) == 1:
        kind = "main effect" if len(involved[0].levels) == 2 else "level vs reference"
        return {"effect": kind, "factor": involved[0].label, "contrast": differences[0] + over}
    (a, b), (_, level_b) = involved, contrast.levels
    return {
        "effect": "interaction",
        "factor": f"{a.label} × {b.label}",
        "contrast": f"{a.label} {differences[0]} at {b.label}={b.text(level_b)} minus at "
        f"{b.label}={b.text(b.reference)}{over}",
    }


def _stratum_text(design: Design, stratum: tuple) -> str:
    return " ".join(f"{f.label}={f.text(level)}" for f, level in zip(design.strata, stratum, strict=True))


def factorial_markdown(table: pd.DataFrame, design: Design) -> str:
    """The section of ``top1.md`` that holds :func:`factorial_table`: a heading, the table, and what its numbers
    are (reference levels, the cells at each combination, the sign convention, the Holm family)."""
    labels = " × ".join(f.label for f in design.factors)
    if table.empty:
        return (
            f"### Factorial effects: {labels}\n\nNot yet: a cell of the design has no finished run with test_hits.npy."
        )
    within = "within | " if "within" in table else ""
    lines = [
        f"### Factorial effects: {labels}",
        "",
        f"| {within}effect | factor | contrast | seeds | Δ test {table['metric'].iloc[0]} (points) | 95% CI | "
        f"p [MC range] | p (Holm, {len(table)} effects) [MC range] | verdict (Holm-adjusted, α={ALPHA:g}) |",
        "|" + "---|" * (9 + bool(within)),
    ]
    for _, r in table.iterrows():
        lines.append(
            "| " + (f"{r['within']} | " if within else "") + f"{r['effect']} | {r['factor']} | {r['contrast']} | "
            f"{r['seeds']} ({r['pairing']}, {r['ci_resamples']}) | {r['effect_pt']:+.1f} | "
            f"[{r['ci_low_pt']:+.1f}, {r['ci_high_pt']:+.1f}] | {p_text(r['p'], r['p_low'], r['p_high'])} | "
            f"{p_text(r['p_holm'], r['p_holm_low'], r['p_holm_high'])} | {r['verdict']} |"
        )
    lines += ["", _legend(table, design)]
    return "\n".join(lines)


def _legend(table: pd.DataFrame, design: Design) -> str:
    """What the factorial table's numbers are, in one paragraph."""
    references = ", ".join(f"{f.label}={f.text(f.reference)}" for f in design.factors)
    cells = "; ".join(
        f"{design.cell(design.stratum_levels[0], combo)} = "
        + ", ".join(f.text(level) for f, level in zip(design.factors, combo, strict=True))
        for combo in design.combinations()
    )
    return (
        f"Each effect is a contrast of cell means in points of test top-1 (×100), every combination of the other "
        f"factors' levels weighted equally whatever its seeds. Reference levels: {references}. Cells "
        f"({', '.join(f.label for f in design.factors)}): {cells}"
        + (" (in the first stratum)" if design.strata else "")
        + ". Main effect / level vs reference: the level minus the reference, averaged over the other factors. "
        "Interaction A × B: A's effect where B is at the level shown minus where B is at its reference (the "
        "difference of the simple effects, not halved; positive: together better than the sum of the two alone). "
        "95% CI and p: the paired bootstrap of the comparisons above, on the seeds every cell of the effect ran, "
        f"{int(table['resamples'].iloc[0]):,} resamples; [MC range]: ±{MC_Z:g} Monte Carlo standard errors. Holm "
        f"over the {len(table)} effects of this table. Verdict: better / worse (the sign of the effect) when the "
        "whole adjusted range is below α, no significant difference when it is at or above α, at the line when it "
        "straddles α."
    )
