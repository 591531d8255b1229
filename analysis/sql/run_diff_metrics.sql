-- run_diff_metrics: how did each stage's dataset metrics move between run $a and run $b?
-- One row per (stage, metric) either run has in the metrics table: both values, the
-- change (b - a), both sample counts and whether anything differs. Stages in chain order;
-- a PTQ run's stages are paired with the QAT stage at the same step (chain.step: quantized
-- with convert, hbm with compile...), named in a_stage and b_stage.
-- Parameters: $a, $b (run ids).
WITH a AS (
    SELECT coalesce(c.step, m.stage) AS step, m.stage, metric, value, n_samples
    FROM metrics AS m LEFT JOIN chain AS c ON c.stage = m.stage WHERE run_id = $a
),
b AS (
    SELECT coalesce(c.step, m.stage) AS step, m.stage, metric, value, n_samples
    FROM metrics AS m LEFT JOIN chain AS c ON c.stage = m.stage WHERE run_id = $b
),
joined AS (
    SELECT
        step AS stage,
        metric,
        a.value AS a_value,
        b.value AS b_value,
        b.value - a.value AS delta,
        a.n_samples AS a_n_samples,
        b.n_samples AS b_n_samples,
        (a.value IS DISTINCT FROM b.value OR a.n_samples IS DISTINCT FROM b.n_samples)
            AS changed,
        a.stage AS a_stage,
        b.stage AS b_stage
    FROM a FULL OUTER JOIN b USING (step, metric)
)
SELECT j.*
FROM joined AS j
LEFT JOIN chain AS c ON c.stage = j.stage
ORDER BY c.position NULLS LAST, j.stage, j.metric
