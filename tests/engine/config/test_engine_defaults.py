"""One source per default: a class or function of the engine (or an app) that takes a config key's value either takes
the schema's default, read from the schema class that holds the key (``pooling: str = ModelSchema.pooling``), or
takes none, so that using the engine from Python gives what the config gives (docs/architecture.md, "One default per
key").

Every public callable is read (:func:`callables`). A parameter stands for a config key when its name is a key's last
part (``pooling``, ``k``, ``margin``), else when its default is one of a key's choices (a ``kind="balltree"`` is an
``index``), or when :data:`KEY_OF` names its key (``Rerank.batch_size`` is ``eval.pair_batch_size``). Such a
parameter's default must be an attribute of a schema class holding that key, the same value written once, unless
:data:`RESOLVED` or :data:`OWN_DEFAULT` says why the value is not the key's. The settings objects a run builds from
its config with ``of_run`` (:class:`Rerank`, :class:`Mining`, :class:`Encoding`) equal, built with no arguments (and
wherever they are a parameter's default), what ``of_run`` builds from the schema's defaults on a CPU.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import textwrap
import types
import typing
from dataclasses import dataclass, fields

import pytest
import torch

import biencoder.engine
from biencoder.engine.config import schema
from biencoder.engine.machine.runtime import Runtime

#: the apps (thin shells over the engine) read besides the engine
APPS = ("callbacks", "corpus", "evaluate", "export", "hydra_glue", "retrieve", "summary", "tasks", "train")
#: the schema's tuples of choices -> the keys that take one of them
CHOICES = {
    "POOLINGS": ("model.pooling",),
    "FUSIONS": ("model.fusion",),
    "SIM_INITS": ("model.sim_init",),
    "RETRIEVE_SPACES": ("eval.retrieve",),
    "SCHEDULERS": ("trainer.scheduler",),
    "SCORES": ("eval.score",),
    "SELECT_METRICS": ("eval.select",),
    "PROTOCOLS": ("eval.protocol",),
    "DEVICES": ("trainer.device",),
    "PRECISIONS": ("trainer.precision",),
    "INDEXES": ("negatives.index", "eval.index"),
    "LAYOUTS": ("data.layout",),
    "POOLS": ("data.pool",),
    "PAIR_FORMATS": ("data.format",),
    "NORMS": ("model.head.norm",),
    "ACTIVATIONS": ("model.head.activation",),
}
#: (callable, parameter) -> its key, where the parameter's name is another key's or none
KEY_OF = {
    ("biencoder.engine.retrieval.rerank.Rerank", "batch_size"): "eval.pair_batch_size",
    ("biencoder.engine.modeling.encoding.Encoding", "batch_size"): "trainer.eval_batch_size",
    ("biencoder.engine.inference.retriever.EncodingSettings", "batch_size"): "trainer.eval_batch_size",
    ("biencoder.engine.inference.export.embed", "batch_size"): "trainer.eval_batch_size",
}
#: (parameter, default) -> why that value, wherever it is a default, is not the key's of the same name
RESOLVED = {
    ("device", "cpu"): "a device already decided (cpu, cuda:<n>); decide() takes trainer.device's choice (auto)",
    ("progress", False): "bars on or off, decided from trainer.progress (auto: when stderr is a terminal) by the app",
    ("progress", True): "bars on or off, decided from trainer.progress (auto: when stderr is a terminal) by the app",
    ("split", None): "the name of a split, for messages: neither data.columns.split nor eval.split",
}
#: (callable, parameter) -> why its default is its own, not a key's
OWN_DEFAULT = {
    ("biencoder.engine.inference.retriever.Retriever.search", "k"): (
        "the hits returned (biencoder-retrieve -k); the shortlist is the run's own eval.k"
    ),
    ("biencoder.engine.inference.retriever.EncodingSettings", "cache_dir"): (
        "schema.default_cache_dir(), the one definition of trainer.cache_dir's default, read at import"
    ),
    ("biencoder.engine.modeling.encoding.TextEncoder", "cache_dir"): "None: an encoder without a cache",
    ("biencoder.engine.modeling.cache.EmbeddingCache", "precision"): (
        "the precision the encoder ran in (fp32 | bf16), which decide() made of trainer.precision"
    ),
    ("biencoder.engine.modeling.encoding.embed_pooled", "batch_size"): (
        "rows per sim-head block, not trainer.batch_size (the training triplets); encode() embeds a fine-tuned run's "
        "splits with it, so another value is a question of numbers, not of defaults"
    ),
    ("biencoder.engine.modeling.encoding.pair_margins", "batch_size"): (
        "pairs per classifier block, not trainer.batch_size; a run passes Rerank.batch_size (shortlist_margins)"
    ),
    ("biencoder.engine.retrieval.rerank.shortlist_margins", "batch_size"): (
        "pairs per classifier block, not trainer.batch_size; a run passes Rerank.batch_size, the Retriever this one"
    ),
    ("biencoder.engine.retrieval.metrics.group_top1", "key"): (
        "the prefix of the per-group record keys (top1_unseen, top1_seen), not the metric eval.select names"
    ),
    ("biencoder.engine.training.run.run", "experiment"): (
        "the MLflow experiment when logger.mlflow.experiment is null: the app passes the sweep's, runs otherwise"
    ),
    ("biencoder.engine.training.runner.Runner", "experiment"): (
        "the MLflow experiment when logger.mlflow.experiment is null: the app passes the sweep's, runs otherwise"
    ),
}


# -- the schema's keys ----------------------------------------------------------------------------------------------
def _node_type(annotation) -> type | None:
    """The schema dataclass an annotation names (``X`` or ``X | None``), else None."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next((a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a)), None)
    return None


def schema_keys() -> dict[str, list[tuple[type, str]]]:
    """Every dotted key of the schema -> the (schema class, field) pairs that hold it: every option of the ``loss``
    group (``loss.ce_weight`` is held by two) and the optional logger subtrees included."""
    keys: dict[str, list[tuple[type, str]]] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            node = _node_type(hints[f.name])
            if node is schema.LossSchema:
                for option in schema.LOSS_OPTIONS.values():
                    walk(option, f"{prefix}{f.name}.")
            elif node is not None:
                walk(node, f"{prefix}{f.name}.")
            else:
                keys.setdefault(prefix + f.name, []).append((cls, f.name))

    walk(schema.Schema, "")
    return keys


KEYS = schema_keys()


# -- the engine's parameters ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """A parameter with a default: where (``module.Qualname``), its name and default, the default's expression."""

    where: str
    name: str
    default: object
    expr: ast.expr | None
    scope: dict


def _function_defaults(fn, source: str | None = None) -> dict[str, ast.expr]:
    """A function's parameter -> its default's expression, from its source (``source``, else the file's)."""
    tree = ast.parse(textwrap.dedent(source or inspect.getsource(fn)))
    node = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    args = node.args
    positional = args.posonlyargs + args.args
    out = {a.arg: d for a, d in zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)}
    out.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
    return out


def _field_defaults(cls: type) -> dict[str, ast.expr]:
    """A dataclass's field -> its default's expression (``= value`` or ``field(default=value)``), bases first; each
    expression carries the globals of the module that wrote it (``scope``: a field inherited from another module's
    class reads that module's names)."""
    out: dict[str, ast.expr] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)).body
        for stmt in body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                value = stmt.value
                if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
                    value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
                if value is not None:
                    value.scope = vars(inspect.getmodule(klass))
                    out[stmt.target.id] = value
    return out


def _params(where: str, fn, exprs: dict[str, ast.expr], scope: dict) -> list[Param]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [
        Param(where, p.name, p.default, exprs.get(p.name), getattr(exprs.get(p.name), "scope", scope))
        for p in signature.parameters.values()
        if p.default is not inspect.Parameter.empty
    ]


def modules() -> list[types.ModuleType]:
    """The engine's modules (the schema itself left out: it is the source) and the apps."""
    names = [m.name for m in pkgutil.walk_packages(biencoder.engine.__path__, "biencoder.engine.")]
    names += [f"biencoder.{app}" for app in APPS]
    return [importlib.import_module(n) for n in names if n != schema.__name__ and not n.endswith("__main__")]


def callables() -> list[tuple[str, object, dict[str, ast.expr]]]:
    """Every public function, class (its constructor) and public method defined in :func:`modules`: (where, the
    callable, its parameters' default expressions)."""
    out = []
    for module in modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            where = f"{module.__name__}.{name}"
            if inspect.isfunction(obj):
                out.append((where, obj, _function_defaults(obj)))
            elif inspect.isclass(obj):
                if dataclasses.is_dataclass(obj):
                    out.append((where, obj, _field_defaults(obj)))
                elif "__init__" in vars(obj):
                    out.append((where, obj, _function_defaults(obj.__init__)))
                for method_name, method in vars(obj).items():
                    fn = getattr(method, "__func__", method)
                    if not method_name.startswith("_") and inspect.isfunction(fn):
                        out.append((f"{where}.{method_name}", fn, _function_defaults(fn)))
    return out


CALLABLES = callables()


def engine_params() -> list[Param]:
    """Every parameter with a default of :data:`CALLABLES`."""
    return [p for where, obj, exprs in CALLABLES for p in _params(where, obj, exprs, vars(inspect.getmodule(obj)))]


# -- the rule -------------------------------------------------------------------------------------------------------
def keys_of(p: Param) -> tuple[str, ...]:
    """The config keys ``p`` stands for (none: it is no config key's)."""
    if (p.where, p.name) in KEY_OF:
        return (KEY_OF[p.where, p.name],)
    by_name = tuple(key for key in KEYS if key.rsplit(".", 1)[-1] == p.name)
    if by_name:
        return by_name
    if isinstance(p.default, str):
        return tuple(key for const, keys in CHOICES.items() if p.default in getattr(schema, const) for key in keys)
    return ()


def _resolved(p: Param) -> bool:
    try:
        return (p.name, p.default) in RESOLVED
    except TypeError:  # an unhashable default
        return False


def read_from(expr: ast.expr | None, scope: dict) -> tuple[type, str] | None:
    """(schema class, field) when ``expr`` reads ``SchemaClass.field`` (a dotted name that resolves, in the module's
    ``scope``, to a class of the schema module, then one attribute), else None."""
    if not isinstance(expr, ast.Attribute):
        return None
    parts, node = [], expr.value
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in scope:
        return None
    owner = scope[node.id]
    for attr in reversed(parts):
        owner = getattr(owner, attr, None)
    if not (inspect.isclass(owner) and owner.__module__ == schema.__name__):
        return None
    return owner, expr.attr


def problem(p: Param) -> str | None:
    """Why ``p``'s default breaks the rule, or None."""
    keys = keys_of(p)
    if not keys or (p.where, p.name) in OWN_DEFAULT or _resolved(p):
        return None
    holders = [holder for key in keys for holder in KEYS[key]]
    read = read_from(p.expr, p.scope)
    if read in holders:
        return None
    schema_side = " or ".join(f"{cls.__name__}.{name} = {getattr(cls, name)!r}" for cls, name in holders)
    if all(getattr(*holder) != p.default for holder in holders):
        return f"{p.where}({p.name}={p.default!r}) differs from the schema's {schema_side}"
    return f"{p.where}({p.name}={p.default!r}) writes the schema's value again: read {schema_side}, or take no default"


PARAMS = engine_params()


def test_every_config_backed_default_is_read_from_the_schema():
    assert [found for p in PARAMS if (found := problem(p))] == []


def test_the_reading_finds_the_config_backed_parameters():
    """The rule above holds nothing if no parameter is found: these are config-backed whatever their defaults."""
    found = {(p.where.rsplit(".", 1)[-1], p.name): keys_of(p) for p in PARAMS}
    assert found[("BiModel", "pooling")] == ("model.pooling",)
    assert found[("BiModel", "sim_dim")] == ("model.sim_dim",)
    assert found[("Rerank", "index")] == ("negatives.index", "eval.index")
    space = {"model.fusion", "eval.retrieve", "eval.score"}  # found by its default, "sim": a choice of each
    assert set(found[("Rerank", "space")]) == space
    assert found[("Rerank", "batch_size")] == ("eval.pair_batch_size",)
    assert found[("Mining", "n_neighbors")] == ("negatives.n_neighbors",)
    assert found[("TripletCELoss", "margin")] == ("loss.margin",)
    assert found[("InfoNCELoss", "scale")] == ("loss.scale",)
    assert found[("decide", "precision")] == ("trainer.precision",)
    assert len(KEYS["loss.ce_weight"]) == 2 and "logger.mlflow.experiment" in KEYS and "seed" in KEYS


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f(pooling='mean'): pass", "writes the schema's value again"),
        ("def f(pooling=ModelSchema.pooling): pass", None),
        ("def f(pooling='pooler'): pass", "differs from the schema's ModelSchema.pooling = 'mean'"),
        ("def f(pooling=ModelSchema.fusion): pass", "differs"),  # another key's
        ("def f(kind='balltree'): pass", "differs"),  # found by its value: one of INDEXES
        ("def f(kind='exact'): pass", "writes the schema's value again"),
        ("def f(kind=EvalSchema.index): pass", None),
        ("def f(batch_size=16): pass", "writes the schema's value again"),  # trainer.batch_size's
        ("def f(device='cpu'): pass", None),  # RESOLVED
        ("def f(device='auto'): pass", "writes the schema's value again"),
        ("def f(width=100): pass", None),  # no key's
    ],
)
def test_the_rule_refuses_a_default_that_is_not_read_from_the_schema(source, expected):
    scope = {"ModelSchema": schema.ModelSchema, "EvalSchema": schema.EvalSchema}
    exec(source, scope)
    [p] = _params("here.f", scope["f"], _function_defaults(scope["f"], source), scope)
    found = problem(p)
    assert found is None if expected is None else expected in found


def test_every_choice_tuple_of_the_schema_names_its_keys():
    tuples = {name for name, value in vars(schema).items() if name.isupper() and isinstance(value, tuple)}
    assert tuples == set(CHOICES)
    for keys in CHOICES.values():
        assert all(key in KEYS for key in keys)


def test_every_exception_names_a_parameter_that_exists():
    """An entry of KEY_OF or OWN_DEFAULT whose parameter went (renamed, removed) is dropped, not kept."""
    present = {(p.where, p.name) for p in PARAMS}
    assert [entry for entry in (*KEY_OF, *OWN_DEFAULT) if entry not in present] == []
    used = {(p.name, p.default) for p in PARAMS if _resolved(p) and keys_of(p)}
    assert set(RESOLVED) <= used


# -- the settings objects a run builds --------------------------------------------------------------------------------
CPU = Runtime(torch.device("cpu"), "fp32")


def of_schema(cls: type):
    """``cls.of_run`` of the schema's defaults on a CPU (fp32, one process, bars off)."""
    hints = typing.get_type_hints(cls.of_run)
    args = []
    for name in inspect.signature(cls.of_run).parameters:
        kind = hints[name]
        args.append(CPU if kind is Runtime else kind() if dataclasses.is_dataclass(kind) else False)
    return cls.of_run(*args)


def _plain(settings) -> dict:
    """A settings object's fields, its device as a ``torch.device`` (``"cpu"`` and ``torch.device("cpu")`` alike)."""
    return {
        f.name: torch.device(getattr(settings, f.name)) if f.name == "device" else getattr(settings, f.name)
        for f in dataclasses.fields(settings)
    }


SETTINGS = sorted(
    {obj for _, obj, _ in CALLABLES if inspect.isclass(obj) and "of_run" in vars(obj)}, key=lambda c: c.__name__
)


def test_the_settings_objects_are_found():
    assert {cls.__name__ for cls in SETTINGS} >= {"Rerank", "Mining", "Encoding"}


def _defaults(cls: type) -> list[bool]:
    """Per field of a settings class: whether it has a default."""
    return [f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING for f in fields(cls)]


@pytest.mark.parametrize("cls", [c for c in SETTINGS if all(_defaults(c))], ids=lambda c: c.__name__)
def test_settings_built_with_no_arguments_are_what_a_run_of_the_schema_builds(cls):
    assert _plain(cls()) == _plain(of_schema(cls))


def test_settings_that_cannot_be_built_with_no_arguments_have_no_defaults_at_all():
    """A settings object is either all schema defaults (the tests above) or all given (the run's settings, which only
    their ``of_run`` makes): no field's default can drift from the schema's."""
    partly = [c.__name__ for c in SETTINGS if any(_defaults(c)) and not all(_defaults(c))]
    given = [c.__name__ for c in SETTINGS if not any(_defaults(c))]
    assert partly == [] and given == ["EvalSettings", "RunSettings", "TrainingSettings"]


def test_settings_given_as_a_default_are_what_a_run_of_the_schema_builds():
    defaults = [p for p in PARAMS if isinstance(p.default, tuple(SETTINGS))]
    assert {type(p.default).__name__ for p in defaults} >= {"Rerank", "Mining", "Encoding"}
    wrong = [p.where for p in defaults if _plain(p.default) != _plain(of_schema(type(p.default)))]
    assert wrong == []
