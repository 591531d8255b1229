-- model_history: the first divergent stage of every run of one model, over time.
-- One row per run of the model (runs.model = $model), ordered by started_at: the run's
-- spec digest and code version (what changed), its kind='stage' localization row of rank 1
-- (NULL if none) and the first divergent layer in it.
-- Parameters: $model (the runs.model value, e.g. the spec's model factory).
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
        any_value(op_type) FILTER (WHERE kind = 'layer') AS first_op_type
    FROM firsts
    GROUP BY run_id
)
SELECT
    r.started_at,
    r.run_id,
    r.status,
    r.spec_digest,
    r.code_version,
    p.first_stage,
    p.base_stage,
    p.stage_metric,
    p.stage_value,
    p.stage_threshold,
    p.first_layer,
    p.first_op_type
FROM runs AS r
LEFT JOIN per_run AS p ON p.run_id = r.run_id
WHERE r.model = $model
ORDER BY r.started_at, r.run_id
