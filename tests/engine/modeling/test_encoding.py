"""Embedding texts in eval mode: the batch size by device (decided once, in the runtime), the longest-first batches,
and vectors kept where they are computed until all are done."""

import numpy as np
import pytest
import torch

from biencoder.engine.config.schema import TrainerSchema
from biencoder.engine.machine.runtime import Runtime
from biencoder.engine.modeling.encoding import Encoding, TokenizedTexts, encode_pooled, to_device
from conftest import compose_cfg

CPU = Runtime(torch.device("cpu"), "fp32")
CUDA = Runtime(torch.device("cuda", 0), "bf16")  # a decision only: nothing here runs on CUDA


def test_the_eval_batch_size_is_the_devices_unless_set():
    """trainer.eval_batch_size is null by default: 64 texts a forward on a CPU (what every CPU run embedded with),
    512 on a GPU; a value set wins on both. An Encoding made in Python takes the same decision."""
    assert TrainerSchema().eval_batch_size is None
    assert (CPU.eval_batch_size(None), CUDA.eval_batch_size(None), CPU.eval_batch_size(16)) == (64, 512, 16)
    assert CUDA.eval_batch_size(16) == 16
    assert Encoding.of_run(TrainerSchema(), CPU, progress=False) == Encoding(64, torch.device("cpu"), None, False)
    assert Encoding.of_run(TrainerSchema(), CUDA, progress=False).batch_size == 512
    assert Encoding.of_run(TrainerSchema(eval_batch_size=7), CUDA, progress=False).batch_size == 7
    assert (Encoding().batch_size, Encoding(device="cuda").batch_size, Encoding(3, "cuda").batch_size) == (64, 512, 3)


@pytest.mark.parametrize(("value", "ok"), [("null", True), ("1", True), ("0", False), ("-64", False)])
def test_the_config_takes_null_or_a_positive_eval_batch_size(value, ok):
    from biencoder.engine.config.validation import validate
    from biencoder.errors import ConfigError

    cfg = compose_cfg([f"trainer.eval_batch_size={value}"])
    if ok:
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match="trainer.eval_batch_size"):
            validate(cfg)


def per_batch_copies(model, texts: TokenizedTexts, encoding: Encoding) -> torch.Tensor:
    """encode_pooled as it was: each batch's vectors copied to the CPU as it comes, then put back in row order."""
    order = np.argsort(-texts.lengths, kind="stable")
    pooled = []
    with torch.no_grad():
        model.eval()
        for start in range(0, len(order), encoding.batch_size):
            batch = to_device(texts.batch(order[start : start + encoding.batch_size]), torch.device("cpu"))
            pooled.append(model.pool(**batch).float().cpu())
    return torch.cat(pooled)[torch.from_numpy(np.argsort(order))]


TEXTS = [f"text number {i} " + "word " * (i * 5 % 11) for i in range(23)]


@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_encode_pooled_gives_the_per_batch_copies_vectors_to_the_bit(tiny_model_and_tokenizer, batch_size):
    """Keeping the vectors on the device changes which memory they sit in, not a bit of them: the same batches give
    the same vectors as copying each batch to the CPU (rows in their own order)."""
    model, tokenizer = tiny_model_and_tokenizer
    tokens = TokenizedTexts(TEXTS, tokenizer, 32)
    encoding = Encoding(batch_size)
    fresh = encode_pooled(model, tokens, encoding)
    expected = per_batch_copies(model, tokens, encoding)
    assert fresh.dtype == torch.float32 and fresh.device.type == "cpu" and fresh.shape == expected.shape
    assert torch.equal(fresh, expected)


def test_batches_run_longest_first_and_reach_the_host_once(tiny_model_and_tokenizer, monkeypatch):
    """23 texts, 8 a forward: batches of 8, 8 and 7 rows, each no wider than the one before; the vectors go to the
    host in one copy of all 23 rows, never batch by batch (a copy per batch is a host sync per batch on a GPU)."""
    model, tokenizer = tiny_model_and_tokenizer
    tokens = TokenizedTexts(TEXTS, tokenizer, 32)
    shapes, copies = [], []
    pool = type(model).pool
    monkeypatch.setattr(
        type(model), "pool", lambda self, **b: shapes.append(tuple(b["input_ids"].shape)) or pool(self, **b)
    )
    cpu = torch.Tensor.cpu
    monkeypatch.setattr(
        torch.Tensor, "cpu", lambda self, *a, **k: copies.append(tuple(self.shape)) or cpu(self, *a, **k)
    )
    out = encode_pooled(model, tokens, Encoding(8))
    assert [rows for rows, _ in shapes] == [8, 8, 7]
    widths = [width for _, width in shapes]
    assert widths == sorted(widths, reverse=True) and widths[0] == tokens.lengths.max()
    assert copies == [(23, model.encoder.config.hidden_size)] and out.shape == copies[0]


def test_no_texts_give_no_vectors(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    out = encode_pooled(model, TokenizedTexts([], tokenizer, 32))
    assert out.shape == (0, model.encoder.config.hidden_size) and out.dtype == torch.float32
