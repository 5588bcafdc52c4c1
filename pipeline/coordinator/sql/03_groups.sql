-- Groups: one per (type, normalised concerns key) across cells, with support and negatives.
CREATE OR REPLACE TABLE pattern_groups AS
SELECT
    printf('G%03d', row_number() OVER (ORDER BY type, concerns)) AS group_id,
    type,
    concerns,
    count(*) AS occurrences,
    sum(len(pattern_ids)) AS patterns,
    count(DISTINCT cell_id) AS n_cells,
    count(DISTINCT task_id) AS n_tasks,
    count(DISTINCT run_id) AS n_runs,
    list_sort(list(DISTINCT cell_id)) AS cells,
    list_sort(list(DISTINCT task_id)) AS tasks,
    list_sort(list(DISTINCT run_id)) AS runs,
    count(*) FILTER (WHERE successful_cell) AS negative_occurrences,
    coalesce(list_sort(list(DISTINCT cell_id) FILTER (WHERE successful_cell)), []) AS negative_cells,
    sum(collapsed_lines) AS collapsed_lines
FROM pattern_occurrences_draft
GROUP BY type, concerns;

-- Occurrence ids follow their group: '<group>-O<nn>' ordered by cell and first evidence.
CREATE OR REPLACE TABLE pattern_occurrences AS
SELECT
    g.group_id || printf('-O%02d', row_number() OVER (PARTITION BY g.group_id ORDER BY o.cell_id, o.first_seq, o.events))
        AS occurrence_id,
    g.group_id,
    o.*
FROM pattern_occurrences_draft o
JOIN pattern_groups g USING (type, concerns);

DROP TABLE pattern_occurrences_draft;
