"""Export a trained run: ``python -m biencoder.export <run> <out_dir>`` (``pip install -e ".[export]"``).

``<out_dir>`` is a **sentence-transformers** model folder built from its own modules: the encoder and tokenizer
(``Transformer``), the run's pooling (``Pooling``; BERT's ``pooler`` output is CLS pooling followed by the
pooler's dense + tanh as a ``Dense``), then the 128-d sim head as a ``Dense`` without activation. So
``SentenceTransformer(out_dir).encode(texts)`` gives the run's sim embeddings (the retrieval space).

``<out_dir>/pair_classifier/`` holds the pair head (:class:`~biencoder.engine.modeling.head.PairHead`: its hidden
layers, norm, activation and output layer; docs/heads.md) as ``model.safetensors`` with ``config.json``, whose
``head`` holds the head's keys; :func:`load_pair_classifier` rebuilds it as a module whose ``classify_pair`` takes
the sim and pooled embeddings of both texts (a component of the user's own must be importable where it is loaded);
:func:`embed` gives both from the exported folder::

    from sentence_transformers import SentenceTransformer
    from biencoder.engine.inference.export import embed, load_pair_classifier
    model = SentenceTransformer(out_dir)
    classifier = load_pair_classifier(out_dir)
    logits = classifier.classify_pair(embed(model, points), embed(model, candidates))  # class 1 = counter
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from torch import nn

from ...errors import ConfigError
from ..config.heads import head_spec
from ..config.schema import TrainerSchema
from ..files import read_json, strict_json
from ..machine.runtime import eval_batch_size
from ..modeling.head import PairHead
from ..modeling.model import Embeddings
from ..runs.checkpoint import load_checkpoint

CLASSIFIER = "pair_classifier"


def _st_modules():
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ConfigError("export needs sentence-transformers: pip install -e '.[export]'") from None
    try:  # sentence-transformers >= 5.x
        from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Dense, Pooling, Transformer
    return SentenceTransformer, Transformer, Pooling, Dense


def export(run: str | Path, out_dir: str | Path, progress: bool = False) -> Path:
    """Write ``out_dir`` (which must not exist yet, or be empty) from a run folder or its ``best.pt``. ``progress``:
    show transformers' bars while the encoder is written and read back (the command: when stderr is a terminal)."""
    from transformers.utils import logging as hf_logging

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "is a file" if not out.is_dir() else "exists and is not empty"
        raise ConfigError(f"'{out}' {what}: export into a new folder (nothing there was touched)")
    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        return _export(run, out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _export(run: str | Path, out: Path) -> Path:
    SentenceTransformer = _st_modules()[0]  # first: without sentence-transformers nothing is read or made
    model, tokenizer, model_cfg, settings = load_checkpoint(run, progress=False, what="run")
    # built next to the target and renamed at the end: an interrupted export never looks finished
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        with tempfile.TemporaryDirectory() as hf:
            model.encoder.save_pretrained(hf)
            tokenizer.save_pretrained(hf)
            SentenceTransformer(modules=_st_model_modules(model, model_cfg, hf), device="cpu").save(str(partial))
        _save_classifier(model, model_cfg, settings, partial / CLASSIFIER)
        _as_umask_allows(partial)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # only the folder this call made
        raise
    return out


def _as_umask_allows(folder: Path) -> None:
    """Give ``folder`` and everything in it the permissions a new folder and file get under the process's umask: the
    temporary folder is made private (0700) and some writers make their files 0600, while an export is made to be
    shared like any other output."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(Path(root) / name, 0o777 & ~mask)
        for name in files:
            os.chmod(Path(root) / name, 0o666 & ~mask)


def _st_model_modules(model, model_cfg: dict, hf: str) -> list:
    """The sentence-transformers modules of ``model`` (its encoder and tokenizer saved in ``hf``): ``Transformer``, the
    run's pooling (BERT's pooler as CLS pooling plus its dense + tanh), then the sim head as a ``Dense``."""
    _, Transformer, Pooling, Dense = _st_modules()
    hidden, sim_dim = model.encoder.config.hidden_size, model.sim_head.out_features
    modules = [Transformer(hf, max_seq_length=model_cfg["max_length"])]
    if model_cfg["pooling"] == "mean":
        modules.append(Pooling(hidden, pooling_mode="mean"))
    else:
        modules.append(Pooling(hidden, pooling_mode="cls"))
        if model_cfg["pooling"] == "pooler":  # BERT's pooler_output = tanh(W · h_cls + b)
            dense = model.encoder.pooler.dense
            modules.append(
                Dense(
                    hidden,
                    hidden,
                    activation_function=nn.Tanh(),
                    init_weight=dense.weight.detach().clone(),
                    init_bias=dense.bias.detach().clone(),
                )
            )
    modules.append(
        Dense(
            hidden,
            sim_dim,
            activation_function=nn.Identity(),
            init_weight=model.sim_head.weight.detach().clone(),
            init_bias=model.sim_head.bias.detach().clone(),
        )
    )
    return modules


def _save_classifier(model, model_cfg: dict, settings: dict, head_dir: Path) -> None:
    """The pair head's weights and buffers (``model.safetensors``: :class:`PairHead`'s own keys, a BatchNorm's running
    statistics included) and ``config.json`` (``hidden``: the encoder's width; ``head``: the head's keys) into the new
    folder ``head_dir``."""
    from safetensors.torch import save_file

    head_dir.mkdir()
    save_file(
        {k: v.detach().contiguous() for k, v in model.head.state_dict().items()}, str(head_dir / "model.safetensors")
    )
    config = {
        "fusion": model.head.fusion,
        "sim_dim": model.sim_head.out_features,
        "hidden": model.encoder.config.hidden_size,
        "head": model.head.spec.as_config(),
        "pooling": model_cfg["pooling"],
        "max_length": model_cfg["max_length"],
        "run": settings,
    }
    (head_dir / "config.json").write_text(strict_json(config, indent=2) + "\n")


def load_pair_classifier(folder: str | Path) -> PairHead:
    """The exported pair head of ``folder`` (an export's folder or its ``pair_classifier/``), in eval mode: the head
    its ``config.json`` names (an export from before the head keys: its two flags), with its weights. Raises
    :class:`ConfigError` in one line when a component of the user's own that it names cannot be imported here."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if (folder / CLASSIFIER).is_dir():
        folder = folder / CLASSIFIER
    config = read_json((folder / "config.json").read_text())
    # an export from before the head keys holds the flags at the top, beside "hidden" (the encoder's width)
    head = config["head"] if "head" in config else {k: config[k] for k in ("use_layernorm", "use_relu")}
    try:
        classifier = PairHead(config["fusion"], config["sim_dim"], config["hidden"], head_spec(head))
    except ConfigError as err:
        raise ConfigError(f"the pair classifier in '{folder}': {err}") from None
    classifier.load_state_dict(load_file(str(folder / "model.safetensors")))
    return classifier.eval()


def embed(model, texts: list[str], batch_size: int | None = TrainerSchema.eval_batch_size) -> Embeddings:
    """sim and pooled embeddings of ``texts`` from an exported SentenceTransformer (pooled = all modules but the
    sim head's ``Dense``), ``batch_size`` texts per call (None, ``trainer.eval_batch_size``'s default: the model
    device's, :func:`~biencoder.engine.machine.runtime.eval_batch_size`)."""
    SentenceTransformer = _st_modules()[0]
    pooled_model = SentenceTransformer(modules=list(model)[:-1], device=model.device)
    kwargs = {
        "batch_size": eval_batch_size(model.device, batch_size),
        "convert_to_tensor": True,
        "show_progress_bar": False,
    }
    return Embeddings(model.encode(texts, **kwargs).cpu().float(), pooled_model.encode(texts, **kwargs).cpu().float())
