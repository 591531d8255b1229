-- model_history: the first divergent stage of every run of one model, over time.
-- One row per run of the model (runs.model = $model), ordered by started_at: the run's
-- spec digest and code version (what changed), its kind='stage' localization row of rank 1
-- (NULL if none) and the first divergent layer in it.
-- Parameters: $model (the runs.model value, e.g. the spec's model factory).
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
LEFT JOIN first_divergences AS p ON p.run_id = r.run_id
WHERE r.model = $model
ORDER BY r.started_at, r.run_id
