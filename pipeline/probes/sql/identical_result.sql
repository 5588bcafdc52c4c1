-- type: zero_information_gain
-- proves_unchanged: true
-- summary: same actor, same stage, same tool call, byte-identical result, nothing changed in between
--
-- zero_information_gain: the same actor, in the same stage, made the same tool call (same tool, same
-- arguments digest) and got a result byte-identical to the one it already had (same result digest),
-- while nothing in between changed the source, a non-report artifact, the operator's input or the
-- controller state. A re-read in a later stage or after a change is not a hit.
WITH results AS (
    SELECT r.cell_id, r.seq, r.event_id, r.result_digest, r.state_digest, c.event_id AS call_event,
           c.seq AS call_seq, c.tool_name, c.args_digest, c.target,
           coalesce(c.actor, '') || '|' || coalesce(c.stage, '') || '|' || c.tool_name || '|' || c.args_digest AS sig
    FROM probe_events r
    JOIN probe_events c
      ON c.cell_id = r.cell_id AND c.kind = 'tool_call' AND c.call_id = r.call_id AND c.seq < r.seq
    WHERE r.kind = 'tool_result' AND r.result_digest IS NOT NULL AND r.call_id IS NOT NULL
      AND c.args_digest IS NOT NULL
),
ordered AS (
    SELECT *, lag(seq) OVER w AS prev_seq, lag(result_digest) OVER w AS prev_digest,
           lag(state_digest) OVER w AS prev_state
    FROM results WINDOW w AS (PARTITION BY cell_id, sig ORDER BY seq)
),
flagged AS (
    SELECT o.*, CASE
        WHEN o.prev_seq IS NULL THEN 1
        WHEN o.prev_digest IS DISTINCT FROM o.result_digest THEN 1
        WHEN NOT lunasol_same_state(o.state_digest, o.prev_state) THEN 1
        WHEN lunasol_changed_between(o.cell_id, o.prev_seq, o.call_seq, o.prev_state) THEN 1
        ELSE 0 END AS brk
    FROM ordered o
),
chains AS (
    SELECT *, sum(brk) OVER (PARTITION BY cell_id, sig ORDER BY seq) AS chain FROM flagged
)
SELECT
    cell_id,
    'target:' || tool_name || ':' || coalesce(any_value(target), left(any_value(args_digest), 19)) AS key,
    list_sort(flatten(list([call_event, event_id]))) AS evidence,
    min(call_seq) AS first_seq,
    max(seq) AS last_seq,
    printf('%d results of %s (args %s) by the same actor in one stage are byte-identical (result %s), nothing changed in between',
           count(*), tool_name, left(any_value(args_digest), 19), left(any_value(result_digest), 19)) AS explanation
FROM chains
GROUP BY cell_id, sig, chain, tool_name
HAVING count(*) >= 2
