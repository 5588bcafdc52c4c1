-- type: repeated_exploration
-- proves_unchanged: true
-- summary: same read-only tool call, same arguments, unchanged controller state and source
--
-- repeated_exploration: the same read-only tool call (same tool, same arguments digest) made again
-- while the controller state digest is the same and nothing in between changed the source, a
-- non-report artifact or the operator's input. Consecutive repeats form one hit (a chain).
WITH chains AS (
    SELECT * FROM probe_call_chains WHERE tool_class = 'read'
)
SELECT
    cell_id,
    'target:' || tool_name || ':' || coalesce(any_value(target), left(any_value(args_digest), 19)) AS key,
    list(event_id ORDER BY seq) AS evidence,
    min(seq) AS first_seq,
    max(seq) AS last_seq,
    printf('%d identical %s calls (args %s) with controller state %s unchanged and no source, artifact or operator change in between',
           count(*), tool_name, left(any_value(args_digest), 19), left(any_value(state_digest), 19)) AS explanation
FROM chains
GROUP BY cell_id, sig, chain, tool_name
HAVING count(*) >= 2
