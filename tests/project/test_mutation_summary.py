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
    "    biencoder.report.statistics.x_holm__mutmut_2: no tests",
    "    biencoder.report.statistics.x_holm__mutmut_3: check was interrupted by user",
    "    biencoder.report.statistics.x_holm__mutmut_4: segfault",
    "    biencoder.report.statistics.x_holm__mutmut_5: caught by type check",
]


def test_a_part_way_run_counts_its_unchecked_mutants_apart():
    """search.py: 4 mutants, 3 checked, a timeout among the killed (2), 1 survivor of 3 checked; the unchecked one
    neither killed nor survived. statistics.py: an interrupted check is unchecked, "no tests" a survivor (nothing
    would notice the mutant), a type check's catch a kill, a segfault named apart: killed + survived + other =
    checked."""
    counts = SCRIPT["tally"](LINES)
    assert list(counts) == ["engine/retrieval/search.py", "report/statistics.py"]
    rows = SCRIPT["table"](counts).splitlines()
    assert rows[2] == "| `engine/retrieval/search.py` | 4 | 3 | 2 | 1 | – | 33.3 % |"
    assert rows[3] == "| `report/statistics.py` | 5 | 4 | 2 | 1 | 1 segfault | 25.0 % |"


def test_a_line_that_is_not_mutmuts_is_named():
    with pytest.raises(ValueError, match="not a line of `mutmut results --all true`: 'survived'"):
        SCRIPT["tally"](["survived"])


def test_the_survivors_are_sorted_by_their_classes():
    """search.py's one survivor is classified; statistics.py's "no tests" mutant is a survivor no row classifies; a
    row for a mutant that did not survive (the killed x_holm__mutmut_1) counts nowhere."""
    classes = SCRIPT["read_classes"](
        [
            "mutant\tclass\twhy",
            "biencoder.engine.retrieval.search.x_distances__mutmut_1\tequivalent\tthe block size bounds memory only",
            "biencoder.report.statistics.x_holm__mutmut_1\tdevice-only\tkilled since",
        ]
    )
    rows = SCRIPT["survivor_table"](LINES, classes).splitlines()
    assert rows[0] == (
        "| module | survived | equivalent | device-only | ddp-only | message-only | number: a test added "
        "| unclassified |"
    )
    assert rows[2] == "| `engine/retrieval/search.py` | 1 | 1 | – | – | – | – | – |"
    assert rows[3] == "| `report/statistics.py` | 1 | – | – | – | – | – | 1 |"


def test_a_class_the_reading_does_not_know_is_named():
    with pytest.raises(ValueError, match="row 2 is not 'mutant<TAB>class<TAB>why'"):
        SCRIPT["read_classes"](["mutant\tclass\twhy", "a.x_f__mutmut_1\tharmless\tno"])
