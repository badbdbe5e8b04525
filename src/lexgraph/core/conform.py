"""A params value checked against its dataclass field's annotation, and the one-sentence
errors about settings (:func:`params_error`, :func:`bad_value`): the checks under
:func:`lexgraph.core.config.section_config`, which re-exports them."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import types
import typing
from collections import abc
from pathlib import Path
from typing import Any, Union

from lexgraph.core.errors import ConfigError, SettingError


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of the settings class ``cls`` (``typing.get_type_hints``, computed
    once per class: a class's annotations are fixed once it is defined, and reading a section asks
    for them once per key). Callers do not change the mapping."""
    return typing.get_type_hints(cls)


DEFAULT_PARAMS = Path("params.yaml")
_NONE = type(None)


def params_error(detail: str) -> ConfigError:
    """The one-sentence error about a setting, naming params.yaml (the file the user edits):
    every module words it through here (or :func:`bad_value`)."""
    return ConfigError(f"{DEFAULT_PARAMS}: {detail}")


def without_params_file(exc: Exception) -> str:
    """A settings error's words without the leading ``params.yaml: ``, for a saved artefact
    (``gnn.json``, ``mvcl.json``) that holds the settings: the caller names that file instead."""
    return str(exc).removeprefix(f"{DEFAULT_PARAMS}: ")


def bad_value(section: str, key: str, value: Any, expected: str) -> ConfigError:
    """The one-sentence error for a bad ``section.key`` value."""
    return ConfigError(f"params.yaml: '{section}.{key}' = {value!r}, expected {expected}")


@contextlib.contextmanager
def settings_of(section: str, keys: dict[str, str]):
    """Build a model from the ``section`` of params.yaml: a :class:`SettingError` raised inside
    (a value that does not fit the model: its width, its tokenizer) becomes :func:`bad_value`
    naming the key, ``keys`` mapping the constructor's argument names to the section's keys."""
    try:
        yield
    except SettingError as exc:
        if exc.setting not in keys:
            raise
        raise bad_value(section, keys[exc.setting], exc.value, exc.expected) from None


def _describe(hint: Any, plural: bool = False) -> str:
    """User wording of a type annotation: ``int | None`` -> "null or an integer"."""
    words = {
        int: ("an integer", "integers"),
        float: ("a number", "numbers"),
        bool: ("true or false", "true/false values"),
        str: ("a string", "strings"),
        _NONE: ("null", "nulls"),
        dict: ("a mapping", "mappings"),
        list: ("a list", "lists"),
    }
    if hint in words:
        return words[hint][plural]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        ordered = sorted(args, key=lambda a: a is not _NONE)  # null first
        return " or ".join(_describe(a, plural) for a in ordered)
    if origin in (list, tuple, abc.Sequence):
        inner = [a for a in args if a is not Ellipsis]
        return ("lists" if plural else "a list") + (f" of {_describe(inner[0], True)}" if inner else "")
    if origin is dict:
        return words[dict][plural]
    return f"a value of type {getattr(hint, '__name__', hint)}"


class _Mismatch(Exception):
    pass


class _NotFinite(_Mismatch):
    """A number that is nan or infinite: the type is right, the value meaningless (an
    infinite temperature trains nothing, a nan learning rate poisons every weight)."""


def _conform(value: Any, hint: Any) -> Any:
    """``value`` checked against annotation ``hint`` (numbers in strings, ``5e-5``, read
    as floats; ints accepted as floats). One rule for what DVC (``dvc exp run -S``, its
    params diff) holds equal: a value equal to a valid one is read as that one, so that DVC's
    "unchanged" is right and no stage refuses the file it leaves: an integral float (``13.0``)
    is the int ``13`` (``13.5`` refused), ``1``/``0`` (``1.0``/``0.0``) are true/false (``2``
    refused); true/false stay refused where a number is expected. Raises :class:`_Mismatch`."""
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None:
            if _NONE in args:
                return None
            raise _Mismatch
        not_finite = None
        for arg in (a for a in args if a is not _NONE):
            try:
                return _conform(value, arg)
            except _NotFinite as exc:
                not_finite = exc
            except _Mismatch:
                continue
        raise not_finite or _Mismatch()
    if hint is _NONE:
        if value is None:
            return None
        raise _Mismatch
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):  # DVC compares 1 == true, 0.0 == false
            return bool(value)
        raise _Mismatch
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # DVC (`-S seed=13.0`) and YAML tools write 13.0 for 13
            return int(value)
        raise _Mismatch
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 (PyYAML, dvc exp run -S) reads `5e-5` as a string
            try:
                number = float(value)
            except ValueError:
                raise _Mismatch from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer beyond float's range (10**400)
                raise _NotFinite from None
        else:
            raise _Mismatch
        if not math.isfinite(number):  # .nan, .inf, and the strings 'nan', 'inf', '1e999' float() reads
            raise _NotFinite
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if hint in (list, tuple) or origin in (list, tuple, abc.Sequence):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        inner = [a for a in args if a is not Ellipsis]
        items = [_conform(v, inner[0]) for v in value] if inner else list(value)
        return tuple(items) if (origin or hint) is tuple else items
    if hint is dict or origin is dict:
        if isinstance(value, dict):
            return value
        raise _Mismatch
    if isinstance(hint, type) and not isinstance(value, hint):
        raise _Mismatch
    return value


def expectation(cls, name: str) -> str:
    """What field ``name`` of dataclass ``cls`` expects, in the user's words (its ``expected``,
    else one of its ``choices``, else its annotation's)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if "expected" in f.metadata:
        return f.metadata["expected"]
    if "choices" in f.metadata:
        return f"one of {', '.join(map(str, f.metadata['choices']))}"
    return _describe(hints(cls)[name])


def _finite(cls, name: str) -> str:
    """The expectation of a field given nan or an infinity."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if "expected" in f.metadata or typing.get_origin(hints(cls)[name]) in (list, tuple, abc.Sequence):
        return f"{expectation(cls, name)}, finite (not nan or inf)"
    return "a finite number (not nan or inf)"


def check_types(cls, values: dict[str, Any], section: str, keys: dict[str, str] | None = None) -> dict[str, Any]:
    """``values`` (field name -> value) checked against the annotations of dataclass
    ``cls`` and conformed (``'5e-5'`` -> ``5e-05``); ``keys`` maps a field to the key
    the user wrote when they differ (``{"kd_weight": "kd.weight"}``)."""
    declared = hints(cls)
    out = dict(values)
    for name, value in values.items():
        if name not in declared:
            continue
        try:
            out[name] = _conform(value, declared[name])
        except _NotFinite:
            raise bad_value(section, (keys or {}).get(name, name), value, _finite(cls, name)) from None
        except _Mismatch:
            raise bad_value(section, (keys or {}).get(name, name), value, expectation(cls, name)) from None
    return out


# ---------------------------------------------------------------------------
# Values read back from an artefact (issue 28): the domain params.yaml allows them
# ---------------------------------------------------------------------------


def saved_value(cls, name: str, value: Any, path, fix: str, *, key: str | None = None, ok=None) -> Any:
    """A tuned value read back from the artefact ``path`` (``hybrid.json``'s depth, ...), checked
    against the domain params.yaml allows for field ``name`` of config ``cls``: its annotation,
    its ``choices``, then ``ok`` (the config's own range check, shared with its ``validate``).
    Anything else is a one-sentence :class:`DataError` naming the file, ``key`` (default
    ``name``), the value, the field's expectation and ``fix``."""
    from lexgraph.core.errors import DataError

    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    try:
        conformed = _conform(value, hints(cls)[name])
        good = conformed in f.metadata.get("choices", (conformed,)) and (ok is None or ok(conformed))
    except _Mismatch:
        good = False
    if not good:
        raise DataError(path, f"key '{key or name}' = {value!r}, expected {expectation(cls, name)}; {fix}")
    return conformed


def saved_config(cls, values: Any, path, key: str, fix: str):
    """Config ``cls`` rebuilt from the mapping ``values`` that the artefact ``path`` holds under
    ``key`` (a stage's settings saved with its model), through the checks params.yaml gets:
    every field present, annotations, ``choices``, then ``cls.validate()``. A missing key or a
    value out of its domain is a one-sentence :class:`DataError` naming the file, ``key`` and
    the setting, then ``fix``."""
    from lexgraph.core.errors import DataError

    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(values, dict) or set(values) != set(names):
        got = sorted(values) if isinstance(values, dict) else type(values).__name__
        raise DataError(path, f"key '{key}' holds {got}, expected the settings {names}; {fix}")
    try:
        conformed = check_types(cls, values, key)
        for f in dataclasses.fields(cls):
            if conformed[f.name] not in f.metadata.get("choices", (conformed[f.name],)):
                raise bad_value(key, f.name, conformed[f.name], expectation(cls, f.name))
        config = cls(**conformed)
        config.validate()
    except ConfigError as exc:
        raise DataError(path, f"key '{key}': {without_params_file(exc)}; {fix}") from None
    return config
