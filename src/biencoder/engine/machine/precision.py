"""The precision torch computes a float32 matrix product in, as a unit roundoff: what the exact search's float32
screen (:func:`~biencoder.engine.retrieval.search.target_bounds`) must allow for.

Torch has two ways to lower it. ``torch.set_float32_matmul_precision`` ("highest", "high", "medium"; the older
``torch.backends.cuda.matmul.allow_tf32`` sets "high" or "highest"), and since torch 2.9 each backend's own matmul
``fp32_precision`` ("ieee", "tf32", "bf16"; "none": as ``torch.backends.fp32_precision`` says), the one torch's
warnings recommend. Once a backend's is set, torch refuses to read the first (a RuntimeError), and it reports the
first's settings through the second.
"""

from __future__ import annotations

import contextlib

import torch

#: a float32 product's unit roundoff in each precision either setting names: float32's (2⁻²⁴), TF32's (2⁻¹¹),
#: bfloat16's (2⁻⁸)
ROUNDOFF = {
    "highest": 2.0**-24,
    "ieee": 2.0**-24,
    "none": 2.0**-24,
    "high": 2.0**-11,
    "tf32": 2.0**-11,
    "medium": 2.0**-8,
    "bf16": 2.0**-8,
}


def unit_roundoff(device: torch.device) -> float:
    """The unit roundoff of a float32 matrix product on ``device`` as torch is set now: the coarsest of what
    ``torch.set_float32_matmul_precision`` allows (where torch still reads it) and what the matmul ``fp32_precision``
    of the device's backend allows (``torch.backends.cuda`` on a GPU, ``torch.backends.mkldnn`` elsewhere; none
    before torch 2.9). Raises KeyError on a precision this table does not know."""
    backend = getattr(torch.backends.cuda if device.type == "cuda" else torch.backends.mkldnn, "matmul", None)
    settings = [getattr(backend, "fp32_precision", "none")]
    with contextlib.suppress(RuntimeError):  # torch >= 2.9 once a backend's fp32_precision is set
        settings.append(torch.get_float32_matmul_precision())
    return max(ROUNDOFF[setting] for setting in settings)
