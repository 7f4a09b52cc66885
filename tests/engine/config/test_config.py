from pathlib import Path

import pytest
import yaml
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from biencoder.engine.config.packaged import packaged_minilm_path
from biencoder.engine.config.validation import validate
from biencoder.errors import ConfigError
from conftest import CONF, compose_cfg

VARIANTS = {"ln_relu": (True, True), "ln": (True, False), "relu": (False, True), "plain": (False, False)}


def test_config_builds_on_the_schema_and_lists_no_variant():
    defaults = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    assert defaults[:2] == ["biencoder_schema", "_self_"]
    assert not any(isinstance(d, dict) and "variant" in d or d == "variant" for d in defaults)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_set_exactly_the_two_flags(variant):
    base = compose_cfg()
    cfg = compose_cfg([f"+variant={variant}"])
    assert (cfg.model.head.use_layernorm, cfg.model.head.use_relu) == VARIANTS[variant]
    text = (CONF / "variant" / f"{variant}.yaml").read_text()
    assert text.startswith("# @package _global_")
    assert yaml.safe_load(text) == {
        "model": {"head": {"use_layernorm": VARIANTS[variant][0], "use_relu": VARIANTS[variant][1]}}
    }
    base.model.head = cfg.model.head
    assert base == cfg


def test_unknown_variant_fails_at_composition():
    with pytest.raises(MissingConfigException, match="variant"):
        compose_cfg(["+variant=layernorm_only"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, key",
    [
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
        ("negatives.relative_margin=-0.05", "negatives.relative_margin"),
        ("negatives.rank_range=[0,5]", "negatives.rank_range"),  # rank 1 is the nearest
        ("negatives.rank_range=[50,10]", "negatives.rank_range"),
        ("negatives.rank_range=[10]", "negatives.rank_range"),
        ("negatives.rank_range=[1,2,3]", "negatives.rank_range"),
        ("loss.name=focal", "loss.name"),
        ("loss=infonce loss.scale=0", "loss.scale"),
        ("loss.ce_weight=-1", "loss.ce_weight"),
        ("+loss.temperature=0.05", "loss.temperature"),  # + lets it past the schema, not past validate
        ("loss=infonce +loss.margin=0.5", "loss.margin"),  # ... nor a key of the other loss past validate
        ("loss.name=infonce", "loss.name"),  # the name does not switch the option: loss=infonce does
        ("data.root=null", "data.root"),  # null is data=pairs' root; the ArguAna layout needs a folder
    ],
)
def test_bad_values_are_named(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose_cfg(override.split()))


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.head.use_layernorm=maybe", "model.head.use_layernorm"),
        ("trainer.lr=fast", "trainer.lr"),
        ("eval.k=1.5", "eval.k"),
        ("trainer.lrr=1", "trainer.lrr"),
    ],
)
def test_wrong_types_and_unknown_keys_fail_at_composition(override, key):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match=key.replace(".", r"\.")):
        compose_cfg([override])


def test_typo_in_a_config_file_fails_at_composition(tmp_path):
    """A variant file with a misspelt flag must not silently train the plain head."""
    import shutil

    from hydra.errors import ConfigCompositionException

    conf = shutil.copytree(CONF, tmp_path / "conf")
    (conf / "variant" / "typo.yaml").write_text("# @package _global_\nmodel:\n  head:\n    use_layrnorm: true\n")
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(["+variant=typo"], config_dir=conf)
    assert "use_layrnorm" in str(err.value.__cause__ or err.value)
    from biencoder.hydra_glue import _one_line

    assert _one_line(err.value).startswith(
        "In 'variant/typo': unknown config key model.head.use_layrnorm (did you mean model.head.use_layernorm?)"
    )


def test_max_length_above_the_encoder_limit_is_named():
    from biencoder.engine.modeling.model import build_model

    with pytest.raises(ConfigError, match=r"model\.max_length=600 .* limit of 512"):
        build_model(compose_cfg(["model=tiny", "model.max_length=600"]).model)


@pytest.mark.slow
def test_defaults_resolve_to_packaged_minilm():
    cfg = compose_cfg()
    validate(cfg)
    path = Path(cfg.model.encoder.name_or_path)
    assert path == Path(packaged_minilm_path()) and (path / "config.json").is_file()
    assert "site-packages" not in (CONF / "model" / "minilm.yaml").read_text()
    from biencoder.engine.config.packaged import demo_root

    assert Path(cfg.data.root) == demo_root() and compose_cfg(["data=arguana"]).data.root


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, says",
    [
        (
            "train",
            [
                "+variant=ln_relu",
                "-m '+variant=glob(*)' seed=0,1,2",
                "-sc install=bash",
                "variant: ln, ln_relu, plain, relu",
            ],
        ),
        ("evaluate", ["eval.checkpoint=logs/runs/<run>", "eval.score=tfidf"]),
    ],
)
def test_help_says_how_to_start(module, says):
    import subprocess
    import sys

    from conftest import REPO

    shown = subprocess.run(
        [sys.executable, "-m", f"biencoder.{module}", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert shown.returncode == 0
    for text in says:
        assert text in shown.stdout


@pytest.mark.slow
def test_loss_group_selects_the_loss_and_the_default_is_triplet_ce():
    from biencoder.engine.modeling.loss import InfoNCELoss, TripletCELoss, build_loss

    default, explicit = compose_cfg(), compose_cfg(["loss=triplet_ce"])
    assert default.loss == explicit.loss and default.loss.name == "triplet_ce"
    assert type(build_loss(default.loss)) is TripletCELoss
    infonce = compose_cfg(["loss=infonce", "loss.scale=10", "loss.ce_weight=0"])
    validate(infonce)
    built = build_loss(infonce.loss)
    assert type(built) is InfoNCELoss and (built.scale, built.ce_weight, built.gather) == (10, 0, False)


@pytest.mark.parametrize(
    "preset, expect",
    [
        ("loss_selection", {"loss.name": "triplet_ce", "trainer.max_epochs": 10, "eval.tasks": False}),
        ("loss_arguana", {"loss.name": "triplet_ce", "trainer.max_epochs": 10, "model.encoder.freeze": True}),
        (
            "finetune_arguana",
            {
                "loss.name": "infonce",
                "trainer.lr": 5e-5,
                "trainer.batch_size": 16,
                "model.encoder.freeze": False,
                "data.name": "arguana",
            },
        ),
    ],
)
def test_loss_presets_compose_and_validate(preset, expect, tmp_path):
    from omegaconf import OmegaConf

    cfg = compose_cfg([f"+experiment={preset}", "+variant=relu", f"data.root={tmp_path}"])
    validate(cfg)
    assert {k: OmegaConf.select(cfg, k) for k in expect} == expect


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["loss=triplet_ce", "loss.scale=10"],
            "loss.scale is a key of loss=infonce, not of loss=triplet_ce: drop it, or pick loss=infonce",
        ),
        (
            ["loss=infonce", "loss.margin=0.5"],
            "loss.margin is a key of loss=triplet_ce, not of loss=infonce: drop it, or pick loss=triplet_ce",
        ),
        (
            ["loss=infonce", "loss.scal=10"],
            "unknown config key loss.scal (did you mean loss.scale?): fix its spelling, or see every key with "
            "--cfg job",
        ),
    ],
)
def test_a_key_of_the_other_loss_is_refused_by_composition_in_one_line(overrides, line):
    """Each loss is its own option of the group (a dataclass): a key it does not read is no key of the config, so
    it cannot be silently ignored; the one line names the key and both losses."""
    from hydra.errors import ConfigCompositionException

    from biencoder.hydra_glue import _one_line

    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(overrides)
    assert _one_line(err.value) == line


def test_a_plain_config_is_checked_against_its_losss_option():
    """Without Hydra: a plain DictConfig (no dataclass behind it to refuse anything) is refused by validate when it
    holds a key of another loss; a structured one switches loss by assigning the option's dataclass."""
    from biencoder.engine.config.schema import InfoNCELossSchema, Schema
    from biencoder.engine.modeling.loss import InfoNCELoss, build_loss

    plain = OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(Schema)))
    assert sorted(plain.loss) == ["ce_weight", "margin", "name", "triplet_weight"]
    plain.loss.scale = 10.0
    with pytest.raises(ConfigError, match=r"^loss\.scale is a key of loss=infonce, not of loss=triplet_ce: "):
        validate(plain)
    structured = OmegaConf.structured(Schema)
    structured.loss = InfoNCELossSchema(scale=10.0)
    validate(structured)
    built = build_loss(structured.loss)
    assert type(built) is InfoNCELoss and (built.scale, built.ce_weight, built.gather) == (10, 1, False)


@pytest.mark.slow
def test_a_run_saved_with_every_losss_keys_has_the_settings_of_one_saved_with_its_own():
    """A saved config may hold both losses' keys (the other loss's at their defaults) or its own loss's alone, as
    composed now: the settings are the same, so such runs resume and share cells; every loss's keys are there, so
    cells of the two losses differ in loss.name (and what was changed), not in keys one of them lacks."""
    from biencoder.engine.config.settings import run_settings

    both = {"name": "infonce", "margin": 1.0, "triplet_weight": 1.0, "ce_weight": 0.0, "scale": 10.0, "gather": False}
    composed = OmegaConf.to_container(compose_cfg(["loss=infonce", "loss.scale=10", "loss.ce_weight=0"]))
    assert sorted(composed["loss"]) == ["ce_weight", "gather", "name", "scale"]
    assert run_settings({**composed, "loss": both}) == run_settings(composed)
    triplet = run_settings(OmegaConf.to_container(compose_cfg()))
    assert {k for k in triplet if k.startswith("loss.")} == {f"loss.{k}" for k in both}
    assert {k for k, v in triplet.items() if run_settings(composed).get(k) != v} == {
        "loss.name",
        "loss.scale",
        "loss.ce_weight",
    }


def test_one_helper_composes_the_configs():
    """The tests, the bench and the scripts compose conf/ through biencoder.hydra_glue.compose_config, which
    registers the schema, the loss options and the resolvers first: no second copy to fall behind it."""
    from conftest import REPO

    call = "initialize_config_dir" + "("
    files = [p for folder in ("src", "tests", "scripts") for p in (REPO / folder).rglob("*.py")]
    assert [str(p.relative_to(REPO)) for p in files if call in p.read_text()] == ["src/biencoder/hydra_glue.py"]


@pytest.mark.parametrize(
    "overrides, name",
    [
        ([], "plain"),
        (["model.head.use_relu=true"], "relu"),
        (["+variant=ln"], "ln"),
        (["+variant=ln", "model.head.use_relu=true"], "ln"),  # the choice names it, whatever the flags say
        (["model.head.norm=layernorm", "model.head.activation=relu"], "ln_relu"),  # the card's name for its head
        (["model.head.norm=rmsnorm", "model.head.activation=gelu"], "rmsnorm_gelu"),
        (["model.head.hidden=[256,64]", "model.head.dropout=0.1", "model.head.use_relu=true"], "h256x64_relu_drop0.1"),
        (["model.head.norm=batchnorm", "model.head.use_layernorm=false"], "batchnorm"),
        (["model.head.activation=mypkg.acts:Swish"], "mypkg.acts.Swish"),  # a folder's name: no colon
        (["model.head.norm=rmsnorm", "model.head.use_layernorm=true"], "invalid-head"),  # validation refuses it
    ],
)
def test_the_variant_is_the_choice_else_the_name_of_the_head(overrides, name):
    from biencoder.engine.config.heads import variant_name

    cfg = compose_cfg(overrides, hydra_config=True)
    assert variant_name(cfg, OmegaConf.select(cfg, "hydra.runtime.choices.variant")) == name
    assert cfg.hydra.run.dir.endswith(f"_{name}_s0")  # the folder's name: ${variant_name:}


def test_one_function_names_the_variant(monkeypatch):
    """The run folder's name, the app's variant and the runner's default come from
    engine.config.heads.variant_name; a head's name is made by head_name alone, which the report's cells call too."""
    from biencoder import hydra_glue
    from biencoder.engine.config import heads
    from conftest import REPO

    monkeypatch.setattr(heads, "variant_name", lambda cfg, choice=None: f"named-{choice}")
    cfg = compose_cfg(["+variant=ln"], hydra_config=True)
    assert cfg.hydra.run.dir.endswith("_named-ln_s0") and hydra_glue.variant_name(cfg) == "named-None"
    callers = sorted(p.name for p in (REPO / "src" / "biencoder").rglob("*.py") if "head_name(" in p.read_text())
    assert callers == ["heads.py", "runs.py"]


@pytest.mark.slow
def test_one_default_folder_for_the_real_corpus(monkeypatch):
    """data=arguana, the tests' real corpus and the bench's --corpus read the same default: ARGUANA_ROOT, else
    data/arguana-counterargs-corpus (engine.data.arguana.arguana_root)."""
    import conftest
    from biencoder.bench import common
    from biencoder.engine.data.arguana import arguana_root

    monkeypatch.delenv("ARGUANA_ROOT", raising=False)
    assert compose_cfg(["data=arguana"]).data.root == str(arguana_root()) == "data/arguana-counterargs-corpus"
    monkeypatch.setenv("ARGUANA_ROOT", "/corpora/arguana")
    assert compose_cfg(["data=arguana"]).data.root == str(arguana_root()) == "/corpora/arguana"
    monkeypatch.undo()
    assert common.DEFAULT_CORPUS == arguana_root() and conftest.REAL_ROOT == arguana_root().absolute()


def plain_configs():
    """The schema's defaults as plain configs (no dataclass behind them, as a Python user may build one), one per
    loss, with the node type of every leaf as OmegaConf's structured config gives it (the oracle of what each key
    holds: not the schema walk validate makes)."""
    from omegaconf.nodes import BooleanNode, FloatNode, IntegerNode

    from biencoder.engine.config.schema import LOSS_OPTIONS, Schema
    from biencoder.engine.config.settings import flatten

    kinds = {IntegerNode: int, FloatNode: float, BooleanNode: bool}
    for option in LOSS_OPTIONS.values():
        structured = OmegaConf.structured(Schema(loss=option()))
        typed = {}
        for key in flatten(OmegaConf.to_container(structured, resolve=False)):
            node = structured
            for part in key.split("."):
                node = node._get_node(part)
            if type(node) in kinds:
                typed[key] = (kinds[type(node)], node._is_optional())
        yield OmegaConf.create(OmegaConf.to_container(structured)), typed


#: per kind of key: values a plain config may hold that are not of that kind
NOT_OF_KIND = {
    int: (True, False, "abc", "3", 1.5, 3.0),
    float: (True, "abc", "0.1", float("nan"), float("inf")),
    bool: ("abc", "true", 1, 0, 1.0),
}


@pytest.mark.slow
def test_every_typed_key_of_a_plain_config_refuses_a_value_of_another_type_in_one_line():
    """Through the Python API (no Hydra to check types): a bool where an int or a float goes (``seed=True`` passed as
    an int), a string, a float for an int, a non-finite float and a null where null is not allowed each end in one
    ConfigError line that names the key and the value and says what to put there; null passes where the schema
    allows it. Every int, float and bool key of the schema, each loss's included."""
    checked = set()
    for plain, typed in plain_configs():
        validate(plain)
        for key, (kind, optional) in typed.items():
            for value in (*NOT_OF_KIND[kind], *(() if optional else (None,))):
                bad = plain.copy()
                OmegaConf.update(bad, key, value)
                with pytest.raises(ConfigError) as err:
                    validate(bad)
                line = str(err.value)
                assert "\n" not in line and line.startswith(f"{key}={value!r} is not "), line
                fix = f"use {key}=true or {key}=false" if kind is bool else "set it to one"
                assert fix in line, line
            if optional:
                fine = plain.copy()
                OmegaConf.update(fine, key, None)
                validate(fine)
            checked.add(key)
    # the keys of the issue, and one of each kind, are among those checked; validate walks the same keys
    assert {"seed", "trainer.warmup_ratio", "trainer.eval_batch_size", "loss.scale", "loss.gather"} <= checked
    from biencoder.engine.config.keys import typed_keys

    assert {key for key, *_ in typed_keys()} == checked


@pytest.mark.parametrize(
    "key, value, line",
    [
        ("seed", True, "seed=True is not an integer: set it to one (the default: seed=0)"),
        (
            "trainer.warmup_ratio",
            "abc",
            "trainer.warmup_ratio='abc' is not a finite number: set it to one (the default: trainer.warmup_ratio=0.0)",
        ),
        (
            "eval.pair_batch_size",
            2.5,
            "eval.pair_batch_size=2.5 is not an integer: set it to one, or null (the default: "
            "eval.pair_batch_size=null)",
        ),
        (
            "trainer.compile",
            "no",
            "trainer.compile='no' is not a boolean: use trainer.compile=true or trainer.compile=false",
        ),
    ],
)
def test_a_wrong_type_in_a_plain_config_is_one_line_naming_the_key_the_value_and_the_fix(key, value, line):
    from biencoder.engine.config.schema import Schema

    plain = OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(Schema)))
    OmegaConf.update(plain, key, value)
    with pytest.raises(ConfigError) as err:
        validate(plain)
    assert str(err.value) == line


@pytest.mark.slow
def test_the_negative_rules_are_checked_in_one_line_each():
    """What a bad negatives.relative_margin or negatives.rank_range is told, and that a misspelt key is named."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(["negatives.rank_range=[50,10]"]))
    assert str(err.value) == (
        "negatives.rank_range=[50,10] is not valid: use [lo,hi], integers with 1 <= lo <= hi (rank 1 is the nearest "
        "eligible argument; e.g. negatives.rank_range=[10,50]), or null for the nearest"
    )
    with pytest.raises(
        ConfigError, match=r"^negatives\.relative_margin=-0\.05 is not valid: it must be a number >= 0$"
    ):
        validate(compose_cfg(["negatives.relative_margin=-0.05"]))
    with pytest.raises(
        ConfigError,
        match=r"^unknown config key negatives\.relative_margn \(did you mean negatives\.relative_margin\?\)",
    ):
        validate(compose_cfg(["+negatives.relative_margn=0.05"]))  # + lets it past the schema, not past validate
    with pytest.raises(ConfigCompositionException, match=r"negatives\.rank_rang"):
        compose_cfg(["negatives.rank_rang=[1,2]"])
    for good in (["negatives.rank_range=[10,50]", "negatives.relative_margin=0.05"], ["negatives.rank_range=[1,1]"]):
        validate(compose_cfg(good))
    cfg = OmegaConf.create(OmegaConf.to_container(compose_cfg()))
    cfg.negatives.rank_range = "10-50"  # a plain config (the engine from Python): no schema checks the type
    with pytest.raises(ConfigError, match=r"^negatives\.rank_range='10-50' is not valid"):
        validate(cfg)
