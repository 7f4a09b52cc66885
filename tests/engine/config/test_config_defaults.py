"""One default per key: the schema (src/biencoder/engine/config/schema.py) holds every default; a file of conf/ holds
only what differs from it. The option each group selects by default holds no key at all, and no file repeats a schema
default. Experiment, variant and sweep files are outside the rule: they state a study's settings in full
(docs/architecture.md, "One default per key")."""

import pytest
import yaml
from omegaconf import OmegaConf

from biencoder.engine.config.schema import LoggerSchema, MlflowSchema, Schema, TensorBoardSchema
from biencoder.engine.config.settings import flatten
from conftest import CONF

#: the config groups that fill schema nodes (their files' keys live under the group's name)
GROUPS = ("paths", "data", "model", "trainer", "loss", "negatives", "eval", "logger")
#: composition roots that set keys (global ones). conf/config.yaml is not among them: it sets none, so a repeat
#: check would compare two empty sets; test_the_training_root_is_a_defaults_list_only says so instead
ROOTS = ("evaluate.yaml",)
#: the config groups whose options are dataclasses (biencoder.hydra_glue.register), not files: nothing to repeat
STORED = ("loss",)


def schema_defaults() -> dict:
    """Every dotted key of the schema with its default, the optional logger subtrees switched on."""
    every = Schema(logger=LoggerSchema(tensorboard=TensorBoardSchema(), mlflow=MlflowSchema()))
    return flatten(OmegaConf.to_container(OmegaConf.structured(every), resolve=False))


def file_keys(path, prefix: str) -> dict:
    """The dotted keys a config file sets (its defaults list and Hydra's own node left out)."""
    body = yaml.safe_load(path.read_text()) or {}
    body = {k: v for k, v in body.items() if k not in ("defaults", "hydra")}
    return flatten({prefix: body} if prefix else body)


def default_options() -> dict:
    """group -> the option conf/config.yaml selects, e.g. {"trainer": "default", "data": "demo"}."""
    listed = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    return {k: v for item in listed if isinstance(item, dict) for k, v in item.items() if k in GROUPS}


def repeats(keys: dict, defaults: dict) -> list[str]:
    return sorted(k for k, v in keys.items() if k in defaults and defaults[k] == v)


@pytest.mark.parametrize("group", [g for g in GROUPS if g not in STORED])
def test_group_files_repeat_no_schema_default(group):
    defaults = schema_defaults()
    files = sorted((CONF / group).glob("*.yaml"))
    assert files
    found = {f.name: repeats(file_keys(f, group), defaults) for f in files}
    assert {name: keys for name, keys in found.items() if keys} == {}


@pytest.mark.parametrize("root", ROOTS)
def test_composition_roots_repeat_no_schema_default(root):
    keys = file_keys(CONF / root, "")
    assert keys, f"{root} sets no key: nothing to compare"
    assert repeats(keys, schema_defaults()) == []


def test_the_training_root_is_a_defaults_list_only():
    """conf/config.yaml holds its defaults list and nothing else: its global keys (task_name, seed) keep the
    schema's defaults, written there once."""
    assert set(yaml.safe_load((CONF / "config.yaml").read_text())) == {"defaults"}


def test_the_default_options_hold_no_key():
    """A key in the option a group selects by default would be a second default beside the schema's."""
    options = default_options()
    assert set(options) == set(GROUPS)
    held = {
        group: sorted(file_keys(CONF / group / f"{option}.yaml", group))
        for group, option in options.items()
        if group not in STORED
    }
    assert {g: keys for g, keys in held.items() if keys} == {}


def test_a_stored_group_has_no_files():
    """A YAML option beside the dataclass of the same name would be a second definition of its keys."""
    assert [group for group in STORED if (CONF / group).exists()] == []


def test_the_check_finds_a_repeated_default(tmp_path):
    """The rule can fail: a file that restates trainer.lr's default is caught; one that changes a key is not."""
    path = tmp_path / "default.yaml"
    path.write_text("lr: 2.0e-5\nmax_epochs: 3\n")
    assert repeats(file_keys(path, "trainer"), schema_defaults()) == ["trainer.lr"]


def test_the_composed_defaults_are_the_schemas():
    """Composing conf/ with no override gives the schema's defaults for every key (the loggers off)."""
    from conftest import compose_cfg

    composed = flatten(OmegaConf.to_container(compose_cfg([]), resolve=False))
    plain = flatten(OmegaConf.to_container(OmegaConf.structured(Schema), resolve=False))
    assert composed == plain
