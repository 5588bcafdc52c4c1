"""pretty_json's fast path (orjson for plain data) writes exactly the bytes json.dumps(indent=2) would."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from pipeline.core.canonical import pretty_json, pretty_json_bytes, write_json


def _reference(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


_CHARS = [chr(c) for c in range(0x80)] + ["é", "中", "\u2028", "\u2029", "\ufeff", "😀", "\x7f", "\u0085"]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 12)))


def _value(rng: random.Random, depth: int) -> Any:
    kind = rng.randint(0, 7 if depth < 4 else 4)
    if kind == 0:
        return _text(rng)
    if kind == 1:
        return rng.choice([0, -1, 1, 2**63 - 1, -(2**63), rng.randint(-(10**12), 10**12)])
    if kind == 2:
        return rng.choice([True, False])
    if kind == 3:
        return None
    if kind == 4:
        return ""
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == 6:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    return {_text(rng): _value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def test_plain_data_gives_json_dumps_bytes() -> None:
    rng = random.Random(11)
    for _ in range(400):
        obj = {"root": _value(rng, 0), _text(rng): [_value(rng, 1)]}
        assert pretty_json(obj) == _reference(obj)
        assert pretty_json_bytes(obj) == _reference(obj).encode("utf-8")


@pytest.mark.parametrize(
    "obj",
    [
        {"x": 1e-05, "y": [1e-07, 100.0, float("nan")]},  # orjson spells floats otherwise
        {"big": 2**64 + 1},  # past orjson's 64 bits
        {1: "int key", 2: "y"},  # json.dumps turns the keys into strings
        {"s": "lone \ud800 surrogate"},
    ],
)
def test_not_plain_data_goes_through_json_dumps(obj: Any) -> None:
    assert pretty_json(obj) == _reference(obj)


def test_other_types_use_the_default_hook(tmp_path: Path) -> None:
    class M(BaseModel):
        a: float
        b: str

    obj = {"m": M(a=0.5, b="x"), "p": Path("a/b"), "s": {"b", "a"}}
    expected = _reference({"m": {"a": 0.5, "b": "x"}, "p": "a/b", "s": ["a", "b"]})
    assert pretty_json(obj) == expected
    write_json(tmp_path / "x.json", obj)
    assert (tmp_path / "x.json").read_text(encoding="utf-8") == expected


def test_a_cycle_is_still_an_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        pretty_json({"x": loop})


def test_deep_nesting_falls_back() -> None:
    deep: Any = "leaf"
    for _ in range(300):  # past orjson's nesting limit
        deep = [deep]
    assert pretty_json(deep) == _reference(deep)
