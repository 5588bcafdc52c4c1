"""Luna's requests share one prefix across cells, so provider prompt caching can reuse it.

Providers cache the longest identical prefix of a request (tools, then the system message). A
per-cell value in Luna's system message would end that prefix after a few hundred tokens; the
recorded demo requests (labelled fixtures, made through record mode) show what is really sent.
"""

from __future__ import annotations

import json

from tests.conftest import DEMO_RECORDINGS


def test_every_luna_request_has_the_same_tools_and_system_message() -> None:
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(DEMO_RECORDINGS.glob("*/*.json"))]
    luna = [r["request"] for r in records if r["role"] == "luna"]
    assert len({r["cell_id"] for r in records if r["role"] == "luna"}) >= 24
    systems = {m["content"] for r in luna for m in r["messages"] if m["role"] == "system"}
    tools = {json.dumps(r.get("tools"), sort_keys=True) for r in luna}
    assert len(systems) == 1 and len(tools) == 1
    (system,) = systems
    assert "C0" not in system  # no cell id in the shared part
    assert len(system) > 2_000  # the instructions are the cacheable part, not a stub
