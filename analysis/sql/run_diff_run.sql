-- run_diff_run: what changed in the recipe between run $a and run $b?
-- One row per difference, from the runs table: section 'run' for the fields spec_digest,
-- model, march, consistency_level, code_version and status; sections 'settings' and
-- 'tags' for every leaf of those JSON columns, and section 'spec' for every leaf of the
-- runs' specs (faults, stages, data, quant, ...: the spec files are not in any table, so
-- they come as parameters). Key: the leaf's JSON path without '$.', e.g.
-- faults[0].layer; value: the JSON text, strings unquoted. A key only one run has shows
-- NULL on the other side. Equal values are left out. Ordered by section, key.
-- Parameters: $a, $b (run ids), $a_spec, $b_spec (each run's spec as JSON text, or NULL).
WITH picked AS (
    SELECT 'a' AS side, * FROM runs WHERE run_id = $a
    UNION ALL
    SELECT 'b' AS side, * FROM runs WHERE run_id = $b
),
fields AS (  -- the zipped unnests give one (key, value) row per field
    SELECT
        side,
        'run' AS section,
        unnest(['spec_digest', 'model', 'march', 'consistency_level', 'code_version', 'status'])
            AS key,
        unnest([spec_digest, model, march, consistency_level, code_version, status]) AS value
    FROM picked
),
json_columns AS (
    SELECT side, 'settings' AS section, settings AS doc FROM picked
    UNION ALL
    SELECT side, 'tags' AS section, tags AS doc FROM picked
    UNION ALL
    SELECT side, 'spec' AS section, CASE side WHEN 'a' THEN $a_spec ELSE $b_spec END AS doc
    FROM picked
),
leaves AS (
    SELECT
        j.side,
        j.section,
        substr(t.fullkey, 3) AS key,
        CASE WHEN t.type = 'VARCHAR' THEN json_extract_string(t.value, '$')
            ELSE t.value::VARCHAR END AS value
    FROM json_columns AS j, json_tree(j.doc) AS t
    WHERE t.fullkey <> '$'
        AND (t.type NOT IN ('OBJECT', 'ARRAY') OR t.value::VARCHAR IN ('{}', '[]'))
),
everything AS (
    SELECT * FROM fields
    UNION ALL
    SELECT * FROM leaves
)
SELECT
    section,
    key,
    a.value AS a_value,
    b.value AS b_value
FROM (SELECT * FROM everything WHERE side = 'a') AS a
FULL OUTER JOIN (SELECT * FROM everything WHERE side = 'b') AS b USING (section, key)
WHERE a.value IS DISTINCT FROM b.value
ORDER BY section, key
