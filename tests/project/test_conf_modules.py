"""Every Python name conf/ mentions (a ``_target_``, or a ``biencoder.…`` module in a comment or a help text) exists:
a module renamed in src/ must be renamed in the configs that point people and Hydra to it."""

import importlib
import re

import pytest

from conftest import CONF

#: a dotted biencoder path anywhere in a file, or the value of a _target_ key
NAMED = re.compile(r"\bbiencoder(?:\.[A-Za-z_]\w*)+|(?<=_target_:)\s*[\w.]+")


def named_paths() -> dict[str, list[str]]:
    """dotted path -> the conf files that name it."""
    found: dict[str, set[str]] = {}
    for path in CONF.rglob("*.yaml"):
        for match in NAMED.findall(path.read_text()):
            found.setdefault(match.strip(), set()).add(str(path.relative_to(CONF)))
    return {dotted: sorted(files) for dotted, files in found.items()}


def resolve(dotted: str):
    """The module (or an attribute of one) a dotted path names; ImportError/AttributeError when there is none."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module in {dotted}")


def test_conf_names_paths():
    # the scan finds what it is meant to: a _target_ (of ours and a plugin's), a module in a comment or a help text
    assert {
        "biencoder.callbacks.SweepSummary",
        "optuna.samplers.TPESampler",
        "biencoder.evaluate",
        "biencoder.report.stability",
    } <= set(named_paths())


@pytest.mark.slow
@pytest.mark.parametrize("dotted, files", sorted(named_paths().items()))
def test_every_python_name_in_conf_exists(dotted, files):
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as err:
        pytest.fail(f"{', '.join(files)} name {dotted}, which does not import ({err})")
