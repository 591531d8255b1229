-- runs_by_id: the runs table rows of the given run ids (to check that runs exist).
-- One row per run id in $ids that has a runs row, ordered by started_at.
-- Parameters: $ids (a list of run ids).
SELECT *
FROM runs
WHERE list_contains($ids, run_id)
ORDER BY started_at, run_id
