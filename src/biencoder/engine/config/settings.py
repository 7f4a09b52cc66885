"""A run's settings as flat dotted keys, and which of them change its results: :data:`NON_RESULT_KEYS` (what a resumed
run may change and a comparison groups across), :func:`run_settings` (a saved config's settings, keys added since at
their schema defaults, the head resolved), :func:`flatten`, and what ``trainer.resume`` asks for
(:func:`resume_requested`, :func:`resume_folder`). Hydra-free and torch-free, like :mod:`.schema`.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from ...errors import ConfigError
from .heads import head_spec
from .schema import LOSS_OPTIONS, Schema

#: Config keys (or prefixes ending in ".") that never change what a run computes: where files go, how much is printed,
#: how work is batched or scheduled, which device runs it. A resumed run may change them, and runs that differ only in
#: them belong to the same cell of a comparison. The one definition, used by the resume check
#: (:mod:`biencoder.engine.runs.folder`) and by the grouping of runs (:mod:`biencoder.summary`). The precision actually
#: used is not one of them: ``config_resolved.yaml`` records it as ``trainer.precision`` (``auto`` resolved), so fp32
#: and bf16 runs never share a cell. ``runtime.`` is the record of the process that ran (device name, processes).
#: ``negatives.index`` and ``eval.index`` say how the neighbours are searched, not which ones are found (exact and
#: BallTree return the same, ``tests/engine/retrieval/test_search.py``), so runs made when BallTree was the default
#: stay in their cells and resume under today's default; ``negatives.log`` only writes what was mined.
#: ``trainer.stats_every`` says which steps the logged ``head_*``
#: and ``grad_norm_*`` statistics sample, not what the model computes: runs from before it share cells with today's.
#: ``trainer.head_stats_every`` is its retired name (2026-11-24): runs that recorded it resume and share cells too. The
#: pair files' paths (``data.train`` ...) are where the data lies, like ``data.root``; what they hold is the
#: ``data_files.<split>.sha256`` the run folder records (:func:`biencoder.engine.data.pair_records.data_files`), a
#: result key (runs on different contents never share a cell); ``data_files.<split>.path`` and ``.bytes`` follow from
#: them.
NON_RESULT_KEYS = (
    "paths.",
    "logger.",
    "data.root",
    "data.train",
    "data.val",
    "data.test",
    "data.file",
    "trainer.resume",
    "trainer.progress",
    "trainer.num_workers",
    "trainer.cache_dir",
    "trainer.keep_last",
    "trainer.save_checkpoint",
    "trainer.checkpoint_every",
    "trainer.device",
    "trainer.eval_batch_size",
    "eval.pair_batch_size",
    "eval.checkpoint",
    "eval.output",
    "eval.split",
    "negatives.index",
    "negatives.log",
    "eval.index",
    "trainer.stats_every",
    "trainer.head_stats_every",
    "runtime.",
    *(
        f"data_files.{role}.{key}"
        for role in ("train", "val", "test", "file", "corpus", "queries")
        for key in ("path", "bytes")
    ),
)


def is_non_result_key(key: str) -> bool:
    """True for a dotted key covered by :data:`NON_RESULT_KEYS`."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in NON_RESULT_KEYS)


def resume_folder(resume: Any) -> str | None:
    """The run folder named by ``trainer.resume=<run dir>``, or None (``true``/``false``/empty)."""
    if isinstance(resume, str) and resume.lower() not in ("", "true", "false"):
        return resume
    return None


def resume_requested(resume: Any) -> bool:
    """``trainer.resume`` asks to continue a run: ``true`` or a run folder."""
    return (
        resume is True or (isinstance(resume, str) and resume.lower() == "true") or resume_folder(resume) is not None
    )


def flatten(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``: nested config dicts as dotted keys."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_settings(config: dict) -> dict:
    """The flat settings of a run's saved config. Keys added to biencoder after the run was made take their schema
    default: a key is only ever added with a default that keeps the old behaviour, so an older run compares equal
    to a new one with the same settings (in summaries and when resumed)."""
    defaults = flatten(OmegaConf.to_container(OmegaConf.structured(Schema), resolve=False))
    # a default read from the environment (${oc.env:...}: the cache and log folders) counts as it resolves now;
    # other interpolations (the packaged encoder's folder, the demo corpus) need the resolvers and are left out
    known = {
        k: _resolve_env(v) if isinstance(v, str) and v.startswith("${oc.env:") else v for k, v in defaults.items()
    }
    # every loss's keys, each at its option's default where the config lacks it (a key of another loss than the
    # run's takes no part in the run): runs of either loss, saved with their own loss's keys or with every loss's,
    # compare key by key
    own = (config.get("loss") or {}).get("name")
    for name in sorted(LOSS_OPTIONS, key=lambda name: name == own):  # the run's own loss last: its defaults win
        option = OmegaConf.to_container(OmegaConf.structured(LOSS_OPTIONS[name]))
        known.update({f"loss.{key}": value for key, value in option.items() if key != "name"})
    return _resolved_head(
        {**{k: v for k, v in known.items() if not (isinstance(v, str) and "${" in v)}, **flatten(config)}
    )


HEAD = "model.head."


def _resolved_head(flat: dict) -> dict:
    """``flat`` with its ``model.head.*`` keys replaced by the head they describe (:func:`~.heads.head_spec`): norm,
    activation, dropout and hidden resolved, both flags null. Configs that build the same head (a card variant's
    flags, the same head spelt with the keys, a run from before the keys existed) then have the same settings: they
    resume each other and share a cell. A config whose flags contradict its keys is left as it is."""
    try:
        spec = head_spec({k[len(HEAD) :]: v for k, v in flat.items() if k.startswith(HEAD)})
    except ConfigError:
        return flat
    resolved = {f"{HEAD}{k}": v for k, v in spec.as_config().items()}
    return {**flat, **resolved, f"{HEAD}use_layernorm": None, f"{HEAD}use_relu": None}


def _resolve_env(value: str) -> str:
    """``${oc.env:NAME,default}`` as it resolves in this process."""
    return str(OmegaConf.create({"value": value}).value)
