"""``best.pt``: the best-by-val weights and everything needed to use them without the config tree or the encoder's
original folder -- so a run folder (or the file alone) moved to another machine still works.

Contents (``torch.load(..., weights_only=True)``-safe: tensors, numbers, strings, bytes):
``state_dict`` (encoder included), ``epoch``, ``model_cfg`` (the ``model`` config group, resolved),
``encoder_config`` (the HF config as a dict: the architecture is rebuilt from it, never downloaded),
``tokenizer_files`` ({file name: bytes} as ``save_pretrained`` writes them), and ``run``: ``retrieve``, ``k``
(the retrieve-then-rerank settings it was selected with), ``data``, ``dedup``, ``variant``, ``seed``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from .errors import ConfigError
from .model import BiModel, bimodel


def checkpoint_payload(model: BiModel, tokenizer, state_dict: dict, epoch: int, model_cfg: dict, run: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
    return {"state_dict": state_dict, "epoch": epoch, "model_cfg": model_cfg,
            "encoder_config": model.encoder.config.to_dict(), "tokenizer_files": files, "run": run}


def load_checkpoint(path: str | Path, progress: bool = True,
                    what: str = "eval.checkpoint") -> tuple[BiModel, object, dict, dict]:
    """(model in eval mode, tokenizer, model config, run settings) from a run folder or its ``best.pt``.

    Checkpoints from before ``encoder_config`` was saved are rebuilt from ``model_cfg``'s encoder path instead.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from .model import build_model

    path = Path(path)
    file = path / "best.pt" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{what}='{path}' has no best.pt: pass a run folder of biencoder.train or its best.pt")
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True)  # never unpickles arbitrary objects
        model_cfg, state_dict = ckpt["model_cfg"], ckpt["state_dict"]
    except Exception as err:  # noqa: BLE001 - truncated, not a checkpoint, or unsafe: the same advice
        raise ConfigError(f"{what}='{file}' is not a readable biencoder checkpoint ({type(err).__name__}): "
                          "pass the best.pt of a finished run") from None
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
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as err:
        raise ConfigError(f"{what}='{file}' does not fit the model it names "
                          f"({str(err).splitlines()[0]})") from None
    model.eval()
    run = {"retrieve": "sim", "k": 10, **ckpt.get("run", {})}
    return model, tokenizer, model_cfg, run
