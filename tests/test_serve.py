"""``jaxtop serve``: the dashboard in a real browser.

A recording served by ``jaxtop serve replay`` is opened in Debian's headless
Chromium, driven over the DevTools protocol: the page without the token is
refused, with it the dashboard draws (a screenshot), a key press changes the
screen, and a second tab is refused while the first is open. Skipped with
the reason where Chromium or textual-serve is missing (``.ci/run`` installs
Chromium; textual-serve is a test dependency).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import PY
from jaxtop.testing import synthetic
from jaxtop.wire import protocol

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing answers at {url}")


class DevTools:
    """The few DevTools calls the test needs, over one page's websocket."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, **params):
        call_id = next(self.ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), 30)
            if message.get("id") == call_id:
                assert "error" not in message, message
                return message.get("result", {})

    async def screenshot(self) -> bytes:
        return base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"])

    async def key(self, text: str) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=text, text=text if kind == "keyDown" else "",
                            code=f"Key{text.upper()}", windowsVirtualKeyCode=ord(text.upper()))

    async def click(self, x: int, y: int) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)


async def settle(tools: DevTools, seconds: float) -> bytes:
    """The screenshot once the screen stopped changing (or after ``seconds``)."""
    last = await tools.screenshot()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.7)
        shot = await tools.screenshot()
        if shot == last:
            return shot
        last = shot
    return last


def test_the_dashboard_in_a_headless_browser(tmp_path, child_env):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed here (.ci/run installs it)")
    aiohttp = pytest.importorskip("aiohttp", reason="textual-serve (and aiohttp) not installed")
    recording = tmp_path / "run.jsonl"
    with open(recording, "wb") as f:
        f.write(protocol.encode(synthetic.hello(4242, 2, 1000.0)))
        for record in synthetic.samples(4242, 2, 1000.0, 200):
            f.write(protocol.encode(record))
    port, devtools_port = free_port(), free_port()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    server = subprocess.Popen([PY, "-m", "jaxtop", "serve", "replay", str(recording), "--port", str(port),
                               "--token", "s3cret"], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              cwd=tmp_path)
    browser = None
    try:
        wait_http(f"http://127.0.0.1:{port}/")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
        assert refused.value.code == 403  # no token: nothing served, not even the page
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/?token=wrong", timeout=5)
        browser = subprocess.Popen([chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                                    "--window-size=1280,800", f"--remote-debugging-port={devtools_port}",
                                    f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{devtools_port}/json/version")

        async def drive():
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as response:
                    page = next(t for t in await response.json() if t.get("type") == "page")
                async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    tools = DevTools(ws)
                    await tools.call("Page.enable")
                    await tools.call("Page.navigate", url=f"http://127.0.0.1:{port}/?token=s3cret")
                    await asyncio.sleep(3.0)
                    await tools.click(640, 400)  # the terminal takes keys once focused
                    before = await settle(tools, 20.0)
                    (tmp_path / "before.png").write_bytes(before)
                    await tools.key("o")  # the all-devices overview
                    after = await settle(tools, 10.0)
                    (tmp_path / "after.png").write_bytes(after)
                    # w: the session goes to the browser as a download, not to a file on the server.
                    await tools.call("Page.setDownloadBehavior", behavior="allow", downloadPath=str(downloads))
                    await tools.key("w")
                    deadline = time.monotonic() + 60  # a loaded machine draws and delivers slowly
                    while time.monotonic() < deadline and not list(downloads.glob("*.jsonl")):
                        await asyncio.sleep(0.3)
                    # A second tab while the first is open: refused (one process per server).
                    async with http.get(f"http://127.0.0.1:{port}/ws",
                                        headers={"Cookie": "jaxtop_token=s3cret"}) as second:
                        status = second.status
                    return before, after, status

        before, after, second = asyncio.run(drive())
        assert before[:8] == b"\x89PNG\r\n\x1a\n" and len(before) > 20_000  # a drawn screen, not a blank page
        assert after != before, "the key press changed nothing on the screen"
        assert second == 409
        [saved] = list(downloads.glob("*.jsonl"))
        records = [json.loads(line) for line in saved.read_text().splitlines()]
        assert records[0]["type"] == "hello" and sum(r["type"] == "sample" for r in records) >= 100
        assert not list(tmp_path.glob("jaxtop-*.jsonl"))  # nothing written where the server runs
    finally:
        if browser is not None:
            browser.kill()
            browser.wait()
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
