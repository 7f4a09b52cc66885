"""The one-screen summary of one finished run, printed at its end (``final.json`` → text), and the 8 tasks' table.

Used by the ``train`` and ``evaluate`` apps; the comparison of many runs is :mod:`biencoder.summary`.
"""

from __future__ import annotations

from pathlib import Path

from ..engine.config.selection import SELECTION_BEFORE_RECORD, selection_label, untrained_classifier_note
from ..engine.data.judged import JUDGED_POOL_TEXT
from ..engine.data.paired import POOL_TEXT
from ..engine.retrieval.official_tasks import TASKS
from .statistics import wilson

#: the per-epoch metrics of the summary's table: (final.json key, column header, width)
COLUMNS = (("top1", "top1", 6), ("retrieval_top1", "retr@1", 7), ("recall_at_k", "R@k", 6), ("mrr", "MRR", 6))


def summary_text(final: dict, out_dir: Path) -> str:
    """The one-screen summary printed at the end of a run: metrics with a 95 % interval and the baselines on the
    same queries, what each metric means, the unseen/seen split, the 8 tasks. The metric that selected the best
    epoch (``final["selection"]``; a record without it selected by the reranked top1) is named in the first line and
    comes first, with the interval; a run whose classifier was not trained says so in one line."""
    chosen = final.get("selection", SELECTION_BEFORE_RECORD)
    # the selection metric first, with its interval: the run's result
    columns = sorted(COLUMNS, key=lambda c: c[0] != chosen["metric"])
    lines = [header_line(final)]
    if chosen["metric"] == "retrieval_top1":  # the rule of selection() for an untrained classifier
        lines.append(untrained_classifier_note(final.get("tasks", {}).get("score", "")))
    lines += _metric_table(final, columns)
    lines.append(_legend(final))
    lines += _unseen_lines(final)
    lines += _group_lines(final)
    if "tasks" in final:
        lines.append(f"8 tasks, score={final['tasks']['score']}, best-by-val weights:")
        lines.append(format_tasks({n: final["tasks"][n] for n in ("val", "test")}))
    elif "tasks_skipped" in final:
        lines.append(final["tasks_skipped"])
    lines.append(f"run folder: {out_dir}")
    return "\n".join(lines)


def header_line(final: dict) -> str:
    """The summary's first line: the cell, seed, model and data, the best epoch and the metric that chose it, and
    the run's wall time (``final.json`` keys ``variant``, ``seed``, ``model``, ``data``, ``best_epoch``, ``epochs``,
    ``selection``, ``wall_time_s``)."""
    chosen = final.get("selection", SELECTION_BEFORE_RECORD)
    return (
        f"== {final['variant']} seed {final['seed']} | {final['model']} on {final['data']} | "
        f"best epoch {final['best_epoch']} of 0-{final['epochs'] - 1}, by {selection_label(chosen)} | "
        f"{final['wall_time_s']:.0f} s"
    )


def _shown(value: float | None) -> str:
    """A metric with 3 decimals, or a dash where it has no value."""
    return "–" if value is None else f"{value:.3f}"


def _metric_table(final: dict, columns: list[tuple[str, str, int]]) -> list[str]:
    """The header and one row per split of the best epoch's metrics (``columns``, the selection metric first with
    its Wilson interval), with the zero-shot and TF-IDF top-1 where the run has baselines."""
    baselines = final.get("baselines", {})
    lines = [
        f"{'split':<6} {'queries':>7} {columns[0][1]:>6} {'95% CI':>15} "
        + " ".join(f"{head:>{width}}" for _, head, width in columns[1:])
        + ("  | zero-shot   TF-IDF" if baselines else "")
    ]
    for name, m in final["best"].items():
        first = columns[0][0]
        low, high = wilson(round(m[first] * m["queries"]), m["queries"])
        row = f"{name:<6} {m['queries']:>7} {m[first]:>6.3f} {f'[{low:.3f}, {high:.3f}]':>15} " + " ".join(
            f"{m[key]:>{width}.3f}" for key, _, width in columns[1:]
        )
        if name in baselines:
            b = baselines[name]
            row += f"  | {b['encoder_cosine']['top1']:>9.3f} {b['tfidf']['top1']:>8.3f}"
        lines.append(row)
    return lines


def _legend(final: dict) -> str:
    """What each metric of the table means, its pool, and which rows are on a sample of their split."""
    k = next(iter(final["best"].values()))["k"]
    true = "true positive" if "data_files" in final else "true counter"
    return (
        f"top1: the {true} ranks first after the classifier reranks the k={k} nearest (pool: "
        f"{_pool(final)}); retr@1: the nearest is the {true}; R@k: it is "
        "among the k; MRR: mean 1/rank after reranking (0 outside the k); 95% CI: Wilson interval over "
        "this run's queries (nothing about other seeds)"
        + (
            "; zero-shot / TF-IDF: the untrained encoder's cosine and TF-IDF top-1 on the same queries and pools"
            if final.get("baselines", {})
            else ""
        )
        + _sample_note(final)
    )


def _unseen_lines(final: dict) -> list[str]:
    """The test top-1 on queries unseen and seen in train/val, and what data.dedup dropped, when the run has it."""
    test, overlap = final["best"]["test"], final.get("overlap", {})
    if "queries_unseen" not in test:
        return []
    return [
        f"test top1 on queries unseen in train/val: {_shown(test['top1_unseen'])} "
        f"(n={test['queries_unseen']}); seen: {_shown(test['top1_seen'])} (n={test['queries_seen']}); "
        + (
            "data.dedup dropped "
            + ", ".join(f"{k} {v}" for k, v in overlap.get("dropped_pairs", {}).items())
            + " pairs"
            if overlap.get("dedup")
            else "official splits (data.dedup=false)"
        )
    ]


def _sample_note(final: dict) -> str:
    """The end of the metrics' legend: which rows are on a fixed sample of their split's queries, and of how many."""
    pairs = final.get("pairs", {})
    sampled = [
        (name, m["queries"], pairs[name]) for name, m in final["best"].items() if m["queries"] < pairs.get(name, 0)
    ]
    if not sampled:
        return "."
    listed = ", ".join(f"{name} {n} of {of} (eval.{name}_queries)" for name, n, of in sampled)
    test = any(name == "test" for name, _, _ in sampled)
    return (
        f". Rows on a fixed sample of their split's queries, the same for every seed and cell: {listed}"
        + ("; the test baselines and the unseen/seen split are on the same sample" if test else "")
        + "."
    )


def _pool(final: dict) -> str:
    """What the per-epoch top-1's pool holds, as the summary names it (``data.pool``; pair files say so)."""
    pool = final.get("pool", "all")
    if "data_files" not in final and pool == "all":
        return "every argument of the split, as in the epa task"
    if "corpus" in final.get("data_files", {}):  # a BEIR folder: the candidates are its documents
        return f"{JUDGED_POOL_TEXT[pool]}, data.pool={pool}"
    return f"{POOL_TEXT[pool]}, data.pool={pool}"


def _group_lines(final: dict) -> list[str]:
    """The within-group top-1 (pair files with a group column) at the best epoch, when the run has it."""
    best = final["best"]
    if "top1_group" not in best.get("test", {}):
        return []
    test = best["test"]
    return [
        "within-group top1 (the pool cut to the query's group; false candidates per query "
        + " / ".join(f"{n} {best[n]['candidates_group']:.1f}" for n in best)
        + "): "
        + ", ".join(f"{n} {best[n]['top1_group']:.3f}" for n in best)
        + f"; test unseen {_shown(test.get('top1_group_unseen'))}, seen {_shown(test.get('top1_group_seen'))}"
    ]


def format_tasks(results: dict[str, dict[str, dict]]) -> str:
    """Markdown table: one row per task, ``acc@1 / MRR`` per evaluated split (``{split: evaluate_tasks(...)}``)."""
    names = list(results)
    # query groups (unseen/seen test queries) get an acc@1 column each, with their query count
    groups = {n: next(iter(results[n].values())).get("groups", {}) for n in names}
    head = [
        f"{n} acc@1 | {n} MRR" + "".join(f" | {n} {g} acc@1 (n={groups[n][g]['queries']})" for g in groups[n])
        for n in names
    ]
    width = 2 + sum(2 + len(groups[n]) for n in names)
    # each split has its own pools: the candidates per query, split by split
    cands = "avg false cands" + (f" ({' / '.join(names)})" if len(names) > 1 else "")
    lines = [f"| task | {cands} | " + " | ".join(head) + " |", "|" + "---|" * width]
    for task in TASKS:
        sizes = " / ".join(
            f"{results[n][task]['candidates'] / max(results[n][task]['queries'], 1):.1f}" for n in names
        )
        cells = " | ".join(
            f"{_shown(results[n][task]['accuracy_at_1'])} | {_shown(results[n][task]['mrr'])}"
            + "".join(f" | {_shown(results[n][task]['groups'][g]['accuracy_at_1'])}" for g in groups[n])
            for n in names
        )
        lines.append(f"| {task} | {sizes} | {cells} |")
    return "\n".join(lines)
