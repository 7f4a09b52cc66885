"""biencoder.export: the sentence-transformers folder reproduces the run's sim embeddings, the exported classifier
its logits; for the pooler (tiny BERT), mean pooling and a frozen encoder alike."""

import os
import stat
from pathlib import Path

import pytest
import torch

from biencoder.engine.modeling.encoding import Encoding, TokenizedTexts, encode
from biencoder.engine.runs.checkpoint import load_checkpoint
from biencoder.engine.training.run import run
from conftest import FAST, compose_cfg

st = pytest.importorskip("sentence_transformers", reason="pip install -e '.[export]'")

from biencoder.engine.inference.export import embed, export, load_pair_classifier  # noqa: E402
from biencoder.export import main  # noqa: E402

TEXTS = [
    "Homework teaches discipline.",
    "Children need time to play, not more worksheets after school.",
    "A short one.",
    "Taxes on sugar change what people buy, and the evidence from several countries says so.",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra", [["model.pooling=pooler"], ["model.pooling=mean"], ["model.pooling=mean", "model.encoder.freeze=true"]]
)
def test_round_trip(tmp_path, extra):
    out = tmp_path / "run"
    run(
        compose_cfg(
            FAST
            + [
                "+variant=ln_relu",
                "eval.tasks=false",
                "trainer.max_epochs=1",
                f"trainer.cache_dir={tmp_path / 'cache'}",
            ]
            + extra
        ),
        out,
    )
    exported = export(out, tmp_path / "st")
    model, tokenizer, model_cfg, _ = load_checkpoint(out)
    own = encode(model, TokenizedTexts(TEXTS, tokenizer, model_cfg["max_length"]), Encoding(batch_size=2))

    loaded = st.SentenceTransformer(str(exported), device="cpu")
    sim = torch.as_tensor(loaded.encode(TEXTS))
    torch.testing.assert_close(sim, own.sim, atol=1e-5, rtol=1e-4)
    theirs = embed(loaded, TEXTS)
    torch.testing.assert_close(theirs.pooled, own.pooled, atol=1e-5, rtol=1e-4)

    classifier = load_pair_classifier(exported)
    rows_a, rows_b = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2])
    with torch.no_grad():
        expected = model.classify_pair(own.index(rows_a), own.index(rows_b))
        got = classifier.classify_pair(theirs.index(rows_a), theirs.index(rows_b))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_an_export_has_the_permissions_the_umask_gives(tmp_path):
    """Made in a private temporary folder, an export still ends as any output does: 0755 folders and 0644 files under
    umask 022 (it was drwx------ with -rw------- weights)."""
    out = tmp_path / "run"
    run(compose_cfg(FAST + ["+variant=ln", "eval.tasks=false", "trainer.max_epochs=1"]), out)
    old = os.umask(0o022)
    try:
        exported = export(out, tmp_path / "st")
    finally:
        os.umask(old)
    modes = {p.relative_to(exported): stat.S_IMODE(p.stat().st_mode) for p in [exported, *exported.rglob("*")]}
    assert modes[Path(".")] == 0o755 and any(p.suffix == ".safetensors" for p in modes)
    assert all(mode == (0o755 if (exported / p).is_dir() else 0o644) for p, mode in modes.items()), modes


def test_export_refuses_a_used_folder_and_leaves_it(tmp_path, capsys):
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "mine.txt").write_text("keep me")
    assert main([str(tmp_path / "no-run"), str(tmp_path / "other")]) == 2
    assert "no-run' does not exist" in capsys.readouterr().err and not (tmp_path / "other").exists()
    out = tmp_path / "run"
    run(compose_cfg(FAST + ["+variant=ln", "eval.tasks=false", "trainer.max_epochs=1"]), out)
    assert main([str(out), str(tmp_path / "st")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "st").iterdir()] == ["mine.txt"]
    (tmp_path / "empty.txt").write_text("")
    assert main([str(out), str(tmp_path / "empty.txt")]) == 2
    assert "empty.txt' is a file" in capsys.readouterr().err and (tmp_path / "empty.txt").read_text() == ""
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.slow
def test_the_command_shows_no_progress_bars_off_a_terminal(tmp_path, capfd):
    """Output to a file or a pipe (here: pytest's capture, not a terminal) gets the two result lines and no
    transformers bars ("Writing model shards", "Loading weights"); the bars' setting is left as it was."""
    from transformers.utils import logging as hf_logging

    out = tmp_path / "run"
    run(compose_cfg(FAST + ["+variant=ln", "eval.tasks=false", "trainer.max_epochs=1"]), out)
    hf_logging.enable_progress_bar()
    capfd.readouterr()
    assert main([str(out), str(tmp_path / "st")]) == 0
    printed = capfd.readouterr()
    assert "it/s" not in printed.err + printed.out and "sentence-transformers model:" in printed.out
    assert hf_logging.is_progress_bar_enabled()


def test_the_exported_head_flags_are_the_runs_config(tmp_path, monkeypatch, tiny_model_and_tokenizer):
    """The classifier's config.json takes use_layernorm / use_relu from the checkpoint's model config, the record of
    the run, not from the module types of the rebuilt model (here made to disagree with it)."""
    import json

    from omegaconf import OmegaConf

    from biencoder.engine.inference import export as engine_export

    model, tokenizer = tiny_model_and_tokenizer  # a plain head: Identity, Identity
    model_cfg = OmegaConf.to_container(compose_cfg(["model=tiny", "+variant=ln_relu"]).model, resolve=True)
    monkeypatch.setattr(engine_export, "load_checkpoint", lambda *args, **kwargs: (model, tokenizer, model_cfg, {}))
    exported = export("a run", tmp_path / "st")
    config = json.loads((exported / "pair_classifier" / "config.json").read_text())
    assert (config["use_layernorm"], config["use_relu"]) == (True, True)
