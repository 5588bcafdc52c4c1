"""One ref spelling for every layer: what Sol resolves, ``lunasol ref`` parses and the report and diff find."""

from __future__ import annotations

import pytest

from pipeline.core.errors import BadInput
from pipeline.core.refs import REF, REF_IN_TEXT
from pipeline.ir.refs import parse_ref
from pipeline.sol.checks import CellInfo, EvidenceIndex

# (ref, path, start, end, pointer)
REFS = [
    ("cells/C001/controller.jsonl#L3-L4", "cells/C001/controller.jsonl", 3, 4, None),
    ("cells/C001/controller.jsonl#L3-4", "cells/C001/controller.jsonl", 3, 4, None),  # how models write it
    ("cells/C001/controller.jsonl#L7", "cells/C001/controller.jsonl", 7, 7, None),
    ("raw/traj.json#L1-L1/history/3/content", "raw/traj.json", 1, 1, "/history/3/content"),
    ("raw/logs/run 2/agent.jsonl#L5-L5", "raw/logs/run 2/agent.jsonl", 5, 5, None),  # bundle paths may hold spaces
]


@pytest.mark.parametrize(("text", "path", "start", "end", "pointer"), REFS)
def test_every_layer_reads_a_ref_the_same_way(text: str, path: str, start: int, end: int, pointer: str | None) -> None:
    ref = parse_ref(text)
    assert (ref.path, ref.line_start, ref.line_end, ref.json_pointer) == (path, start, end, pointer)
    # Sol resolves what it cites with the same pattern: a hand-built index holding one event there
    index = EvidenceIndex(
        cells={"C001": CellInfo(task_id="t", run_id="r", harness=None, eligible=True)},
        events={"C001-e0001": ("C001", path, start, end)},
    )
    assert index.resolve(text) == ("C001", None)


@pytest.mark.parametrize(("text", "path", "start", "end", "pointer"), [r for r in REFS if " " not in r[1]])
def test_a_ref_inside_text_is_found_whole(text: str, path: str, start: int, end: int, pointer: str | None) -> None:
    found = [m.group(0) for m in REF_IN_TEXT.finditer(f"see ({text}), then stop.")]
    assert found == [text]
    m = REF.match(found[0])
    assert m is not None and m["path"] == path


def test_a_malformed_ref_is_refused_by_name() -> None:
    for bad in ("cells/C001/controller.jsonl", "cells/C001/controller.jsonl#L", "#L3-L4", "cells/x#L4-L3"):
        with pytest.raises(BadInput):
            parse_ref(bad)
