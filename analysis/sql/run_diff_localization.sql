-- run_diff_localization: did the localizer's findings change between run $a and run $b?
-- Rows of the localization table paired by what they are about, never by rank: the
-- stage, layer and triage rows by (kind, stage, base_stage), the sensitive rows by
-- (kind, stage, base_stage, layer_id) (several rows of one key are paired in rank order).
-- Both sides' rank, layer, op type, metric, value and detail, and changed (a side
-- missing, or rank, layer_id, op_type, metric or detail differs; values alone do not
-- count). Kinds in the order stage, layer, sensitive, triage, then stages in chain
-- order, then rank.
-- Parameters: $a, $b (run ids).
WITH keyed AS (
    SELECT
        *,
        coalesce(CASE WHEN kind = 'sensitive' THEN layer_id END, '') AS about,
        row_number() OVER (
            PARTITION BY run_id, kind, stage, base_stage,
                CASE WHEN kind = 'sensitive' THEN layer_id END
            ORDER BY rank, layer_id, metric
        ) AS nth
    FROM localization
    WHERE run_id IN ($a, $b)
),
a AS (SELECT * FROM keyed WHERE run_id = $a),
b AS (SELECT * FROM keyed WHERE run_id = $b),
paired AS (
    SELECT
        kind,
        stage,
        base_stage,
        a.rank AS a_rank,
        b.rank AS b_rank,
        a.layer_id AS a_layer_id,
        b.layer_id AS b_layer_id,
        a.op_type AS a_op_type,
        b.op_type AS b_op_type,
        a.metric AS a_metric,
        b.metric AS b_metric,
        a.value AS a_value,
        b.value AS b_value,
        a.detail AS a_detail,
        b.detail AS b_detail,
        (a.run_id IS NULL OR b.run_id IS NULL
            OR a.rank IS DISTINCT FROM b.rank
            OR a.layer_id IS DISTINCT FROM b.layer_id
            OR a.op_type IS DISTINCT FROM b.op_type
            OR a.metric IS DISTINCT FROM b.metric
            OR a.detail IS DISTINCT FROM b.detail) AS changed
    FROM a FULL OUTER JOIN b USING (kind, stage, base_stage, about, nth)
)
SELECT p.*
FROM paired AS p
LEFT JOIN chain AS c ON c.stage = p.stage
ORDER BY
    CASE p.kind WHEN 'stage' THEN 0 WHEN 'layer' THEN 1 WHEN 'sensitive' THEN 2
        WHEN 'triage' THEN 3 ELSE 4 END,
    p.kind,
    c.position NULLS LAST,
    p.stage,
    coalesce(p.a_rank, p.b_rank),
    coalesce(p.a_layer_id, p.b_layer_id)
