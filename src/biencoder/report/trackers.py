"""A comparison's figure and tables, attached to the experiment trackers its runs were logged to.

Runs trained with ``logger=mlflow`` name their MLflow run and store in ``tracking.json``
(:func:`biencoder.engine.runs.tracking.saved_state`); the summary becomes a run named ``summary`` in each of their
experiments.
Runs without a tracker: nothing happens. MLflow is imported only when a run used it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..engine.runs.tracking import saved_state
from .runs import Run


def log_summary(run_folders: list[Path], files: list[Path]) -> list[str]:
    """Attach a sweep summary's figure and tables to the MLflow experiment(s) its runs were tracked in, as a run
    named ``summary``. Returns the experiment names (none when no run used logger=mlflow)."""
    states = [s for s in map(saved_state, run_folders) if "mlflow_run_id" in s]
    if not states:
        return []
    from mlflow.tracking import MlflowClient

    names = []
    for uri in sorted({s["mlflow_tracking_uri"] for s in states}):
        client = MlflowClient(tracking_uri=uri)
        ids = {
            client.get_run(s["mlflow_run_id"]).info.experiment_id for s in states if s["mlflow_tracking_uri"] == uri
        }
        for experiment_id in sorted(ids):
            summary = client.create_run(experiment_id, run_name="summary", tags={"summary": "true"})
            for file in files:
                client.log_artifact(summary.info.run_id, str(file))
            client.set_terminated(summary.info.run_id, "FINISHED")
            names.append(client.get_experiment(experiment_id).name)
    return names


def attach(runs: list[Run], files: list[Path]) -> None:
    """Runs tracked with logger=mlflow: the figure and tables go to their experiment too (a run named summary);
    says so on stdout, or on stderr that MLflow is missing here."""
    try:
        names = log_summary([r.path for r in runs], files)
    except ImportError:
        print(
            "note: these runs were tracked with MLflow, which is not installed here: the figure stays local "
            "(pip install -e '.[tracking]')",
            file=sys.stderr,
        )
        return
    if names:
        print(f"mlflow: figure and tables attached to experiment(s) {', '.join(names)} (run 'summary')")
