"""Experiment trackers beside ``metrics.jsonl`` (which stays the source of truth): the ``logger`` config group.

``logger=tensorboard``: one event folder per run, ``<run folder>/tensorboard``; tags ``<metric>/<split>`` so
TensorBoard shows train, val and test of one metric in one chart group. ``logger=mlflow``: a local store under the
log dir (``<paths.log_dir>/mlflow.db``, artifacts in ``<paths.log_dir>/mlartifacts``) unless
``logger.mlflow.tracking_uri`` names a server; one experiment per sweep (its folder name; ``runs`` for single
runs); each run tagged with variant, seed and folder. ``logger=many``: both. Packages: ``pip install -e
".[tracking]"``; they are imported only when selected.

Resume continues the same MLflow run (its id is kept in ``<run folder>/tracking.json``) and the same TensorBoard
folder. The epochs a resumed run re-trains (after the last checkpoint) are not logged twice: TensorBoard purges its
events from that step on, and MLflow skips the epochs it already holds (a resumed run re-computes them bit for bit).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import math
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ...errors import ConfigError
from ..config.settings import flatten
from ..files import read_json, strict_json, write_text_atomic

#: logger → (module it needs, pip extra)
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow"}
ROW_KEYS = ("epoch", "split", "variant", "seed")
#: a run's tracker state beside its metrics: the MLflow run (and store) a resumed run continues
STATE_FILE = "tracking.json"


def saved_state(folder: Path) -> dict:
    """The tracker state of a run folder (``tracking.json``: ``mlflow_run_id``, ``mlflow_tracking_uri``), or {}."""
    path = Path(folder) / STATE_FILE
    return read_json(path.read_text()) if path.is_file() else {}


def selected(cfg: DictConfig) -> list[str]:
    return [name for name in PACKAGES if OmegaConf.select(cfg, f"logger.{name}") is not None]


def check_packages(cfg: DictConfig) -> None:
    """A selected logger whose package is missing: one line naming the extra (before any folder is touched)."""
    for name in selected(cfg):
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(
                f"logger={name} needs the {PACKAGES[name]} package: pip install -e '.[tracking]' "
                "(or choose logger=none)"
            )


def _numbers(row: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if k not in ROW_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class TensorBoardLogger:
    def __init__(self, folder: Path, first_epoch: int):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run hides what the killed attempt logged from the re-trained epochs on
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=first_epoch or None)

    def log_rows(self, rows: list[dict]) -> None:
        for row in rows:
            for key, value in _numbers(row).items():
                self.writer.add_scalar(f"{key}/{row['split']}", value, global_step=int(row["epoch"]))
        self.writer.flush()

    def finish(self, final: dict, status: str) -> None:
        self.writer.close()


class MlflowLogger:
    """One run in MLflow. ``where``: ``tracking_uri`` (None: a local store under ``log_dir``), ``experiment`` (the
    name) and ``log_dir`` (:meth:`Tracker.__init__` reads them from the config)."""

    def __init__(self, where: dict, folder: Path, params: dict, tags: dict, state: dict):
        from mlflow.tracking import MlflowClient

        self.folder = folder
        log_dir, name = where["log_dir"], where["experiment"]
        local = where["tracking_uri"] is None
        uri = f"sqlite:///{log_dir / 'mlflow.db'}" if local else str(where["tracking_uri"])
        if local:
            log_dir.mkdir(parents=True, exist_ok=True)
        # jobs of a parallel sweep start together: one at a time creates the store and the experiment
        with _lock(log_dir / "mlflow.lock") if local else contextlib.nullcontext():
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(name)
            if found is None:
                location = (log_dir / "mlartifacts" / name).as_uri() if local else None
                experiment_id = self.client.create_experiment(name, artifact_location=location)
            else:
                experiment_id = found.experiment_id
        self.run_id = state.get("mlflow_run_id")
        self.logged_until = -1
        if self.run_id is not None:  # resume: the same run, continued
            self.client.update_run(self.run_id, status="RUNNING")
            history = self.client.get_metric_history(self.run_id, "loss/train")
            self.logged_until = max((m.step for m in history), default=-1)
        else:
            run = self.client.create_run(experiment_id, run_name=folder.name, tags=tags)
            self.run_id = run.info.run_id
            state["mlflow_run_id"] = self.run_id
            state["mlflow_tracking_uri"] = uri
            self._params(params)

    def _params(self, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def _metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in values.items()]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def log_rows(self, rows: list[dict]) -> None:
        for row in rows:
            if int(row["epoch"]) > self.logged_until:
                self._metrics({f"{k}/{row['split']}": v for k, v in _numbers(row).items()}, int(row["epoch"]))

    def finish(self, final: dict, status: str) -> None:
        values = {}
        for split, metrics in (final.get("best") or {}).items():
            values.update({f"best/{k}/{split}": v for k, v in _numbers(metrics).items()})
        for split, tasks in (final.get("tasks") or {}).items():
            if isinstance(tasks, dict):
                for task, m in tasks.items():
                    values.update(
                        {
                            f"tasks/{task}_{k}/{split}": m[k]
                            for k in ("accuracy_at_1", "mrr")
                            if isinstance(m.get(k), float)
                        }
                    )
        if "best_epoch" in final:
            values["best_epoch"] = float(final["best_epoch"])
        if values:
            self._metrics(values, int(final.get("best_epoch", 0)))
        self.client.set_tag(self.run_id, "status", status)
        if (self.folder / "final.json").is_file():
            self.client.log_artifact(self.run_id, str(self.folder / "final.json"))
        self.client.set_terminated(self.run_id, "FINISHED" if status == "done" else "FAILED")


@contextlib.contextmanager
def _lock(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Tracker:
    """The selected loggers of one run, fed by the runner; does nothing with ``logger=none``. What they need of the
    config is read here, once (the runner opens them when training starts)."""

    def __init__(self, cfg: DictConfig, folder: Path, experiment: str, variant: str):
        self.folder, self.loggers = Path(folder), []
        self.state_file = self.folder / STATE_FILE
        self.names = selected(cfg)
        self.tensorboard_dir = self.folder / cfg.logger.tensorboard.dir if "tensorboard" in self.names else None
        self.mlflow: tuple[dict, dict, dict] | None = None  # (where, params, tags) of MlflowLogger
        if "mlflow" in self.names:
            node = cfg.logger.mlflow
            where = {
                "tracking_uri": node.tracking_uri,
                "experiment": node.experiment or experiment,
                "log_dir": Path(cfg.paths.log_dir).expanduser().resolve(),
            }
            params = {**flatten(OmegaConf.to_container(cfg, resolve=True)), "variant": variant}
            tags = {
                "variant": variant,
                "seed": str(cfg.seed),
                "run_folder": str(self.folder),
                "data": str(cfg.data.name),
            }
            self.mlflow = (where, params, tags)

    def open(self, first_epoch: int) -> None:
        """Start (or, after a kill, continue) the run in every selected logger."""
        if not self.names:
            return
        state = saved_state(self.folder)
        if self.tensorboard_dir is not None:
            self.loggers.append(TensorBoardLogger(self.tensorboard_dir, first_epoch))
        if self.mlflow is not None:
            where, params, tags = self.mlflow
            self.loggers.append(MlflowLogger(where, self.folder, params, tags, state))
        write_text_atomic(self.state_file, strict_json(state, indent=2) + "\n")  # a torn file would block resume

    def log_rows(self, rows: list[dict]) -> None:
        for logger in self.loggers:
            logger.log_rows(rows)

    def finish(self, final: dict, status: str = "done") -> None:
        """Close every logger; ``status`` other than ``done`` (failed, diverged) marks the MLflow run FAILED."""
        for logger in self.loggers:
            logger.finish(final, status)
        self.loggers = []
