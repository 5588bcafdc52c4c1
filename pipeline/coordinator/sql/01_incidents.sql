-- One controller incident may write the same line several times (same ts, same content). Each such
-- line keeps its own event and ref; they share one incident id (the first line's event id, among
-- every event with that cell, ts, kind, detail, text and target). Every other event is its own incident.
-- Hash aggregates over the keys of controller lines only (NULLs equal, as in a PARTITION BY): a
-- window over every event sorted all of them by their text (2x the CPU at 1,000 cells).
--
-- Run by pipeline.coordinator.incidents for the cells in temp table incident_cells only (a cell's
-- incidents depend on its own events: the other cells' links are cached by content digest). It
-- writes temp table incident_links_fresh: the events whose incident is another event's id.
CREATE OR REPLACE TEMP TABLE incident_links_fresh AS
WITH ev AS (  -- every event of these cells, its text as a hash: hash tables of every event's text spilled
              -- past DuckDB's memory limit at 10,000 cells (4.0 CPU s against 0.17 at 1,000)
    SELECT e.cell_id, e.event_id, e.seq, e.ts, e.kind, e.detail, hash(e.text) AS text_hash, e.target, e.actor
    FROM events e SEMI JOIN incident_cells c ON e.cell_id = c.cell_id
),
keys AS (
    SELECT DISTINCT cell_id, ts, kind, detail, text_hash, target FROM ev WHERE actor = 'controller'
),
candidates AS (  -- the events that may repeat a controller line, with their text (equal texts, equal hashes)
    SELECT e.cell_id, e.event_id, e.seq, e.ts, e.kind, e.detail, t.text, e.target, e.actor
    FROM ev e SEMI JOIN keys k
      ON e.cell_id = k.cell_id AND e.kind = k.kind AND e.ts IS NOT DISTINCT FROM k.ts
     AND e.detail IS NOT DISTINCT FROM k.detail AND e.text_hash IS NOT DISTINCT FROM k.text_hash
     AND e.target IS NOT DISTINCT FROM k.target
    JOIN events t ON t.event_id = e.event_id
),
firsts AS (  -- grouped by the text itself: a hash shared by two texts never joins them
    SELECT cell_id, ts, kind, detail, text, target, arg_min(event_id, seq) AS first_id
    FROM candidates
    GROUP BY ALL
)
SELECT e.cell_id, e.event_id, f.first_id AS incident_id
FROM candidates e
JOIN firsts f
  ON f.cell_id = e.cell_id AND f.kind = e.kind AND f.ts IS NOT DISTINCT FROM e.ts
 AND f.detail IS NOT DISTINCT FROM e.detail AND f.text IS NOT DISTINCT FROM e.text
 AND f.target IS NOT DISTINCT FROM e.target
WHERE e.actor = 'controller' AND f.first_id <> e.event_id;
