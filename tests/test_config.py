from pathlib import Path

import pytest
import yaml
from hydra.errors import MissingConfigException

from biencoder.config import ConfigError, packaged_minilm_path, validate
from conftest import CONF, compose_cfg

VARIANTS = {"ln_relu": (True, True), "ln": (True, False), "relu": (False, True), "plain": (False, False)}


def test_config_lists_self_first_and_no_variant():
    defaults = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    assert defaults[0] == "_self_"
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
    ("model.head.use_layernorm=maybe", "model.head.use_layernorm"),
    ("model.pooling=max", "model.pooling"),
    ("eval.k=0", "eval.k"),
    ("trainer.device=tpu", "trainer.device"),
    ("eval.score=bm25", "eval.score"),
    ("data.root=null", "data.root"),
])
def test_bad_values_are_named(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose_cfg([override]))


def test_defaults_resolve_to_packaged_minilm():
    cfg = compose_cfg()
    validate(cfg)
    path = Path(cfg.model.encoder.name_or_path)
    assert path == Path(packaged_minilm_path()) and (path / "config.json").is_file()
    assert "site-packages" not in (CONF / "model" / "minilm.yaml").read_text()
    from biencoder.corpus import demo_root

    assert Path(cfg.data.root) == demo_root() and compose_cfg(["data=arguana"]).data.root
