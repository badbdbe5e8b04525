"""Loading Hugging Face checkpoints by name or directory, with one-sentence errors.

:func:`from_pretrained` wraps any ``from_pretrained`` loader; :func:`hub_reachable` probes
the hub once (a few seconds at most) so that an offline machine is told at once instead
of waiting through the hub client's retries.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

from lexgraph.errors import DataError, HubUnreachableError

log = logging.getLogger(__name__)

HUB_ENDPOINT = "https://huggingface.co"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0].rstrip(".") if text else type(exc).__name__


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub (``HF_ENDPOINT``) accepts a TCP connection; ``False`` under
    ``HF_HUB_OFFLINE=1``."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", HUB_ENDPOINT))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def from_pretrained(loader: Callable[..., Any], name: str, *, param: str, **kwargs) -> Any:
    """``loader(name, **kwargs)`` (a ``from_pretrained``) with one-sentence errors.

    A local directory that cannot be loaded raises :class:`DataError`; a hub name that
    cannot be fetched (offline, hub unreachable, unknown model) raises
    :class:`HubUnreachableError` saying what to do. ``param`` is the dotted params key
    holding ``name``, quoted in the message.
    """
    from huggingface_hub.errors import HfHubHTTPError

    if Path(name).is_dir():
        try:
            return loader(name, **kwargs)
        except (OSError, ValueError) as exc:
            raise DataError(name, f"not a loadable Hugging Face checkpoint ({type(exc).__name__}: "
                            f"{first_line(exc)})") from exc
    try:
        return loader(name, **kwargs)
    except (OSError, HfHubHTTPError) as exc:
        raise HubUnreachableError(
            f"could not load '{name}' (params '{param}') from the Hugging Face hub or the local cache "
            f"({first_line(exc)}): connect to the internet with HF_HUB_OFFLINE unset, or run "
            f"`hf download {name}` on a connected machine and copy the cache here, or set '{param}' "
            "to a local checkpoint directory"
        ) from exc
