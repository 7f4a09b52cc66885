"""model.head: the rule relating the card's flags and the head keys, the head's name, and the one-line refusals of a
bad head (engine/config/heads.py, validation.py; docs/heads.md)."""

import sys

import pytest
from omegaconf import OmegaConf

from biencoder.engine.config.heads import HeadSpec, head_name, head_spec
from biencoder.engine.config.validation import validate
from biencoder.errors import ConfigError
from conftest import compose_cfg


@pytest.mark.parametrize(
    "head, spec",
    [
        ({}, ("none", "none")),  # nothing said: the default config's plain head
        # a best.pt or config from before the head keys: the two flags alone, with their old meaning
        ({"use_layernorm": True, "use_relu": True}, ("layernorm", "relu")),
        ({"use_layernorm": True, "use_relu": False}, ("layernorm", "none")),
        ({"use_layernorm": False, "use_relu": True}, ("none", "relu")),
        ({"use_layernorm": False, "use_relu": False}, ("none", "none")),
        # a key alone, on the default config (both flags null)
        ({"norm": "rmsnorm", "activation": "gelu"}, ("rmsnorm", "gelu")),
        ({"use_layernorm": None, "norm": "batchnorm"}, ("batchnorm", "none")),
        # a flag and its key that say the same thing
        ({"use_layernorm": True, "norm": "layernorm", "use_relu": True, "activation": "relu"}, ("layernorm", "relu")),
        # false says "not LayerNorm" / "not ReLU": true of an RMSNorm / a GELU head (+variant=plain norm=rmsnorm)
        ({"use_layernorm": False, "norm": "rmsnorm", "use_relu": False, "activation": "gelu"}, ("rmsnorm", "gelu")),
        ({"use_layernorm": True, "use_relu": False, "activation": "silu"}, ("layernorm", "silu")),
        ({"norm": "mypkg.norms:ScaleNorm", "use_layernorm": False}, ("mypkg.norms:ScaleNorm", "none")),
    ],
)
def test_the_flags_and_the_keys_describe_one_head(head, spec):
    got = head_spec(head)
    assert (got.norm, got.activation) == spec
    assert head_spec(OmegaConf.create(head)) == got  # a DictConfig (a run) and a dict (best.pt) alike


@pytest.mark.parametrize(
    "head, flag, key",
    [
        ({"use_layernorm": True, "norm": "rmsnorm"}, "model.head.use_layernorm=true", "model.head.norm=rmsnorm"),
        ({"use_layernorm": False, "norm": "layernorm"}, "model.head.use_layernorm=false", "model.head.norm=layernorm"),
        ({"use_relu": True, "activation": "none"}, "model.head.use_relu=true", "model.head.activation=none"),
        ({"use_relu": False, "activation": "relu"}, "model.head.use_relu=false", "model.head.activation=relu"),
    ],
)
def test_a_flag_that_contradicts_its_key_is_refused_in_one_line(head, flag, key):
    with pytest.raises(ConfigError) as err:
        head_spec(head)
    message = str(err.value)
    assert "\n" not in message and flag in message and key in message and f"{flag.split('=')[0]}=null" in message


def test_dropout_and_hidden_default_to_the_schema_s_and_are_read_as_numbers():
    assert head_spec({}) == HeadSpec("none", "none", 0.0, ())
    spec = head_spec(OmegaConf.create({"dropout": 0.25, "hidden": [256, 64]}))
    assert spec.dropout == 0.25 and spec.hidden == (256, 64) and isinstance(spec.hidden, tuple)
    assert spec.as_config() == {"norm": "none", "activation": "none", "dropout": 0.25, "hidden": [256, 64]}
    assert head_spec(spec.as_config()) == spec  # what an export writes rebuilds the same head


@pytest.mark.parametrize(
    "head, name",
    [
        ({"use_layernorm": True, "use_relu": True}, "ln_relu"),
        ({"use_layernorm": True, "use_relu": False}, "ln"),
        ({"use_layernorm": False, "use_relu": True}, "relu"),
        ({"use_layernorm": False, "use_relu": False}, "plain"),
        ({"norm": "layernorm", "activation": "relu"}, "ln_relu"),  # the same head, the same cell
        ({"norm": "batchnorm", "activation": "tanh", "dropout": 0.1}, "batchnorm_tanh_drop0.1"),
        ({"hidden": [256], "activation": "gelu"}, "h256_gelu"),
        ({"hidden": [512, 128], "norm": "rmsnorm"}, "h512x128_rmsnorm"),
        ({"norm": "mypkg.norms:ScaleNorm", "activation": "silu"}, "mypkg.norms.ScaleNorm_silu"),
    ],
)
def test_a_head_is_named_by_its_parts_and_the_card_s_heads_keep_their_names(head, name):
    assert head_name(head_spec(head)) == name


# -- validation: each key alone on the default config, a bad value in one line --------------------------------------
@pytest.mark.slow
def test_each_head_key_works_alone_on_the_default_config():
    for overrides in (
        ["model.head.norm=rmsnorm", "model.head.activation=gelu"],
        ["model.head.norm=batchnorm"],
        ["model.head.dropout=0.1"],
        ["model.head.hidden=[256]"],
        ["model.head.hidden=[64,32]", "model.head.norm=layernorm", "model.head.activation=silu"],
        ["+variant=plain", "model.head.norm=rmsnorm", "model.head.activation=tanh"],
        ["+variant=ln", "model.head.activation=gelu", "model.head.hidden=[16]"],
    ):
        validate(compose_cfg(overrides))


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["model.head.norm=rmsnrom"],
            "model.head.norm='rmsnrom' is not valid (did you mean rmsnorm?): use one of none, layernorm, rmsnorm, "
            "batchnorm, or a factory of your own as module:name (docs/heads.md)",
        ),
        (
            ["model.head.activation=GELU"],
            "model.head.activation='GELU' is not valid (did you mean gelu?): use one of none, relu, gelu, tanh, "
            "silu, or a factory of your own as module:name (docs/heads.md)",
        ),
        (["model.head.dropout=1.0"], "model.head.dropout=1.0 is not valid: it must be a probability in [0, 1)"),
        (["model.head.dropout=-0.1"], "model.head.dropout=-0.1 is not valid: it must be a probability in [0, 1)"),
        (["model.head.hidden=[256,0]"], "model.head.hidden=[256, 0] is not valid: it must be a list of widths >= 1"),
        (
            ["+variant=ln", "model.head.norm=rmsnorm"],
            "model.head.use_layernorm=true and model.head.norm=rmsnorm contradict each other: drop one of them (a "
            "variant file's flag: add model.head.use_layernorm=null), docs/heads.md",
        ),
        (
            ["model.head.norm=no_such_package.norms:ScaleNorm"],
            "model.head.norm='no_such_package.norms:ScaleNorm' needs the module 'no_such_package', which is not "
            "installed here: install the package that provides it, or put its folder on PYTHONPATH",
        ),
        (
            ["model.head.activation=math:no_such_function"],
            "model.head.activation='math:no_such_function': module 'math' has no callable 'no_such_function'",
        ),
    ],
)
def test_a_bad_head_is_refused_in_one_line_naming_the_key(overrides, expected):
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(overrides))
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_a_misspelt_head_key_gets_did_you_mean():
    from biencoder.engine.config.keys import unknown_key_message

    assert unknown_key_message("model.head.activaton") == (
        "unknown config key model.head.activaton (did you mean model.head.activation?): fix its spelling, or see "
        "every key with --cfg job"
    )


@pytest.mark.slow
def test_a_variant_file_with_only_the_keys_it_changes(tmp_path):
    """A new ablation is a new file with the keys it changes (here the head keys, from a folder of the user's own
    on Hydra's search path), composed over the schema: nothing to unset first."""
    (tmp_path / "variant").mkdir()
    (tmp_path / "variant" / "rms_gelu.yaml").write_text(
        "# @package _global_\nmodel:\n  head:\n    norm: rmsnorm\n    activation: gelu\n    dropout: 0.1\n"
    )
    overrides = [f"hydra.searchpath=[file://{tmp_path}]", "+variant=rms_gelu"]
    cfg = compose_cfg(overrides)
    validate(cfg)
    assert head_spec(cfg.model.head) == HeadSpec("rmsnorm", "gelu", 0.1, ())
    assert compose_cfg(overrides, hydra_config=True).hydra.run.dir.endswith("_rms_gelu_s0")


@pytest.mark.slow
def test_a_component_of_the_user_s_own_is_imported_when_validated(tmp_path, monkeypatch):
    """An import path names a factory of the user's own package (here a module written outside src/, on
    sys.path): validation imports it, so a typo in its name fails before anything runs."""
    (tmp_path / "userheads_v.py").write_text("import torch\n\ndef Scale(width):\n    return torch.nn.Identity()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    validate(compose_cfg(["model.head.norm=userheads_v:Scale"]))
    assert "userheads_v" in sys.modules
    with pytest.raises(ConfigError, match="has no callable 'Scal'"):
        validate(compose_cfg(["model.head.norm=userheads_v:Scal"]))
