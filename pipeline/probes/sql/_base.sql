-- Shared definitions for the probes. Conservative on purpose: a probe claims "nothing changed"
-- only when it can show it, so any tool it cannot classify counts as a possible change.
--
-- probe_events stays a view (it carries every column, text included: no copy of the IR's text);
-- the narrow derived sets below are temp tables, made once per probing instead of once per probe
-- that reads them (2-3x less probe time on the demo and on a 200-cell bundle).

-- read / check / request / mutating / unknown, from the tool's name. A permission request changes
-- nothing by itself (if granted, the write that follows is the change). Mutating words are tested
-- before checks so that e.g. `git_checkout` is not taken for a check.
CREATE OR REPLACE TEMP MACRO lunasol_tool_class(t) AS CASE
    WHEN t IS NULL THEN 'none'
    WHEN regexp_matches(lower(t), '(permission|approval)') THEN 'request'
    WHEN regexp_matches(lower(t), '(write|edit|patch|apply|create|delete|remove|rename|move|replace|insert|commit|append|save|update|checkout|reset|install|mkdir|touch|ask|submit|accept|approve)')
        THEN 'mutating'
    WHEN regexp_matches(lower(t), '(test|pytest|lint|check|validate|verify|typecheck|mypy|ruff|clippy|build|compile|vet)')
        THEN 'check'
    WHEN regexp_matches(lower(t), '(read|cat|grep|rg|search|find|list|ls|view|open|get|show|glob|head|tail|stat|diff|inspect|query|fetch|status|log|blame|tree|scroll)')
        THEN 'read'
    ELSE 'unknown'
END;

-- A report is what a checker writes about other stages' work (validation.md, review.md, ...).
CREATE OR REPLACE TEMP MACRO lunasol_is_report_path(target) AS
    coalesce(regexp_matches(lower(target), '(^|/)(validation|review|report|verification)[^/]*\.(md|txt|json)$'), FALSE);
CREATE OR REPLACE TEMP MACRO lunasol_is_report(target, stage) AS
    lunasol_is_report_path(target) OR coalesce(lower(stage) IN ('validation', 'review', 'verification'), FALSE);

-- Two controller states are the same only when both are known and equal.
CREATE OR REPLACE TEMP MACRO lunasol_same_state(a, b) AS coalesce(a = b, FALSE);

-- Cells whose log carries controller state at all (a state line, or a digest on any event). In a
-- cell without any (most foreign formats: the adapter knows no controller state), "same state"
-- means "no state change observed": its events get the state 'none-observed', so repeat chains
-- can form there, and any state line that does appear still breaks them.
CREATE OR REPLACE TEMP TABLE probe_stateful_cells AS
SELECT DISTINCT cell_id FROM events WHERE kind = 'state_change' OR state_digest IS NOT NULL;

CREATE OR REPLACE TEMP VIEW probe_events AS
SELECT
    e.* REPLACE (
        CASE WHEN e.state_digest IS NULL AND e.cell_id NOT IN (SELECT cell_id FROM probe_stateful_cells)
             THEN 'none-observed' ELSE e.state_digest END AS state_digest
    ),
    lunasol_tool_class(e.tool_name) AS tool_class,
    -- a duplicate line of one controller incident (same ts, same content as an earlier line)
    (e.actor = 'controller' AND EXISTS (
        SELECT 1 FROM events d
        WHERE d.cell_id = e.cell_id AND d.seq < e.seq AND d.ts IS NOT DISTINCT FROM e.ts
          AND d.kind = e.kind AND d.detail IS NOT DISTINCT FROM e.detail
          AND d.text IS NOT DISTINCT FROM e.text AND d.target IS NOT DISTINCT FROM e.target
    )) AS is_duplicate_line,
    -- may change the source, a non-report artifact, or the decision input
    CASE
        WHEN e.kind = 'artifact' THEN NOT lunasol_is_report(e.target, e.stage)
        WHEN e.kind = 'tool_call' THEN lunasol_tool_class(e.tool_name) IN ('mutating', 'unknown')
            AND NOT lunasol_is_report_path(e.target)
        WHEN e.kind = 'message' THEN e.actor = 'operator'
        ELSE FALSE
    END AS changes_source
FROM events e;

-- Every event that breaks an "unchanged" claim: a source/input change or a controller state line.
CREATE OR REPLACE TEMP TABLE probe_changes AS
SELECT cell_id, seq, kind, state_digest, changes_source FROM probe_events
WHERE changes_source OR kind = 'state_change';

-- Whether anything strictly between two events of a cell breaks an "unchanged" claim: a change of
-- the source, a non-report artifact or the operator's input, or a controller state line whose
-- digest is not `in_state` (the state in force at the earlier event).
CREATE OR REPLACE TEMP MACRO lunasol_changed_between(cell, after_seq, before_seq, in_state) AS EXISTS (
    SELECT 1 FROM probe_changes c
    WHERE c.cell_id = cell AND c.seq > after_seq AND c.seq < before_seq
      AND (c.changes_source OR c.state_digest IS DISTINCT FROM in_state)
);

-- Tool calls with their repeat chains: consecutive identical calls (same tool, same arguments
-- digest) stay in one chain while the controller state is the same and nothing in between changed.
-- The repeated-read and repeated-check probes read their tool class from here.
CREATE OR REPLACE TEMP TABLE probe_call_chains AS
WITH calls AS (
    SELECT cell_id, seq, event_id, tool_name, tool_class, args_digest, target, state_digest,
           coalesce(target, '') AS what,
           tool_name || '|' || args_digest AS sig
    FROM probe_events
    WHERE kind = 'tool_call' AND args_digest IS NOT NULL
),
ordered AS (
    SELECT *, lag(seq) OVER w AS prev_seq, lag(state_digest) OVER w AS prev_state
    FROM calls WINDOW w AS (PARTITION BY cell_id, sig ORDER BY seq)
),
flagged AS (
    SELECT o.*, CASE
        WHEN o.prev_seq IS NULL THEN 1
        WHEN NOT lunasol_same_state(o.state_digest, o.prev_state) THEN 1
        WHEN lunasol_changed_between(o.cell_id, o.prev_seq, o.seq, o.prev_state) THEN 1
        ELSE 0 END AS brk
    FROM ordered o
)
SELECT *, sum(brk) OVER (PARTITION BY cell_id, sig ORDER BY seq) AS chain FROM flagged;

-- Tool results and errors with their repeat chains: the same actor, in the same stage, making the
-- same tool call (same tool, same arguments digest) and getting a result of the same kind
-- (`result_kind`: tool_result or error) with a byte-identical digest stay in one chain while the
-- controller state is the same and nothing between the previous result and this call changed.
-- The identical-result (tool_result) and repeated-failure (error) probes read their kind from here.
CREATE OR REPLACE TEMP TABLE probe_result_chains AS
WITH results AS (
    SELECT r.cell_id, r.seq, r.event_id, r.kind AS result_kind, r.result_digest, r.state_digest,
           c.event_id AS call_event, c.seq AS call_seq, c.tool_name, c.args_digest, c.target,
           coalesce(c.actor, '') || '|' || coalesce(c.stage, '') || '|' || c.tool_name || '|' || c.args_digest AS sig
    FROM probe_events r
    JOIN probe_events c
      ON c.cell_id = r.cell_id AND c.kind = 'tool_call' AND c.call_id = r.call_id AND c.seq < r.seq
    WHERE r.kind IN ('tool_result', 'error') AND r.result_digest IS NOT NULL AND r.call_id IS NOT NULL
      AND c.args_digest IS NOT NULL
),
ordered AS (
    SELECT *, lag(seq) OVER w AS prev_seq, lag(result_digest) OVER w AS prev_digest,
           lag(state_digest) OVER w AS prev_state
    FROM results WINDOW w AS (PARTITION BY cell_id, result_kind, sig ORDER BY seq)
),
flagged AS (
    SELECT o.*, CASE
        WHEN o.prev_seq IS NULL THEN 1
        WHEN o.prev_digest IS DISTINCT FROM o.result_digest THEN 1
        WHEN NOT lunasol_same_state(o.state_digest, o.prev_state) THEN 1
        WHEN lunasol_changed_between(o.cell_id, o.prev_seq, o.call_seq, o.prev_state) THEN 1
        ELSE 0 END AS brk
    FROM ordered o
)
SELECT *, sum(brk) OVER (PARTITION BY cell_id, result_kind, sig ORDER BY seq) AS chain FROM flagged;

-- The repeats themselves: every chain of two or more such results, one row a chain, with the
-- call and result event ids as evidence (what both probes return, but for their explanation).
CREATE OR REPLACE TEMP VIEW probe_result_repeats AS
SELECT
    cell_id,
    result_kind,
    tool_name,
    'target:' || tool_name || ':' || coalesce(any_value(target), left(any_value(args_digest), 19)) AS key,
    list_sort(flatten(list([call_event, event_id]))) AS evidence,
    min(call_seq) AS first_seq,
    max(seq) AS last_seq,
    count(*) AS repeats,
    left(any_value(args_digest), 19) AS args_short,
    left(any_value(result_digest), 19) AS result_short
FROM probe_result_chains
GROUP BY cell_id, result_kind, sig, chain, tool_name
HAVING count(*) >= 2;
