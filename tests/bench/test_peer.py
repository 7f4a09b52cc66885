"""biencoder.bench.peer (item 8): the triplets are the runner's own epoch 0, the item refuses a CPU in one line and
never stops the bench, the clock times only the steps after the warm-up; where sentence-transformers is installed,
its trainer trains on the batches in their order and the own loop stands in for it, saying why."""

from __future__ import annotations

import argparse
import ast

import pytest
import torch

from biencoder.bench import cli, peer, st_peer
from biencoder.bench.common import Devices

CPU = torch.device("cpu")


def _args(tmp_path) -> argparse.Namespace:
    return cli.parse_args(["--items", "peer", "--corpus", str(tmp_path)])


def test_the_peer_item_refuses_a_cpu_in_one_line(tmp_path, capsys):
    """A CPU figure cannot stand in for the GPU one: without CUDA the item prints its title and one line, no figure."""
    assert "peer" in cli.ITEMS and ("peer", peer.run) in cli.RUNS
    peer.run(_args(tmp_path), Devices(CPU, None))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "" and out[1].startswith("8. a peer: sentence-transformers' own trainer")
    assert out[2:] == ["   skipped (no CUDA device: the peer is a GPU figure, and a CPU one cannot stand in for it)"]
    if not torch.cuda.is_available():
        assert cli.main(["--items", "peer"]) == 0
        printed = capsys.readouterr().out
        assert "   skipped (no CUDA device" in printed and peer.HEADLINE not in printed


def test_a_failing_peer_is_one_line_and_the_bench_goes_on(tmp_path, monkeypatch, capsys):
    """Whatever fails inside the item (here composing the run) is one line with the reason, not a traceback."""

    def broken(overrides):
        raise RuntimeError("no config here\nsecond line")

    monkeypatch.setattr(peer, "corpus_found", lambda root: True)
    monkeypatch.setattr(peer, "compose_config", broken)
    peer.run(_args(tmp_path), Devices(CPU, torch.device("cuda")))  # a CUDA device as far as the item knows
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "peer_sentence_transformers_triplets_s: not measured (RuntimeError: no config here)"


@pytest.mark.parametrize("module", [peer, st_peer])
def test_importing_the_bench_needs_no_sentence_transformers(module):
    """The peer's modules import sentence-transformers, datasets, accelerate and transformers inside their functions
    only."""
    tree = ast.parse(open(module.__file__).read())
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in top if isinstance(node, ast.ImportFrom)]
    lazy = ("sentence_transformers", "datasets", "accelerate", "transformers")
    assert "torch" in names and not [name for name in names if name.split(".")[0] in lazy]


@pytest.mark.slow
def test_the_triplets_are_the_runners_own_epoch_0(tmp_path, monkeypatch):
    """epoch_triplets gives the texts of the (point, counter, negative) rows that the runner's own epoch 0 trains on,
    in its order, and leaves its random streams as it found them: the epoch run after it sees the same triplets. No
    negative has the point's or the counter's text."""
    from biencoder.engine.training.epoch import EpochTrainer
    from biencoder.engine.training.runner import Runner
    from conftest import FAST, compose_cfg

    runner = Runner(compose_cfg(FAST + ["+variant=ln_relu", "eval.baselines=false"]), tmp_path)
    triplets = peer.epoch_triplets(runner)
    split = runner.trainer.split
    assert len(triplets) == split.n_pairs == 30  # the demo's training pairs, each once
    assert all(n != p and n != c for p, c, n in triplets)
    assert len({n for _, _, n in triplets}) > 1

    seen = []
    step = EpochTrainer.train_step

    def spy(self, inputs, sums):
        seen.extend(inputs["text_id"].view(3, -1).T.tolist())
        return step(self, inputs, sums)

    monkeypatch.setattr(EpochTrainer, "train_step", spy)
    _, best, train_sim = runner.begin()
    runner.run_epoch(0, train_sim, best)
    text_id = dict(zip(split.texts, split.training_text_id.tolist(), strict=True))
    assert seen == [[text_id[text] for text in triplet] for triplet in triplets]


def test_the_clock_times_the_steps_after_the_warm_up(monkeypatch):
    """steps=3 after warmup=2: from the end of step 2 to the end of step 5; a peer that stops early has no time."""
    now = iter(range(100, 200, 10))
    monkeypatch.setattr(st_peer.time, "perf_counter", lambda: next(now))
    clock = st_peer.StepClock(CPU, st_peer.PeerSettings(steps=3, warmup=2))
    for step in range(1, 5):
        clock.step_ended(step)
    with pytest.raises(RuntimeError, match="stopped before step 5"):
        clock.seconds()
    clock.step_ended(5)
    assert clock.seconds() == 10  # two readings only: 100 at step 2, 110 at step 5
    with pytest.raises(ValueError, match="warmup >= 1"):
        st_peer.PeerSettings(warmup=0)


def test_the_batches_are_consecutive_triplets_again_from_the_first():
    triplets = [(f"p{i}", f"c{i}", f"n{i}") for i in range(10)]
    batches = st_peer.peer_batches(triplets, st_peer.PeerSettings(steps=3, warmup=1, batch_size=4))
    assert batches == [triplets[0:4], triplets[4:8], triplets[0:4], triplets[4:8]]  # 8-9: no full batch
    with pytest.raises(ValueError, match="10 triplets make no batch of 16"):
        st_peer.peer_batches(triplets, st_peer.PeerSettings())


def test_the_lines_say_what_ran_and_the_ratio():
    settings = st_peer.PeerSettings()
    versions = {"sentence-transformers": "6.2.0", "datasets": None}
    result = st_peer.PeerResult(200.0, st_peer.OWN_LOOP, "ModuleNotFoundError: x", versions, settings, "NVIDIA H200")
    assert peer.headline(result) == (
        "peer_sentence_transformers_triplets_s: 200.0 (sentence-transformers model+loss, own loop (trainer "
        "unavailable: ModuleNotFoundError: x); sentence-transformers 6.2.0, datasets -; 100 steps after 10, "
        "16 triplets x 128 tok, bf16; NVIDIA H200)"
    )
    assert peer.ratio(300.0, result) == 1.5
    assert peer.ratio_line(300.0, result) == (
        "ours_over_sentence_transformers: 1.50x (ours 300.0, sentence-transformers 200.0 triplets/s; "
        "target >= 1.5x: met)"
    )
    assert peer.ratio_line(299.0, result).endswith("target >= 1.5x: not met)")
    assert st_peer.one_line(ValueError("a\nb")) == "ValueError: a"
    assert len(st_peer.one_line(ValueError("x" * 500))) == 200


# -- with sentence-transformers installed ----------------------------------------------------------------------------
TINY = st_peer.PeerSettings(steps=2, warmup=1, batch_size=2, max_seq_length=16, bf16=False)


@pytest.fixture(scope="module")
def tiny_st_folder(tmp_path_factory):
    """A SentenceTransformer folder holding a random 2-layer BERT and MiniLM's tokenizer (mean pooling)."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, BertModel

    from biencoder.bench.common import bert_config
    from biencoder.engine.config.packaged import packaged_minilm_path

    folder = tmp_path_factory.mktemp("tiny-st")
    torch.manual_seed(0)
    BertModel(bert_config("tiny")).save_pretrained(folder / "hf")
    AutoTokenizer.from_pretrained(packaged_minilm_path()).save_pretrained(folder / "hf")
    SentenceTransformer(str(folder / "hf"), device="cpu").save(str(folder / "st"))
    return str(folder / "st")


def _triplets(n: int) -> list[tuple[str, str, str]]:
    return [(f"point {i} " * (1 + i % 3), f"counter {i}", f"negative {i} " * (1 + i % 5)) for i in range(n)]


def _recording_loss(monkeypatch) -> list[list[list[int]]]:
    """The anchors' token ids of every loss call, in order."""
    seen, make = [], st_peer._mnrl

    def recording(model):
        loss = make(model)
        forward = loss.forward

        def recorded(features, labels):
            seen.append(features[0]["input_ids"].tolist())
            return forward(features, labels)

        loss.forward = recorded
        return loss

    monkeypatch.setattr(st_peer, "_mnrl", recording)
    return seen


@pytest.mark.slow
def test_the_peer_trains_on_the_batches_in_their_order(tiny_st_folder, monkeypatch):
    """With datasets and accelerate installed, SentenceTransformerTrainer trains, on the batches of peer_batches in
    order (it would shuffle them), warm-up included; without either (the [dev] install has neither), the own loop
    trains on the same batches and the result says which package was missing. The result names the versions."""
    seen = _recording_loss(monkeypatch)
    triplets = _triplets(5)
    result = st_peer.bench_sentence_transformers(triplets, tiny_st_folder, CPU, TINY)
    missing = [name for name in ("datasets", "accelerate") if result.versions[name] is None]
    if missing:
        assert result.path == st_peer.OWN_LOOP and "No module named" in result.reason, result.reason
        assert any(name in result.reason for name in missing), result.reason
    else:
        assert (result.path, result.reason) == (st_peer.TRAINER, None)
    assert result.triplets_s > 0 and result.versions["sentence-transformers"] is not None
    tokenizer = st_peer._st_model(tiny_st_folder, CPU, TINY).tokenizer
    expected = [
        tokenizer([p for p, _, _ in batch], padding=True, truncation=True, max_length=16)["input_ids"]
        for batch in st_peer.peer_batches(triplets, TINY)
    ]
    assert seen == expected  # batches 0-1, 2-3, then 0-1 again: the 5th triplet makes no batch


@pytest.mark.slow
def test_without_the_trainer_the_own_loop_runs_and_says_why(tiny_st_folder, monkeypatch):
    """Where the trainer cannot be imported (the GPU image may lack accelerate), the same model and loss train in a
    plain loop on the same batches, and the label carries the reason."""

    def unavailable(*args):
        raise ModuleNotFoundError("No module named 'accelerate'")

    monkeypatch.setattr(st_peer, "_trainer_seconds", unavailable)
    seen = _recording_loss(monkeypatch)
    result = st_peer.bench_sentence_transformers(_triplets(4), tiny_st_folder, CPU, TINY)
    assert result.path == st_peer.OWN_LOOP and result.triplets_s > 0
    assert "own loop (trainer unavailable: ModuleNotFoundError: No module named 'accelerate')" in result.label()
    assert len(seen) == TINY.warmup + TINY.steps


@pytest.mark.slow
def test_the_item_prints_its_line_end_to_end(tmp_path, monkeypatch, capsys):
    """run() as a CUDA machine runs it, on the CPU and smaller: the demo's epoch-0 triplets (tiny encoder), the
    packaged MiniLM the config names, two steps of two triplets; one figure line naming what ran."""
    pytest.importorskip("sentence_transformers")
    small = st_peer.PeerSettings(steps=2, warmup=1, batch_size=2, max_seq_length=32, bf16=False)
    monkeypatch.setattr(peer, "TRIPLET_OVERRIDES", ["model=tiny", "+variant=ln_relu", "trainer.progress=false"])
    monkeypatch.setattr(st_peer, "PeerSettings", lambda: small)
    monkeypatch.setattr(peer, "corpus_found", lambda root: True)
    peer.run(_args(tmp_path), Devices(CPU, CPU))  # the CPU in the CUDA device's place
    ours, line, ratio = capsys.readouterr().out.splitlines()[-3:]
    assert line.startswith("peer_sentence_transformers_triplets_s: "), line
    assert "2 steps after 1, 2 triplets x 32 tok, fp32; CPU (" in line
    assert float(line.split()[1]) > 0
    assert ours.startswith("ours_triplets_s: ") and float(ours.split()[1]) > 0
    assert ratio.startswith("ours_over_sentence_transformers: ") and "target >= 1.5x" in ratio
    # the ratio is of the two printed figures (each rounded to 0.1 triplets/s)
    assert float(ratio.split()[1].rstrip("x")) == pytest.approx(float(ours.split()[1]) / float(line.split()[1]), 0.1)
