"""lexgraph.core.config.section_config, the one reader of every params section: nested
mappings, per-variant sections, keys read under a condition and nested dataclasses, on a toy
section (the real ones: test_params_errors, test_gnn_published, test_mvcl_published)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from lexgraph.core.config import ConfigError, params_error, section_config


@dataclass(frozen=True)
class Arch:
    width: int
    depth: int

    def validate(self) -> None:
        if self.width % self.depth:
            raise params_error(f"'toy.width' = {self.width} is not divisible by 'toy.depth' = {self.depth}")


@dataclass(frozen=True)
class Toy:
    VARIANTS = ("a", "b")  # not a field

    variant: str
    shared: int
    arch: Arch = field(metadata={"keys": {"width": "{variant}.width", "depth": "depth"}})
    lr: float = field(metadata={"key": "{variant}.lr"})
    kd_weight: float = field(metadata={"key": "{variant}.kd.weight", "variants": ("b",), "unread": 0.0})
    mode: str = field(metadata={"key": "{variant}.mode", "choices": ("x", "y")})
    temp: float | None = field(metadata={"key": "{variant}.temp", "read_with": ("mode", "y"), "unread": None})


PARAMS = {
    "shared": 1,
    "depth": 2,
    "a": {"width": 4, "lr": "1e-3", "mode": "x"},
    "b": {"width": 6, "lr": 0.5, "mode": "y", "temp": 0.1, "kd": {"weight": 0.3}},
}


DROP = object()  # an edit that removes the key


def _read(variant: str, **edits):
    """The toy section for ``variant``, with ``edits`` to the variants' mappings."""
    params = {**PARAMS, **{k: v for k, v in edits.items() if k in PARAMS and k not in "ab"}}
    for k in ("a", "b"):
        params[k] = {**PARAMS[k], **edits.get(k, {})}
        params[k] = {key: v for key, v in params[k].items() if v is not DROP}
    return section_config(Toy, params, "toy", variant)


def test_each_variant_reads_the_shared_keys_and_its_own_mapping():
    a, b = _read("a"), _read("b")
    assert (a.variant, a.shared, a.arch, a.lr, a.kd_weight, a.mode, a.temp) == (
        "a",
        1,
        Arch(4, 2),
        1e-3,
        0.0,
        "x",
        None,
    )
    assert (b.arch, b.lr, b.kd_weight, b.temp) == (Arch(6, 2), 0.5, 0.3, 0.1)


@pytest.mark.parametrize(
    "variant, edits, message",
    [
        ("a", {"a": {"depth": 2}}, "unknown keys 'toy.a.depth' (a shared key: set it once under 'toy')"),
        ("a", {"a": {"kd": {"weight": 1}}}, "unknown keys 'toy.a.kd'"),
        ("b", {"b": {"kd": {"wieght": 1}}}, "unknown keys 'toy.b.kd.wieght' (did you mean 'toy.b.kd.weight'?)"),
        ("b", {"b": {"kd": 3}}, "'toy.b.kd' = 3, expected a mapping with the keys weight"),
        ("b", {"b": {"kd": {}}}, "missing key 'toy.b.kd.weight', expected a number"),
        ("a", {"a": {"lr": DROP}}, "missing key 'toy.a.lr', expected a number"),
        ("a", {"a": {"width": "4"}}, "'toy.a.width' = '4', expected an integer"),
        ("a", {"a": {"width": 5}}, "'toy.a.width' = 5 is not divisible by 'toy.depth' = 2"),
        ("a", {"a": {"mode": "z"}}, "'toy.a.mode' = 'z', expected one of x, y"),
        (
            "a",
            {"a": {"temp": 0.1}},
            "'toy.a.temp' is read only with mode: y; expected no temp with mode: x (remove it)",
        ),
        ("b", {"b": {"temp": DROP}}, "missing key 'toy.b.temp', expected null or a number (read with mode: y)"),
        ("c", {}, "unknown 'toy' variant 'c', expected one of a, b"),
    ],
)
def test_refusals_name_the_key_as_written(variant, edits, message):
    with pytest.raises(ConfigError) as info:
        _read(variant, **edits)
    assert str(info.value).startswith(f"params.yaml: {message}"), str(info.value)


def test_a_missing_variant_mapping_is_named():
    with pytest.raises(
        ConfigError, match=r"^params\.yaml: missing key 'toy\.b', expected a mapping of the b settings$"
    ):
        section_config(Toy, {k: v for k, v in PARAMS.items() if k != "b"}, "toy", "a")
