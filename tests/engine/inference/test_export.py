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
from biencoder.errors import ConfigError
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
        expected = model.head.classify_pair(own.index(rows_a), own.index(rows_b))
        got = classifier.classify_pair(theirs.index(rows_a), theirs.index(rows_b))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
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


@pytest.mark.slow
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


def _trained_like(model, seed: int = 7):
    """``model`` with every head parameter moved off its start and a BatchNorm's running statistics updated, so
    that an export that drops or misplaces one of them shows in the logits."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.head.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    model.train()
    model.head(torch.randn(32, model.head.n_features) * 2 + 1)
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize(
    "head",
    [
        {"use_layernorm": True, "use_relu": True},
        {"norm": "batchnorm", "activation": "gelu", "hidden": [16, 8], "dropout": 0.2},
        {"norm": "rmsnorm", "activation": "silu", "hidden": [12]},
    ],
)
def test_the_exported_classifier_rebuilds_the_head_and_its_logits(
    tmp_path, monkeypatch, tiny_model_and_tokenizer, head
):
    """config.json's ``head`` is the head that holds the weights (hidden layers, norm, activation, dropout), and the
    safetensors hold every weight and buffer of it (a BatchNorm's running statistics too): the loaded classifier gives
    the run's logits."""
    import copy
    import json

    from omegaconf import OmegaConf

    from biencoder.engine.config.heads import head_spec
    from biencoder.engine.inference import export as engine_export
    from biencoder.engine.modeling.model import BiModel, Embeddings

    base, tokenizer = tiny_model_and_tokenizer
    model = _trained_like(BiModel(copy.deepcopy(base.encoder), pooling="pooler", head=head_spec(head)))
    model_cfg = OmegaConf.to_container(compose_cfg(["model=tiny"]).model, resolve=True)
    monkeypatch.setattr(engine_export, "load_checkpoint", lambda *args, **kwargs: (model, tokenizer, model_cfg, {}))
    exported = export("a run", tmp_path / "st")
    config = json.loads((exported / "pair_classifier" / "config.json").read_text())
    assert config["head"] == head_spec(head).as_config() and config["hidden"] == 32
    classifier = load_pair_classifier(exported)
    assert not classifier.training
    torch.manual_seed(1)
    a, b = Embeddings(torch.randn(6, 128), torch.randn(6, 32)), Embeddings(torch.randn(6, 128), torch.randn(6, 32))
    with torch.no_grad():
        torch.testing.assert_close(classifier.classify_pair(a, b), model.head.classify_pair(a, b), rtol=0, atol=0)


def test_an_export_from_before_the_head_keys_loads_as_the_same_head(tmp_path, tiny_model_and_tokenizer):
    """An export written before the head keys: config.json with the two flags and ``hidden`` = the encoder's width,
    safetensors keys ``norm.*``/``out.*`` (made here as that code wrote them): it loads, with the same logits."""
    import copy
    import json

    from safetensors.torch import save_file

    from biencoder.engine.config.heads import head_spec
    from biencoder.engine.modeling.model import BiModel, Embeddings

    model = _trained_like(
        BiModel(copy.deepcopy(tiny_model_and_tokenizer[0].encoder), head=head_spec({"use_layernorm": True}))
    )
    folder = tmp_path / "old" / "pair_classifier"
    folder.mkdir(parents=True)
    old = {k: v for k, v in model.state_dict().items() if k.startswith(("head.norm.", "head.out."))}
    save_file({k[len("head.") :]: v.contiguous() for k, v in old.items()}, str(folder / "model.safetensors"))
    config = {"fusion": "concat", "sim_dim": 128, "hidden": 32, "use_layernorm": True, "use_relu": False}
    (folder / "config.json").write_text(json.dumps({**config, "pooling": "mean", "max_length": 64, "run": {}}))
    classifier = load_pair_classifier(tmp_path / "old")
    assert type(classifier.norm).__name__ == "LayerNorm" and classifier.act is None and len(classifier.hidden) == 0
    torch.manual_seed(1)
    a, b = Embeddings(torch.randn(6, 128), torch.randn(6, 32)), Embeddings(torch.randn(6, 128), torch.randn(6, 32))
    with torch.no_grad():
        torch.testing.assert_close(classifier.classify_pair(a, b), model.head.classify_pair(a, b), rtol=0, atol=0)


def test_an_export_whose_component_is_not_installed_says_what_to_install(tmp_path, monkeypatch):
    """A classifier whose head names a factory of the user's own: loaded where its module is importable, refused in
    one line naming the module where it is not."""
    import json
    import sys

    from safetensors.torch import save_file

    from biencoder.engine.config.heads import head_spec
    from biencoder.engine.modeling.head import PairHead

    (tmp_path / "userheads_x.py").write_text("import torch\n\ndef Half(width):\n    return torch.nn.Identity()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = head_spec({"activation": "userheads_x:Half"})
    folder = tmp_path / "st" / "pair_classifier"
    folder.mkdir(parents=True)
    save_file(PairHead("sim", 4, 2, spec).state_dict(), str(folder / "model.safetensors"))
    config = {"fusion": "sim", "sim_dim": 4, "hidden": 2, "head": spec.as_config(), "pooling": "mean"}
    (folder / "config.json").write_text(json.dumps({**config, "max_length": 64, "run": {}}))
    assert type(load_pair_classifier(tmp_path / "st").act).__name__ == "Identity"
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    monkeypatch.delitem(sys.modules, "userheads_x")
    with pytest.raises(ConfigError) as err:
        load_pair_classifier(tmp_path / "st")
    assert str(err.value) == (
        f"the pair classifier in '{folder}': model.head.activation='userheads_x:Half' needs the module "
        "'userheads_x', which is not installed here: install the package that provides it, or put its folder on "
        "PYTHONPATH"
    )
