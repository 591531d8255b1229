"""The report in a real browser: headless Chromium driven over its DevTools protocol (CDP).

Checks that the page renders without JavaScript or console errors, that its script works
(a click on the marked cell fills the detail line), and that a full-page screenshot shows
the heatmap: every cell's pixels carry the cell's colour, the cells span several colours,
and the first divergent cell has its dark outline. The screenshot is kept (path printed)
and copied to ``$TMPDIR/qparity_report.png``. scripts/test.sh installs Debian's chromium
when it is missing; without it this test skips.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from analysis.report import write_report
from tests.analysis.test_report import FAULT, build_faulty_run

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (scripts/test.sh installs it: "
    "apt-get install -y --no-install-recommends chromium)",
)
connect = pytest.importorskip("websockets.sync.client", reason="needs websockets").connect

TIMEOUT_S = 30.0
"""Longest wait for Chromium to start, answer or load the page."""
VIEW = (1400, 1000)
"""Window size (CSS pixels; device scale 1, so screenshot pixels are CSS pixels)."""
KEEP = Path(tempfile.gettempdir()) / "qparity_report.png"
"""Where a copy of the screenshot is left to look at."""

# Run in the page: decode the screenshot, compare each heatmap cell's pixels with its CSS
# background, and read the pixel on the marked cell's outline.
PIXELS_JS = """
new Promise(function (resolve) {
  var img = new Image();
  img.onload = function () {
    var c = document.createElement('canvas');
    c.width = img.width; c.height = img.height;
    var g = c.getContext('2d'); g.drawImage(img, 0, 0);
    function px(x, y) { return Array.from(g.getImageData(Math.round(x), Math.round(y), 1, 1).data.slice(0, 3)); }
    var cells = Array.from(document.querySelectorAll('td.cell')), out = {cells: cells.length, matched: 0, colours: []};
    cells.forEach(function (td) {
      var r = td.getBoundingClientRect(), x = r.left + window.scrollX + 6, y = r.top + window.scrollY + 6;
      var want = getComputedStyle(td).backgroundColor.match(/\\d+/g).slice(0, 3).map(Number);
      var got = px(x, y);
      if (got.every(function (v, i) { return Math.abs(v - want[i]) <= 2; })) out.matched++;
      if (out.colours.indexOf(got.join()) < 0) out.colours.push(got.join());
    });
    var m = document.querySelector('td.cell.first').getBoundingClientRect();
    out.outline = px(m.left + window.scrollX + 1, m.top + window.scrollY + m.height / 2);
    out.inside = px(m.left + window.scrollX + 8, m.top + window.scrollY + 8);
    resolve(JSON.stringify(out));
  };
  img.src = 'data:image/png;base64,' + SHOT;
})
"""


class Cdp:
    """A minimal synchronous CDP client over one websocket; keeps the events it reads."""

    def __init__(self, url: str):
        self.ws = connect(url, max_size=None, open_timeout=TIMEOUT_S)
        self.events: list[dict] = []
        self.last_id = 0

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self.last_id += 1
        msg = {"id": self.last_id, "method": method, "params": params}
        self.ws.send(json.dumps(msg | ({"sessionId": session} if session else {})))
        while True:
            reply = json.loads(self.ws.recv(timeout=TIMEOUT_S))
            if reply.get("id") != self.last_id:
                self.events.append(reply)
            elif "error" in reply:
                raise AssertionError(f"{method}: {reply['error']}")
            else:
                return reply["result"]

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        while not any(e.get("method") == method for e in self.events):
            self.events.append(json.loads(self.ws.recv(timeout=deadline - time.monotonic())))
        return next(e for e in self.events if e.get("method") == method)

    def evaluate(self, session: str, expression: str):
        result = self.call(
            "Runtime.evaluate",
            session,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"]["value"]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    return write_report(build_faulty_run(tmp_path_factory.mktemp("runs")))


@pytest.fixture
def browser(tmp_path):
    """A websocket URL of a headless Chromium started for this test (stopped after it)."""
    profile = tmp_path / "profile"
    cmd = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run"]
    cmd += ["--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"]
    with open(tmp_path / "chromium.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    try:
        yield _devtools_url(profile / "DevToolsActivePort", proc, tmp_path / "chromium.log")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=TIMEOUT_S)


def _devtools_url(port_file: Path, proc: subprocess.Popen, log: Path) -> str:
    """Chromium writes its port and browser path to DevToolsActivePort once it listens."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        lines = port_file.read_text().split() if port_file.exists() else []
        if len(lines) == 2:
            return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        time.sleep(0.1)
    pytest.fail(f"chromium did not start (exit {proc.poll()}): {log.read_text()[-2000:]}")


def _errors(events: list[dict]) -> list[dict]:
    """JS exceptions, console.error/assert calls and error log entries."""
    return [
        e
        for e in events
        if e.get("method") == "Runtime.exceptionThrown"
        or (
            e.get("method") == "Runtime.consoleAPICalled"
            and e["params"]["type"] in ("error", "assert")
        )
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]


def _open(cdp: Cdp, page: Path) -> str:
    """A new tab showing ``page`` (loaded); returns its CDP session id."""
    target = cdp.call("Target.createTarget", url="about:blank")["targetId"]
    session = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Runtime", "Log", "Page"):
        cdp.call(f"{domain}.enable", session)
    cdp.call(
        "Emulation.setDeviceMetricsOverride",
        session,
        width=VIEW[0],
        height=VIEW[1],
        deviceScaleFactor=1,
        mobile=False,
    )
    cdp.call("Page.navigate", session, url=page.as_uri())
    cdp.wait_for("Page.loadEventFired")
    return session


def _screenshot(cdp: Cdp, session: str, path: Path) -> str:
    """A full-page PNG written to ``path``; returns it base64-encoded."""
    size = cdp.call("Page.getLayoutMetrics", session)["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = cdp.call(
        "Page.captureScreenshot", session, format="png", captureBeyondViewport=True, clip=clip
    )["data"]
    path.write_bytes(base64.b64decode(shot))
    return shot


def test_the_report_renders_without_errors_and_the_screenshot_shows_the_heatmap(
    report, browser, tmp_path, capsys
):
    cdp = Cdp(browser)
    session = _open(cdp, report)
    detail = cdp.evaluate(
        session,
        "document.querySelector('td.cell.first').click();"
        "document.getElementById('detail').textContent",
    )
    assert detail.startswith(f"{FAULT['layer']} (") and "at convert" in detail
    png = tmp_path / "report.png"
    shot = _screenshot(cdp, session, png)
    shutil.copyfile(png, KEEP)
    with capsys.disabled():
        print(f"\nreport screenshot: {png} (copy: {KEEP})")
    assert _errors(cdp.events) == []
    width, height = struct.unpack(">II", png.read_bytes()[16:24])  # the PNG's IHDR
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and width >= VIEW[0] // 2 and height > 0
    seen = json.loads(cdp.evaluate(session, PIXELS_JS.replace("SHOT", json.dumps(shot))))
    assert seen["cells"] > 0 and seen["matched"] == seen["cells"], seen
    assert len(seen["colours"]) >= 3, seen  # clean, at threshold and past it at least
    assert max(seen["outline"]) < min(seen["inside"]), seen  # the dark outline of the marked cell
