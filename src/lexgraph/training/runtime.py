"""The Accelerate side of a training run (:class:`Runtime`: process, device, precision) and the
attention backends of its forward passes (:func:`sdpa_backends`); :mod:`lexgraph.training.engine`
re-exports both."""

from __future__ import annotations

import logging
from typing import Any

import torch

from lexgraph.core.errors import ConfigError

log = logging.getLogger(__name__)

MIXED_PRECISION = ("auto", "no", "bf16", "fp16")


# ---------------------------------------------------------------------------
# Runtime: processes, device, precision
# ---------------------------------------------------------------------------


class Runtime:
    """The Accelerate side of a run: which process this is, its device and precision.

    ``device`` is the stage's resolved ``base.device``; in a multi-process launch each
    process takes Accelerate's device instead (``cuda:<local rank>``, or the CPU).
    ``mixed_precision``: auto | no | bf16 | fp16 (CPU: always no).
    """

    def __init__(self, device: torch.device | str = "cpu", mixed_precision: str = "auto") -> None:
        from accelerate import Accelerator

        if mixed_precision not in MIXED_PRECISION:
            raise ConfigError(f"mixed precision {mixed_precision!r}, expected one of {', '.join(MIXED_PRECISION)}")
        device = torch.device(device)
        precision = "no"
        if device.type == "cuda" and mixed_precision != "no":
            precision = mixed_precision
            if precision == "auto":
                precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        self.accelerator = Accelerator(mixed_precision=precision, cpu=device.type == "cpu")
        self.mixed_precision = precision
        self.world_size = self.accelerator.num_processes
        self.rank = self.accelerator.process_index
        self.device = device if self.world_size == 1 else self.accelerator.device
        if self.world_size > 1:
            log.info(
                "process %d of %d on %s (%s)",
                self.rank,
                self.world_size,
                self.device,
                self.accelerator.distributed_type,
            )

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def scaler(self):
        """The fp16 gradient scaler (None in bf16 / float32)."""
        return self.accelerator.scaler

    def autocast(self):
        """Mixed-precision context for forward passes (a no-op in float32), with the attention
        backends of :func:`sdpa_backends` where ``LEXGRAPH_SDPA`` names them."""
        import contextlib

        stack = contextlib.ExitStack()
        backends = sdpa_backends()
        if backends is not None:
            from torch.nn.attention import sdpa_kernel

            stack.enter_context(sdpa_kernel(backends))
        if self.mixed_precision != "no":
            dtype = torch.bfloat16 if self.mixed_precision == "bf16" else torch.float16
            stack.enter_context(torch.autocast(device_type=self.device.type, dtype=dtype))
        return stack

    def wait(self) -> None:
        """Barrier: every process waits here for the others."""
        self.accelerator.wait_for_everyone()

    def broadcast(self, value: Any) -> Any:
        """``value`` of the main process, on every process (any picklable object)."""
        if self.world_size == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor


SDPA_ENV = "LEXGRAPH_SDPA"


def sdpa_backends(value: str | None = None) -> list | None:
    """The scaled-dot-product attention backends forward passes may use: ``value`` (default: the
    ``LEXGRAPH_SDPA`` environment variable), a comma-separated subset of flash, efficient, cudnn,
    math; unset or ``default``: torch's own choice (None). Which one a GPU should use is not
    measured yet (docs/gpu.md: issue 43 found cuDNN's 18 % slower on an H100 with the old step)."""
    import os

    from torch.nn.attention import SDPBackend

    value = os.environ.get(SDPA_ENV, "default") if value is None else value
    if value.strip() in ("", "default"):
        return None
    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
    chosen = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise ConfigError(
            f"{SDPA_ENV}={value!r}: unknown backend {unknown[0]!r}, expected default or {', '.join(names)}"
        )
    return [getattr(SDPBackend, names[n]) for n in chosen]
