"""Typed settings on pydantic v2: every params.yaml section is a :class:`Settings` model, checked
once where it enters (:func:`read_section`), and its errors are one sentence naming the file, the
dotted key and what was expected.

A model is plain pydantic: fields typed with the constrained types below (``Int``, ``Float``,
``Bool``, ``Str``, ``Literal[...]``, ``list[...]``, ``X | None``, nested models for nested
mappings), constraints with ``Field(ge=..., gt=..., le=..., lt=..., min_length=...)``, help text
in ``Field(description=...)``, cross-key rules in validators that raise :class:`Invalid`. Extras
are forbidden and every key is required: a value lives in params.yaml (and the profiles), not in
code. A section read as it stands is a :class:`Section`, named in its class statement
(``class XConfig(Section, section="x")``) and read by its ``from_params``. What the user reads
after "expected" is generated from the field's type and constraints (:func:`expectation`), or given
by an :class:`Expect` in the type's metadata where words say more.

One rule for what DVC holds equal (``dvc exp run -S``, its params diff): a value equal to a valid
one is read as that one, so that DVC's "unchanged" is right and no stage refuses the file it
leaves: an integral float (``13.0``) is the int ``13`` (``13.5`` refused); ``1``/``0`` are
true/false (``2`` refused); a number in a string (YAML 1.1 reads ``5e-5`` as one) is a number
where a number is expected. True/false stay refused where a number is expected, numbers where a
string is, and nan or infinities everywhere.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Strict, ValidationError
from pydantic.fields import FieldInfo

from lexgraph.core.errors import ConfigError, DataError, SettingError

PARAMS_FILE = "params.yaml"


class Expect:
    """The user's words for a type (``Annotated[str, Expect("auto, cpu, cuda or cuda:N")]``),
    where its constraints alone would not say what to write."""

    def __init__(self, words: str):
        self.words = words

    def __repr__(self) -> str:
        return f"Expect({self.words!r})"


class Invalid(ValueError):
    """A value that breaks a rule its type cannot state (a cross-key rule, a name that must be
    known), raised inside a validator: ``key`` is the key as the user writes it, relative to the
    model whose validator raises (dotted for a nested one), ``expected`` the sentence's end."""

    def __init__(self, key: str, value: Any, expected: str):
        super().__init__(f"{key} = {value!r}, expected {expected}")
        self.key, self.value, self.expected = key, value, expected


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():  # DVC (`-S seed=13.0`) and YAML tools write 13.0
        return int(value)
    return value


def _truth(value: Any) -> Any:
    if not isinstance(value, bool) and isinstance(value, int | float) and value in (0, 1):
        return bool(value)  # DVC compares 1 == true, 0.0 == false
    return value


def _number(value: Any) -> Any:
    if isinstance(value, str):  # YAML 1.1 (PyYAML, dvc exp run -S) reads `5e-5` as a string
        try:
            return float(value)
        except ValueError:
            return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer beyond float's range (10**400)
            return math.inf
    return value


#: an integer (``13.0`` read as ``13``; true/false refused)
Int = Annotated[int, BeforeValidator(_integral), Strict()]
#: a finite number (integers and numbers in strings read as numbers; nan, infinities, true/false refused)
Float = Annotated[float, BeforeValidator(_number), Strict()]
#: true or false (``1``/``0`` read as true/false)
Bool = Annotated[bool, BeforeValidator(_truth), Strict()]
#: a string (numbers refused)
Str = Annotated[str, Strict()]


def enforce(values: Any, rules: Iterable[tuple[str, Any, str]]) -> Any:
    """``values`` (a model, or a mapping in a ``mode="before"`` validator) if no rule is broken;
    else :class:`Invalid` for the first ``(key, broken, expected)`` whose ``broken`` holds: the
    rules between keys of a section, as one table."""
    for key, broken, expected in rules:
        if broken:
            raise Invalid(key, values[key] if isinstance(values, Mapping) else getattr(values, key), expected)
    return values


class Settings(BaseModel):
    """A params.yaml section (or a nested mapping of one): frozen, no unknown keys, no defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, validate_default=True)


M = TypeVar("M", bound=BaseModel)


class Section(Settings):
    """A top-level params.yaml section, named where it is declared (``class XConfig(Section,
    section="x")``) and read by :meth:`from_params`."""

    section: ClassVar[str]

    def __init_subclass__(cls, section: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if section is not None:
            cls.section = section

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> Self:
        """The section's values (None: an empty section) as this model (:func:`read_section`)."""
        return read_section(cls, params, cls.section)


def read_section(model: type[M], values: Any, section: str, where: str = PARAMS_FILE, **context: Any) -> M:
    """``values`` (one section of params.yaml, or a mapping read back from an artefact) as
    ``model``; any error is one :class:`ConfigError` sentence naming ``where``, the dotted key
    under ``section`` and what was expected. ``context`` reaches the model's validators
    (``info.context``)."""
    try:
        return model.model_validate({} if values is None else values, context=context or None)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {describe(model, values, section, exc)}") from None


def saved_section(model: type[M], values: Any, path, key: str | None, fix: str) -> M:
    """Settings saved in an artefact read back through the same model as params.yaml: a value out
    of its domain is a :class:`DataError` naming the file and ``key`` (None: the settings are the
    file's top level, as in ``zeroshot.json``, and the sentence names the value's own key), then ``fix``."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        where = (
            f"key '{key}': {describe(model, values, key, exc)}" if key else f"key {describe(model, values, '', exc)}"
        )
        raise DataError(path, f"{where}; {fix}") from None


# ---------------------------------------------------------------------------
# One sentence from a ValidationError
# ---------------------------------------------------------------------------

_ORDER = {"extra_forbidden": 0, "missing": 1}


def describe(model: type[BaseModel], values: Any, section: str, exc: ValidationError) -> str:
    """The first error of ``exc`` in the user's words: unknown keys first, then missing ones,
    then values, in the order the model declares them."""
    errors = sorted(exc.errors(), key=lambda e: _ORDER.get(e["type"], 2))
    error = errors[0]
    loc = _keys_of(error["loc"], model)
    if error["type"] == "extra_forbidden":
        extras = (_keys_of(e["loc"], model) for e in errors if e["type"] == "extra_forbidden")
        unknown = [k[-1] for k in extras if k[:-1] == loc[:-1]]
        return _unknown(_model_at(model, loc[:-1]), (section, *loc[:-1]), unknown)
    if error["type"] == "missing":
        return f"missing key '{_dotted(section, loc)}', expected {_expected_at(model, loc)}"
    problem = (error.get("ctx") or {}).get("error")
    if isinstance(problem, Invalid):
        return f"'{_dotted(section, (*loc, problem.key))}' = {problem.value!r}, expected {problem.expected}"
    value, loc = _value_at(model, values, error, loc)
    expected = _expected_at(model, loc)
    if any(e["type"] == "finite_number" and _keys_of(e["loc"], model)[: len(loc)] == loc for e in errors):
        expected = f"{expected}, finite (not nan or inf)"  # a number's type, not its value: nan, inf
    return f"'{_dotted(section, loc)}' = {value!r}, expected {expected}"


def _dotted(section: str, loc: tuple) -> str:
    return ".".join(str(p) for p in (section, *loc) if p != "")


def _keys_of(loc: tuple, model: type[BaseModel]) -> tuple:
    """A pydantic location as the user's keys: the fields' names down to the value (list indices
    kept: the value shown is then the whole list); what pydantic adds below a leaf (a union
    member's name) is dropped, and an unknown key is the last part of its own location."""
    keys: list = []
    current: Any = model
    for i, part in enumerate(loc):
        if isinstance(part, int):
            keys.append(part)
        elif current is not None and part in current.model_fields:
            keys.append(part)
            current = _nested(current.model_fields[part].annotation)
        elif current is not None and i == len(loc) - 1:
            keys.append(part)  # an unknown key
        else:
            break
    return tuple(keys)


#: errors of a value of the right type out of its range: the value is shown as read (``0`` as ``0.0``)
_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long"}


def _value_at(model: type[BaseModel], values: Any, error: dict, loc: tuple) -> tuple[Any, tuple]:
    """The value to show and its key: as written, the whole list for a list item's error; an
    integer out of a number's range as the number it was read as (``0`` -> ``0.0``)."""
    if any(isinstance(p, int) for p in loc):
        loc = loc[: next(i for i, p in enumerate(loc) if isinstance(p, int))]
    node = values
    for part in loc:
        node = node[part]
    if error["type"] in _RANGE and isinstance(node, int) and not isinstance(node, bool):
        if _core(_field_at(model, loc).annotation) is float:
            return float(node), loc
    return node, loc


def _core(hint: Any) -> Any:
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _field_at(model: type[BaseModel], loc: tuple) -> FieldInfo:
    return _model_at(model, loc[:-1]).model_fields[loc[-1]]


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel]:
    for part in loc:
        model = _nested(model.model_fields[part].annotation)
    return model


def _nested(annotation: Any) -> Any:
    """The model inside an annotation (``Model``, ``Model | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested(arg)
        if found is not None:
            return found
    return None


def _unknown(model: type[BaseModel], where: tuple, unknown: list) -> str:
    dotted = ".".join(map(str, where))
    names = sorted(model.model_fields)
    close = difflib.get_close_matches(str(unknown[0]), names, n=1)
    hint = getattr(model, "unknown_hint", lambda keys: None)(unknown)  # a model may say more
    hint = hint or (f" (did you mean '{dotted}.{close[0]}'?)" if close else "")
    listed = ", ".join(repr(f"{dotted}.{k}") for k in sorted(unknown, key=str))
    return f"unknown keys {listed}{hint}; expected keys of '{dotted}': {', '.join(names)}"


def _expected_at(model: type[BaseModel], loc: tuple) -> str:
    """What the field at ``loc`` expects."""
    return expectation(_field_at(model, loc))


# ---------------------------------------------------------------------------
# What a field expects, in words
# ---------------------------------------------------------------------------

_WORDS = {
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    bool: ("true or false", "true/false values"),
    str: ("a string", "strings"),
    type(None): ("null", "nulls"),
    dict: ("a mapping", "mappings"),
}


def expectation(field: FieldInfo) -> str:
    """A field's expectation: an :class:`Expect` among its metadata, else its type's words with
    its constraints (``an integer >= 0``, ``a positive number``, ``a number in (0, 1]``,
    ``one of cosine, dot``, ``a non-empty list of numbers in [0, 1]``, ``null or an integer``)."""
    return _words(field.annotation, list(field.metadata))


def _words(hint: Any, metadata: list, plural: bool = False) -> str:
    for item in metadata:
        if isinstance(item, Expect):
            return item.words
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        own = [m for item in hint.__metadata__ for m in (item.metadata if isinstance(item, FieldInfo) else [item])]
        return _words(args[0], [*metadata, *own], plural)
    if origin in (Union, types.UnionType):
        ordered = sorted(args, key=lambda a: a is not type(None))  # null first
        return " or ".join(_words(a, metadata if a is not type(None) else [], plural) for a in ordered)
    if origin is Literal:
        return "one of " + ", ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in args)
    if origin in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        size = _bound(metadata, "min_length")
        head = ("non-empty lists" if plural else "a non-empty list") if size else ("lists" if plural else "a list")
        return head + (f" of {_words(inner[0], [], True)}" if inner else "")
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return f"a mapping with the keys {', '.join(hint.model_fields)}"
    noun = _WORDS.get(hint, (f"a value of type {getattr(hint, '__name__', hint)}",) * 2)[plural]
    ge, gt, le, lt = (_bound(metadata, n) for n in ("ge", "gt", "le", "lt"))
    if gt == 0 and le is None and lt is None and hint in (int, float):
        return f"positive {noun}" if plural else f"a positive {noun.split(' ', 1)[1]}"
    low, opening = (ge, "[") if ge is not None else (gt, "(")
    high, closing = (le, "]") if le is not None else (lt, ")")
    if low is not None and high is not None:
        return f"{noun} in {opening}{low}, {high}{closing}"
    if low is not None:
        return f"{noun} >= {ge}" if ge is not None else f"{noun} > {gt}"
    if high is not None:
        return f"{noun} <= {le}" if le is not None else f"{noun} < {lt}"
    return noun


def _bound(metadata: list, name: str) -> Any:
    for item in metadata:
        value = getattr(item, name, None)
        if value is not None:
            return value
    return None


# ---------------------------------------------------------------------------
# Errors about settings found after reading (a value against the data, a model's own rule)
# ---------------------------------------------------------------------------


def params_error(detail: str) -> ConfigError:
    """The one-sentence error about a setting, naming params.yaml (the file the user edits)."""
    return ConfigError(f"{PARAMS_FILE}: {detail}")


def bad_value(section: str, key: str, value: Any, expected: str) -> ConfigError:
    """The one-sentence error for a bad ``section.key`` value found against the data (a split
    with no questions), after the section was read."""
    return params_error(f"'{section}.{key}' = {value!r}, expected {expected}")


def without_params_file(exc: Exception) -> str:
    """A settings error's words without the leading ``params.yaml: ``, for a saved artefact
    (``gnn.json``, ``mvcl.json``) that holds the settings: the caller names that file instead."""
    return str(exc).removeprefix(f"{PARAMS_FILE}: ")


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
