"""scripts/mutation_summary.py: docs/mutation.md's per-module table from ``mutmut results --all true``."""

import runpy

import pytest

from conftest import REPO

SCRIPT = runpy.run_path(str(REPO / "scripts" / "mutation_summary.py"))

LINES = [
    "    biencoder.engine.retrieval.search.x_distances__mutmut_1: survived",
    "    biencoder.engine.retrieval.search.x_distances__mutmut_2: killed",
    "    biencoder.engine.retrieval.search.xǁNeighbourIndexǁquery__mutmut_13: timeout",
    "    biencoder.engine.retrieval.search.xǁNeighbourIndexǁ__init____mutmut_4: not checked",
    "",
    "    biencoder.report.statistics.x_holm__mutmut_1: killed",
]


def test_a_part_way_run_counts_its_unchecked_mutants_apart():
    """Per module: 4 mutants, 3 checked, a timeout among the killed (2), 1 survivor of 3 checked; the unchecked one
    neither killed nor survived."""
    counts = SCRIPT["tally"](LINES)
    assert list(counts) == ["engine.retrieval.search", "report.statistics"]
    rows = SCRIPT["table"](counts).splitlines()
    assert rows[2] == "| `engine.retrieval.search` | 4 | 3 | 2 | 1 | 33.3 % |"
    assert rows[3] == "| `report.statistics` | 1 | 1 | 1 | 0 | 0.0 % |"


def test_a_line_that_is_not_mutmuts_is_named():
    with pytest.raises(ValueError, match="not a line of `mutmut results --all true`: 'survived'"):
        SCRIPT["tally"](["survived"])
