-- repeated_exploration: a check (tests, lint, validate, ...) on the same target run again while the
-- controller state digest is the same and nothing in between changed the source, a non-report
-- artifact or the operator's input. "Same check" is the same tool with the same arguments digest (the
-- same command): a focused test and the full suite in one directory are different checks.
WITH calls AS (
    SELECT cell_id, seq, event_id, tool_name, state_digest,
           coalesce(target, '') AS what, args_digest,
           tool_name || '|' || args_digest AS sig
    FROM probe_events
    WHERE kind = 'tool_call' AND tool_class = 'check' AND args_digest IS NOT NULL
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
),
chains AS (
    SELECT *, sum(brk) OVER (PARTITION BY cell_id, sig ORDER BY seq) AS chain FROM flagged
)
SELECT
    cell_id,
    'target:' || tool_name || ':' || left(any_value(args_digest), 19) AS key,
    list(event_id ORDER BY seq) AS evidence,
    min(seq) AS first_seq,
    max(seq) AS last_seq,
    printf('check %s (args %s%s) run %d times with controller state %s unchanged and no source, artifact or operator change in between',
           tool_name, left(any_value(args_digest), 19), CASE WHEN any_value(what) = '' THEN '' ELSE ' in ' || any_value(what) END,
           count(*), left(any_value(state_digest), 19)) AS explanation
FROM chains
GROUP BY cell_id, sig, chain, tool_name
HAVING count(*) >= 2
