-- convert_error_ops: which op types most often add error at one stage (e.g. convert)?
-- One row per op type seen at $stage:
--   n_first_divergent: runs whose first divergent layer (localization kind='layer', rank 1,
--     stage = $stage) has this op type;
--   n_sensitive: runs where a layer of this op type is among the sensitive ops at $stage
--     (localization kind='sensitive');
--   n_runs, n_layers, mean/max max_qscale_diff: over the aggregate layer_stats rows
--     (sample_id IS NULL) of the pair (the run's latest earlier stage in chain order,
--     $stage): the error in quantization steps the stage adds, per layer.
-- Ordered by n_first_divergent, n_sensitive, mean_max_qscale_diff (all descending).
-- Parameters: $stage (the analysis stage, e.g. 'convert').
WITH first_layer AS (
    SELECT op_type, count(DISTINCT run_id) AS n_first_divergent
    FROM localization
    WHERE kind = 'layer' AND rank = 1 AND stage = $stage
    GROUP BY op_type
),
sensitive AS (
    SELECT op_type, count(DISTINCT run_id) AS n_sensitive
    FROM localization
    WHERE kind = 'sensitive' AND stage = $stage
    GROUP BY op_type
),
pairs AS (
    SELECT s.run_id, s.op_type, s.max_qscale_diff, c.position AS base_position
    FROM layer_stats AS s
    JOIN chain AS c ON c.stage = s.base_stage
    WHERE s.analysis_stage = $stage AND s.sample_id IS NULL
),
adjacent AS (
    SELECT run_id, op_type, max_qscale_diff
    FROM pairs
    QUALIFY base_position = max(base_position) OVER (PARTITION BY run_id)
),
stats AS (
    SELECT
        op_type,
        count(DISTINCT run_id) AS n_runs,
        count(*) AS n_layers,
        avg(max_qscale_diff) AS mean_max_qscale_diff,
        max(max_qscale_diff) AS max_max_qscale_diff
    FROM adjacent
    GROUP BY op_type
)
SELECT
    op_type,
    coalesce(f.n_first_divergent, 0) AS n_first_divergent,
    coalesce(x.n_sensitive, 0) AS n_sensitive,
    coalesce(s.n_runs, 0) AS n_runs,
    coalesce(s.n_layers, 0) AS n_layers,
    s.mean_max_qscale_diff,
    s.max_max_qscale_diff
FROM stats AS s
FULL OUTER JOIN first_layer AS f USING (op_type)
FULL OUTER JOIN sensitive AS x USING (op_type)
ORDER BY
    n_first_divergent DESC,
    n_sensitive DESC,
    s.mean_max_qscale_diff DESC NULLS LAST,
    op_type
