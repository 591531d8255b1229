-- run_diff_localization: did the localizer's findings change between run $a and run $b?
-- Rows of the localization table paired by (kind, rank) (several rows of one kind and
-- rank are paired in order of stage, layer_id): both sides' stage, base stage, layer, op
-- type, metric, value and detail, and changed (any of stage, base_stage, layer_id,
-- op_type, metric or detail differs; values alone do not count). Kinds in the order
-- stage, layer, sensitive, triage, then rank.
-- Parameters: $a, $b (run ids).
WITH a AS (
    SELECT
        *,
        row_number() OVER (PARTITION BY kind, rank ORDER BY stage, layer_id, metric) AS nth
    FROM localization
    WHERE run_id = $a
),
b AS (
    SELECT
        *,
        row_number() OVER (PARTITION BY kind, rank ORDER BY stage, layer_id, metric) AS nth
    FROM localization
    WHERE run_id = $b
)
SELECT
    kind,
    rank,
    a.stage AS a_stage,
    b.stage AS b_stage,
    a.base_stage AS a_base_stage,
    b.base_stage AS b_base_stage,
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
        OR a.stage IS DISTINCT FROM b.stage
        OR a.base_stage IS DISTINCT FROM b.base_stage
        OR a.layer_id IS DISTINCT FROM b.layer_id
        OR a.op_type IS DISTINCT FROM b.op_type
        OR a.metric IS DISTINCT FROM b.metric
        OR a.detail IS DISTINCT FROM b.detail) AS changed
FROM a FULL OUTER JOIN b USING (kind, rank, nth)
ORDER BY
    CASE kind WHEN 'stage' THEN 0 WHEN 'layer' THEN 1 WHEN 'sensitive' THEN 2
        WHEN 'triage' THEN 3 ELSE 4 END,
    kind,
    rank,
    nth
