"""The ``serve`` section of params.yaml: what ``lexgraph serve`` loads and the bounds it holds
requests to (where it listens is the command's ``--host`` and ``--port``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lexgraph.core.config import bad_value, expectation, section_config


@dataclass(frozen=True)
class ServeConfig:
    """The ``serve`` section of params.yaml."""

    systems: list[str] = field(metadata={"expected": "a non-empty list of systems (lexgraph systems lists them)"})
    max_batch: int = field(metadata={"expected": "a positive integer"})  # questions per system call when batching
    max_wait_ms: float = field(metadata={"expected": "a number of milliseconds in [0, 1000]"})
    max_k: int = field(metadata={"expected": "a positive integer"})  # the largest k a request may ask for
    page_k: int = field(metadata={"expected": "a positive integer, at most max_k"})  # hits shown on the web page
    max_question_chars: int = field(metadata={"expected": "a positive integer"})
    max_batch_questions: int = field(metadata={"expected": "a positive integer"})  # questions of one POST /search
    max_body_bytes: int = field(metadata={"expected": "a positive integer"})
    max_head_bytes: int = field(metadata={"expected": "a positive integer"})  # request line and headers
    header_timeout_s: float = field(metadata={"expected": "a positive number of seconds"})
    body_timeout_s: float = field(metadata={"expected": "a positive number of seconds"})
    #: a client that reads nothing of its answer for this long is disconnected (lexgraph.serve.limits)
    write_timeout_s: float = field(metadata={"expected": "a positive number of seconds"})
    #: a keep-alive connection with no new request for this long is closed
    idle_timeout_s: float = field(metadata={"expected": "a positive number of seconds"})
    #: the names a request's Host header may give (the address of --host is always allowed)
    allowed_hosts: list[str] = field(
        metadata={"expected": "a list of host names or addresses without scheme, port or path (such as localhost)"}
    )
    #: the file holding the token POST /admin/reload needs (generated at first start, mode 0600);
    #: ``~`` is the user's home, a relative path starts at the workspace
    admin_token_file: str = field(metadata={"expected": "a file path (created with mode 0600 if absent)"})

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> ServeConfig:
        return section_config(cls, params, "serve")

    def validate(self) -> None:
        if not self.systems or len(set(self.systems)) < len(self.systems):
            raise bad_value("serve", "systems", self.systems, expectation(ServeConfig, "systems") + ", each once")
        positive = (
            "max_batch",
            "max_k",
            "page_k",
            "max_question_chars",
            "max_batch_questions",
            "max_body_bytes",
            "max_head_bytes",
        )
        timeouts = ("header_timeout_s", "body_timeout_s", "write_timeout_s", "idle_timeout_s")
        for key in (*positive, *timeouts):
            if getattr(self, key) <= 0:
                raise bad_value("serve", key, getattr(self, key), expectation(ServeConfig, key))
        if not 0 <= self.max_wait_ms <= 1000:
            raise bad_value("serve", "max_wait_ms", self.max_wait_ms, expectation(ServeConfig, "max_wait_ms"))
        if self.page_k > self.max_k:
            raise bad_value("serve", "page_k", self.page_k, expectation(ServeConfig, "page_k"))
        if any(host_name(h) is None for h in self.allowed_hosts):
            raise bad_value("serve", "allowed_hosts", self.allowed_hosts, expectation(ServeConfig, "allowed_hosts"))
        if not self.admin_token_file.strip():
            expected = expectation(ServeConfig, "admin_token_file")
            raise bad_value("serve", "admin_token_file", self.admin_token_file, expected)


def read_config(workspace: Path) -> ServeConfig:
    """The ``serve`` section of the workspace's params.yaml (a bad value: one
    :class:`lexgraph.core.errors.ConfigError` line)."""
    from lexgraph.core.config import load_params

    _, raw = load_params("serve", workspace / "params.yaml")
    return ServeConfig.from_params(raw)


def host_name(text: str) -> str | None:
    """``text`` as a host the Host header is compared with (lower case, no brackets around an IPv6
    address, no trailing dot), or None when it is not a bare host name or address."""
    import re

    name = text.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if not name or not re.fullmatch(r"[a-z0-9._:-]+", name) or (":" in name and not re.fullmatch(r"[0-9a-f:.]+", name)):
        return None
    return name
