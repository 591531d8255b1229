-- first_divergences: one row per localized run with its first divergent stage (the
-- kind='stage' localization row of rank 1) and the first divergent layer in it (the
-- kind='layer' row of rank 1). Runs without such rows have no row here. A view of every
-- `qparity sql` session; first_divergence and model_history join it to runs.
-- Runs localized before stage ranks counted on past a passing pair can hold several
-- rank-1 stage rows: the first in chain order is the first divergent stage.
WITH firsts AS (  -- one scan of localization: the rank-1 stage and layer rows of each run
    SELECT l.run_id, l.kind, l.stage, l.base_stage, l.layer_id, l.op_type, l.metric, l.value,
        l.threshold
    FROM localization AS l
    LEFT JOIN chain AS c ON c.stage = l.stage
    WHERE l.kind IN ('stage', 'layer') AND l.rank = 1
    QUALIFY row_number() OVER (
        PARTITION BY l.run_id, l.kind ORDER BY c.position NULLS LAST, l.stage, l.layer_id
    ) = 1
)
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
