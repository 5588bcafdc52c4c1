-- type: zero_information_gain
-- proves_unchanged: true
-- summary: same actor, same tool call, the same failure again, nothing changed in between
--
-- zero_information_gain: the same actor made the same tool call (same tool, same arguments digest)
-- and got the same failure again (an error result with a byte-identical digest), while nothing in
-- between changed the source, a non-report artifact, the operator's input or the controller state.
-- The identical-result probe covers successful results; this one covers a command failing the
-- same way again (a re-run that could not have turned out differently).
-- The chains are built in _base.sql (probe_result_chains); this probe keeps the error ones.
SELECT
    cell_id,
    key,
    evidence,
    first_seq,
    last_seq,
    printf('%d identical failures of %s (args %s, error %s) by the same actor, nothing changed in between',
           repeats, tool_name, args_short, result_short) AS explanation
FROM probe_result_repeats
WHERE result_kind = 'error' AND tool_name IS NOT NULL
