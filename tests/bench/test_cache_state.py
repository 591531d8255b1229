"""bench/cache_state.py's helpers: the cache size it flushes and the order it times in."""

from bench.cache_state import llc_bytes, time_state


def test_llc_bytes_reads_sysfs_sizes_and_falls_back(tmp_path):
    (tmp_path / "index2").mkdir()
    (tmp_path / "index2" / "size").write_text("2048K\n")
    assert llc_bytes(tmp_path) == 2048 << 10
    (tmp_path / "index3").mkdir()
    (tmp_path / "index3" / "size").write_text("32M\n")
    assert llc_bytes(tmp_path) == 32 << 20
    assert llc_bytes(tmp_path / "missing") == 64 << 20


def test_every_timed_run_follows_its_state():
    events = []
    median = time_state(lambda: events.append("run"), lambda: events.append("before"), 3)
    assert events == ["run"] + ["before", "run"] * 3  # one untimed warm-up, then the rounds
    assert median >= 0
