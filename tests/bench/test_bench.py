"""biencoder.bench (``scripts/bench.py``): importable without Hydra, its headline is the defaults' figure, and its
epoch-by-phase and per-step items run on the CPU (tiny settings)."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import biencoder.bench
from biencoder.bench import cli, common, epoch_phases, eval_speed, finetune_epoch, import_graph, step_counts

REPO = Path(__file__).resolve().parents[2]
BENCH = Path(biencoder.bench.__file__).parent


@pytest.mark.slow
def test_importing_the_bench_imports_no_hydra():
    """Every module of the package, the command line included: the items that compose a run import Hydra then."""
    modules = [f"biencoder.bench.{m.name}" for m in pkgutil.iter_modules([str(BENCH)]) if m.name != "__main__"]
    assert "biencoder.bench.cli" in modules and "biencoder.bench.eval_speed" in modules
    code = f"import sys; import {', '.join(modules)}; assert not [m for m in sys.modules if m.startswith('hydra')]"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


@pytest.mark.slow
def test_the_script_is_the_packages_command_line():
    """scripts/bench.py runs biencoder.bench's command line: the same options, no path set-up of its own."""
    out = subprocess.run(
        [sys.executable, "scripts/bench.py", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("usage: bench.py [-h] [--corpus CORPUS]")
    assert "--gpu-only" in out and "--items sweep --jobs 4 8 12" in out
    assert "sys.path" not in (REPO / "scripts" / "bench.py").read_text()


@pytest.mark.slow
def test_the_bench_package_keeps_the_house_limits():
    """No module over 350 lines, no function over 50 lines or with more than 6 parameters."""
    sizes = {path.name: len(path.read_text().splitlines()) for path in BENCH.glob("*.py")}
    assert max(sizes.values()) <= 350, sizes
    assert import_graph.long_functions(BENCH) == []
    assert import_graph.wide_functions(BENCH) == []


def test_the_headline_is_the_default_index_with_the_other_beside_it():
    """eval.index's default (exact) gives the headline figure; BallTree's is beside it, named."""
    assert eval_speed.DEFAULT_INDEX == "exact"
    line = eval_speed.headline({"balltree": 8.44, "exact": 65.06})
    assert line == "eval_speedup_vs_seed_style: 65.1 (eval.index=exact, the default; balltree: 8.4)"


@pytest.mark.slow
def test_the_eval_item_prints_the_default_configs_figure_last(tmp_path, capsys):
    """Item 1 end to end on the demo's test split: the last line is the figure of the index a composed default run
    searches with (its ``(exact)`` column), not the BallTree column beside it."""
    from conftest import compose_cfg

    default = compose_cfg().eval.index
    code, out = _printed(capsys, ["--items", "eval", "--corpus", str(tmp_path / "nowhere")])
    assert code == 0
    row = next(line for line in out if line.startswith("CPU (") and "demo test" in line)
    balltree, exact = re.findall(r"([\d.]+)x", row)
    assert out[-1] == f"eval_speedup_vs_seed_style: {exact} (eval.index={default}, the default; balltree: {balltree})"


def test_which_items_run():
    """The plain command runs every item but the 20-run ablation; --gpu-only keeps the GPU targets of the step and the
    epoch (2, 5, 6) and the peer (8); the ablation runs only when named."""

    def chosen(*argv):
        return cli.chosen_items(cli.parse_args(list(argv)))

    assert chosen() == set(cli.ITEMS) - {"sweep"}
    assert chosen("--gpu-only") == {"train", "steps", "finetune", "peer"}
    assert chosen("--items", "sweep") == chosen("--gpu-only", "--items", "sweep") == {"sweep"}
    assert chosen("--skip-frozen") == set(cli.ITEMS) - {"sweep", "frozen"}


@pytest.mark.slow
def test_finetune_epoch_by_phase_on_cpu():
    overrides = finetune_epoch.finetune_overrides(cuda=False) + ["trainer.batch_size=8"]
    result = epoch_phases.bench_epoch_phases(overrides, epochs=1)
    phases = result["phases"]
    expected = {f"tokenise {s} (once)" for s in ("train", "val", "test")} | {
        "mine",
        "train",
        "log",
        "checkpoint",
        "rest",
        "epoch",
    }
    expected |= {f"{what} {s}" for what in ("encode", "retrieve+rerank") for s in ("train", "val", "test")}
    assert set(phases) - {"keep best"} == expected  # keep best: only when val improved in the timed epoch
    assert result["steps"] == 4  # 32 demo training pairs in batches of 8
    assert all(seconds > 0 for seconds in phases.values())
    # the phases are measured inside the epoch, so they cannot add up to more than it
    # rest = the epoch less its phases: small unless a phase's work fell out of the Runner.phase hook
    assert phases["rest"] < 0.5 * phases["epoch"]


@pytest.mark.slow
def test_the_bench_times_the_runners_own_epoch(monkeypatch):
    """The phases come from Runner.run_epoch itself, not from a copy of its loop in the bench: the epoch's rows are
    logged, the best weights copied when val improves and last.pt written, each inside its phase."""
    from biencoder.engine.training.runner import Runner

    seen = []
    for method in ("_append", "_weights_on_cpu", "save_last"):
        original = getattr(Runner, method)

        def spy(self, *args, _name=method, _original=original):
            seen.append((_name, sorted(self.phase.open)))
            return _original(self, *args)

        monkeypatch.setattr(Runner, method, spy)
    monkeypatch.setattr(common.PhaseTimer, "open", set(), raising=False)
    enter = common.PhaseTimer.__call__

    def tracked(self, name, fn):
        self.open = self.open | {name}
        try:
            return enter(self, name, fn)
        finally:
            self.open = self.open - {name}

    monkeypatch.setattr(common.PhaseTimer, "__call__", tracked)
    epoch_phases.bench_epoch_phases(finetune_epoch.finetune_overrides(cuda=False) + ["trainer.batch_size=8"], epochs=1)
    assert ("_append", ["epoch", "log"]) in seen
    assert ("save_last", ["checkpoint", "epoch"]) in seen
    assert ("_weights_on_cpu", ["epoch", "keep best"]) in seen  # epoch 0 is always the best so far


def test_the_profilers_own_exit_sync_is_not_a_step_sync():
    """On CUDA the profiler synchronises the device at its exit while it still records (measured on an H200: one
    cudaDeviceSynchronize per window of 8 and of 32 steps alike). That one is exempt; any other is counted, and a
    CPU window exempts only fused AdamW's step-counter reads."""
    from types import SimpleNamespace

    def events(*names, parent=None):
        return [SimpleNamespace(name=name, cpu_parent=parent) for name in names]

    cuda = torch.device("cuda")
    assert common._tally(events("aten::mm", "cudaDeviceSynchronize"), cuda) == (1, {}, 1)
    window = events("aten::mm", "aten::add", "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize")
    assert common._tally(window, cuda) == (2, {"cudaDeviceSynchronize": 1, "cudaStreamSynchronize": 1}, 1)
    assert common._tally(events("cudaStreamSynchronize"), cuda) == (0, {"cudaStreamSynchronize": 1}, 0)
    cpu = torch.device("cpu")
    read = common.SYNC_OPS[0]
    assert common._tally(events(read, "cudaDeviceSynchronize"), cpu) == (int(read.startswith("aten::")), {read: 1}, 0)
    adamw = SimpleNamespace(name=common.OPTIMIZER_KERNELS[0], cpu_parent=None)
    assert common._tally(events(read, parent=adamw), cpu)[1:] == ({}, 1)


@pytest.mark.slow
def test_a_frozen_training_step_reads_nothing_back(monkeypatch):
    """EpochTrainer.train_step leaves every value on the device: no .item()/tolist()/bool() of a tensor per step (only
    fused AdamW's kernel reads its CPU step counters), and the count would see one if it were added."""
    before = step_counts.bench_step_counts(frozen=True, steps=8)  # 8: one sampled step of statistics falls inside
    assert before["syncs"] == 0, before["sync_names"]
    assert before["exempt"] == 2  # the frozen ln_relu head: its flat tensor and the loose 2-value bias, one read each
    assert before["ops"] <= 445  # the target: at most half the 891 ops of the per-step loop it replaced

    from biencoder.engine.training import epoch

    original = epoch.EpochSums.add

    def reads_the_loss(self, parts, *tensors):
        parts["loss"].item()  # what a per-step log line would do
        return original(self, parts, *tensors)

    monkeypatch.setattr(epoch.EpochSums, "add", reads_the_loss)
    after = step_counts.bench_step_counts(frozen=True, steps=8)
    assert after["syncs"] == 1 and after["sync_names"] == {"aten::_local_scalar_dense": 1}
    assert after["ops"] > before["ops"]

    def lists_the_loss(self, parts, *tensors):
        parts["loss"].tolist()  # a CPU tensor's tolist() dispatches no op: the count catches it another way
        return original(self, parts, *tensors)

    monkeypatch.setattr(epoch.EpochSums, "add", lists_the_loss)
    listed = step_counts.bench_step_counts(frozen=True, steps=8)
    assert listed["syncs"] == 1 and listed["sync_names"] == {"Tensor.tolist": 1}


@pytest.mark.slow
def test_a_trained_encoder_step_reads_nothing_back():
    """The same for a step that trains the encoder (the tiny BERT here; the bench's row is MiniLM-sized): the encoder's
    attention mask is decided on the host before the step, so transformers' own padding check reads nothing back."""
    result = step_counts.bench_step_counts(frozen=False, steps=8, size="tiny")
    assert result["syncs"] == 0, result["sync_names"]
    assert result["exempt"] == 3  # the step counters of the flat encoder, the flat head and its 2-value bias


@pytest.mark.slow
def test_cache_check_counts_the_texts_the_run_encodes(tmp_path):
    """The bench's cold-cache check and the runner agree on a run's texts: after the runner has filled the cache,
    nothing is missing (the old check also asked for texts of pairs that data.dedup drops)."""
    from biencoder.engine.data.corpus import run_splits
    from biencoder.engine.training.runner import Runner

    cfg = common.compose_config(step_counts.step_overrides(frozen=True, cache_dir=tmp_path / "cache"))
    _, splits = run_splits(cfg.data)
    texts = {text for split in splits.values() for text in split.texts}
    cold = f"embedding cache cold: {len(texts)} of {len(texts)} texts missing"
    assert epoch_phases.cache_report(cfg).startswith(cold)
    Runner(cfg, tmp_path / "run")  # encodes and caches them
    assert epoch_phases.cache_report(cfg) is None


@pytest.mark.slow
def test_a_cold_cache_is_warmed_and_said_not_skipped(tmp_path):
    """bench_epoch_phases on a frozen run with an empty embedding cache says so, warms it and times the epoch; the
    second time the cache is warm and nothing is said."""
    overrides = step_counts.step_overrides(frozen=True, cache_dir=tmp_path / "cache")
    for expected in (["embedding cache cold"], []):
        said = []
        result = epoch_phases.bench_epoch_phases(overrides, epochs=1, say=said.append)
        assert [line.strip()[: len("embedding cache cold")] for line in said] == expected
        assert result["phases"]["epoch"] > 0 and result["steps"] == 1  # 32 demo pairs, 32 triplets a step


@pytest.mark.slow
def test_a_step_computes_its_statistics_only_on_sampled_steps(monkeypatch):
    """The head statistics and gradient norms cost ops on a CPU, so train_step computes them only on the steps that
    EpochSums samples: 18 steps (2 warm-up, 8 profiled, 8 timed) at trainer.stats_every 8 compute them 3 times."""
    from biencoder.engine.training import epoch

    calls = {"grad_norms": 0, "head": 0}
    grad_norms, head = epoch.EpochTrainer.grad_norms, epoch.head_statistics_vector

    def counted_grad_norms(self):
        calls["grad_norms"] += 1
        return grad_norms(self)

    def counted_head(*args):
        calls["head"] += 1
        return head(*args)

    monkeypatch.setattr(epoch.EpochTrainer, "grad_norms", counted_grad_norms)
    monkeypatch.setattr(epoch, "head_statistics_vector", counted_head)
    step_counts.bench_step_counts(frozen=True, steps=8)
    assert calls == {"grad_norms": 3, "head": 3}


@pytest.mark.slow
def test_a_resumed_optimizer_state_saved_by_foreach_adamw_runs_fused(tmp_path):
    """A last.pt written before the CPU used fused AdamW carries foreach in its param groups, and torch's
    load_state_dict restores that: EpochTrainer.load_state_dict sets fused again, and the next epoch trains."""
    from biencoder.engine.training.runner import Runner
    from conftest import FAST, compose_cfg

    runner = Runner(compose_cfg(FAST + ["+variant=ln_relu", "eval.baselines=false"]), tmp_path / "run")
    state = runner.trainer.state_dict()
    for group in state["optimizer"]["param_groups"]:
        group.update(fused=None, foreach=True)
    runner.trainer.load_state_dict(state)
    assert all(g["fused"] is True and g["foreach"] is None for g in runner.trainer.optimizer.param_groups)
    negatives = runner.trainer.mine(0, runner.evaluation.embed("train").sim)
    assert runner.trainer.train_epoch(0, negatives)["loss"] > 0


def _printed(capsys, argv) -> tuple[int, list[str]]:
    code = cli.main(argv)
    return code, capsys.readouterr().out.splitlines()


@pytest.mark.slow
def test_the_frozen_item_warms_the_cache_and_prints_frozen_epoch_s(tmp_path, monkeypatch, capsys):
    """Item 4 end to end, on a small corpus in the real corpus's layout: it says the cache is cold, warms it and prints
    the one line `frozen_epoch_s: <seconds>`; with no corpus it says it skipped and why."""
    from conftest import grid_layout, write_corpus

    root = write_corpus(tmp_path / "corpus", grid_layout())
    monkeypatch.setenv("BIENCODER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ARGUANA_ROOT", str(root))  # restored afterwards: the bench points the runs at --corpus
    code, out = _printed(capsys, ["--items", "frozen", "--corpus", str(root), "--epochs", "1"])
    assert code == 0
    assert any(line.strip().startswith("embedding cache cold:") for line in out), out
    assert len([line for line in out if re.fullmatch(r"frozen_epoch_s: \d+\.\d{3}", line)]) == 1, out
    assert any((tmp_path / "cache").iterdir())  # warmed in BIENCODER_CACHE_DIR, not the user's cache

    code, out = _printed(capsys, ["--items", "frozen", "--corpus", str(tmp_path / "nowhere")])
    assert code == 0 and not any(line.startswith("frozen_epoch_s") for line in out)
    assert f"   skipped (no ArguAna corpus at {tmp_path / 'nowhere'}; set ARGUANA_ROOT or pass --corpus)" in out


def test_the_frozen_item_measures_the_head_the_run_overrides_name(monkeypatch, capsys):
    """``--run-overrides`` reaches item 4's run (a head with a hidden layer, measured against the card's ln_relu),
    after the preset's own overrides, and its header says so."""
    from biencoder.bench import frozen_epoch

    seen = []
    result = {"phases": {"epoch": 1.0}, "cpu": {"epoch": 2.0}}
    monkeypatch.setattr(frozen_epoch, "corpus_found", lambda corpus: True)
    monkeypatch.setattr(frozen_epoch, "bench_epoch_phases", lambda overrides, epochs: seen.append(overrides) or result)
    monkeypatch.setattr(frozen_epoch, "print_phases", lambda result: None)
    code, out = _printed(capsys, ["--items", "frozen", "--run-overrides", "model.head.hidden=[256]"])
    assert code == 0 and seen == [frozen_epoch.frozen_overrides() + ["model.head.hidden=[256]"]]
    assert any("ln_relu model.head.hidden=[256];" in line for line in out) and "frozen_epoch_s: 1.000" in out


@pytest.mark.slow
def test_the_step_and_epoch_items_print_their_lines(monkeypatch, capsys):
    """Items 5 and 6 as the command prints them (item 5 on the tiny encoder here: the MiniLM-sized row takes ~30 s):
    the per-step counts with no host sync, and `finetune_epoch_s: <seconds>`."""
    counts = step_counts.bench_step_counts
    monkeypatch.setattr(step_counts, "bench_step_counts", lambda frozen, steps: counts(frozen, 8, size="tiny"))
    code, out = _printed(capsys, ["--items", "steps", "finetune", "--epochs", "1"])
    assert code == 0
    rows = [line for line in out if "ops/step" in line]
    assert len(rows) == 2 and all(re.search(r"host syncs/step +0\.0 \(none;", row) for row in rows), rows
    assert len([line for line in out if re.fullmatch(r"finetune_epoch_s: \d+\.\d{3}", line)]) == 1, out


def test_gpu_only_without_a_gpu_is_refused_not_run_on_the_cpu(capsys):
    """--gpu-only prints the GPU targets' figures; on a machine without CUDA it must not print CPU figures in their
    place (a tiny-model `finetune_epoch_s` would read as the GPU epoch): one line on stderr, exit 2."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert cli.main(["--gpu-only"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("bench.py: --gpu-only measures the GPU targets, but torch sees no CUDA device")
