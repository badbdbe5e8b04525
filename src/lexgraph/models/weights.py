"""Loading a saved network with one-line errors (the GNN, MVCL and chunk-level loaders):
building it from the settings file saved beside it (:func:`built_from`), then loading its
weights (:func:`load_state`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from lexgraph.core.config import without_params_file
from lexgraph.core.errors import DataError, LexgraphError
from lexgraph.core.io import load_tensors


@contextmanager
def built_from(
    settings_file: str | os.PathLike,
    problem: str,
    expected: str,
    remedy: str,
    errors: tuple[type[Exception], ...] = (TypeError, ValueError, LexgraphError),
) -> Iterator[None]:
    """Build a network inside the block from what ``settings_file`` holds: one of ``errors``
    raised there is a one-sentence :class:`DataError` naming that file,
    ``<problem> (<detail>); expected <expected>; <remedy>``. The detail drops a leading
    ``params.yaml: `` (settings errors name params.yaml, but here the file holds the value)."""
    try:
        yield
    except errors as exc:
        raise DataError(
            settings_file, f"{problem} ({without_params_file(exc)}); expected {expected}; {remedy}"
        ) from None


def load_state(model, target: str | os.PathLike, what: str, settings: str, remedy: str):
    """``model`` with the tensors of the safetensors file ``target`` loaded
    (:func:`lexgraph.core.io.load_tensors`: missing, unreadable or corrupt files are one line);
    tensors that do not fit the network the ``settings`` file describes are a one-sentence
    :class:`DataError` naming ``target``, then ``remedy``."""
    tensors = load_tensors(target, what, remedy)
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(t.isfinite().all())]
    if bad:  # a nan weight turns every score into nan: the ranking would be arbitrary
        raise DataError(
            target,
            f"{len(bad)} of {len(tensors)} tensors hold nan or infinite values (first: {bad[0]!r}), expected "
            f"finite weights; {remedy}",
        )
    try:
        model.load_state_dict(tensors)
    except RuntimeError as exc:  # missing, unexpected or mis-shaped tensors
        raise DataError(
            target, f"weights that do not fit the network {settings} describes ({str(exc).splitlines()[0]}); {remedy}"
        ) from None
    return model
