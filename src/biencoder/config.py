"""Compatibility names: ``biencoder.config`` was split into :mod:`biencoder.schema` (keys, defaults, checks),
:mod:`biencoder.runtime` (seed, progress) and :mod:`biencoder.hydra_glue` (everything Hydra).

Kept because people and scripts import from here: ``packaged_minilm_path`` (RESULTS.md's commands),
``register`` (scripts that compose ``conf/``), ``conf_dir`` (tests/test_install.py), ``ConfigError``,
``validate``, ``run_settings``, ``set_seed_everywhere``. Code inside the package imports from the new homes.
Importing this module imports Hydra (through :mod:`biencoder.hydra_glue`).
"""

from .errors import ConfigError
from .hydra_glue import conf_dir, fail, hydra_cli, register, variant_name
from .engine.runtime import set_seed_everywhere, show_progress
from .engine.schema import (
    NON_RESULT_KEYS,
    Schema,
    check_known_keys,
    flags_name,
    flatten,
    is_non_result_key,
    packaged_minilm_path,
    resume_folder,
    resume_requested,
    run_settings,
    validate,
)

__all__ = ["ConfigError", "NON_RESULT_KEYS", "Schema", "check_known_keys", "conf_dir", "fail", "flags_name",
           "flatten", "hydra_cli", "is_non_result_key", "packaged_minilm_path", "register", "resume_folder",
           "resume_requested", "run_settings", "set_seed_everywhere", "show_progress", "validate", "variant_name"]
