"""lexgraph.core.settings, the reader of every params section on pydantic: the DVC-equal types,
the words after "expected" generated from a field's type and constraints, and the one sentence a
ValidationError becomes, on a toy section (the real ones: test_params_errors, test_run_outputs,
test_gnn_published, test_mvcl_published)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import pytest
from pydantic import Field, model_validator

from lexgraph.core.errors import ConfigError, DataError
from lexgraph.core.settings import (
    Bool,
    Expect,
    Float,
    Int,
    Invalid,
    Settings,
    Str,
    enforce,
    read_section,
    saved_section,
)


class Kd(Settings):
    weight: Annotated[Float, Field(ge=0, le=1)]
    mode: Literal["score", "feature"]


class Own(Settings):
    width: Annotated[Int, Field(gt=0)]
    lr: Annotated[Float, Field(gt=0)]
    kd: Kd

    @classmethod
    def unknown_hint(cls, keys: list[str]) -> str | None:
        return " (a shared key: set it once under 'toy')" if "depth" in keys else None


class Toy(Settings):
    depth: Annotated[Int, Field(ge=1, le=8)]
    rate: Annotated[Float, Field(gt=0, lt=1)]
    on: Bool
    name: Str
    grid: list[Annotated[Float, Field(ge=0)]] = Field(min_length=1)
    cap: Annotated[Int, Field(ge=0)] | None
    k1: Annotated[Annotated[Float, Field(ge=0)] | Literal["tuned"], Expect("a number >= 0 or 'tuned'")]
    a: Own

    @model_validator(mode="after")
    def _rules(self) -> Toy:
        if self.a.width % self.depth:  # a nested key: raised by hand
            raise Invalid("a.width", self.a.width, f"a multiple of depth ({self.depth})")
        return enforce(self, (("cap", self.cap is not None and self.cap > 10 * self.depth, "at most 10 * depth"),))


GOOD = {
    "depth": 2,
    "rate": 0.5,
    "on": True,
    "name": "x",
    "grid": [0.5, 1.2],
    "cap": None,
    "k1": "tuned",
    "a": {"width": 4, "lr": 0.1, "kd": {"weight": 0.3, "mode": "score"}},
}
DROP = object()


def _read(**edits):
    values = {**GOOD, **{k: v for k, v in edits.items() if "." not in k}}
    if "a" not in edits:
        values["a"] = {**GOOD["a"], "kd": dict(GOOD["a"]["kd"])}
    for key, value in edits.items():
        if "." in key:
            node = values
            *parents, last = key.split(".")
            for part in parents:
                node = node[part]
            node[last] = value
    values = _drop(values)
    return read_section(Toy, values, "toy")


def _drop(values):
    if isinstance(values, dict):
        return {k: _drop(v) for k, v in values.items() if v is not DROP}
    return values


def _error(**edits) -> str:
    with pytest.raises(ConfigError) as caught:
        _read(**edits)
    message = str(caught.value)
    assert message.startswith("params.yaml: ") and "\n" not in message
    return message.removeprefix("params.yaml: ")


def test_values_equal_to_valid_ones_are_read_as_those_as_dvc_compares_them():
    toy = _read(depth=2.0, on=1, rate="5e-1", cap=3.0, **{"a.lr": 1})
    assert (toy.depth, toy.on, toy.rate, toy.cap, toy.a.lr) == (2, True, 0.5, 3, 1.0)
    assert type(toy.depth) is int and type(toy.a.lr) is float and _read(on=0.0).on is False


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ({"depth": 2.5}, "'toy.depth' = 2.5, expected an integer in [1, 8]"),
        ({"depth": True}, "'toy.depth' = True, expected an integer in [1, 8]"),
        ({"depth": "2"}, "'toy.depth' = '2', expected an integer in [1, 8]"),
        ({"depth": 9}, "'toy.depth' = 9, expected an integer in [1, 8]"),
        ({"on": 2}, "'toy.on' = 2, expected true or false"),
        ({"on": "yes"}, "'toy.on' = 'yes', expected true or false"),
        ({"name": 3}, "'toy.name' = 3, expected a string"),
        ({"rate": True}, "'toy.rate' = True, expected a number in (0, 1)"),
        ({"rate": 1}, "'toy.rate' = 1.0, expected a number in (0, 1)"),  # the integer as the number it is read as
        ({"rate": "nan"}, "'toy.rate' = 'nan', expected a number in (0, 1), finite (not nan or inf)"),
        ({"rate": math.inf}, "'toy.rate' = inf, expected a number in (0, 1), finite (not nan or inf)"),
        ({"grid": []}, "'toy.grid' = [], expected a non-empty list of numbers >= 0"),
        ({"grid": [1.2, -1]}, "'toy.grid' = [1.2, -1], expected a non-empty list of numbers >= 0"),  # the whole list
        ({"grid": [1.2, math.inf]}, "'toy.grid' = [1.2, inf], expected a non-empty list of numbers >= 0, finite"),
        ({"grid": 1.2}, "'toy.grid' = 1.2, expected a non-empty list of numbers >= 0"),
        ({"cap": "all"}, "'toy.cap' = 'all', expected null or an integer >= 0"),
        ({"k1": "fast"}, "'toy.k1' = 'fast', expected a number >= 0 or 'tuned'"),
        ({"k1": math.inf}, "'toy.k1' = inf, expected a number >= 0 or 'tuned', finite (not nan or inf)"),
        ({"a.width": 0}, "'toy.a.width' = 0, expected a positive integer"),
        ({"a.kd.mode": "rank"}, "'toy.a.kd.mode' = 'rank', expected one of score, feature"),
        ({"a.kd.weight": -1}, "'toy.a.kd.weight' = -1.0, expected a number in [0, 1]"),
        ({"a.kd": 3}, "'toy.a.kd' = 3, expected a mapping with the keys weight, mode"),
        ({"a.width": 6, "depth": 4}, "'toy.a.width' = 6, expected a multiple of depth (4)"),  # a validator's rule
        ({"cap": 21}, "'toy.cap' = 21, expected at most 10 * depth"),  # a rule of the validator's table
        ({"depth": DROP}, "missing key 'toy.depth', expected an integer in [1, 8]"),
        ({"a.kd.mode": DROP}, "missing key 'toy.a.kd.mode', expected one of score, feature"),
        ({"a": DROP}, "missing key 'toy.a', expected a mapping with the keys width, lr, kd"),
    ],
)
def test_each_refusal_is_one_sentence_naming_the_key_the_value_and_what_was_expected(edits, message):
    assert _error(**edits).startswith(message)


def test_an_integer_beyond_floats_range_is_not_finite():
    assert _error(rate=10**400).endswith("expected a number in (0, 1), finite (not nan or inf)")


def test_unknown_keys_come_first_with_the_closest_key_or_the_models_own_hint():
    assert _error(dpeth=2, zzz=1, depth=DROP) == (
        "unknown keys 'toy.dpeth', 'toy.zzz' (did you mean 'toy.depth'?); expected keys of 'toy': "
        "a, cap, depth, grid, k1, name, on, rate"
    )
    assert _error(**{"a.depth": 2, "a.width": "x"}).startswith(
        "unknown keys 'toy.a.depth' (a shared key: set it once under 'toy'); expected keys of 'toy.a': kd, lr, width"
    )


def test_a_missing_key_comes_before_a_bad_value():
    assert _error(depth=DROP, rate="x").startswith("missing key 'toy.depth'")


def test_settings_read_back_from_an_artefact_name_the_file_and_key(tmp_path):
    path = tmp_path / "model.json"
    with pytest.raises(DataError) as caught:
        saved_section(Kd, {"weight": 2, "mode": "score"}, path, "kd", "rebuild it with dvc repro")
    assert str(caught.value) == (
        f"{path}: key 'kd': 'kd.weight' = 2.0, expected a number in [0, 1]; rebuild it with dvc repro"
    )
    assert saved_section(Kd, {"weight": 1, "mode": "score"}, path, "kd", "x") == Kd(weight=1.0, mode="score")


def test_a_section_is_frozen_and_has_no_defaults():
    toy = _read()
    with pytest.raises(Exception, match="frozen"):
        toy.depth = 3
    for model in (Toy, Own, Kd):
        assert all(f.is_required() for f in model.model_fields.values()), model
