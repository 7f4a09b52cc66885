"""Runs and cells: find run folders, read what each holds, and group runs into cells.

A run folder holds ``metrics.jsonl`` beside its config (``config_resolved.yaml`` or Hydra's ``.hydra/config.yaml``),
and once finished ``final.json``, ``test_hits.npy`` and ``test_seen.npy``. Every best epoch here is the one the run
picked, by the metric its record names (:attr:`Run.selection`), never by the metric a table shows. A cell is named by
its variant and, where the variant's name is not its head's, its head (:attr:`Run.name`). Runs whose variant, head
or settings differ in anything but the seed and the settings that change no result
(:data:`biencoder.engine.config.settings.NON_RESULT_KEYS`) never share a cell: runs on pair files whose contents
differ (``data_files.<split>.sha256`` in their config) are never averaged together, whatever the files' paths.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ..engine.config.heads import head_name, head_spec
from ..engine.config.selection import SELECTION_BEFORE_RECORD, selection
from ..engine.config.settings import HEAD, is_non_result_key, run_settings
from ..engine.runs.records import RunFolderError, read_final, read_metrics
from . import SummaryError

log = logging.getLogger("biencoder")

SPLITS = ("train", "val", "test")
METRICS = ("top1", "retrieval_top1", "mrr", "recall_at_k")
#: groups of test queries: all, those whose texts occur in no training or validation pair the run used (unseen, from
#: ``test_seen.npy``), and the rest (seen)
QUERY_GROUPS = ("all", "unseen", "seen")
#: config keys that never separate cells beyond the settings that change no result (NON_RESULT_KEYS, shared with
#: the resume check): the seed is aggregated over, and the head is in the cell's name (:attr:`Run.name`)
GROUPED_OVER = ("seed", HEAD)


@dataclass
class Run:
    """One run folder as read by :func:`find_runs`: its config (nested, and ``flat`` with schema defaults), its
    ``metrics.jsonl`` rows, ``final.json`` (None while unfinished), per-query test hits [Q] and seen mask [Q]."""

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
    def head(self) -> str:
        """The name of the run's head (:func:`~biencoder.engine.config.heads.head_name`: ``ln_relu``,
        ``h256_rmsnorm_gelu``, ...), from its settings; a run from before the head keys, by its two flags."""
        return head_name(head_spec({k[len(HEAD) :]: v for k, v in self.flat.items() if k.startswith(HEAD)}))

    @property
    def name(self) -> str:
        """What a cell of this run is called before the settings that separate it: the variant, followed by
        ``head=<its head>`` unless the variant is named after its head (the card's cells, a run without
        ``+variant=``), so every cell's name says its head and runs of one variant with other heads stay apart."""
        head = self.head
        return self.variant if head == self.variant else f"{self.variant} head={head}"

    @property
    def complete(self) -> bool:
        return self.final is not None and self.final.get("status") == "done"

    @property
    def selection(self) -> dict:
        """What picked the run's best epoch (``{"split": "val", "metric": ...}``, the rule of
        :mod:`biencoder.engine.config.selection`): its ``final.json``'s ``selection``; for a finished run whose
        final.json predates that field, the reranked top1 (``SELECTION_BEFORE_RECORD``); for a run without the field
        and unfinished (running, killed, or an older failed one), its config's rule."""
        if self.final is not None and "selection" in self.final:
            return self.final["selection"]
        if self.complete:
            return SELECTION_BEFORE_RECORD
        return selection(
            float(self.flat.get("loss.ce_weight", 1.0)), self.flat.get("eval.select"), self.flat.get("data.layout")
        )

    @property
    def status(self) -> str:
        """``done``, ``failed``, ``diverged`` (from final.json) or ``unfinished`` (running, or killed)."""
        return "unfinished" if self.final is None else str(self.final.get("status", "unfinished"))


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Every run folder (``metrics.jsonl`` beside its config) under ``paths``, recursively.

    The config is the runner's ``config_resolved.yaml`` or, failing that, Hydra's ``.hydra/config.yaml``. A folder
    whose files cannot be read (:func:`read_run`: a corrupt line, config or ``test_hits.npy``) is left out with one
    warning line naming it and why, and the others are compared. Raises :class:`SummaryError` when no run folder
    is left (naming the first one left out, if any).
    """
    runs, skipped = [], []
    for root in map(Path, paths):
        if not root.exists():
            raise SummaryError(f"'{root}' does not exist: pass the logs folder (e.g. logs/) or run folders")
        candidates = (
            [root / "metrics.jsonl"] if (root / "metrics.jsonl").is_file() else sorted(root.rglob("metrics.jsonl"))
        )
        for metrics_file in candidates:
            try:
                run = read_run(metrics_file.parent)
            except RunFolderError as err:
                log.warning("%s: skipped, %s", metrics_file.parent, err)
                skipped.append(str(err))
                continue
            if run is not None:
                runs.append(run)
    if not runs:
        raise SummaryError(
            f"no run folders (metrics.jsonl + config) under {', '.join(map(str, paths))}"
            + (f" that can be read ({len(skipped)} skipped; the first: {skipped[0]})" if skipped else "")
            + ": train some with python -m biencoder.train"
        )
    return one_run_per_seed(runs)


def read_run(folder: Path) -> Run | None:
    """The run in ``folder``, or None when it is not one yet (no config, or no whole line in ``metrics.jsonl``: a
    run killed before its first epoch). Raises :class:`~biencoder.engine.runs.records.RunFolderError` naming the
    file for a corrupt one: a bad line before the last of ``metrics.jsonl`` (a torn last line is skipped with a
    warning), rows without ``variant`` and ``seed``, a config that is not a YAML mapping, or a ``test_hits.npy`` /
    ``test_seen.npy`` that cannot be loaded, or whose length differs from the test query count ``metrics.jsonl``
    records."""
    config_file = next(
        (f for f in (folder / "config_resolved.yaml", folder / ".hydra" / "config.yaml") if f.is_file()), None
    )
    if config_file is None:
        return None
    lines, _ = read_metrics(folder / "metrics.jsonl")
    if not lines:
        return None
    if not all(key in lines[0] for key in ("variant", "seed")):
        raise RunFolderError(f"{folder / 'metrics.jsonl'} line 1 names no variant and seed: not a biencoder run")
    try:
        config = yaml.safe_load(config_file.read_text())
    except yaml.YAMLError as err:
        raise RunFolderError(f"{config_file} is not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise RunFolderError(f"{config_file} is not a mapping of config keys")
    metrics = pd.DataFrame(lines)
    hits, seen = _array(folder / "test_hits.npy", metrics), _array(folder / "test_seen.npy", metrics)
    return Run(
        path=folder,
        config=config,
        metrics=metrics,
        final=read_final(folder),
        hits=hits,
        seen=seen,
        variant=str(metrics["variant"].iloc[0]),
        seed=int(metrics["seed"].iloc[0]),
        flat={key: _hashable(value) for key, value in run_settings(config).items()},
    )


def _hashable(value):
    """A setting as cells compare and key it: a list (``negatives.rank_range=[10,50]``) as a tuple."""
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def _array(file: Path, metrics: pd.DataFrame) -> np.ndarray | None:
    """The per-test-query array in ``file`` ([Q]), None when absent. Raises :class:`RunFolderError` when it cannot
    be loaded or when ``metrics`` record another test query count (a file from another run, or a partial copy)."""
    if not file.is_file():
        return None
    try:
        values = np.load(file)
    except (ValueError, OSError, EOFError) as err:
        reason = str(err).split(". ")[0]  # numpy's first sentence says what is wrong; the rest is advice on pickles
        raise RunFolderError(f"{file} cannot be read ({reason}): copy it again or delete the run folder") from None
    recorded = "queries" in metrics and "split" in metrics
    counts = set(metrics.loc[metrics["split"] == "test", "queries"].dropna()) if recorded else set()
    if values.ndim != 1 or (counts and len(values) not in counts):
        raise RunFolderError(
            f"{file} holds {values.shape} values where metrics.jsonl has {sorted(map(int, counts))} test queries"
        )
    return values


def one_run_per_seed(runs: list[Run]) -> list[Run]:
    """``runs`` with one finished run per setting and seed: a run repeated with the same variant, settings and seed
    (differing at most in :data:`~biencoder.engine.config.settings.NON_RESULT_KEYS`, e.g. its log folder) is one draw,
    not two seeds. The first finished one by path is kept, so the choice is the same on every copy of the folders; the
    other runs of that seed, finished or not, are left out and logged. A seed with no finished run keeps all its
    runs (each outcome, failed or diverged, counts as before)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        identity = repr((run.name, sorted((k, repr(v)) for k, v in run.flat.items() if not is_non_result_key(k))))
        groups.setdefault(identity, []).append(run)
    left_out = set()
    for group in groups.values():
        done = sorted((r for r in group if r.complete), key=lambda r: str(r.path))
        for other in group:
            if done and other is not done[0]:
                left_out.add(id(other))
                log.warning(
                    "%s: left out, a repeat of variant %s seed %d with the same settings as %s",
                    other.path,
                    other.variant,
                    other.seed,
                    done[0].path,
                )
    return [r for r in runs if id(r) not in left_out]


def assign_cells(runs: list[Run], also: tuple[str, ...] = ()) -> list[str]:
    """Label each run by its name (:attr:`Run.name`: the variant, and the head unless the variant says it) plus every
    config key that differs between runs (seed and head excepted, and the keys in ``also``, e.g. the key a stability
    plot puts on its x-axis).

    Runs whose corpus, model or any other setting differs therefore never share a cell. Returns the keys used.
    """
    keys = sorted({k for r in runs for k in r.flat})
    varying = [
        k
        for k in keys
        if not k.startswith(GROUPED_OVER + tuple(also))
        and not is_non_result_key(k)
        and len({repr(r.flat.get(k)) for r in runs}) > 1
    ]
    # labels stay short: a config group whose name differs (model=tiny) stands for the keys under it
    named = {k[: -len(".name")] for k in varying if k.endswith(".name")}
    shown = [k for k in varying if not any(k.startswith(g + ".") and k != g + ".name" for g in named)]
    for run in runs:
        run.cell = " ".join([run.name] + [f"{label_key(k, shown)}={label_value(run.flat.get(k), k)}" for k in shown])
        run.settings = {k: run.flat.get(k) for k in varying}
    return varying


def label_key(key: str, keys: list[str]) -> str:
    """``key`` as a cell label or table names it among ``keys``: its last part when no other key ends the same,
    a config group for its ``.name``, the split and hash of a pair file's ``data_files`` key."""
    if key.startswith("data_files."):
        return key[len("data_files.") :]  # train.sha256: which file's contents differ
    if key.endswith(".name"):
        return key[: -len(".name")]
    return key.split(".")[-1] if _unique_leaf(key, keys) else key


def label_value(value, key: str = "") -> str:
    """A config value of ``key`` as a label shows it: floats with ``:g``, a file hash cut to 12 digits."""
    if key.endswith(".sha256") and isinstance(value, str):
        return value[:12]  # a data file's hash: 12 hex digits tell versions apart in a label
    return f"{value:g}" if isinstance(value, float) else str(value)


def _unique_leaf(key: str, keys: list[str]) -> bool:
    leaf = key.split(".")[-1]
    return sum(k.split(".")[-1] == leaf for k in keys) == 1


def best_rows(run: Run, metric: str | None = None) -> tuple[int, dict, dict] | None:
    """(best epoch, its val row, its test row), or None if the run has no val rows. The best epoch is the first with
    the highest val ``metric``, by default the run's own selection metric (:attr:`Run.selection`), as the runner picked
    it: the rows then hold every metric at the epoch whose weights, test hits and tasks the run kept."""
    metric = metric or run.selection["metric"]
    m = run.metrics
    val = m[m["split"] == "val"]
    if val.empty or metric not in val or val[metric].isna().all():
        return None
    best = val.loc[val[metric].idxmax()]  # first epoch with the maximum, as the runner picks it
    epoch = int(best["epoch"])
    test = m[(m["split"] == "test") & (m["epoch"] == epoch)]
    return epoch, best.to_dict(), test.iloc[0].to_dict() if len(test) else {}


def queries_label(runs: list[Run], split: str) -> str:
    """`` (N queries)`` when every run evaluated ``split`` on the same number of queries (a train sample shows)."""
    counts = (
        {int(q) for r in runs for q in r.metrics.loc[r.metrics["split"] == split, "queries"].dropna().unique()}
        if all("queries" in r.metrics for r in runs)
        else set()
    )
    return f" ({counts.pop()} queries)" if len(counts) == 1 else ""


def recorded_baseline(runs: list[Run], split: str, score: str = "encoder_cosine") -> float | None:
    """The zero-shot (or TF-IDF) top-1 on ``split`` that the runs' final.json record, when they all agree."""
    values = {
        round(r.final["baselines"][split][score]["top1"], 6)
        for r in runs
        if r.complete and split in r.final.get("baselines", {})
    }
    return values.pop() if len(values) == 1 else None
