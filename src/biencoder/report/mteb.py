"""The table of the MTEB protocol (``eval.protocol=mteb``; docs/protocol.md): baselines and cells from the evaluation
records ``python -m biencoder.evaluate eval.protocol=mteb`` writes, with bootstrap intervals, and each cell against
zero-shot on nDCG@10 in one Holm family (``scripts/mteb_table.py``).

A folder of records is read by name: ``zero_shot.json`` (``eval.score=encoder_cosine``), ``tfidf.json``, and
``<cell>_seed<N>.json`` (a run's checkpoint, its final ranking). Each record's ``mteb.ranks`` are the counters' ranks
of the same queries in the same order (the split's pairs), so the per-query numbers pair up across records.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..engine.retrieval.metrics import Ranks
from ..engine.retrieval.mteb import per_query
from . import SummaryError
from .statistics import ALPHA, MC_Z, MIN_SEEDS_FOR_SEED_LEVEL, N_BOOT, bootstrap_ci, p_text, paired_bootstrap, verdicts

#: the numbers of the table, MTEB's names: the headline first
METRICS = ("ndcg_at_10", "mrr_at_10", "recall_at_100")
#: the baselines' files and labels, in the table's order
BASELINE_FILES = {"zero_shot": "zero-shot MiniLM (cosine)", "tfidf": "TF-IDF"}
_RUN_FILE = re.compile(r"^(?P<cell>.+)_seed(?P<seed>\d+)$")


def read_records(folder: str | Path) -> tuple[dict[str, dict], dict[str, dict[int, dict]]]:
    """(baseline name -> record, cell -> seed -> record) of the ``*.json`` records in ``folder``; other JSON files
    are refused. :class:`SummaryError` when a record is not of the MTEB protocol, or the records' queries differ."""
    baselines: dict[str, dict] = {}
    cells: dict[str, dict[int, dict]] = {}
    for path in sorted(Path(folder).glob("*.json")):
        record = json.loads(path.read_text())
        if record.get("protocol") != "mteb":
            raise SummaryError(f"{path}: not an evaluation record of eval.protocol=mteb")
        match = _RUN_FILE.match(path.stem)
        if path.stem in BASELINE_FILES:
            baselines[path.stem] = record
        elif match:
            cells.setdefault(match["cell"], {})[int(match["seed"])] = record
        else:
            raise SummaryError(f"{path}: name it zero_shot.json, tfidf.json or <cell>_seed<N>.json")
    counts = {len(r["mteb"]["ranks"]) for r in [*baselines.values(), *(r for c in cells.values() for r in c.values())]}
    if len(counts) > 1:
        raise SummaryError(f"the records rank different numbers of queries ({sorted(counts)}): not one test split")
    return baselines, cells


def _values(record: dict, metric: str) -> np.ndarray:
    """[Q] the metric of each query of a record (:func:`~biencoder.engine.retrieval.mteb.per_query`)."""
    return per_query(Ranks(np.asarray(record["mteb"]["ranks"], dtype=np.int64)), metric)


def mteb_rows(
    baselines: dict[str, dict], cells: dict[str, dict[int, dict]], n_boot: int = N_BOOT
) -> tuple[list[dict], list[dict]]:
    """(rows, comparisons). A row per baseline and per cell: its seeds, queries, candidates, and per metric the mean
    with its 95 % bootstrap interval (queries for a baseline; seeds then queries for a cell of
    :data:`~.statistics.MIN_SEEDS_FOR_SEED_LEVEL`+ seeds). A comparison per cell: its nDCG@10 minus zero-shot's on the
    same queries (the paired bootstrap, zero-shot repeated for every seed), p, and the Holm family's columns over
    the cells (:func:`~.statistics.verdicts`)."""
    rows = []
    values: dict[str, dict[str, np.ndarray]] = {}
    for name, record in sorted(baselines.items(), key=lambda item: list(BASELINE_FILES).index(item[0])):
        values[name] = {m: _values(record, m)[None, :] for m in METRICS}
        rows.append({"name": BASELINE_FILES[name], "seeds": None, "record": record, "values": values[name]})
    for cell, seeds in sorted(cells.items()):
        ordered = [seeds[s] for s in sorted(seeds)]
        values[cell] = {m: np.stack([_values(r, m) for r in ordered]) for m in METRICS}
        rows.append({"name": cell, "seeds": sorted(seeds), "record": ordered[0], "values": values[cell]})
    for row in rows:
        row["queries"] = row["record"]["mteb"]["queries"]
        row["candidates"] = row["record"]["mteb"]["candidates"]
        row["ci"] = {m: bootstrap_ci(v, n_boot) for m, v in row.pop("values").items()}
    comparisons = []
    if "zero_shot" in values:
        for cell in sorted(cells):
            ours = values[cell]["ndcg_at_10"]
            theirs = np.repeat(values["zero_shot"]["ndcg_at_10"], len(ours), axis=0)
            diff, low, high, p = paired_bootstrap(ours, theirs, n_boot)
            comparisons.append({"cell": cell, "seeds": len(ours), "diff": diff, "low": low, "high": high, "p": p})
        if comparisons:
            family = verdicts([c["diff"] for c in comparisons], [c["p"] for c in comparisons], n_boot)
            for i, c in enumerate(comparisons):
                c.update({k: v[i] for k, v in family.items()})
    return rows, comparisons


def mteb_markdown(rows: list[dict], comparisons: list[dict], n_boot: int = N_BOOT) -> str:
    """:func:`mteb_rows` as two Markdown tables with what their numbers are."""
    lines = [
        "| ranking | seeds | queries | candidates | nDCG@10 [95% CI] | MRR@10 [95% CI] | R@100 [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        seeds = "–" if r["seeds"] is None else f"{len(r['seeds'])} ({', '.join(map(str, r['seeds']))})"
        shown = [f"{mean:.3f} [{low:.3f}, {high:.3f}]" for mean, low, high in (r["ci"][m] for m in METRICS)]
        lines.append(f"| {r['name']} | {seeds} | {r['queries']} | {r['candidates']} | " + " | ".join(shown) + " |")
    lines.append(
        "\nIntervals: bootstrap over the test queries (a baseline, or a cell of fewer than "
        f"{MIN_SEEDS_FOR_SEED_LEVEL} seeds); over seeds, then queries (the two-level bootstrap) for a cell of "
        f"{MIN_SEEDS_FOR_SEED_LEVEL}+ seeds; {n_boot:,} resamples."
    )
    if comparisons:
        lines += [
            "",
            f"| cell | seeds | Δ nDCG@10 vs zero-shot [95% CI] | p [MC range] | p (Holm, {len(comparisons)}) "
            f"[MC range] | verdict (α={ALPHA:g}) |",
            "|---|---|---|---|---|---|",
        ]
        for c in comparisons:
            lines.append(
                f"| {c['cell']} | {c['seeds']} | {c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] | "
                f"{p_text(c['p'], c['p_low'], c['p_high'])} | "
                f"{p_text(c['p_holm'], c['p_holm_low'], c['p_holm_high'])} | {c['verdict']} |"
            )
        lines.append(
            "\nΔ: the cell's nDCG@10 minus zero-shot's on the same queries; paired bootstrap over seeds, then "
            f"queries, for a cell of {MIN_SEEDS_FOR_SEED_LEVEL}+ seeds (zero-shot is one ranking, repeated for each "
            "seed), over queries only for fewer (no claim about training randomness), "
            f"{n_boot:,} resamples; [MC range]: ±{MC_Z:g} Monte Carlo standard errors of p; Holm over the cells. "
            "Verdict: better / worse when the whole adjusted range is below α, at the line when it straddles α."
        )
    return "\n".join(lines)
