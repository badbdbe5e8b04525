"""Counting what a training step asks of the device: dispatched operators and host
synchronisations (issue 43; ``benchmarks/throughput.py`` and ``tests/test_step_syncs.py``).

On a GPU the host enqueues kernels and runs ahead; a *synchronisation* makes it wait for the
device (a value read back: ``.item()``, ``int()``/``float()``/``bool()`` of a tensor,
``.tolist()``, ``.numpy()``; an output whose size depends on values: ``nonzero``, boolean
indexing, ``masked_select``, ``unique``, ``repeat_interleave`` without ``output_size``).
:class:`StepProbe` counts these on any device, the CPU included (where none of them waits),
so that a test on a CPU pins what a GPU would pay. On CUDA, ``torch.cuda.set_sync_debug_mode``
sees the rest (a pageable host-to-device copy also synchronises); the benchmark uses both.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

log = logging.getLogger(__name__)

_aten = torch.ops.aten
# value-dependent output sizes: the host needs the device's answer before it can go on
SYNC_OPS = {
    _aten._local_scalar_dense.default,  # .item(), int(), float(), bool() of a tensor
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten.is_nonzero.default,
    _aten.equal.default,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
}
BOOL_INDEX_OPS = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}
READBACK_METHODS = ("tolist", "numpy")  # not dispatched as operators: wrapped while the probe is on


def _bool_index(indices) -> bool:
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


class StepProbe(TorchDispatchMode):
    """Counts operators (``ops``, by name in ``by_op``) and synchronisations (``syncs``, by
    cause in ``sync_causes``) dispatched inside ``with StepProbe():``.

    ``device``: the device the step runs on; a read-back of a tensor elsewhere (a CPU tensor
    of the collator while the step runs on CUDA) waits for nothing and is not counted.
    ``host_scalars``: tensors that live on the host by design (an optimizer's step counters,
    which AdamW keeps on the CPU unless fused or capturable): reading them is no
    synchronisation, and on a CPU run they could not be told apart otherwise.
    """

    def __init__(self, host_scalars: Iterable[torch.Tensor] = (), device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.device_type = torch.device(device).type
        self.ops = 0
        self.syncs = 0
        self.by_op: Counter[str] = Counter()
        self.sync_causes: Counter[str] = Counter()
        self.host = {t.data_ptr() for t in host_scalars}
        self._saved: dict[str, object] = {}

    def _on_device(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self.device_type and tensor.data_ptr() not in self.host

    def _sync(self, cause: str) -> None:
        self.syncs += 1
        self.sync_causes[cause] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        self.by_op[str(func.overloadpacket.__name__)] += 1
        if func in SYNC_OPS:
            first = args[0] if args else None
            if isinstance(first, torch.Tensor) and self._on_device(first):
                self._sync(func.overloadpacket.__name__)
        elif func in BOOL_INDEX_OPS and self._on_device(args[0]) and _bool_index(args[1]):
            self._sync(f"{func.overloadpacket.__name__} (boolean mask)")
        elif func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self._sync("repeat_interleave")
        return func(*args, **kwargs)

    def __enter__(self):
        probe = self
        for name in READBACK_METHODS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def wrapped(tensor, *args, _original=original, _name=name, **kwargs):
                if probe._on_device(tensor):
                    probe._sync(_name)
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, wrapped)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()
        return super().__exit__(*exc)


def optimizer_host_scalars(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's per-parameter step counters that live on the CPU (AdamW's, unless fused
    or capturable): :class:`StepProbe`'s ``host_scalars``."""
    return [
        value
        for state in optimizer.state.values()
        for key, value in state.items()
        if key == "step" and isinstance(value, torch.Tensor) and value.device.type == "cpu"
    ]
