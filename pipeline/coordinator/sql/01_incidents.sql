-- One controller incident may write the same line several times (same ts, same content). Each such
-- line keeps its own event and ref; they share one incident id (the first line's event id).
-- Every other event is its own incident.
CREATE OR REPLACE TABLE event_incidents AS
SELECT
    cell_id,
    event_id,
    seq,
    CASE WHEN actor = 'controller'
        THEN first_value(event_id) OVER (PARTITION BY cell_id, ts, kind, detail, text, target ORDER BY seq)
        ELSE event_id
    END AS incident_id
FROM events;
