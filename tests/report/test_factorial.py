"""The factorial reading of a comparison (biencoder.report.design, biencoder.report.factorial) on planted runs whose
effects are worked out by hand; each case fails on a plausible wrong contrast (named in its docstring)."""

import numpy as np
import pytest
import yaml

from biencoder.report import SummaryError
from biencoder.report.design import find_design
from biencoder.report.factorial import factorial_markdown, factorial_table
from biencoder.report.runs import assign_cells, find_runs
from helpers import write_run

Q = 100  # test queries of every planted run


def hits(first: int, last: int = 0) -> np.ndarray:
    """[Q] bool: queries ``last`` … ``first`` − 1 right (all from 0 when ``last`` is 0)."""
    out = np.zeros(Q, bool)
    out[last:first] = True
    return out


def planted(tmp_path, cells: dict, extra: dict | None = None):
    """Runs in ``tmp_path``: ``cells`` maps (variant, seed) → hits, or (variant, seed, setting) → hits with
    ``extra[setting]`` a dict of dotted config keys set in that run. Returns the runs with their cells assigned."""
    for key, run_hits in cells.items():
        variant, seed, *setting = key
        folder = write_run(tmp_path / "_".join(map(str, key)), variant, seed, [0.1], [run_hits.mean()], run_hits)
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        for dotted, value in (extra or {}).get(setting[0] if setting else None, {}).items():
            *parents, leaf = dotted.split(".")
            node = config
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = value
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = find_runs([tmp_path])
    assign_cells(runs)
    return runs


def effects(runs, named=None, n_boot=2000):
    design, note = find_design(runs, named)
    assert note == "", note
    table = factorial_table(runs, design, n_boot)
    return design, table.set_index(["effect", "factor", "contrast"]) if "within" not in table else table


@pytest.mark.slow
def test_an_additive_design_has_its_main_effects_and_no_interaction(tmp_path):
    """LayerNorm costs 10 points with and without ReLU, ReLU gains 10 with and without LayerNorm: main effects −10
    and +10, interaction 0. Seeds 0 and 1 ran in every cell; `ln_relu` also ran seeds 2-4, at 0.50. The effect is
    read on the matched seeds 0, 1: the mean of each cell over all its seeds would give a LayerNorm effect of −4
    (ln_relu at 0.42), and a difference of the marginal means over runs −2.9."""
    means = {"plain": 30, "ln": 20, "relu": 40, "ln_relu": 30}
    cells = {(v, s): hits(n) for v, n in means.items() for s in (0, 1)}
    cells.update({("ln_relu", s): hits(50) for s in (2, 3, 4)})
    design, table = effects(planted(tmp_path, cells))
    assert [f.keys for f in design.factors] == [("model.head.use_layernorm",), ("model.head.use_relu",)]
    assert [f.reference for f in design.factors] == [(False,), (False,)]
    main_ln = table.loc[("main effect", "use_layernorm", "True − False, mean over use_relu")]
    main_relu = table.loc[("main effect", "use_relu", "True − False, mean over use_layernorm")]
    interaction = table.loc[
        (
            "interaction",
            "use_layernorm × use_relu",
            "use_layernorm True − False at use_relu=True minus at use_relu=False",
        )
    ]
    assert main_ln["effect_pt"] == pytest.approx(-10) and main_relu["effect_pt"] == pytest.approx(10)
    assert interaction["effect_pt"] == pytest.approx(0, abs=1e-12)
    assert (main_ln["seeds"], main_ln["pairing"], main_ln["ci_resamples"]) == (2, "matched", "queries")
    assert main_ln["verdict"] == "worse" and main_relu["verdict"] == "better"
    assert interaction["verdict"] == "no significant difference"


@pytest.mark.slow
def test_disjoint_seeds_weigh_each_cell_once_whatever_its_seeds(tmp_path):
    """No seed is shared: each cell is its mean over its own seeds, and every cell counts once. `ln` (2 seeds, at
    0.10 and 0.30) and `ln_relu` (3 seeds, 0.20 to 0.40) have means 0.20 and 0.30: the LayerNorm effect is −10;
    the difference of the marginal means over runs would be −9 (0.26 − 0.35)."""
    cells = {
        ("plain", 0): hits(30),
        ("ln", 1): hits(10),
        ("ln", 2): hits(30),
        ("relu", 3): hits(40),
        ("ln_relu", 4): hits(20),
        ("ln_relu", 5): hits(30),
        ("ln_relu", 6): hits(40),
    }
    _, table = effects(planted(tmp_path, cells))
    main_ln = table.loc[("main effect", "use_layernorm", "True − False, mean over use_relu")]
    assert main_ln["effect_pt"] == pytest.approx(-10)
    assert (main_ln["seeds"], main_ln["pairing"]) == ("1-3 per cell", "pooled")


@pytest.mark.slow
def test_a_pure_interaction_has_no_main_effects_and_the_stated_sign(tmp_path):
    """LayerNorm alone and ReLU alone each gain queries 30-39; together they lose them again. Query by query both
    main effects are 0 (p 1), and the interaction μ(ln_relu) − μ(relu) − μ(ln) + μ(plain) is −20 points: not +20
    (the opposite sign), not −10 (halved), and worse, since every resample is below 0."""
    means = {"plain": 30, "ln": 40, "relu": 40, "ln_relu": 30}
    _, table = effects(planted(tmp_path, {(v, s): hits(n) for v, n in means.items() for s in (0, 1, 2)}))
    by_effect = table.reset_index().set_index("effect")
    assert list(by_effect.loc["main effect", "effect_pt"]) == [0.0, 0.0]
    assert list(by_effect.loc["main effect", "p"]) == [1.0, 1.0]
    interaction = by_effect.loc["interaction"]
    assert interaction["effect_pt"] == pytest.approx(-20)
    assert (interaction["ci_low_pt"], interaction["ci_high_pt"]) < (0, 0) and interaction["p"] == 0.0
    assert interaction["verdict"] == "worse" and interaction["ci_resamples"] == "seeds+queries"
    assert list(table["p_holm"]) == [1.0, 1.0, 0.0]  # one Holm family over the table's three effects


@pytest.mark.slow
def test_a_three_level_factor_is_read_level_by_level_against_its_reference(tmp_path):
    """model.fusion ∈ {concat, sim, cls} × ReLU. Means (plain, relu): concat 0.30, 0.40; cls 0.20, 0.40; sim 0.40,
    0.50. The reference is the schema's default, concat (not cls, which sorts first): cls −5 and sim +10, each
    averaged over ReLU (against the mean of all levels, effect coding, cls would be −6.7); ReLU +13.3, averaged
    over the three levels (1/3 each); ReLU × cls +10 and ReLU × sim 0. Named as the reference, cls moves them."""
    means = {"concat": (30, 40), "cls": (20, 40), "sim": (40, 50)}
    cells = {
        (variant, s, fusion): hits(n[i])
        for fusion, n in means.items()
        for i, variant in enumerate(("plain", "relu"))
        for s in (0, 1, 2)
    }
    runs = planted(tmp_path, cells, {f: {"model.fusion": f} for f in means})
    design, table = effects(runs)
    assert [f.label for f in design.factors] == ["fusion", "use_relu"]
    assert design.factors[0].levels == (("concat",), ("cls",), ("sim",))
    shown = {(r.effect, r.contrast): r.effect_pt for r in table.reset_index().itertuples()}
    assert shown == pytest.approx(
        {
            ("level vs reference", "cls − concat, mean over use_relu"): -5,
            ("level vs reference", "sim − concat, mean over use_relu"): 10,
            ("main effect", "True − False, mean over fusion"): 40 / 3,
            ("interaction", "fusion cls − concat at use_relu=True minus at use_relu=False"): 10,
            ("interaction", "fusion sim − concat at use_relu=True minus at use_relu=False"): 0,
        }
    )
    _, named = effects(runs, ["model.fusion=cls", "model.head.use_relu"])
    assert named.loc[("level vs reference", "fusion", "sim − cls, mean over use_relu"), "effect_pt"] == pytest.approx(
        15
    )
    markdown = factorial_markdown(table.reset_index(), design)
    assert (
        "| level vs reference | fusion | cls − concat, mean over use_relu | 3 (matched, seeds+queries) | -5.0 |"
        in (markdown)
    )
    assert "Reference levels: fusion=concat, use_relu=False." in markdown and "Holm over the 5 effects" in markdown


@pytest.mark.slow
def test_keys_that_change_together_are_one_factor_and_named_factors_leave_strata(tmp_path):
    """Two losses, each at its own head_lr, × ReLU × encoder retrieval: loss.name and trainer.head_lr split the
    cells alike, so they are one factor (three factors, not four). Named, two of them leave the third as strata,
    one factorial each, in one Holm family."""
    settings = {
        f"{loss}_{retrieve}": {"loss.name": loss, "trainer.head_lr": lr, "eval.retrieve": retrieve}
        for loss, lr in (("triplet_ce", 3e-4), ("infonce", 1e-3))
        for retrieve in ("sim", "encoder")
    }
    cells = {
        (v, 0, name): hits(30 + 5 * i + 10 * (v == "relu"))
        for i, name in enumerate(settings)
        for v in ("plain", "relu")
    }
    runs = planted(tmp_path, cells, settings)
    design, _ = find_design(runs)
    assert sorted(f.keys for f in design.factors) == [
        ("eval.retrieve",),
        ("loss.name", "trainer.head_lr"),
        ("model.head.use_relu",),
    ]
    loss = next(f for f in design.factors if len(f.keys) == 2)
    assert loss.label == "loss + head_lr" and loss.text(loss.reference) == "triplet_ce, 0.0003"
    design, table = effects(runs, ["model.head.use_relu", "trainer.head_lr"])
    assert [f.keys for f in design.strata] == [("eval.retrieve",)]
    assert list(table["within"]) == ["retrieve=encoder"] * 3 + ["retrieve=sim"] * 3
    relu = table[table["factor"] == "use_relu"]
    assert list(relu["effect_pt"]) == pytest.approx([10, 10])
    assert table["p_holm"].max() <= 1 and len(table) == 6


def test_cells_that_do_not_cross_their_factors_give_a_note_or_an_error(tmp_path):
    """Three cells of a 2 × 2: no table, one line naming a missing combination; named, it is an error. One factor:
    nothing to say. A named key that separates no cells, or is no config key, is an error naming it."""
    three = {(v, 0): hits(30) for v in ("plain", "ln", "relu")}
    runs = planted(tmp_path / "three", three)
    design, note = find_design(runs)
    assert design is None and "do not cross use_layernorm × use_relu" in note
    assert "1 combination(s) without a cell, e.g. use_layernorm=True use_relu=True" in note
    with pytest.raises(SummaryError, match="^--factors model.head.use_relu model.head.use_layernorm: no factorial"):
        find_design(runs, ["model.head.use_relu", "model.head.use_layernorm"])
    assert find_design(planted(tmp_path / "one", {(v, 0): hits(30) for v in ("plain", "ln")})) == (None, "")
    with pytest.raises(SummaryError, match="--factors data.name: it does not separate the cells"):
        find_design(runs, ["data.name", "model.head.use_relu"])
    with pytest.raises(SummaryError, match=r"--factors head.use_relu is not a config key .*did you mean model.head"):
        find_design(runs, ["head.use_relu"])
    with pytest.raises(SummaryError, match="--factors model.head.use_relu=maybe: no cell has that value"):
        find_design(runs, ["model.head.use_relu=maybe", "model.head.use_layernorm"])


def test_a_design_whose_cells_have_not_finished_has_no_numbers_yet(tmp_path):
    runs = planted(tmp_path, {(v, 0): hits(30) for v in ("plain", "ln", "relu", "ln_relu")})
    for run in runs:
        if run.variant == "ln_relu":
            run.final = None
    design, _ = find_design(runs)
    table = factorial_table(runs, design, 100)
    assert table.empty and "Not yet" in factorial_markdown(table, design)


@pytest.mark.slow
def test_a_sweep_over_the_head_s_norms_is_one_factor_of_norms_and_the_card_s_runs_keep_their_switches(tmp_path):
    """model.head.norm ∈ {none, layernorm, rmsnorm} × activation ∈ {none, gelu} (docs/heads.md). Means (none,
    gelu): none 0.30, 0.40; layernorm 0.20, 0.30; rmsnorm 0.40, 0.50. The norm is one three-level factor with the
    reference none (the default head, not layernorm, which sorts first), not the card's switch use_layernorm, which
    would put none and rmsnorm at one level and leave the cells uncrossed; the activation, whose levels are not
    the card's, is a factor of its own: layernorm −10, rmsnorm +10, GELU +10. A card run of the same sweep spelt with
    the flags (plain, with norm none) shares the cell of none/none."""
    means = {"none": (30, 40), "layernorm": (20, 30), "rmsnorm": (40, 50)}
    for norm, pair in means.items():
        for activation, n in zip(("none", "gelu"), pair, strict=True):
            name = "_".join(p for p in ("ln" if norm == "layernorm" else norm, activation) if p != "none") or "plain"
            for seed in (0, 1):
                run_hits = hits(n)
                head = {"norm": norm, "activation": activation}
                if name == "plain" and seed == 1:
                    head = {"use_layernorm": False, "use_relu": False}  # the card's spelling of the same head
                write_run(tmp_path / f"{name}_{seed}", name, seed, [0.1], [run_hits.mean()], run_hits, head=head)
    runs = find_runs([tmp_path])
    assign_cells(runs)
    assert sorted({r.cell for r in runs}) == ["gelu", "ln", "ln_gelu", "plain", "rmsnorm", "rmsnorm_gelu"]
    design, table = effects(runs)
    assert [f.keys for f in design.factors] == [("model.head.activation",), ("model.head.norm",)]
    assert design.factors[1].levels == (("none",), ("layernorm",), ("rmsnorm",))
    shown = {(r.effect, r.contrast): r.effect_pt for r in table.reset_index().itertuples()}
    assert shown[("main effect", "gelu − none, mean over norm")] == pytest.approx(10)
    assert shown[("level vs reference", "layernorm − none, mean over activation")] == pytest.approx(-10)
    assert shown[("level vs reference", "rmsnorm − none, mean over activation")] == pytest.approx(10)
