-- run_diff_stages: which stage artifacts changed between run $a and run $b, and which
-- stages came from the cache?
-- One row per stage either run has in the stages table: status, artifact digest, cache
-- hit and duration of both, and same_artifact (equal digests, both present). Stages in
-- chain order.
-- Parameters: $a, $b (run ids).
WITH a AS (
    SELECT stage, status, artifact_digest, cache_hit, duration_s FROM stages WHERE run_id = $a
),
b AS (
    SELECT stage, status, artifact_digest, cache_hit, duration_s FROM stages WHERE run_id = $b
),
joined AS (
    SELECT
        stage,
        a.status AS a_status,
        b.status AS b_status,
        a.artifact_digest AS a_digest,
        b.artifact_digest AS b_digest,
        coalesce(a.artifact_digest = b.artifact_digest, false) AS same_artifact,
        a.cache_hit AS a_cache_hit,
        b.cache_hit AS b_cache_hit,
        a.duration_s AS a_duration_s,
        b.duration_s AS b_duration_s
    FROM a FULL OUTER JOIN b USING (stage)
)
SELECT j.*
FROM joined AS j
LEFT JOIN chain AS c ON c.stage = j.stage
ORDER BY c.position NULLS LAST, j.stage
