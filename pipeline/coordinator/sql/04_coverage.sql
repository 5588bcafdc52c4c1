-- Coverage: every eligible cell, with its Luna status and pattern count (zero included).
CREATE OR REPLACE TABLE pattern_coverage AS
SELECT
    c.cell_id,
    c.task_id,
    c.run_id,
    coalesce(l.status, 'missing') AS luna_status,
    l.reason AS luna_reason,
    (SELECT count(*) FROM patterns p WHERE p.cell_id = c.cell_id) AS patterns,
    (SELECT count(*) FROM pattern_occurrences o WHERE o.cell_id = c.cell_id) AS occurrences,
    (SELECT count(DISTINCT o.group_id) FROM pattern_occurrences o WHERE o.cell_id = c.cell_id) AS groups,
    coalesce(lunasol_successful(oc.label), FALSE) AS successful_cell
FROM cells c
LEFT JOIN luna_cells l ON l.cell_id = c.cell_id
LEFT JOIN outcomes oc ON oc.cell_id = c.cell_id
WHERE c.eligibility = 'valid_behavior'
ORDER BY c.cell_id;
