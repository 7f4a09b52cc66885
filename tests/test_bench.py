"""scripts/bench.py: importable without Hydra, and its epoch-by-phase and per-step items run on the CPU (tiny settings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import bench  # noqa: E402


def test_importing_the_bench_imports_no_hydra():
    code = "import sys; sys.path.insert(0, 'scripts'); import bench; assert 'hydra' not in sys.modules, 'hydra'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_finetune_epoch_by_phase_on_cpu():
    result = bench.bench_epoch_phases(bench.finetune_overrides(cuda=False) + ["trainer.batch_size=8"], epochs=1)
    phases = result["phases"]
    expected = {f"tokenise {s} (once)" for s in ("train", "val", "test")} | {"mine", "train", "log", "checkpoint",
                                                                             "epoch"}
    expected |= {f"{what} {s}" for what in ("encode", "retrieve+rerank") for s in ("train", "val", "test")}
    assert set(phases) == expected
    assert result["steps"] == 4  # 32 demo training pairs in batches of 8
    assert all(seconds > 0 for seconds in phases.values())
    # the phases are measured inside the epoch, so they cannot add up to more than it
    inside = sum(v for k, v in phases.items() if k != "epoch" and not k.startswith("tokenise"))
    assert inside <= phases["epoch"]


def test_a_frozen_training_step_reads_nothing_back(monkeypatch):
    """EpochTrainer.train_step leaves every value on the device: no .item()/tolist()/bool() of a tensor per step (only
    fused AdamW's kernel reads its CPU step counters), and the count would see one if it were added."""
    before = bench.bench_step_counts(frozen=True, steps=8)  # 8: one sampled step of statistics falls inside
    assert before["syncs"] == 0, before["sync_names"]
    assert before["exempt"] == 6  # the frozen ln_relu head's 6 parameters, one read each inside the fused kernel

    from biencoder.engine import epoch

    original = epoch.EpochSums.add

    def reads_the_loss(self, parts, *tensors):
        parts["loss"].item()  # what a per-step log line would do
        return original(self, parts, *tensors)

    monkeypatch.setattr(epoch.EpochSums, "add", reads_the_loss)
    after = bench.bench_step_counts(frozen=True, steps=8)
    assert after["syncs"] == 1 and after["sync_names"] == {"aten::_local_scalar_dense": 1}
    assert after["ops"] > before["ops"]


def test_cache_check_counts_the_texts_the_run_encodes(tmp_path):
    """The bench's cold-cache check and the runner agree on a run's texts: after the runner has filled the cache,
    nothing is missing (the old check also asked for texts of pairs that data.dedup drops)."""
    from biencoder.engine.corpus import run_splits
    from biencoder.engine.runner import Runner

    cfg = bench.compose_config(bench.step_overrides(frozen=True, cache_dir=tmp_path / "cache"))
    _, splits = run_splits(cfg.data)
    texts = {text for split in splits.values() for text in split.texts}
    assert bench.cache_report(cfg).startswith(f"embedding cache cold: {len(texts)} of {len(texts)} texts missing")
    Runner(cfg, tmp_path / "run")  # encodes and caches them
    assert bench.cache_report(cfg) is None


def test_a_step_computes_its_statistics_only_on_sampled_steps(monkeypatch):
    """The head statistics and gradient norms cost ops on a CPU, so train_step computes them only on the steps that
    EpochSums samples: 18 steps (2 warm-up, 8 profiled, 8 timed) at trainer.stats_every 8 compute them 3 times."""
    from biencoder.engine import epoch

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
    bench.bench_step_counts(frozen=True, steps=8)
    assert calls == {"grad_norms": 3, "head": 3}


def test_a_resumed_optimizer_state_saved_by_foreach_adamw_runs_fused(tmp_path):
    """A last.pt written before the CPU used fused AdamW carries foreach in its param groups, and torch's
    load_state_dict restores that: EpochTrainer.load_state_dict sets fused again, and the next epoch trains."""
    from biencoder.engine.runner import Runner

    from conftest import FAST, compose_cfg

    runner = Runner(compose_cfg(FAST + ["+variant=ln_relu", "eval.baselines=false"]), tmp_path / "run")
    state = runner.trainer.state_dict()
    for group in state["optimizer"]["param_groups"]:
        group.update(fused=None, foreach=True)
    runner.trainer.load_state_dict(state)
    assert all(g["fused"] is True and g["foreach"] is None for g in runner.trainer.optimizer.param_groups)
    negatives = runner.trainer.mine(0, runner.embed("train").sim)
    assert runner.trainer.train_epoch(0, negatives)["loss"] > 0
