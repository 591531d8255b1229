-- output_metrics: every model output's agreement at every stage, one row per (run, stage,
-- output) in chain order: cosine, sqnr_db, l1 and top1_agreement against the float model
-- (stages.evaluate), and top1 when the data has labels (NULL where a metric was not
-- recorded). Task metrics (data.metric: map50, miou...) judge all outputs at once: they
-- are the metrics rows whose output is NULL. A view of every `qparity sql` session.
SELECT
    m.run_id,
    m.stage,
    any_value(c.position) AS chain_position,
    m.output,
    any_value(m.value) FILTER (WHERE m.metric = 'cosine') AS cosine,
    any_value(m.value) FILTER (WHERE m.metric = 'sqnr_db') AS sqnr_db,
    any_value(m.value) FILTER (WHERE m.metric = 'l1') AS l1,
    any_value(m.value) FILTER (WHERE m.metric = 'top1_agreement') AS top1_agreement,
    any_value(m.value) FILTER (WHERE m.metric = 'top1') AS top1,
    max(m.n_samples) AS n_samples
FROM metrics AS m
LEFT JOIN chain AS c ON c.stage = m.stage
WHERE m.output IS NOT NULL
GROUP BY m.run_id, m.stage, m.output
ORDER BY m.run_id, chain_position NULLS LAST, m.output
