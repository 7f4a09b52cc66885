"""The design of a comparison: the factors its cells differ in, their levels and reference levels, and whether the
cells cross them (:func:`find_design`), for the factorial reading of :mod:`biencoder.report.factorial`.

A factor is a config key whose value differs between cells (after :func:`~biencoder.report.runs.assign_cells`):
every key of the runs' resolved configs (schema defaults filled in, :func:`~biencoder.engine.config.settings.
run_settings`) but the seed and the keys that change no result (:data:`~biencoder.engine.config.settings.
NON_RESULT_KEYS`), so the head's keys and every other setting a sweep varies are found alike. The head's norm and
activation are the card's switches (``model.head.use_layernorm``, ``model.head.use_relu``) where every cell's is the
card's part or none, else the factors ``model.head.norm`` / ``.activation`` (:func:`_head_as_said`). Keys that
change together, one's value fixing the other's in every cell (``loss.name`` with ``trainer.head_lr``), are one
factor: apart they would be confounded. ``--factors KEY ...`` names the factors instead; the other keys that separate
cells are then strata, each read as a factorial of its own.

A factor's reference level is the one named with ``KEY=VALUE``; otherwise the level at the schema's default of its
first key that takes it (``False`` for a head switch, the default config's value for any other key); otherwise the
first level in sorted order. The other levels follow in sorted order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..engine.config.heads import FLAGS
from ..engine.config.settings import HEAD, is_non_result_key, run_settings
from . import SummaryError
from .runs import Run, label_key, label_value


@dataclass(frozen=True)
class Factor:
    """A factor of a design: its config ``keys`` (several when they change together), its ``levels`` (each the
    keys' values, reference first) and its ``label`` as the tables show it."""

    keys: tuple[str, ...]
    levels: tuple[tuple, ...]
    label: str

    @property
    def reference(self) -> tuple:
        return self.levels[0]

    def text(self, level: tuple) -> str:
        """A level as the tables print it: ``True``, or ``infonce, 0.001`` for keys that change together."""
        return ", ".join(label_value(value, key) for key, value in zip(self.keys, level, strict=True))


@dataclass
class Design:
    """The factorial design of a comparison's cells: ``factors`` (two or more), ``strata`` (the other keys that
    separate cells when the factors were named; each combination of their levels is a factorial of its own), and
    the cell at every combination of the factors' levels in every stratum (:meth:`cell`)."""

    factors: list[Factor]
    strata: list[Factor] = field(default_factory=list)
    #: repr((stratum levels, factor levels)) → cell name (levels may hold lists, which a dict key cannot)
    placed: dict[str, str] = field(default_factory=dict)
    #: the combinations of the strata's levels that ran, each once (one empty tuple without strata)
    stratum_levels: list[tuple] = field(default_factory=list)

    def combinations(self) -> list[tuple]:
        """Every combination of the factors' levels, one level per factor, the first factor's changing slowest."""
        return list(itertools.product(*(f.levels for f in self.factors)))

    def cell(self, stratum: tuple, combo: tuple) -> str | None:
        """The cell at ``combo`` (one level per factor) within ``stratum``, or None."""
        return self.placed.get(repr((stratum, combo)))


def find_design(runs: list[Run], named: list[str] | None = None) -> tuple[Design | None, str]:
    """(design, note) of the cells of ``runs`` (labelled by :func:`~biencoder.report.runs.assign_cells`).

    ``named``: the ``--factors`` (``KEY`` or ``KEY=REFERENCE``); None: every factor the cells differ in. Returns
    (None, "") when the cells differ in fewer than two factors, and (None, note) when they differ in two or more
    but are not a crossed design (a combination of levels without a cell, or two cells at one combination): the
    note says which, in one line. Raises :class:`SummaryError` when named factors are not keys that separate the
    cells, are fewer than two, or are not crossed.
    """
    cells = _cell_values(runs)
    candidates = _merged(_varying(cells), cells)
    named_keys = dict(part.partition("=")[::2] for part in named or [])
    if named is not None:
        _check_named(named_keys, candidates, runs)
        chosen = [keys for keys in candidates if set(keys) & set(named_keys)]
    else:
        chosen = candidates
    if len(chosen) < 2:
        if named is not None:
            raise SummaryError(f"--factors names {len(chosen)} factor: a factorial reading needs two or more")
        return None, ""
    all_keys = sorted(k for keys in candidates for k in keys)
    factors = [_factor(keys, cells, named_keys, all_keys) for keys in chosen]
    strata = [_factor(keys, cells, {}, all_keys) for keys in candidates if keys not in chosen]
    design = Design(factors, strata)
    problem = _place_cells(design, cells)
    if problem and named is not None:
        raise SummaryError(f"--factors {' '.join(named)}: {problem}")
    return (None, problem) if problem else (design, "")


def _cell_values(runs: list[Run]) -> dict[str, dict[str, object]]:
    """cell → {key: value} of the keys that can be factors: those with one value in every run of the cell."""
    by_cell: dict[str, list[Run]] = {}
    for run in runs:
        by_cell.setdefault(run.cell, []).append(run)
    keys = sorted({k for r in runs for k in r.flat if k != "seed" and not is_non_result_key(k)})
    cells = {
        cell: {k: members[0].flat.get(k) for k in keys if len({repr(r.flat.get(k)) for r in members}) == 1}
        for cell, members in by_cell.items()
    }
    return _head_as_said(cells)


def _head_as_said(cells: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    """``cells`` with each head part as the comparison says it: a run's settings hold its resolved head
    (:func:`~biencoder.engine.config.settings.run_settings`: ``model.head.norm``, ``.activation``, both flags
    null). Where every cell's norm is ``none`` or ``layernorm``, the norm is the card's switch
    ``model.head.use_layernorm`` (False/True) and ``model.head.norm`` is left out; otherwise the norm is the factor and
    the flag is left out. ``use_relu`` and the activation likewise. So the card's 2 × 2 reads as its two switches,
    and a sweep over norms as one factor of the norms (docs/heads.md)."""
    for flag, (part, named) in FLAGS.items():
        key, flag_key = HEAD + part, HEAD + flag
        values = [values[key] for values in cells.values() if key in values]
        as_switch = bool(values) and all(value in ("none", named) for value in values)
        for values in cells.values():
            if as_switch and key in values:
                values[flag_key] = values.pop(key) == named
            elif not as_switch:
                values.pop(flag_key, None)
    return cells


def _varying(cells: dict[str, dict[str, object]]) -> list[str]:
    """The keys, with one value in each cell, whose value differs between cells."""
    shared = set.intersection(*(set(values) for values in cells.values())) if cells else set()
    return sorted(k for k in shared if len({repr(values[k]) for values in cells.values()}) > 1)


def _merged(keys: list[str], cells: dict[str, dict[str, object]]) -> list[tuple[str, ...]]:
    """``keys`` grouped into factors: keys that split the cells into the same groups changed together, and are one
    factor."""
    groups: dict[frozenset, list[str]] = {}
    for key in keys:
        by_value: dict[str, set[str]] = {}
        for cell, values in cells.items():
            by_value.setdefault(repr(values[key]), set()).add(cell)
        groups.setdefault(frozenset(frozenset(g) for g in by_value.values()), []).append(key)
    return [tuple(group) for group in groups.values()]


def _check_named(named: dict[str, str], candidates: list[tuple[str, ...]], runs: list[Run]) -> None:
    """Raise :class:`SummaryError` for a ``--factors`` key that does not separate the cells."""
    separating = {k for keys in candidates for k in keys}
    for key in named:
        if key in separating:
            continue
        known = sorted({k for r in runs for k in r.flat if not is_non_result_key(k) and k != "seed"})
        if key in known:
            raise SummaryError(
                f"--factors {key}: it does not separate the cells (one value in all of them, or several in one); "
                f"keys that do: {', '.join(sorted(separating)) or 'none'}"
            )
        close = [k for k in known if k.split(".")[-1] == key.split(".")[-1]]
        raise SummaryError(
            f"--factors {key} is not a config key of these runs"
            + (f" (did you mean {close[0]}?)" if close else ": pass dotted keys such as model.head.use_relu")
        )


def _order(level: tuple) -> tuple:
    """A sort key for levels of any type: numbers (and booleans) by value, then strings, then anything else."""
    return tuple(
        (0, float(v), "")
        if isinstance(v, (bool, int, float))
        else (1, 0.0, v)
        if isinstance(v, str)
        else (2, 0.0, repr(v))
        for v in level
    )


def _factor(keys: tuple[str, ...], cells: dict[str, dict[str, object]], named: dict[str, str], shown: list[str]):
    """The :class:`Factor` of ``keys``: its levels in ``cells``, the reference first, then in sorted order;
    ``named``: the ``--factors`` with their reference values; ``shown``: every factor key (for the labels)."""
    found = {repr(level): level for level in (tuple(values[k] for k in keys) for values in cells.values())}
    levels = sorted(found.values(), key=_order)
    reference = _reference(keys, levels, named)
    rest = [level for level in levels if level is not reference]
    return Factor(keys, (reference, *rest), " + ".join(label_key(k, shown) for k in keys))


def _reference(keys: tuple[str, ...], levels: list[tuple], named: dict[str, str]) -> tuple:
    """The reference among ``levels`` of the factor of ``keys``: the level named ``KEY=VALUE``, else the one at the
    schema's default of its first key that takes it there, else the first. Raises :class:`SummaryError` for a
    named value that no cell has."""
    for i, key in enumerate(keys):
        if named.get(key):
            spelled = [level for level in levels if _spelled(level[i], named[key])]
            if not spelled:
                raise SummaryError(
                    f"--factors {key}={named[key]}: no cell has that value; its values: "
                    + ", ".join(label_value(level[i], key) for level in levels)
                )
            return spelled[0]
    defaults = run_settings({})
    for i, key in enumerate(keys):
        at_default = [level for level in levels if key in defaults and repr(level[i]) == repr(defaults[key])]
        if at_default:
            return at_default[0]
    return levels[0]


def _spelled(value, text: str) -> bool:
    """Whether ``text`` (from the command line) names the config value ``value``: ``true``, ``3e-4``, ``gelu``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value).lower() == text.lower()
    try:
        return float(text) == value
    except ValueError:
        return False


def _place_cells(design: Design, cells: dict[str, dict[str, object]]) -> str:
    """Place every cell in ``design``; returns "" for a crossed design, else the one line that says why it is not."""
    strata = {}
    for cell, values in sorted(cells.items()):
        stratum = tuple(tuple(values[k] for k in f.keys) for f in design.strata)
        combo = tuple(tuple(values[k] for k in f.keys) for f in design.factors)
        other = design.placed.setdefault(repr((stratum, combo)), cell)
        if other != cell:
            return f"no factorial table: cells {other} and {cell} are at the same level of every factor"
        strata[repr(stratum)] = stratum
    design.stratum_levels = sorted(strata.values(), key=lambda stratum: tuple(_order(level) for level in stratum))
    missing = [
        " ".join(f"{f.label}={f.text(level)}" for f, level in zip(design.factors, combo, strict=True))
        for stratum in design.stratum_levels
        for combo in design.combinations()
        if design.cell(stratum, combo) is None
    ]
    if missing:
        return (
            f"no factorial table: the cells do not cross {' × '.join(f.label for f in design.factors)} "
            f"({len(missing)} combination(s) without a cell, e.g. {missing[0]})"
        )
    return ""
