"""The chain as a Prefect flow (ephemeral local server): the one flow test we keep."""

from pathlib import Path

import yaml

from pipelines.flow import run_chain
from schemas.spec import parse_spec
from schemas.store import RunStore
from stages.registry import plan
from tests.conftest import tiny_spec_dict


def test_prefect_flow_runs_the_chain_and_reuses_the_cache(tmp_path):
    data = tiny_spec_dict()
    spec = parse_spec(data, "t")
    seen = []
    first = run_chain(spec, yaml.safe_dump(data), tmp_path, on_stage=lambda n, o: seen.append(n))
    with_report = parse_spec(tiny_spec_dict(compare={"steps": ["report"]}), "t")
    second = run_chain(with_report, yaml.safe_dump(data), tmp_path)
    assert seen == [stage.name for stage, _ in plan(spec)] and len(seen) >= 5
    assert not any(o.cache_hit for o in first.outcomes.values())
    assert all(o.cache_hit for o in second.outcomes.values())
    assert Path(second.steps["report"]).is_file()  # the steps flow ran after the chain
    runs = [RunStore(tmp_path).open(r.run_id) for r in (first, second)]
    debug = [run.path("debug/qat_onnx.txt").read_text() for run in runs]
    assert debug[1] == debug[0]  # cache hits restore the stages' debug files under Prefect too
    _the_temporary_prefect_server_listens_on_localhost_only()


def _the_temporary_prefect_server_listens_on_localhost_only() -> None:
    """The README's claim checked on the bound sockets, not on a string in the source: the
    temporary server Prefect started for the flows is a child process of this one."""
    from prefect.settings import PREFECT_API_URL

    from tests.test_security import _listening, _loopback

    if PREFECT_API_URL.value():  # a server of the user's own: not ours to check
        return
    listening = _listening()
    assert listening, "no temporary Prefect server listening"
    assert [ip for ip, _ in listening if not _loopback(ip)] == []
