"""The catalogue of retrieval systems: every declaration, lexgraph's and other packages'.

Each system is declared once, next to its code (:class:`lexgraph.methods.system.System`, a method's
``SYSTEM``, or ``SYSTEMS`` for a family): lexgraph's own in :data:`BUILTIN`'s modules, another package's under the
``lexgraph.systems`` entry-point group (docs/systems.md). :func:`systems` collects them, and every
question about systems (which are dense, what an index of them holds, what export writes) is a
query on it; a composed system or a re-ranker asks it which systems it may be built on. The
catalogue imports lexgraph's system modules directly (no import strings), so the import contracts
(``lint-imports``) and the stages' DVC dependencies see every module it can run. Loading a system
from a workspace is :func:`lexgraph.systems.registry.load_retriever`'s.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from lexgraph.core.errors import LexgraphError
from lexgraph.methods.bm25 import system as bm25
from lexgraph.methods.dsr import system as dsr
from lexgraph.methods.gnn import system as gnn
from lexgraph.methods.hprior import system as hprior
from lexgraph.methods.hybrid import system as hybrid
from lexgraph.methods.rerank import system as rerank
from lexgraph.methods.system import System
from lexgraph.methods.zeroshot import system as zeroshot

#: lexgraph's own systems, in the order every listing shows them
BUILTIN: tuple[System, ...] = (
    bm25.SYSTEM,
    zeroshot.SYSTEM,
    dsr.SYSTEM,
    hprior.SYSTEM,
    *gnn.SYSTEMS,
    hybrid.SYSTEM,
    *rerank.SYSTEMS,
)
#: the entry-point group under which another package declares its systems: each entry is a
#: :class:`System` or a sequence of them (``[project.entry-points."lexgraph.systems"]``)
GROUP = "lexgraph.systems"


def _plugins() -> list[tuple[str, tuple[System, ...]]]:
    """``(origin, systems)`` of each ``lexgraph.systems`` entry point, by its name; one that does not
    import, or holds no System, is refused in one line naming it."""
    found = []
    for entry in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        origin = f"entry point '{entry.name} = {entry.value}' (group {GROUP})"
        try:
            value = entry.load()
        except (ImportError, AttributeError, TypeError) as exc:  # TypeError: a declaration of another form
            raise LexgraphError(f"{origin} does not load ({exc}); expected an importable System") from None
        given = (value,) if isinstance(value, System) else tuple(value) if isinstance(value, list | tuple) else ()
        if not given or not all(isinstance(s, System) for s in given):
            raise LexgraphError(f"{origin} is a {type(value).__name__}; expected a System or a list of them")
        found.append((origin, given))
    return found


@cache
def systems() -> dict[str, System]:
    """Every system, by name: :data:`BUILTIN`, then those of the ``lexgraph.systems`` entry points
    (a name declared twice is refused in one line naming both places)."""
    found: dict[str, System] = {}
    where: dict[str, str] = {}
    for origin, given in [("lexgraph", BUILTIN), *_plugins()]:
        for spec in given:
            if spec.name in found:
                raise LexgraphError(
                    f"system '{spec.name}' is declared twice: by {where[spec.name]} and by {origin}; "
                    "expected one declaration per name"
                )
            found[spec.name], where[spec.name] = spec, origin
    return found


def names(kind: str | None = None) -> tuple[str, ...]:
    """The systems' names (of ``kind`` only, when given), in the registry's order."""
    return tuple(name for name, system in systems().items() if kind is None or system.kind == kind)


def declared(name: str, label: str = "") -> System:
    """The declaration of ``name``; an unknown name is refused in one line listing the known ones,
    after ``label`` (the option or key that gave it)."""
    found = systems().get(name)
    if found is None:
        prefix = f"{label}: " if label else ""
        raise LexgraphError(f"{prefix}unknown system '{name}'; expected one of {', '.join(systems())}")
    return found
