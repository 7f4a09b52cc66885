from pathlib import Path

import pytest
import yaml
from hydra.errors import MissingConfigException

from biencoder.engine.schema import packaged_minilm_path
from biencoder.engine.validation import validate
from biencoder.errors import ConfigError
from conftest import CONF, compose_cfg

VARIANTS = {"ln_relu": (True, True), "ln": (True, False), "relu": (False, True), "plain": (False, False)}


def test_config_builds_on_the_schema_and_lists_no_variant():
    defaults = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    assert defaults[:2] == ["biencoder_schema", "_self_"]
    assert not any(isinstance(d, dict) and "variant" in d or d == "variant" for d in defaults)


@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_set_exactly_the_two_flags(variant):
    base = compose_cfg()
    cfg = compose_cfg([f"+variant={variant}"])
    assert (cfg.model.head.use_layernorm, cfg.model.head.use_relu) == VARIANTS[variant]
    text = (CONF / "variant" / f"{variant}.yaml").read_text()
    assert text.startswith("# @package _global_")
    assert yaml.safe_load(text) == {"model": {"head": {"use_layernorm": VARIANTS[variant][0], "use_relu": VARIANTS[variant][1]}}}
    base.model.head = cfg.model.head
    assert base == cfg


def test_unknown_variant_fails_at_composition():
    with pytest.raises(MissingConfigException, match="variant"):
        compose_cfg(["+variant=layernorm_only"])


@pytest.mark.parametrize("override, key", [
    ("model.pooling=max", "model.pooling"),
    ("eval.k=0", "eval.k"),
    ("eval.pair_batch_size=0", "eval.pair_batch_size"),  # once a ValueError from range() after the run started
    ("trainer.device=tpu", "trainer.device"),
    ("eval.score=bm25", "eval.score"),
    ("trainer.lr=-1e-5", "trainer.lr"),
    ("trainer.max_epochs=0", "trainer.max_epochs"),
    ("trainer.stats_every=0", "trainer.stats_every"),  # would divide by zero sampled steps
    ("negatives.random_rate.start=1.5", "negatives.random_rate.start"),
    ("negatives.random_rate.decay=-0.1", "negatives.random_rate.decay"),
    ("trainer.precision=fp16", "trainer.precision"),
    ("negatives.index=faiss", "negatives.index"),
    ("loss.name=focal", "loss.name"),
    ("loss.scale=0", "loss.scale"),
    ("loss.ce_weight=-1", "loss.ce_weight"),
    # a key of the other loss would be silently ignored
    ("loss.margin=0.5 loss=infonce", "loss.margin"),
    ("loss.scale=10", "loss.scale"),
    ("+loss.temperature=0.05", "loss.temperature"),  # + lets it past the schema, not past validate
    ("data.root=null", "data.root"),  # null is data=pairs' root; the ArguAna layout needs a folder
])
def test_bad_values_are_named(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose_cfg(override.split()))


@pytest.mark.parametrize("override, key", [
    ("model.head.use_layernorm=maybe", "model.head.use_layernorm"),
    ("trainer.lr=fast", "trainer.lr"),
    ("eval.k=1.5", "eval.k"),
    ("trainer.lrr=1", "trainer.lrr"),
])
def test_wrong_types_and_unknown_keys_fail_at_composition(override, key):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match=key.replace(".", r"\.")):
        compose_cfg([override])


def test_typo_in_a_config_file_fails_at_composition(tmp_path):
    """A variant file with a misspelt flag must not silently train the plain head."""
    import shutil

    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    conf = shutil.copytree(CONF, tmp_path / "conf")
    (conf / "variant" / "typo.yaml").write_text("# @package _global_\nmodel:\n  head:\n    use_layrnorm: true\n")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        with pytest.raises(ConfigCompositionException) as err:
            compose(config_name="config", overrides=["+variant=typo"])
    assert "use_layrnorm" in str(err.value.__cause__ or err.value)


def test_max_length_above_the_encoder_limit_is_named():
    from biencoder.engine.model import build_model

    with pytest.raises(ConfigError, match=r"model\.max_length=600 .* limit of 512"):
        build_model(compose_cfg(["model=tiny", "model.max_length=600"]).model)


def test_defaults_resolve_to_packaged_minilm():
    cfg = compose_cfg()
    validate(cfg)
    path = Path(cfg.model.encoder.name_or_path)
    assert path == Path(packaged_minilm_path()) and (path / "config.json").is_file()
    assert "site-packages" not in (CONF / "model" / "minilm.yaml").read_text()
    from biencoder.engine.schema import demo_root

    assert Path(cfg.data.root) == demo_root() and compose_cfg(["data=arguana"]).data.root


@pytest.mark.parametrize("module, says", [("train", ["+variant=ln_relu", "-m '+variant=glob(*)' seed=0,1,2",
                                                      "-sc install=bash", "variant: ln, ln_relu, plain, relu"]),
                                          ("evaluate", ["eval.checkpoint=logs/runs/<run>", "eval.score=tfidf"])])
def test_help_says_how_to_start(module, says):
    import subprocess
    import sys

    from conftest import REPO

    shown = subprocess.run([sys.executable, "-m", f"biencoder.{module}", "--help"], capture_output=True, text=True,
                           cwd=REPO)
    assert shown.returncode == 0
    for text in says:
        assert text in shown.stdout


def test_loss_group_selects_the_loss_and_the_default_is_triplet_ce():
    from biencoder.engine.loss import InfoNCELoss, TripletCELoss, build_loss

    default, explicit = compose_cfg(), compose_cfg(["loss=triplet_ce"])
    assert default.loss == explicit.loss and default.loss.name == "triplet_ce"
    assert type(build_loss(default.loss)) is TripletCELoss
    infonce = compose_cfg(["loss=infonce", "loss.scale=10", "loss.ce_weight=0"])
    validate(infonce)
    built = build_loss(infonce.loss)
    assert type(built) is InfoNCELoss and (built.scale, built.ce_weight, built.gather) == (10, 0, False)


@pytest.mark.parametrize("preset, expect", [
    ("loss_selection", {"loss.name": "triplet_ce", "trainer.max_epochs": 10, "eval.tasks": False}),
    ("loss_arguana", {"loss.name": "triplet_ce", "trainer.max_epochs": 10, "model.encoder.freeze": True}),
    ("finetune_arguana", {"loss.name": "infonce", "trainer.lr": 5e-5, "trainer.batch_size": 16,
                          "model.encoder.freeze": False, "data.name": "arguana"}),
])
def test_loss_presets_compose_and_validate(preset, expect, tmp_path):
    from omegaconf import OmegaConf

    cfg = compose_cfg([f"+experiment={preset}", "+variant=relu", f"data.root={tmp_path}"])
    validate(cfg)
    assert {k: OmegaConf.select(cfg, k) for k in expect} == expect
