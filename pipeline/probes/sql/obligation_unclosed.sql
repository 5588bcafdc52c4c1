-- omission: an obligation was opened and never closed in the cell although its stage ran (the
-- completion opportunity). Duplicate opening lines count once; all of them stay in the evidence.
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
ran AS (
    SELECT cell_id, stage, list(event_id ORDER BY seq) AS stage_events, max(seq) AS last_seq
    FROM probe_events
    WHERE kind = 'stage' AND stage IS NOT NULL AND NOT is_duplicate_line
    GROUP BY cell_id, stage
)
SELECT
    o.cell_id,
    'obligation:' || o.target AS key,
    list_sort(list_concat(o.open_events, r.stage_events)) AS evidence,
    o.first_seq,
    greatest(o.first_seq, r.last_seq) AS last_seq,
    printf('obligation %s opened for stage %s, the stage ran (%d stage events), and no closing line follows',
           o.target, o.stage, len(r.stage_events)) AS explanation
FROM opened o
JOIN ran r ON r.cell_id = o.cell_id AND r.stage = o.stage
WHERE NOT EXISTS (SELECT 1 FROM closed c WHERE c.cell_id = o.cell_id AND c.target = o.target)
