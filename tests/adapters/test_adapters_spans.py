"""The span locator and ref resolution, on hand-made JSON (no shared data needed)."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from pipeline.adapters.spans import JsonFile, pointer, ref_lines, resolve_element, split_pointer, value_spans


def test_pretty_json_element_lines() -> None:
    doc = {"history": [{"content": "a", "role": "x"}, {"content": "b\nc", "role": "y"}], "n": 1}
    text = json.dumps(doc, indent=4)
    jf = JsonFile(text, max_depth=2)
    lines = text.split("\n")
    for i in range(2):
        loc = jf.locate(f"/history/{i}")
        block = "\n".join(lines[loc.line_start - 1 : loc.line_end]).strip().rstrip(",")
        assert json.loads(block) == doc["history"][i]  # exactly the element's own lines
    assert jf.locate("/n").line_start == jf.locate("/n").line_end == len(lines) - 1


def test_compact_json_needs_the_pointer() -> None:
    text = json.dumps({"traj": [{"a": 1}, {"b": [1, 2]}]})
    jf = JsonFile(text, max_depth=3)
    loc = jf.locate("/traj/1/b")
    assert (loc.line_start, loc.line_end) == (1, 1)
    assert json.loads(resolve_element(text.encode(), 1, 1, "/traj/1/b")) == [1, 2]


def test_spans_are_character_exact_with_tricky_strings() -> None:
    text = '{"k": ["x,]}\\"", {"a/b": "~"}, 3.5e2, null]}'
    spans = value_spans(text, 3)
    assert text[slice(*spans["/k/0"])] == '"x,]}\\""'
    assert text[slice(*spans["/k/1/a~1b"])] == '"~"'
    assert text[slice(*spans["/k/2"])] == "3.5e2"
    assert text[slice(*spans["/k/3"])] == "null"


def test_jsonl_pointer_is_relative_to_its_line() -> None:
    text = '{"a": 1}\n{"message": {"content": [{"t": 1}, {"t": 2}]}}\n'
    jf = JsonFile(text)
    assert jf.jsonl
    loc = jf.locate("/message/content/1", 2)
    assert (loc.line_start, loc.line_end) == (2, 2)
    assert json.loads(resolve_element(text.encode(), 2, 2, "/message/content/1")) == {"t": 2}


def test_string_line_suffix_and_nested_json() -> None:
    inner = json.dumps({"content": "l1\nl2\nl3"}, indent=1)
    text = json.dumps([{"trace": "one\ntwo\nthree"}, {"trace": inner}], indent=1)
    line = next(n for n, ln in enumerate(text.split("\n"), 1) if '"trace": "one' in ln)
    assert resolve_element(text.encode(), line, line, "/0/trace#L2-L3") == "two\nthree"
    line2 = next(n for n, ln in enumerate(text.split("\n"), 1) if '"trace": "{' in ln)
    assert resolve_element(text.encode(), line2, line2, "/1/trace#/content#L2-L2") == "l2"
    with pytest.raises(ValueError):
        resolve_element(text.encode(), line, line, "/0/trace#L2-L9")


def test_ref_outside_the_element_lines_fails() -> None:
    text = json.dumps({"h": [{"c": 1}, {"c": 2}]}, indent=2)
    jf = JsonFile(text, 2)
    loc = jf.locate("/h/1")
    with pytest.raises(ValueError, match="not within"):
        resolve_element(text.encode(), loc.line_start - 1, loc.line_start - 1, "/h/1")
    with pytest.raises(ValueError, match="outside the file"):
        resolve_element(text.encode(), 1, 999, None)


def test_zip_member_pointer() -> None:
    buf = io.BytesIO()
    member = json.dumps({"messages": [{"role": "user"}, {"role": "tool", "content": "x"}]}, indent=2)
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("samples/1_epoch_1.json", member)
    loc = JsonFile(member, 3).locate("/messages/1")
    got = resolve_element(buf.getvalue(), loc.line_start, loc.line_end, "/samples/1_epoch_1.json!/messages/1")
    assert json.loads(got) == {"role": "tool", "content": "x"}
    shown = ref_lines(buf.getvalue(), loc.line_start, loc.line_end, "/samples/1_epoch_1.json!/messages/1")
    assert json.loads(shown.strip().rstrip(",")) == {"role": "tool", "content": "x"}


def test_pointer_escaping_round_trip() -> None:
    assert split_pointer(pointer("a/b", "~c", 3)) == ["a/b", "~c", "3"]
