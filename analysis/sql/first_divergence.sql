-- first_divergence: which stage, and which layer inside it, first diverged in each run?
-- One row per run of the runs table, oldest first. From the localization table: the
-- kind='stage' row of rank 1 (the first stage pair past its tolerance) and the kind='layer'
-- row of rank 1 (the first layer above threshold in it). Runs without such rows (not
-- localized yet, or consistent) have NULL in those columns.
-- Parameters: none.
WITH firsts AS (  -- one scan of localization: the rank-1 stage and layer rows of each run
    SELECT run_id, kind, stage, base_stage, layer_id, op_type, metric, value, threshold
    FROM localization
    WHERE kind IN ('stage', 'layer') AND rank = 1
    QUALIFY row_number() OVER (PARTITION BY run_id, kind ORDER BY stage, layer_id) = 1
),
per_run AS (
    SELECT
        run_id,
        any_value(stage) FILTER (WHERE kind = 'stage') AS first_stage,
        any_value(base_stage) FILTER (WHERE kind = 'stage') AS base_stage,
        any_value(metric) FILTER (WHERE kind = 'stage') AS stage_metric,
        any_value(value) FILTER (WHERE kind = 'stage') AS stage_value,
        any_value(threshold) FILTER (WHERE kind = 'stage') AS stage_threshold,
        any_value(layer_id) FILTER (WHERE kind = 'layer') AS first_layer,
        any_value(op_type) FILTER (WHERE kind = 'layer') AS first_op_type,
        any_value(metric) FILTER (WHERE kind = 'layer') AS layer_metric,
        any_value(value) FILTER (WHERE kind = 'layer') AS layer_value,
        any_value(threshold) FILTER (WHERE kind = 'layer') AS layer_threshold
    FROM firsts
    GROUP BY run_id
)
SELECT
    r.run_id,
    r.model,
    r.started_at,
    r.status,
    p.first_stage,
    p.base_stage,
    p.stage_metric,
    p.stage_value,
    p.stage_threshold,
    p.first_layer,
    p.first_op_type,
    p.layer_metric,
    p.layer_value,
    p.layer_threshold
FROM runs AS r
LEFT JOIN per_run AS p ON p.run_id = r.run_id
ORDER BY r.started_at, r.run_id
