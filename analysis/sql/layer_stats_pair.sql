-- layer_stats_pair: the per-layer comparison of one stage pair of one run.
-- The aggregate layer_stats rows (sample_id IS NULL: reduced over the samples) of run
-- $run_id comparing $analysis_stage against $base_stage, in topological order.
-- Parameters: $run_id, $base_stage, $analysis_stage.
SELECT
    topo_index,
    layer_id,
    op_type,
    dtype,
    aggregate,
    n_elements,
    scale,
    cosine,
    mse,
    l1,
    max_abs,
    sqnr_db,
    max_qscale_diff,
    exact_ratio,
    base_min,
    base_max,
    base_mean,
    analysis_min,
    analysis_max,
    analysis_mean,
    base_nan_count,
    analysis_nan_count
FROM layer_stats
WHERE
    run_id = $run_id
    AND base_stage = $base_stage
    AND analysis_stage = $analysis_stage
    AND sample_id IS NULL
ORDER BY topo_index NULLS LAST, layer_id, aggregate
