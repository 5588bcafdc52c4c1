-- zero_information_gain: the same tool call (same tool, same arguments digest) returned a result
-- byte-identical to the one it returned just before (same result digest). Makes no claim about
-- what happened in between; it only says the later result told nothing new.
WITH results AS (
    SELECT r.cell_id, r.seq, r.event_id, r.result_digest, c.event_id AS call_event, c.seq AS call_seq,
           c.tool_name, c.args_digest, c.target,
           c.tool_name || '|' || c.args_digest AS sig
    FROM probe_events r
    JOIN probe_events c
      ON c.cell_id = r.cell_id AND c.kind = 'tool_call' AND c.call_id = r.call_id AND c.seq < r.seq
    WHERE r.kind = 'tool_result' AND r.result_digest IS NOT NULL AND r.call_id IS NOT NULL
      AND c.args_digest IS NOT NULL
),
ordered AS (
    SELECT *, lag(result_digest) OVER (PARTITION BY cell_id, sig ORDER BY seq) AS prev_digest
    FROM results
),
chains AS (
    SELECT *, sum(CASE WHEN prev_digest IS NOT DISTINCT FROM result_digest THEN 0 ELSE 1 END)
              OVER (PARTITION BY cell_id, sig ORDER BY seq) AS chain
    FROM ordered
)
SELECT
    cell_id,
    'target:' || tool_name || ':' || coalesce(any_value(target), left(any_value(args_digest), 19)) AS key,
    list_sort(flatten(list([call_event, event_id]))) AS evidence,
    min(call_seq) AS first_seq,
    max(seq) AS last_seq,
    printf('%d results of %s (args %s) are byte-identical (result %s)',
           count(*), tool_name, left(any_value(args_digest), 19), left(any_value(result_digest), 19)) AS explanation
FROM chains
GROUP BY cell_id, sig, chain, tool_name
HAVING count(*) >= 2
