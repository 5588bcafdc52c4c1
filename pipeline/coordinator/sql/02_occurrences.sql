-- Occurrences: the patterns of one cell with the same type and concerns key that cite the same set
-- of incidents are one occurrence (duplicate controller lines collapse); every event and ref is kept.
CREATE OR REPLACE TABLE pattern_occurrences AS
WITH mapped AS (
    SELECT p.pattern_id, p.cell_id, p.type, p.concerns, ev.event_id, i.incident_id, e.seq,
           e.source_path || '#L' || e.line_start || '-L' || e.line_end AS ref
    FROM patterns p, unnest(p.evidence) AS ev(event_id)
    JOIN event_incidents i ON i.event_id = ev.event_id
    JOIN events e ON e.event_id = ev.event_id
),
per_pattern AS (
    SELECT pattern_id, list_sort(list_distinct(list(incident_id))) AS signature
    FROM mapped GROUP BY pattern_id
),
tagged AS (
    SELECT m.*, pp.signature FROM mapped m JOIN per_pattern pp USING (pattern_id)
),
occ AS (
    SELECT type, concerns, cell_id, signature, list_sort(list(DISTINCT pattern_id)) AS pattern_ids
    FROM tagged GROUP BY type, concerns, cell_id, signature
),
occ_events AS (
    SELECT type, concerns, cell_id, signature,
           list(event_id ORDER BY seq) AS events,
           list(ref ORDER BY seq) AS refs,
           min(seq) AS first_seq
    FROM (SELECT DISTINCT type, concerns, cell_id, signature, event_id, seq, ref FROM tagged)
    GROUP BY type, concerns, cell_id, signature
)
SELECT
    o.type, o.concerns, o.cell_id, c.task_id, c.run_id,
    o.pattern_ids,
    oe.events,
    oe.refs,
    o.signature AS incidents,
    len(oe.events) - len(o.signature) AS collapsed_lines,
    -- a "repeat" made only of duplicate lines of one incident is one event, not a repetition
    (o.type = 'repeated_exploration' AND len(o.signature) < 2) AS duplicate_lines_only,
    oe.first_seq,
    coalesce(lunasol_successful(oc.label), FALSE) AS successful_cell
FROM occ o
JOIN occ_events oe USING (type, concerns, cell_id, signature)
JOIN cells c ON c.cell_id = o.cell_id
LEFT JOIN outcomes oc ON oc.cell_id = o.cell_id;
