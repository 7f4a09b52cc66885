"""The ``python -m biencoder.evaluate`` app: the 8 official tasks on one split (or the MTEB protocol on its points,
``eval.protocol=mteb``), for a checkpoint or a baseline.

The Hydra shell over :func:`biencoder.engine.inference.evaluation.run_evaluation` (what is evaluated, and how, is
said there): it names the output folder, logs the task table and where the record went, and turns bad input into one
line and exit code 2.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .engine.inference.evaluation import evaluation_output, run_evaluation
from .errors import BiencoderError
from .hydra_glue import conf_dir, fail, hydra_cli, register
from .report.run_summary import format_tasks

log = logging.getLogger("biencoder")

register()


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = run_evaluation(cfg, out_dir)
        if "mteb" in result:
            got = result["mteb"]
            what = f"MTEB protocol on {result['split']}"
            table = (
                f"{got['queries']} queries, {got['candidates']} candidates: nDCG@10 {got['ndcg_at_10']:.4f}, "
                f"MRR@10 {got['mrr_at_10']:.4f}, R@100 {got['recall_at_100']:.4f}, "
                f"accuracy@1 {got['accuracy_at_1']:.4f}"
            )
        else:
            what, table = f"8 tasks on {result['split']}", format_tasks({result["split"]: result["tasks"]})
        log.info(
            "%s, score=%s (%.1f s, peak RSS %.0f MB)\n%s\nwritten to %s",
            what,
            result["score"],
            result["wall_time_s"],
            result["peak_rss_mb"],
            table,
            evaluation_output(cfg, out_dir),
        )
    except BiencoderError as err:
        fail(err, out_dir)


def cli() -> None:
    """The ``biencoder-evaluate`` command (Hydra tab completion: ``eval "$(biencoder-evaluate -sc install=bash)"``)."""
    hydra_cli(main)


if __name__ == "__main__":
    cli()
