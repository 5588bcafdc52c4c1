-- type: zero_information_gain
-- proves_unchanged: true
-- summary: same actor, same stage, same tool call, byte-identical result, nothing changed in between
--
-- zero_information_gain: the same actor, in the same stage, made the same tool call (same tool, same
-- arguments digest) and got a result byte-identical to the one it already had (same result digest),
-- while nothing in between changed the source, a non-report artifact, the operator's input or the
-- controller state. A re-read in a later stage or after a change is not a hit.
-- The chains are built in _base.sql (probe_result_chains); this probe keeps the tool_result ones.
SELECT
    cell_id,
    key,
    evidence,
    first_seq,
    last_seq,
    printf('%d results of %s (args %s) by the same actor in one stage are byte-identical (result %s), nothing changed in between',
           repeats, tool_name, args_short, result_short) AS explanation
FROM probe_result_repeats
WHERE result_kind = 'tool_result'
