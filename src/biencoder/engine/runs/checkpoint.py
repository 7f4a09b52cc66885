"""The two checkpoints of a run folder: ``best.pt`` (to use the model) and ``last.pt`` (to resume training).

``best.pt``: the best-by-val weights and everything needed to use them without the config tree or the encoder's
original folder -- so a run folder (or the file alone) moved to another machine still works.

Contents (``torch.load(..., weights_only=True)``-safe: tensors, numbers, strings, bytes):
``state_dict`` (encoder included), ``epoch``, ``model_cfg`` (the ``model`` config group, resolved),
``encoder_config`` (the HF config as a dict: the architecture is rebuilt from it, never downloaded),
``tokenizer_files`` ({file name: bytes} as ``save_pretrained`` writes them), and ``run``: ``retrieve``, ``k``
(the retrieve-then-rerank settings it was selected with), ``data``, ``dedup``, ``variant``, ``seed``.

``last.pt`` (:func:`training_state`, copied and written in the background by
:meth:`biencoder.engine.runs.folder.RunFolder.save_state`): the full training state after an epoch; resuming from it
(:func:`restore_last`, then :meth:`~biencoder.engine.runs.best.BestEpoch.valued_by`) continues bit for bit.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from ...errors import ConfigError
from ..machine import distributed
from ..machine.rng import set_rng_states
from ..modeling.model import BiModel, bimodel, build_model, is_encoder_weight, renamed_head_keys
from .best import BestEpoch
from .records import RunFolderError


def checkpoint_payload(model: BiModel, tokenizer, state_dict: dict, epoch: int, model_cfg: dict, run: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
    return {
        "state_dict": state_dict,
        "epoch": epoch,
        "model_cfg": model_cfg,
        "encoder_config": model.encoder.config.to_dict(),
        "tokenizer_files": files,
        "run": run,
    }


def load_checkpoint(
    path: str | Path, progress: bool = True, what: str = "eval.checkpoint"
) -> tuple[BiModel, object, dict, dict]:
    """(model in eval mode, tokenizer, model config, run settings) from a run folder or its ``best.pt``.

    Checkpoints from before ``encoder_config`` was saved are rebuilt from ``model_cfg``'s encoder path instead; those
    from before the head was a component (only the two flags in ``model_cfg``, the head's keys at the top level) load
    as the same head. Raises :class:`ConfigError` in one line for a file that is no checkpoint, one that does not fit
    the model it names, and a head whose own component cannot be imported here (naming what to install).
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    path = Path(path)
    file = path / "best.pt" if path.is_dir() else path
    if not path.exists():
        raise ConfigError(f"{what}='{path}' does not exist: pass a run folder of biencoder.train or its best.pt")
    if not file.is_file():
        raise ConfigError(f"{what}='{path}' has no best.pt: pass a run folder of biencoder.train or its best.pt")
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True)  # never unpickles arbitrary objects
        model_cfg, state_dict = ckpt["model_cfg"], ckpt["state_dict"]
    except Exception as err:  # noqa: BLE001 - truncated, not a checkpoint, or unsafe: the same advice
        raise ConfigError(
            f"{what}='{file}' is not a readable biencoder checkpoint ({type(err).__name__}): "
            "pass the best.pt of a finished run"
        ) from None
    try:
        if "encoder_config" in ckpt:
            config = dict(ckpt["encoder_config"])
            encoder = AutoModel.from_config(AutoConfig.for_model(config.pop("model_type"), **config))
            with tempfile.TemporaryDirectory() as tmp:
                for name, data in ckpt["tokenizer_files"].items():
                    (Path(tmp) / name).write_bytes(data)
                tokenizer = AutoTokenizer.from_pretrained(tmp)
            model = bimodel(encoder, model_cfg)
        else:
            model, tokenizer = build_model(model_cfg, progress)
    except ConfigError as err:  # the encoder it names, or a component of its head, is not to be had here
        raise ConfigError(f"{what}='{file}': {err}") from None
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as err:
        raise ConfigError(f"{what}='{file}' does not fit the model it names ({str(err).splitlines()[0]})") from None
    model.eval()
    run = {"retrieve": "sim", "k": 10, **ckpt.get("run", {})}
    return model, tokenizer, model_cfg, run


def _weights(state_dict: dict, frozen: bool) -> dict:
    """What ``last.pt`` holds of a state dict: all of it, or the heads only when the encoder is frozen (its weights
    are the pretrained ones, checked by fingerprint on resume)."""
    return {k: v for k, v in state_dict.items() if not (frozen and is_encoder_weight(k))}


def training_state(
    epoch: int, trainer, best: BestEpoch, train_sim: torch.Tensor, rngs: list[dict], fingerprint: str | None
) -> dict:
    """What ``last.pt`` holds after ``epoch``: the weights of ``trainer``'s model, its state (optimiser, LR schedule,
    mining and loader RNGs: ``trainer`` is the :class:`~biencoder.engine.training.epoch.EpochTrainer`), ``rngs``
    (every rank's global RNG states, index = rank, so each rank resumes its own dropout stream), ``train_sim`` (the
    embeddings the next epoch mines with), the best epoch so far (its weights and test hits; not its embeddings) and
    the frozen encoder's ``fingerprint`` (None: the encoder trains, and its weights are saved too)."""
    frozen = fingerprint is not None
    return {
        "epoch": epoch,
        "model": _weights(trainer.model.state_dict(), frozen),
        **trainer.state_dict(),
        "rng": rngs,
        "train_sim": train_sim,
        "best": {
            **best.saved(),
            "state": _weights(best.state, frozen) if best.state else None,
            "hits": None if best.hits is None else torch.from_numpy(best.hits),
        },
        "encoder_fingerprint": fingerprint,
    }


def restore_last(state: dict, path: Path, trainer, fingerprint: str | None) -> tuple[int, BestEpoch, torch.Tensor]:
    """Restore :func:`training_state`'s ``state`` (read from ``path``) into ``trainer`` (the
    :class:`~biencoder.engine.training.epoch.EpochTrainer`: its model, optimiser, LR schedule and RNGs) and this rank's
    RNGs; returns (next epoch, best so far, train embeddings to mine with). Raises :class:`RunFolderError` for another
    encoder or another number of processes, before anything is restored (``trainer`` and the RNGs as they were)."""
    if state["encoder_fingerprint"] != fingerprint:
        raise RunFolderError(f"{path} was trained on another encoder than model.encoder.name_or_path loads now")
    rngs = state["rng"]
    if len(rngs) != distributed.world_size():
        raise RunFolderError(
            f"{path} was saved by {len(rngs)} process(es), not "
            f"{distributed.world_size()}: resume with the same number of processes"
        )
    model = trainer.model
    model.load_state_dict(state["model"], strict=fingerprint is None)
    trainer.load_state_dict(state)
    set_rng_states(rngs[distributed.rank()])
    best = BestEpoch.from_saved(state["best"])
    weights = best.state
    if weights is not None:  # last.pt leaves out a frozen encoder's weights: the model's own, as the runner's
        weights = renamed_head_keys(weights)  # a last.pt from before the head was a component: today's keys
        frozen = {
            k: v.detach().to("cpu", copy=v.device.type != "cpu")
            for k, v in model.state_dict().items()
            if k not in weights
        }
        weights = {**frozen, **weights}
    hits = None if best.hits is None else best.hits.numpy()
    return state["epoch"] + 1, replace(best, state=weights, hits=hits), state["train_sim"]
