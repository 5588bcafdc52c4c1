-- type: repeated_exploration
-- proves_unchanged: true
-- summary: same check on the same target re-run with unchanged controller state and source
--
-- repeated_exploration: a check (tests, lint, validate, ...) on the same target run again while the
-- controller state digest is the same and nothing in between changed the source, a non-report
-- artifact or the operator's input. "Same check" is the same tool with the same arguments digest (the
-- same command): a focused test and the full suite in one directory are different checks.
WITH chains AS (
    SELECT * FROM probe_call_chains WHERE tool_class = 'check'
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
