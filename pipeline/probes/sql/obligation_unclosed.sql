-- type: omission
-- proves_unchanged: false
-- summary: obligation opened, its stage ran, never closed
--
-- omission: an obligation was opened and never closed in the cell although the workflow went on to
-- start at least one stage after it (the completion opportunity). Duplicate opening lines count
-- once; all of them stay in the evidence, with the stage starts that followed.
WITH opened AS (
    SELECT cell_id, target, list(event_id ORDER BY seq) AS open_events, min(seq) AS first_seq,
           any_value(stage) AS stage
    FROM probe_events
    WHERE kind = 'obligation' AND target IS NOT NULL
      AND regexp_matches(lower(coalesce(detail, '')), '(open|declar)')
    GROUP BY cell_id, target
),
closed AS (
    SELECT DISTINCT cell_id, target FROM probe_events
    WHERE kind = 'obligation' AND regexp_matches(lower(coalesce(detail, '')), '(clos|discharg|fulfil|satisf)')
),
later_starts AS (
    SELECT o.cell_id, o.target, list(s.event_id ORDER BY s.seq) AS start_events,
           list(s.stage ORDER BY s.seq) AS stages, max(s.seq) AS last_seq
    FROM opened o
    JOIN probe_events s
      ON s.cell_id = o.cell_id AND s.seq > o.first_seq AND s.kind = 'stage' AND NOT s.is_duplicate_line
         AND regexp_matches(lower(coalesce(s.detail, '')), 'start')
    GROUP BY o.cell_id, o.target
)
SELECT
    o.cell_id,
    'obligation:' || o.target AS key,
    list_sort(list_concat(o.open_events, l.start_events)) AS evidence,
    o.first_seq,
    l.last_seq,
    printf('obligation %s opened in stage %s and never closed, although %d later stage(s) started (%s)',
           o.target, coalesce(o.stage, '-'), len(l.start_events), array_to_string(l.stages, ', ')) AS explanation
FROM opened o
JOIN later_starts l ON l.cell_id = o.cell_id AND l.target = o.target
WHERE NOT EXISTS (SELECT 1 FROM closed c WHERE c.cell_id = o.cell_id AND c.target = o.target)
