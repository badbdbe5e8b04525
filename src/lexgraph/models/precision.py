"""The number format an encoder runs in on the CPU: float32, or bfloat16 weights and activations.

``precision`` (``lexgraph index --precision``): ``fp32``; ``bf16``, the backbone's weights cast to
bfloat16, which a CPU with AMX (``amx_bf16``) multiplies in hardware; ``auto``, bf16 when the CPU's
flags have ``amx_bf16``, else fp32. Pooled vectors are float32 whatever the backbone ran in
(:meth:`lexgraph.models.encoders.TextEncoder.pool_states`). On CUDA the setting changes nothing:
the encoders' own autocast applies there (:func:`lexgraph.core.config.autocast`).

Measured (``benchmarks/cpu_precision.py``, docs/scale.md, "Faster encoding on the CPU"): on this
project's 2-core AMX Xeon, e5-small's 512-token windows in shape-stable batches, 2.4x float32's
articles/s, chunk vectors at a cosine of at least 0.9999 to float32's, and one gold article fewer
at rank 100 on the sample's test questions; hence ``lexgraph index``'s default stays fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the encoders, not with the command line that names a precision
    import torch
    from torch import nn

PRECISIONS = ("auto", "fp32", "bf16")
#: the CPU flag ``auto`` asks for: bf16 matrix tiles (AMX); avx512_bf16 alone was not measured
AUTO_FLAG = "amx_bf16"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first ``flags`` line of ``cpuinfo`` (Linux), or no flags where it cannot be read."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def resolve_precision(precision: str, device: torch.device, flags: frozenset[str] | None = None) -> str:
    """``fp32`` or ``bf16``: ``precision`` on ``device`` (CUDA: fp32, its autocast being the encoders'
    own); ``auto`` from the CPU's ``flags`` (default: this machine's)."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}, expected one of {', '.join(PRECISIONS)}")
    if torch.device(device).type != "cpu":
        return "fp32"
    if precision == "auto":
        return "bf16" if AUTO_FLAG in (cpu_flags() if flags is None else flags) else "fp32"
    return precision


def cast_backbone(backbone: nn.Module, precision: str) -> nn.Module:
    """``backbone`` in the resolved ``precision`` (fp32 or bf16), in place."""
    import torch

    return backbone.to(torch.bfloat16 if precision == "bf16" else torch.float32)
