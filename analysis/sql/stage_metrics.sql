-- stage_metrics: top-1 of every stage of every run, in chain order.
-- One row per (run, stage) with a 'top1' row in the metrics table: its value, the number
-- of samples, and the change from the previous stage of the same run that has one
-- (NULL for the first). Runs ordered by started_at (runs without a runs row last),
-- stages by their position in the chain.
-- Parameters: none.
SELECT
    m.run_id,
    m.stage,
    c.position AS chain_position,
    m.value AS top1,
    m.n_samples,
    m.value - lag(m.value) OVER (PARTITION BY m.run_id ORDER BY c.position) AS delta_prev
FROM metrics AS m
LEFT JOIN chain AS c ON c.stage = m.stage
LEFT JOIN runs AS r ON r.run_id = m.run_id
WHERE m.metric = 'top1'
ORDER BY r.started_at NULLS LAST, m.run_id, c.position NULLS LAST, m.stage
