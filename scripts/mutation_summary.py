"""The per-module table of a mutation run (docs/mutation.md), from ``mutmut results --all true``.

    mutmut results --all true | python scripts/mutation_summary.py
    mutmut results --all true | python scripts/mutation_summary.py --classes results/mutation/survivors.tsv

Reads the ``<module>.x_<function>__mutmut_<n>: <status>`` lines mutmut prints (methods: ``xǁ<Class>ǁ<method>``) and
prints one markdown row per module (its path under ``src/biencoder/``): its mutants; how many were checked; killed (a
timeout counts as killed: the mutant never finishes; so does one a type check caught); survived, with "no tests"
(no test reaches the mutated function: nothing would notice it); any other status mutmut gives (suspicious,
segfault, skipped), named; and the survivors' share of the checked ones. A run stopped part-way is read as it stands:
its unchecked and interrupted mutants are counted apart, never as killed or survived.

With ``--classes``, a second table sorts each module's survivors by the class a reader gave each of them in a
tab-separated file (columns ``mutant``, ``class``, ``why``; the classes of docs/mutation.md, "Reading the result"),
and counts the survivors no row classifies.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(?P<name>(?P<module>[\w.]+)\.x(?:ǁ\w+ǁ|_)\w+__mutmut_\d+): (?P<status>.+?)\s*$")
KILLED = {"killed", "timeout", "caught by type check"}
SURVIVED = {"survived", "no tests"}
UNCHECKED = {"not checked", "check was interrupted by user"}
#: what a surviving mutant is (docs/mutation.md, "Reading the result"), in the order of the survivors' table
CLASSES = ("equivalent", "device-only", "ddp-only", "message-only", "number: a test added")


def parsed(lines) -> list[tuple[str, str, str]]:
    """(module path under ``src/biencoder/``, mutant name, status) per line; ValueError naming a line that is not
    mutmut's."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        found = LINE.match(line)
        if found is None:
            raise ValueError(f"not a line of `mutmut results --all true`: {line.strip()[:80]!r}")
        out.append(
            (found["module"].removeprefix("biencoder.").replace(".", "/") + ".py", found["name"], found["status"])
        )
    return out


def tally(lines) -> dict[str, Counter]:
    """Module (its path under ``src/biencoder/``) → Counter of statuses; ValueError naming a line that is not
    mutmut's."""
    out: dict[str, Counter] = defaultdict(Counter)
    for path, _, status in parsed(lines):
        out[path][status] += 1
    return dict(out)


def read_classes(lines) -> dict[str, str]:
    """Mutant name → class, from the lines of a tab-separated file whose first line is its header (``mutant``,
    ``class``, ``why``); ValueError naming a row of another class or of fewer columns."""
    out = {}
    for number, line in enumerate(list(lines)[1:], start=2):
        if not line.strip():
            continue
        cells = line.rstrip("\n").split("\t")
        if len(cells) != 3 or cells[1] not in CLASSES:
            raise ValueError(f"row {number} is not 'mutant<TAB>class<TAB>why' with a class of {', '.join(CLASSES)}")
        out[cells[0]] = cells[1]
    return out


def survivor_table(lines, classes: dict[str, str]) -> str:
    """Per module, its survivors of :func:`parsed`'s lines (survived or no tests) by their class in ``classes``, and
    those no class names."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for path, name, status in parsed(lines):
        row = counts[path]  # every module a row, survivors or not
        if status in SURVIVED:
            row[classes.get(name, "unclassified")] += 1
    columns = (*CLASSES, "unclassified")
    rows = ["| module | survived | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for module, c in counts.items():
        cells = [str(c[name]) if c[name] else "–" for name in columns]
        rows.append(f"| `{module}` | {sum(c.values())} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table(counts: dict[str, Counter]) -> str:
    """The markdown table of :func:`tally`'s counts, modules in the order given."""
    rows = [
        "| module | mutants | checked | killed (timeouts included) | survived (no tests included) | other | "
        "survived / checked |",
        "|---|---|---|---|---|---|---|",
    ]
    for module, c in counts.items():
        total, killed, survived = sum(c.values()), sum(c[s] for s in KILLED), sum(c[s] for s in SURVIVED)
        checked = total - sum(c[s] for s in UNCHECKED)
        other = ", ".join(f"{n} {s}" for s, n in sorted(c.items()) if s not in KILLED | SURVIVED | UNCHECKED) or "–"
        share = f"{100 * survived / checked:.1f} %" if checked else "–"
        rows.append(f"| `{module}` | {total} | {checked} | {killed} | {survived} | {other} | {share} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=Path, help="the survivors' classes (tab-separated: mutant, class, why)")
    args = parser.parse_args(argv)
    classes = None
    if args.classes is not None:
        try:
            classes = read_classes(args.classes.read_text().splitlines())
        except (OSError, ValueError) as err:
            print(f"error: {args.classes}: {err}", file=sys.stderr)
            return 2
    lines = sys.stdin.readlines()
    try:
        counts = tally(lines)
    except ValueError as err:
        print(f"error: {err}; pipe `mutmut results --all true` into this script", file=sys.stderr)
        return 2
    print(table(counts))
    if classes is not None:
        print()
        print(survivor_table(lines, classes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
