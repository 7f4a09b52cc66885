"""The training step on a GPU as one CUDA graph: forward, loss, backward and fused AdamW captured once per input
shape and replayed (``trainer.cuda_graphs``).

An eager step of a MiniLM-sized encoder on 16 triplets launches about 3,000 operators, each a few microseconds of
host work for a few microseconds of GPU work: the host sets the pace. A CUDA graph replays the recorded kernels with
one launch. What a graph needs, and how the step provides it:

* **static shapes**: a trained encoder's token batches are padded to a bucket width (:func:`bucket_width`: powers of
  two from :data:`SMALLEST_BUCKET`, capped at ``model.max_length``), so an epoch has a handful of shapes, each
  captured once (:class:`GraphedStep` keys its graphs by the inputs' shapes and the host's ``padded`` flag). Padding
  adds masked positions only: the mask keeps them out of attention and of mean pooling.
* **static memory**: each graph reads its inputs from buffers of its own (a step copies the batch into them) and its
  outputs (the loss parts, the head's features) stay in place until the next replay of that graph.
* **no host work inside**: the step already makes no host read (the loss parts are summed on the device, the
  attention mask is decided on the host); the learning rates that the schedule changes on the host are device
  tensors that the captured fused AdamW reads, refreshed before each replay.
* **a warm-up**: the first :data:`WARMUP` steps run eagerly on the capture stream, so that lazily made state (the
  optimiser's moments, cuBLAS's workspace, cached labels) exists before the first capture; a later shape takes
  :data:`WARMUP_LATER` (an epoch's smaller last batch is captured in the second epoch).

Dropout draws from the default CUDA generator, whose state a graph advances by the same amount as the eager step
would: a replay draws the numbers the eager step would have drawn. What differs from an eager step is rounding
(padded shapes pick other kernels; the learning rate is a float32 tensor instead of a double).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from ...errors import ConfigError
from ..modeling.loss import LossOutput

log = logging.getLogger("biencoder")

#: the narrowest bucket of token widths; the others double up to ``model.max_length``
SMALLEST_BUCKET = 32
#: eager steps before the first graph is captured (the optimiser's state, cuBLAS's workspace are made in them), and
#: of each later shape before its own (its batch-size-dependent constants)
WARMUP, WARMUP_LATER = 2, 1


@dataclass(frozen=True)
class StepMode:
    """How a run's training step runs: ``graphs`` (captured and replayed) or eagerly, and ``why``, for the log."""

    graphs: bool
    why: str


def step_mode(setting, device: torch.device, world_size: int, compile: bool) -> StepMode:
    """The step's mode for ``trainer.cuda_graphs`` = ``setting`` on ``device`` with ``world_size`` processes and
    ``trainer.compile`` = ``compile``. ``auto`` takes graphs wherever they can run; ``true`` where they cannot raises
    :class:`ConfigError`; ``false`` is eager everywhere (the config's validation refuses other values)."""
    if not (isinstance(setting, bool) or setting == "auto"):
        raise ValueError(f"cuda_graphs must be 'auto', True or False, not {setting!r}")
    if setting is False:
        return StepMode(False, "trainer.cuda_graphs=false")
    obstacle = None
    if device.type != "cuda":
        obstacle = f"the step runs on {device.type}, and CUDA graphs need a CUDA device"
    elif world_size > 1:
        obstacle = f"{world_size} processes train with DDP, whose gradient all-reduce is not captured here"
    elif compile:
        obstacle = "trainer.compile=true compiles the step instead"
    if obstacle is None:
        return StepMode(True, f"trainer.cuda_graphs={setting}: one graph per batch shape, tokens padded to buckets")
    if setting is True:
        raise ConfigError(f"trainer.cuda_graphs=true cannot run: {obstacle}; use trainer.cuda_graphs=auto or false")
    return StepMode(False, f"eager: {obstacle}")


def bucket_width(longest: int, max_length: int) -> int:
    """The padded width of a token batch whose longest row has ``longest`` tokens: the smallest power of two from
    :data:`SMALLEST_BUCKET` up that holds it, but never more than ``max_length`` (the tokenizer's truncation), so a
    run has at most log2(max_length / 32) + 1 widths."""
    width = SMALLEST_BUCKET
    while width < longest:
        width *= 2
    return max(longest, min(width, max_length))


@dataclass
class _Graph:
    """One input shape's state: the eager steps taken so far, then the captured graph, its input buffers and its
    output."""

    eager_steps: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    inputs: dict = field(default_factory=dict)
    output: LossOutput | None = None


class GraphedStep:
    """``step`` (a module: batch inputs → :class:`LossOutput`), its backward and ``optimizer``'s step, as CUDA graphs.

    ``graphed(inputs)`` performs one whole optimisation step on ``inputs`` (the step module's keyword arguments:
    tensors on the device and the host's ``padded`` flag) and returns its :class:`LossOutput`, whose tensors hold
    their values until the next step of the same shape. The optimiser must be a fused AdamW (its kernel can be
    captured); its parameters and state tensors must stay the same objects once a graph is captured (load a
    checkpoint before the first step). Call it where the eager step would be: the model in train mode.
    """

    def __init__(self, step: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, autocast_dtype):
        self.step, self.optimizer, self.autocast_dtype = step, optimizer, autocast_dtype
        self.device, self.stream = device, torch.cuda.Stream(device)
        self.graphs: dict[tuple, _Graph] = {}
        #: why a capture failed (then every later step runs eagerly), or None
        self.failed: str | None = None
        # the learning rates the captured optimiser reads, refreshed from the param groups before each replay
        self.lrs = [torch.zeros((), dtype=torch.float32, device=device) for _ in optimizer.param_groups]
        self.lr_values: list[float | None] = [None] * len(self.lrs)

    def __call__(self, inputs: dict) -> LossOutput:
        key = shape_key(inputs)
        warmup = WARMUP_LATER if any(g.graph is not None for g in self.graphs.values()) else WARMUP
        entry = self.graphs.setdefault(key, _Graph())
        if self.failed is not None or (entry.graph is None and entry.eager_steps < warmup):
            entry.eager_steps += 1
            return self._eager(inputs)
        if entry.graph is None:
            try:
                self._capture(entry, inputs)
            except Exception as err:  # noqa: BLE001 - a step that cannot be captured still trains, eagerly
                entry.graph, self.failed = None, f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
                _reset_generator(self.device, self.failed)
                log.warning("training step: CUDA graph capture failed (%s); the run goes on eagerly", self.failed)
                return self._eager(inputs)
            log.info("training step: captured a CUDA graph for inputs %s", describe(key))
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor):
                entry.inputs[name].copy_(value, non_blocking=True)
        self._refresh_lrs()
        entry.graph.replay()
        return entry.output

    def _body(self, inputs: dict) -> LossOutput:
        """The step as the eager trainer runs it (``EpochTrainer.train_step``), autocast's weight cache off: a cache
        made inside a capture would be freed when autocast exits."""
        dtype = self.autocast_dtype
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None, cache_enabled=False):
            out = self.step(**inputs)
        self.optimizer.zero_grad(set_to_none=False)
        out.total.backward()
        self.optimizer.step()
        return out

    def _eager(self, inputs: dict) -> LossOutput:
        """A warm-up step, on the capture stream (cuBLAS's workspace and the optimiser's state are made for it)."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = self._body(inputs)
        torch.cuda.current_stream().wait_stream(self.stream)
        return out

    def _capture(self, entry: _Graph, inputs: dict) -> None:
        """Record :meth:`_body` on buffers of ``inputs``' shapes; nothing runs until the first replay."""
        entry.inputs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        groups = self.optimizer.param_groups
        saved = [(group["lr"], group.get("capturable", False)) for group in groups]
        self._refresh_lrs()
        for group, lr in zip(groups, self.lrs, strict=True):
            group["lr"], group["capturable"] = lr, True  # the kernel reads the tensor: no lr baked into the graph
        entry.graph = torch.cuda.CUDAGraph()
        self.stream.wait_stream(torch.cuda.current_stream())
        try:
            # thread_local: another thread's CUDA calls (none is expected) do not invalidate this capture
            with torch.cuda.graph(entry.graph, stream=self.stream, capture_error_mode="thread_local"):
                entry.output = self._body(entry.inputs)
        finally:
            for group, (lr, capturable) in zip(groups, saved, strict=True):
                group["lr"], group["capturable"] = lr, capturable  # the schedule and last.pt see floats
        torch.cuda.current_stream().wait_stream(self.stream)

    def _refresh_lrs(self) -> None:
        """Copy each param group's current learning rate (set by the schedule on the host) into its tensor, where it
        changed: one small fill on the stream, no host wait."""
        for i, group in enumerate(self.optimizer.param_groups):
            value = float(group["lr"])
            if value != self.lr_values[i]:
                self.lrs[i].fill_(value)
                self.lr_values[i] = value


def _reset_generator(device: torch.device, why: str) -> None:
    """Give ``device``'s default CUDA generator a fresh state (the same seed and offset) after a failed capture.

    torch's ``CUDAGraph.capture_end`` raises on an invalidated capture before its epilogue has ended the generator's
    capture, so the next eager dropout would fail with "Offset increment outside graph capture encountered
    unexpectedly" (seen on the H200 at 426e694). A draw checks the repair; where it still fails, the run stops here
    with what to do instead of at the next step with torch's message."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    try:
        generator.graphsafe_set_state(generator.clone_state())
        torch.empty(8, device=device).bernoulli_(0.5)
        torch.cuda.synchronize(device)
    except RuntimeError as err:
        raise RuntimeError(
            f"training step: CUDA graph capture failed ({why}) and left the CUDA generator unusable ({err}); "
            "rerun with trainer.cuda_graphs=false"
        ) from err


def shape_key(inputs: dict) -> tuple:
    """What decides a graph: each tensor input's name, shape and dtype, and each other input's value (``padded``)."""
    return tuple(
        (name, tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else (name, value)
        for name, value in sorted(inputs.items())
    )


def describe(key: tuple) -> str:
    """A graph's key for the log: ``input_ids 48x128, padded True``."""
    return ", ".join(
        f"{entry[0]} {'x'.join(map(str, entry[1]))}" if len(entry) == 3 else f"{entry[0]} {entry[1]}" for entry in key
    )
