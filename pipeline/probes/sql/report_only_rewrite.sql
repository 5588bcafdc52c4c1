-- type: zero_information_gain
-- proves_unchanged: true
-- summary: report artifact rewritten with no source, artifact, input or controller state change
--
-- zero_information_gain: a report artifact (validation.md, review.md, ...) written again while
-- nothing in between changed the source, a non-report artifact or the operator's input, and no
-- controller state line moved away from the state in force at the earlier write.
WITH writes AS (
    SELECT cell_id, seq, event_id, target, result_digest, state_digest
    FROM probe_events
    WHERE kind = 'artifact' AND target IS NOT NULL AND lunasol_is_report(target, stage)
      AND NOT is_duplicate_line
),
ordered AS (
    SELECT *, lag(seq) OVER w AS prev_seq, lag(state_digest) OVER w AS prev_state
    FROM writes WINDOW w AS (PARTITION BY cell_id, target ORDER BY seq)
),
flagged AS (
    SELECT o.*, CASE
        WHEN o.prev_seq IS NULL THEN 1
        WHEN lunasol_changed_between(o.cell_id, o.prev_seq, o.seq, o.prev_state) THEN 1
        ELSE 0 END AS brk
    FROM ordered o
),
chains AS (
    SELECT *, sum(brk) OVER (PARTITION BY cell_id, target ORDER BY seq) AS chain FROM flagged
)
SELECT
    cell_id,
    'target:' || target AS key,
    list(event_id ORDER BY seq) AS evidence,
    min(seq) AS first_seq,
    max(seq) AS last_seq,
    printf('report %s written %d times (%d distinct digests) with no source, artifact, operator or controller state change in between',
           target, count(*), count(DISTINCT result_digest)) AS explanation
FROM chains
GROUP BY cell_id, target, chain
HAVING count(*) >= 2
