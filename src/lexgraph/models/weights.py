"""Loading a saved network's weights with a one-line error (the GNN and MVCL loaders)."""

from __future__ import annotations

import os

from lexgraph.errors import DataError
from lexgraph.io import load_tensors


def load_state(model, target: str | os.PathLike, what: str, settings: str, remedy: str):
    """``model`` with the tensors of the safetensors file ``target`` loaded
    (:func:`lexgraph.io.load_tensors`: missing, unreadable or corrupt files are one line);
    tensors that do not fit the network the ``settings`` file describes are a one-sentence
    :class:`DataError` naming ``target``, then ``remedy``."""
    try:
        model.load_state_dict(load_tensors(target, what, remedy))
    except RuntimeError as exc:  # missing, unexpected or mis-shaped tensors
        raise DataError(target, f"weights that do not fit the network {settings} describes "
                                f"({str(exc).splitlines()[0]}); {remedy}") from None
    return model
