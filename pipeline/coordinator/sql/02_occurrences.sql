-- Occurrences: the patterns of one cell with the same type and concerns key that cite the same set
-- of incidents are one occurrence (duplicate controller lines collapse); every event and ref is kept.
-- Numbered by 03_groups.sql, which writes the table; this draft is a temp table (never stored).
-- Run by pipeline.coordinator.groups on ranges of cells, those of temp table occurrence_cells (a cell's
-- occurrences depend on its own patterns and events): the draft is the union of the ranges'.
CREATE OR REPLACE TEMP TABLE pattern_occurrences_draft AS
WITH shared AS (  -- an event is its own incident unless it repeats a controller line (01_incidents.sql)
    SELECT event_id, incident_id FROM incident_links
),
cited AS (  -- unnest in the select list: a lateral unnest carries each whole list along every row (2x the join)
    SELECT pattern_id, cell_id, type, concerns, unnest(evidence) AS event_id
    FROM patterns SEMI JOIN occurrence_cells USING (cell_id)
),
per_pattern AS (  -- each pattern: the set of incidents it cites, and its events with their seq and ref
    -- (the event's own ref, pipeline.ir.refs: with its JSON pointer, the element inside a JSON file or zip)
    SELECT p.pattern_id, p.cell_id, p.type, p.concerns,
           list_sort(list_distinct(list(coalesce(s.incident_id, p.event_id)))) AS signature,
           list({'seq': e.seq, 'event_id': p.event_id,
                 'ref': e.source_path || '#L' || e.line_start || '-L' || e.line_end || coalesce(e.json_pointer, '')})
               AS cited_events
    FROM cited p
    JOIN events e ON e.event_id = p.event_id
    LEFT JOIN shared s ON s.event_id = p.event_id
    GROUP BY p.pattern_id, p.cell_id, p.type, p.concerns
),
occ AS (  -- their union, each event once, in seq order
    SELECT type, concerns, cell_id, signature, list_sort(list(pattern_id)) AS pattern_ids,
           list_sort(list_distinct(flatten(list(cited_events)))) AS cited_events
    FROM per_pattern GROUP BY type, concerns, cell_id, signature
)
SELECT
    o.type, o.concerns, o.cell_id, c.task_id, c.run_id,
    o.pattern_ids,
    [x.event_id FOR x IN o.cited_events] AS events,
    [x.ref FOR x IN o.cited_events] AS refs,
    o.signature AS incidents,
    len(o.cited_events) - len(o.signature) AS collapsed_lines,
    -- a "repeat" made only of duplicate lines of one incident is one event, not a repetition
    (o.type = 'repeated_exploration' AND len(o.signature) < 2) AS duplicate_lines_only,
    o.cited_events[1].seq AS first_seq,
    coalesce(lunasol_successful(oc.label), FALSE) AS successful_cell
FROM occ o
JOIN cells c ON c.cell_id = o.cell_id
LEFT JOIN outcomes oc ON oc.cell_id = o.cell_id;
