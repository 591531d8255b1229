-- first_divergence: which stage, and which layer inside it, first diverged in each run?
-- One row per run of the runs table, oldest first. From the localization table: the
-- kind='stage' row of rank 1 (the first stage pair past its tolerance) and the kind='layer'
-- row of rank 1 (the first layer above threshold in it). Runs without such rows (not
-- localized yet, or consistent) have NULL in those columns.
-- (the first_divergences view, joined to runs).
-- Parameters: none.
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
LEFT JOIN first_divergences AS p ON p.run_id = r.run_id
ORDER BY r.started_at, r.run_id
