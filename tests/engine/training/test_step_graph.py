"""The training step as CUDA graphs (engine/training/step_graph.py): on any machine, the decisions (which mode, the
bucket widths, the padded batches, padding that changes no number); on a CUDA machine, the graphed step against the
eager step on the same batches."""

import numpy as np
import pytest
import torch

from biencoder.engine.training.epoch import EpochSums
from biencoder.engine.training.runner import Runner
from biencoder.engine.training.step_graph import SMALLEST_BUCKET, WARMUP, bucket_width, shape_key, step_mode
from biencoder.engine.training.triplets import TripletCollate
from biencoder.errors import ConfigError
from conftest import FAST, compose_cfg

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@pytest.mark.parametrize(
    "setting, device, world, compile, graphs, why",
    [
        ("auto", CUDA, 1, False, True, "one graph per batch shape"),
        (True, CUDA, 1, False, True, "one graph per batch shape"),
        (False, CUDA, 1, False, False, "trainer.cuda_graphs=false"),
        ("auto", CPU, 1, False, False, "runs on cpu"),
        ("auto", CUDA, 2, False, False, "2 processes train with DDP"),
        ("auto", CUDA, 1, True, False, "trainer.compile=true"),
        (False, CPU, 1, False, False, "trainer.cuda_graphs=false"),
    ],
)
def test_the_step_mode_takes_graphs_only_where_they_can_run(setting, device, world, compile, graphs, why):
    mode = step_mode(setting, device, world, compile)
    assert mode.graphs is graphs and why in mode.why


@pytest.mark.parametrize(
    "device, world, compile, why", [(CPU, 1, False, "cpu"), (CUDA, 4, False, "DDP"), (CUDA, 1, True, "compile")]
)
def test_graphs_asked_for_where_they_cannot_run_are_refused_in_one_line(device, world, compile, why):
    with pytest.raises(ConfigError) as err:
        step_mode(True, device, world, compile)
    message = str(err.value)
    assert "\n" not in message and why in message and "trainer.cuda_graphs=auto or false" in message


def test_a_setting_other_than_auto_true_false_is_a_programming_error():
    with pytest.raises(ValueError):
        step_mode(1, CUDA, 1, False)  # 1 == True, but the config's validation would have refused it


@pytest.mark.parametrize(
    "longest, max_length, width",
    [
        (1, 128, 32),
        (32, 128, 32),
        (33, 128, 64),
        (64, 128, 64),
        (65, 128, 128),
        (128, 128, 128),
        (100, 100, 100),  # never wider than the truncation
        (20, 16, 20),  # a row longer than max_length (not made by the tokenizer) still fits
        (257, 512, 512),
    ],
)
def test_bucket_widths(longest, max_length, width):
    assert bucket_width(longest, max_length) == width


def test_a_run_has_few_widths():
    widths = {bucket_width(n, 128) for n in range(1, 129)}
    assert widths == {32, 64, 128} and min(widths) == SMALLEST_BUCKET


@pytest.mark.slow
def test_the_collate_pads_to_the_bucket_and_says_whether_anything_is_padded(tmp_path):
    runner = Runner(compose_cfg(FAST), tmp_path)
    tokens, split = runner.inputs.tokens["train"], runner.data.splits["train"]
    rows = np.stack([split.query, split.counter, split.counter], axis=1)[:4]
    plain = TripletCollate(tokens)(list(rows))
    wide = TripletCollate(tokens, lambda n: bucket_width(n, runner.text_encoder.max_length))(list(rows))
    longest = int(tokens.lengths[rows.T.ravel()].max())
    assert plain["input_ids"].shape[1] == longest
    assert wide["input_ids"].shape[1] == bucket_width(longest, runner.text_encoder.max_length) > longest
    assert torch.equal(wide["input_ids"][:, :longest], plain["input_ids"])
    assert (wide["input_ids"][:, longest:] == tokens.pad_id).all() and (wide["attention_mask"][:, longest:] == 0).all()
    assert wide["padded"] is True
    with pytest.raises(ValueError, match="does not fit"):
        tokens.batch(rows.T.ravel(), width=longest - 1)


@pytest.mark.slow
def test_padding_to_the_bucket_changes_no_number(tmp_path):
    """The masked positions take no part: the step's loss and gradients at the bucket width equal those at the batch's
    own width (dropout off, so both draw nothing). On the CPU, where the batches are made (on a GPU too)."""
    runner = Runner(compose_cfg(FAST + ["trainer.device=cpu"]), tmp_path)
    trainer, model = runner.trainer, runner.model
    model.eval()  # no dropout: the two widths would draw different masks
    split = runner.data.splits["train"]
    rows = np.stack([split.query, split.counter, np.roll(split.counter, 1)], axis=1)[:8]
    text_id = torch.as_tensor(split.training_text_id)[torch.as_tensor(rows.T.ravel())]
    results = []
    for width in (None, lambda n: bucket_width(n, runner.text_encoder.max_length)):
        batch = TripletCollate(trainer.tokens, width)(list(rows))
        batch.pop("rows")
        model.zero_grad(set_to_none=True)
        out = trainer.step(**batch, text_id=text_id)
        out.total.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        results.append((batch["input_ids"].shape[1], out.total.detach(), grads))
    (narrow, loss_a, grads_a), (wide, loss_b, grads_b) = results
    assert wide > narrow
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grads_b, grads_a, rtol=1e-4, atol=1e-5)  # summation order: a few differ by 1e-6


@pytest.mark.slow
def test_an_eager_run_pads_as_before_and_says_why(tmp_path, caplog):
    """Where graphs do not run (here: the CPU) nothing changes: batches are padded to their own longest text."""
    with caplog.at_level("INFO", logger="biencoder"):
        runner = Runner(compose_cfg(FAST + ["trainer.device=cpu"]), tmp_path)
    assert not runner.trainer.mode.graphs and runner.trainer.graphed is None and runner.trainer.width is None
    assert "training step: eager: the step runs on cpu" in caplog.text


@pytest.mark.slow
def test_graphs_required_on_a_cpu_stop_the_run_before_it_trains(tmp_path):
    with pytest.raises(ConfigError, match="trainer.cuda_graphs=true cannot run"):
        Runner(compose_cfg(FAST + ["trainer.device=cpu", "trainer.cuda_graphs=true"]), tmp_path / "run")


def test_the_shape_key_separates_shapes_and_the_padded_flag():
    a = {"input_ids": torch.zeros(6, 32, dtype=torch.long), "padded": True}
    assert shape_key(a) == shape_key({"input_ids": torch.ones(6, 32, dtype=torch.long), "padded": True})
    assert shape_key(a) != shape_key({"input_ids": torch.zeros(6, 64, dtype=torch.long), "padded": True})
    assert shape_key(a) != shape_key({"input_ids": torch.zeros(6, 32, dtype=torch.long), "padded": False})


# -- on a CUDA machine ----------------------------------------------------------------------------------------------
def _flat(runner: Runner) -> torch.Tensor:
    return torch.cat([f.flat.detach().float().cpu() for f in runner.trainer.flat if f.flat is not None])


def _steps(runner: Runner, batches: list[dict]) -> tuple[list[dict], torch.Tensor]:
    """Train ``runner`` on ``batches`` (inputs on its device), the CUDA generator seeded first; returns each step's
    loss parts and the flat weights after."""
    runner.model.train()
    torch.cuda.manual_seed(0)
    parts = []
    for inputs in batches:
        sums = EpochSums(1)
        runner.trainer.train_step(dict(inputs), sums)
        parts.append(sums.means())
    return parts, _flat(runner)


def _pair(tmp_path, extra: list[str]):
    """Two runners, same seed, graphs on and off; the eager one pads as the graphed one does (the same shapes draw
    the same dropout masks); and batches of the first epoch, two shapes (the last batch is smaller)."""
    base = FAST + ["trainer.device=cuda", "trainer.scheduler=linear", "trainer.warmup_ratio=0.3", *extra]
    graphed = Runner(compose_cfg(base + ["trainer.cuda_graphs=true"]), tmp_path / "graphed")
    eager = Runner(compose_cfg(base + ["trainer.cuda_graphs=false"]), tmp_path / "eager")
    eager.trainer.width = graphed.trainer.width
    negatives = graphed.trainer.mine(0, graphed.evaluation.embed("train").sim)
    batches = [inputs for epoch in range(3) for _, inputs in graphed.trainer.batches(epoch, negatives)]
    return graphed, eager, batches


@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_graphed_step_trains_as_the_eager_step(tmp_path, precision):
    """Warm-up, capture and replay of two shapes over three epochs, a changing learning rate, dropout off: the loss
    parts of every step and the weights after all of them agree with the eager step's to rounding. A graph that
    replayed stale inputs, a baked-in learning rate or no optimiser step would differ at once."""
    off = [f"+model.encoder.random_init.{k}=0.0" for k in ("hidden_dropout_prob", "attention_probs_dropout_prob")]
    graphed, eager, batches = _pair(tmp_path, off + [f"trainer.precision={precision}"])
    assert len({shape_key(b) for b in batches}) == 2 and len(batches) > 2 * (WARMUP + 2)
    before = _flat(graphed)
    parts_g, weights_g = _steps(graphed, batches)
    parts_e, weights_e = _steps(eager, batches)
    assert all(entry.graph is not None for entry in graphed.trainer.graphed.graphs.values())
    # the same kernels on the same shapes: what differs is the learning rate's rounding (a float32 tensor)
    tol = dict(rtol=1e-4, atol=1e-6) if precision == "fp32" else dict(rtol=1e-3, atol=1e-5)
    for g, e in zip(parts_g, parts_e, strict=True):
        torch.testing.assert_close(torch.tensor(list(g.values())), torch.tensor(list(e.values())), **tol)
    moved_g, moved_e = weights_g - before, weights_e - before  # what training changed, compared
    assert moved_e.abs().max() > 100 * tol["atol"]
    torch.testing.assert_close(moved_g, moved_e, **tol)


@needs_cuda
def test_a_replay_draws_the_dropout_masks_of_the_eager_step(tmp_path):
    """Dropout on (the default): a replay advances the CUDA generator as the eager step does, so the same seed gives
    the same masks, and the two runs agree to rounding."""
    graphed, eager, batches = _pair(tmp_path, ["trainer.precision=fp32"])
    before = _flat(graphed)
    parts_g, weights_g = _steps(graphed, batches)
    parts_e, weights_e = _steps(eager, batches)
    torch.testing.assert_close(weights_g - before, weights_e - before, rtol=1e-4, atol=1e-6)
    assert parts_g[-1]["loss"] == pytest.approx(parts_e[-1]["loss"], rel=1e-4)


@needs_cuda
def test_a_step_that_cannot_be_captured_trains_eagerly_and_says_so(tmp_path, caplog):
    """A host read inside the forward (here: the loss reads itself with .item()) cannot be captured: the capture
    fails once, train.log says why, and every step still trains, eagerly."""
    graphed, _, batches = _pair(tmp_path, ["trainer.precision=fp32"])
    step = graphed.trainer.graphed.step
    real = step.forward

    def reading(**inputs):
        out = real(**inputs)
        out.total.item()  # a host read: illegal while a stream captures
        return out

    step.forward = reading
    before = _flat(graphed)
    with caplog.at_level("WARNING", logger="biencoder"):
        parts, after = _steps(graphed, batches)
    assert graphed.trainer.graphed.failed is not None and "capture failed" in caplog.text
    assert all(entry.graph is None for entry in graphed.trainer.graphed.graphs.values())
    assert len(parts) == len(batches) and (after - before).abs().max() > 0
