"""The frozen-encoder ablation on a slice of the real corpus: packaged MiniLM, all four cells, 2 epochs each.

The first cell encodes the slice once; the other three read every vector from the cache (no encoder call).
"""

import pytest

from biencoder.engine.training.run import run
from conftest import compose_cfg

pytestmark = pytest.mark.slow
CELLS = ("plain", "ln", "relu", "ln_relu")


def test_four_cells_on_a_real_slice_encode_once(real_root, tmp_path, monkeypatch, encoder_calls):
    monkeypatch.setenv("ARGUANA_ROOT", str(real_root))
    calls = encoder_calls
    finals = {}
    for i, cell in enumerate(CELLS):
        cfg = compose_cfg(
            [
                "+experiment=frozen_arguana",
                f"+variant={cell}",
                "data.max_debates=8",
                "trainer.max_epochs=2",
                "trainer.progress=false",
                f"trainer.cache_dir={tmp_path / 'cache'}",
            ]
        )
        n_calls = len(calls)
        finals[cell] = run(cfg, tmp_path / cell)
        assert (len(calls) > n_calls) == (i == 0), f"{cell}: the encoder ran {len(calls) - n_calls} times"
    for cell, final in finals.items():
        assert final["status"] == "done" and final["data"] == "arguana" and final["variant"] == cell
        assert final["best"]["test"]["queries"] > 30
        # a frozen MiniLM with trained heads is far above chance (1/k) on the slice
        assert final["best"]["val"]["recall_at_k"] > 0.5
    assert len({repr(f["best"]["val"]) for f in finals.values()}) == 4  # four different heads, four results
