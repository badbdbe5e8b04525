"""The ``lexgraph`` command's standard streams and file-system errors, decided once in
:func:`lexgraph.cli.main.main` (issue 28):

- an output encoding that cannot write a character (``PYTHONIOENCODING=ascii``, ``latin-1``)
  writes it as a ``\\uXXXX`` escape (valid inside the JSON strings of ``--json``, readable in
  text), never a ``UnicodeEncodeError``;
- a closed standard input or output (``<&-``, ``>&-``) and a failed write to standard output
  (``> /dev/full``: no space left) are one :class:`StreamError` line, exit status 2, when the
  command first reads or writes it; a reader that went away (``| head -1``) stays the quiet
  ``BrokenPipeError`` path of :mod:`lexgraph.cli.main`;
- under a locale that is not UTF-8 (``LANG=C`` with ``PYTHONUTF8=0``: Python decodes the command
  line as ASCII, each other byte a lone surrogate), a text argument (the question) whose bytes are
  UTF-8 is read as UTF-8 (:func:`utf8_argument`), as the files lexgraph reads always are, whatever
  the locale; a path argument keeps its bytes (the file system takes them as they are);
- an :class:`OSError` that names a path the user gave (``--run`` of 256 bytes, a path longer
  than ``PATH_MAX``) is one line naming the path and the reason (:func:`lexgraph.core.errors.path_error`).
"""

from __future__ import annotations

import codecs
import os
import sys

from lexgraph.core.errors import LexgraphError

#: the encoding error handler of stdout and stderr: ``\uXXXX`` (a surrogate pair beyond the BMP)
ESCAPE = "lexgraph-json-escape"


class StreamError(LexgraphError):
    """A standard stream that is closed or cannot be written."""


def _json_escape(exc: UnicodeError):
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    out = []
    for ch in exc.object[exc.start : exc.end]:
        code = ord(ch)
        if code > 0xFFFF:  # a surrogate pair, as JSON writes it
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out), exc.end


codecs.register_error(ESCAPE, _json_escape)


class _Closed:
    """Stands for a standard stream that was closed when the command started."""

    def __init__(self, name: str):
        self.name = name

    def isatty(self) -> bool:
        return False

    def _fail(self, *args, **kwargs):
        raise StreamError(f"{self.name} is closed; expected it open (run the command without closing it)")

    write = flush = read = readline = fileno = _fail


class _Guarded:
    """Standard output whose failed writes (no space left, an I/O error) are a :class:`StreamError`."""

    def __init__(self, stream, name: str):
        self._stream, self._name, self.failed = stream, name, False

    def __getattr__(self, attr):
        return getattr(self._stream, attr)

    def _call(self, method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.failed = True
            raise StreamError(
                f"cannot write to {self._name}: {exc.strerror or exc}; expected a writable output"
            ) from None

    def write(self, text):
        return self._call(self._stream.write, text)

    def flush(self):
        return self._call(self._stream.flush)


def utf8_argument(arg: str) -> str:
    """A text argument that Python decoded with ``surrogateescape`` under a non-UTF-8 locale,
    decoded again as UTF-8 when its bytes are UTF-8; otherwise as it is, for the caller's check
    to name the bytes that are not."""
    if arg.isascii():
        return arg
    try:
        return os.fsencode(arg).decode("utf-8")
    except UnicodeError:
        return arg


def guard_streams() -> None:
    """Apply the rules of this module's docstring to ``sys.stdin`` and ``sys.stdout``."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=ESCAPE)
    if sys.stdin is None:
        sys.stdin = _Closed("standard input")
    sys.stdout = _Closed("standard output") if sys.stdout is None else _Guarded(sys.stdout, "standard output")
