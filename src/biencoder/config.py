"""Compatibility names: ``biencoder.config`` was split into :mod:`biencoder.engine.config.schema` (keys, defaults, checks),
:mod:`biencoder.engine.machine.runtime` (seed, progress) and :mod:`biencoder.hydra_glue` (everything Hydra).

Kept for code outside the package that imports the old names (``packaged_minilm_path``, ``register``, ``validate``,
``run_settings``, ...); the package, its tests and scripts import from the new homes. Importing this module imports
Hydra (through :mod:`biencoder.hydra_glue`).
"""

from .engine.config.packaged import packaged_minilm_path
from .engine.config.schema import Schema, flags_name
from .engine.config.settings import (
    NON_RESULT_KEYS,
    flatten,
    is_non_result_key,
    resume_folder,
    resume_requested,
    run_settings,
)
from .engine.config.validation import check_known_keys, validate
from .engine.machine.runtime import set_seed_everywhere, show_progress
from .errors import ConfigError
from .hydra_glue import conf_dir, fail, hydra_cli, register, variant_name

__all__ = [
    "ConfigError",
    "NON_RESULT_KEYS",
    "Schema",
    "check_known_keys",
    "conf_dir",
    "fail",
    "flags_name",
    "flatten",
    "hydra_cli",
    "is_non_result_key",
    "packaged_minilm_path",
    "register",
    "resume_folder",
    "resume_requested",
    "run_settings",
    "set_seed_everywhere",
    "show_progress",
    "validate",
    "variant_name",
]
