"""The random number generators' states of a process (python, numpy, torch CPU and CUDA), saved in ``last.pt`` so
that a resumed run continues bit for bit."""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_states() -> dict:
    """python, numpy (global) and torch (CPU and CUDA) RNG states, in types ``torch.load(weights_only=True)`` reads."""
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": np_state["state"]["key"].tolist(),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: dict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
            "state": {"key": np.array(n["key"], dtype=np.uint32), "pos": n["pos"]},
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
