"""The per-module table of a mutation run (docs/mutation.md), from ``mutmut results --all true``.

    mutmut results --all true | python scripts/mutation_summary.py

Reads the ``<module>.x_<function>__mutmut_<n>: <status>`` lines mutmut prints (methods: ``xǁ<Class>ǁ<method>``) and
prints one markdown row per module (its path under ``src/biencoder/``): its mutants; how many were checked; killed (a
timeout counts as killed: the mutant never finishes; so does one a type check caught); survived, with "no tests"
(no test reaches the mutated function: nothing would notice it); any other status mutmut gives (suspicious,
segfault, skipped), named; and the survivors' share of the checked ones. A run stopped part-way is read as it stands:
its unchecked and interrupted mutants are counted apart, never as killed or survived.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict

LINE = re.compile(r"^\s*(?P<module>[\w.]+)\.x(?:ǁ\w+ǁ|_)\w+__mutmut_\d+: (?P<status>.+?)\s*$")
KILLED = {"killed", "timeout", "caught by type check"}
SURVIVED = {"survived", "no tests"}
UNCHECKED = {"not checked", "check was interrupted by user"}


def tally(lines) -> dict[str, Counter]:
    """Module (its path under ``src/biencoder/``) → Counter of statuses; ValueError naming a line that is not
    mutmut's."""
    out: dict[str, Counter] = defaultdict(Counter)
    for line in lines:
        if not line.strip():
            continue
        found = LINE.match(line)
        if found is None:
            raise ValueError(f"not a line of `mutmut results --all true`: {line.strip()[:80]!r}")
        path = found["module"].removeprefix("biencoder.").replace(".", "/") + ".py"
        out[path][found["status"]] += 1
    return dict(out)


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


def main() -> int:
    try:
        counts = tally(sys.stdin)
    except ValueError as err:
        print(f"error: {err}; pipe `mutmut results --all true` into this script", file=sys.stderr)
        return 2
    print(table(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
