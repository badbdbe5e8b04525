"""The ``serve`` section of params.yaml: what ``lexgraph serve`` loads and the bounds it holds
requests to (where it listens is the command's ``--host`` and ``--port``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from lexgraph.core.settings import Expect, Float, Int, Section, Str, enforce

#: a positive integer
Positive = Annotated[Int, Field(gt=0)]
#: a timeout
Seconds = Annotated[Float, Field(gt=0), Expect("a positive number of seconds")]
SYSTEMS = "a non-empty list of systems (lexgraph systems lists them), each once"
PAGE_K = "a positive integer, at most max_k"
HOSTS = "a list of host names or addresses without scheme, port or path (such as localhost)"


class ServeConfig(Section, section="serve"):
    """The ``serve`` section of params.yaml."""

    systems: Annotated[list[Str], Field(min_length=1), Expect(SYSTEMS)] = Field(
        description="what the server loads, each once, in this order; the first is the default"
    )
    max_batch: Positive = Field(description="questions per system call when batching")
    max_wait_ms: Annotated[Float, Field(ge=0, le=1000), Expect("a number of milliseconds in [0, 1000]")] = Field(
        description="how long the first queued question waits for others to join its batch"
    )
    max_k: Positive = Field(description="the largest k a request may ask for")
    page_k: Annotated[Int, Field(gt=0), Expect(PAGE_K)] = Field(description="hits shown on the web page")
    max_question_chars: Positive = Field(description="the longest question a request may ask")
    max_batch_questions: Positive = Field(description="questions of one POST /search")
    max_body_bytes: Positive = Field(description="the largest request body")
    max_head_bytes: Positive = Field(description="request line and headers")
    header_timeout_s: Seconds = Field(description="a connection's request head must arrive within this")
    body_timeout_s: Seconds = Field(description="... and its body within this")
    write_timeout_s: Seconds = Field(
        description="a client that reads nothing of its answer for this long is disconnected (lexgraph.serve.limits)"
    )
    idle_timeout_s: Seconds = Field(description="a keep-alive connection with no new request for this long is closed")
    allowed_hosts: Annotated[list[Str], Expect(HOSTS)] = Field(
        description="the names a request's Host header may give (the address of --host is always allowed)"
    )
    admin_token_file: Annotated[Str, Field(pattern=r"\S"), Expect("a file path (created with mode 0600 if absent)")] = (
        Field(
            description="the file holding the token POST /admin/reload needs (generated at first start, mode 0600); "
            "``~`` is the user's home, a relative path starts at the workspace"
        )
    )

    @model_validator(mode="after")
    def _rules(self) -> ServeConfig:
        from lexgraph.methods.catalog import names  # the names are the registry's

        known = names()
        unknown = next((s for s in self.systems if s not in known), None)
        rules = (
            ("systems", len(set(self.systems)) < len(self.systems), SYSTEMS),
            ("systems", unknown, f"a non-empty list of systems, each one of {', '.join(known)} ({unknown!r} is none)"),
            ("page_k", self.page_k > self.max_k, PAGE_K),
            ("allowed_hosts", any(host_name(h) is None for h in self.allowed_hosts), HOSTS),
        )
        enforce(self, rules)
        return self


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
