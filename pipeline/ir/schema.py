"""The IR's tables. Every producer (native exporter, adapters) writes exactly these columns.

Refs: ``source_path`` is relative to the bundle root, ``line_start``/``line_end`` are
1-based inclusive, ``source_sha256`` is the whole raw file's digest as in the manifest
(``sha256:<hex>``). ``json_pointer`` is set when one line holds a whole JSON document and
the event is one element of it (e.g. ``/history/17``).
"""

from __future__ import annotations

from pipeline.artifacts.versions import VERSIONS

IR_SCHEMA_VERSION = VERSIONS["ir"]

# Event kinds. Producers map their sources onto these; `detail` keeps the source's own name.
EVENT_KINDS = (
    "message",  # natural-language turn (operator, candidate, reviewer, ...)
    "tool_call",  # a tool invocation with arguments (args_digest set)
    "tool_result",  # the tool's output (result_digest set)
    "error",  # an error reported by a tool, the harness or the model API
    "state_change",  # controller state changed (state_digest set)
    "stage",  # controller stage lifecycle: started / accepted / sent_back / failed / finished
    "artifact",  # an artifact written, with its digest
    "handoff",  # control passed between actors or stages
    "obligation",  # an obligation declared or discharged (detail says which)
    "other",  # anything else kept for completeness
)

DDL = """
CREATE TABLE IF NOT EXISTS meta (
    key VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS cells (
    cell_id VARCHAR PRIMARY KEY,
    task_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    eligibility VARCHAR NOT NULL,      -- 'valid_behavior' or 'excluded'
    exclusion_reason VARCHAR,
    harness VARCHAR,
    step_index_base INTEGER            -- 0 or 1 when the source numbers steps; NULL otherwise
);
CREATE TABLE IF NOT EXISTS segments (
    segment_id VARCHAR PRIMARY KEY,
    cell_id VARCHAR NOT NULL,
    seq INTEGER NOT NULL,              -- order of the segment within its cell
    stage VARCHAR,
    session_id VARCHAR,
    actor VARCHAR,
    first_event_seq INTEGER NOT NULL,
    last_event_seq INTEGER NOT NULL,
    event_count INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    event_id VARCHAR PRIMARY KEY,      -- '<cell_id>-e<seq, 4+ digits>', stable across reruns
    cell_id VARCHAR NOT NULL,
    segment_id VARCHAR NOT NULL,
    seq INTEGER NOT NULL,              -- order within the cell, 0-based
    ts VARCHAR,
    kind VARCHAR NOT NULL,             -- one of EVENT_KINDS
    detail VARCHAR,                    -- the source's own sub-kind (e.g. 'stage_accepted')
    actor VARCHAR,
    stage VARCHAR,
    session_id VARCHAR,
    step_index INTEGER,                -- step number as the source defines it (see cells.step_index_base)
    text VARCHAR,                      -- trimmed text; trimming is marked inside the text and by text_truncated
    text_truncated BOOLEAN NOT NULL,
    text_chars INTEGER NOT NULL,       -- length of the untrimmed text
    tool_name VARCHAR,
    call_id VARCHAR,
    args_digest VARCHAR,               -- sha256 of canonical tool arguments
    result_digest VARCHAR,             -- sha256 of the tool output / artifact content when known
    state_digest VARCHAR,              -- controller state digest in force at this event, when known
    target VARCHAR,                    -- what the event acts on (file, stage, artifact, obligation id)
    source_path VARCHAR NOT NULL,
    line_start INTEGER NOT NULL,
    line_end INTEGER NOT NULL,
    source_sha256 VARCHAR NOT NULL,
    json_pointer VARCHAR
);
CREATE TABLE IF NOT EXISTS outcomes (
    cell_id VARCHAR PRIMARY KEY,
    label VARCHAR,                     -- 'completed' / 'workflow_failed' / dataset-specific
    quality DOUBLE,
    completion DOUBLE,
    cost DOUBLE,
    stability DOUBLE,
    extra VARCHAR                      -- canonical JSON of every other label field (never shown to Luna)
);
CREATE TABLE IF NOT EXISTS coverage (
    cell_id VARCHAR PRIMARY KEY,
    status VARCHAR NOT NULL,           -- 'included' or 'excluded'
    reason VARCHAR,
    events INTEGER NOT NULL,
    redactions INTEGER NOT NULL DEFAULT 0  -- secrets replaced by [REDACTED:<kind>] in the cell's event text
);
CREATE TABLE IF NOT EXISTS cell_digests (
    cell_id VARCHAR PRIMARY KEY,
    source_digest VARCHAR,             -- what its events were read from (raw files, format, lunasol); NULL: excluded
    content_digest VARCHAR NOT NULL    -- the cell's IR content (cells row + events), see pipeline.ir.digests
);
"""

# Text longer than this is trimmed in the IR with an explicit marker (full bytes stay in the bundle).
TEXT_LIMIT = 2000


def event_id(cell_id: str, seq: int) -> str:
    """Stable event id: the cell id and the event's 0-based order in the cell."""
    return f"{cell_id}-e{seq:04d}"


def trim_text(text: str, limit: int = TEXT_LIMIT) -> tuple[str, bool]:
    """Trim long text, never silently: the marker says how much was cut."""
    if len(text) <= limit:
        return text, False
    head = limit * 3 // 4
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... lunasol trimmed {cut} chars ...]\n{text[-tail:]}", True
