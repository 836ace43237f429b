"""``jaxtop serve``: the dashboard in a real browser.

A recording served by ``jaxtop serve replay`` is opened in Debian's headless
Chromium, driven over the DevTools protocol: the page without the token is
refused, with it the dashboard draws (a screenshot), a key press changes the
screen, and a second tab is refused while the first is open. Skipped with
the reason where Chromium or textual-serve is missing (``.ci/run`` installs
Chromium; textual-serve is a test dependency). The helpers here (the server,
its printed URL, the browser) serve tests/test_serve_security.py too.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

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


def write_recording(path, extra=(), samples: int = 200) -> None:
    """A synthetic recording of pid 4242 (two devices); ``extra`` records follow the 20th sample."""
    with open(path, "wb") as f:
        f.write(protocol.encode(synthetic.hello(4242, 2, 1000.0)))
        for n, record in enumerate(synthetic.samples(4242, 2, 1000.0, samples)):
            f.write(protocol.encode(record))
            if n == 20:
                for other in extra:
                    f.write(protocol.encode(other))


class Served:
    """A running ``jaxtop serve``: its process, what it printed, its URL."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._read, args=(proc.stdout, self.out), daemon=True),
                         threading.Thread(target=self._read, args=(proc.stderr, self.err), daemon=True)]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in iter(stream.readline, b""):
            into.append(line.decode(errors="replace"))

    def url(self, timeout: float = 30.0) -> str:
        """The URL printed for the user (waits for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.out):
                found = re.search(r"open (http://\S+)", line)
                if found:
                    return found.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no URL printed: {''.join(self.out + self.err)[-2000:]}")

    def stop(self) -> str:
        """Stop the server; returns everything it printed (stdout, then stderr)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for thread in self._threads:
            thread.join(timeout=5)
        return "".join(self.out) + "".join(self.err)


@contextmanager
def serving(recording, port: int, env, cwd, *extra: str):
    """``jaxtop serve replay RECORDING --port PORT`` while the block runs."""
    served = Served(subprocess.Popen([PY, "-m", "jaxtop", "serve", "replay", str(recording), "--port", str(port),
                                      *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd))
    try:
        yield served
    finally:
        served.stop()


def chromium_or_skip() -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed here (.ci/run installs it)")
    return chromium


@contextmanager
def browser(chromium: str, profile, devtools_port: int):
    """A headless Chromium with its DevTools protocol on ``devtools_port``."""
    proc = subprocess.Popen([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,800",
                             f"--remote-debugging-port={devtools_port}", f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{devtools_port}/json/version")
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def first_page(http, devtools_port: int) -> dict:
    async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as response:
        return next(t for t in await response.json() if t.get("type") == "page")


class DevTools:
    """The few DevTools calls the test needs, over one page's websocket."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict] = []  # the events read while waiting for answers

    async def call(self, method: str, **params):
        call_id = next(self.ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), 30)
            if message.get("id") == call_id:
                assert "error" not in message, message
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

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
    chromium = chromium_or_skip()
    aiohttp = pytest.importorskip("aiohttp", reason="textual-serve (and aiohttp) not installed")
    recording = tmp_path / "run.jsonl"
    write_recording(recording)
    port, devtools_port = free_port(), free_port()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with serving(recording, port, child_env, tmp_path) as served:
        url = served.url()
        token = url.rstrip("/").rsplit("/", 1)[1]
        assert url == f"http://127.0.0.1:{port}/{token}/" and len(token) >= 32
        for wrong in ("", "?token=" + token, "wrong/", token[:-1] + "/", "static/js/textual.js"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/{wrong}", timeout=5)
            assert refused.value.code == 403, wrong  # no token: nothing served, not even the page
        tools_events: list[dict] = []  # the page's events, for a failure's message
        with browser(chromium, tmp_path / "profile", devtools_port):

            async def drive():
                async with aiohttp.ClientSession() as http:
                    page = await first_page(http, devtools_port)
                    async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                        tools = DevTools(ws)
                        tools.events = tools_events
                        await tools.call("Page.enable")
                        await tools.call("Page.navigate", url=url)
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
                        (tmp_path / "written.png").write_bytes(await tools.screenshot())  # kept for a failure
                        # A second tab while the first is open: refused (one process per server).
                        async with http.get(f"http://127.0.0.1:{port}/{token}/ws",
                                            headers={"Origin": f"http://127.0.0.1:{port}", "Connection": "Upgrade",
                                                     "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                                                     "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}) as second:
                            status = second.status
                        return before, after, status

            before, after, second = asyncio.run(drive())
    served_output = served.stop()  # stopped already: what it printed
    assert before[:8] == b"\x89PNG\r\n\x1a\n" and len(before) > 20_000  # a drawn screen, not a blank page
    assert after != before, "the key press changed nothing on the screen"
    assert second == 409
    saved_files = list(downloads.glob("*.jsonl"))
    assert len(saved_files) == 1, (f"w delivered {saved_files} (screen: {tmp_path / 'written.png'}); "
                                   f"server said: {served_output[-3000:]}; page events: "
                                   f"{[e.get('method') for e in tools_events][-40:]}")
    [saved] = saved_files
    records = [json.loads(line) for line in saved.read_text().splitlines()]
    assert records[0]["type"] == "hello" and sum(r["type"] == "sample" for r in records) >= 100
    assert not list(tmp_path.glob("jaxtop-*.jsonl"))  # nothing written where the server runs


def test_s_downloads_the_memory_profile_it_asked_for(tmp_path, child_env, targets):
    """``jaxtop serve attach``: s has the agent write its profile into the
    dashboard's private directory, from where the browser gets it (and the
    program's own profile directory gets nothing)."""
    from conftest import TARGETS

    chromium = chromium_or_skip()
    aiohttp = pytest.importorskip("aiohttp", reason="textual-serve (and aiohttp) not installed")
    workdir = tmp_path / "program"
    workdir.mkdir()
    with open(tmp_path / "program.out", "wb") as out:
        program = targets.run(TARGETS / "loop.py", "--seconds", "240", stdout=out, stderr=subprocess.DEVNULL,
                              cwd=workdir, env=dict(child_env, JAXTOP_PROFILE_DIR=str(workdir)))
    deadline = time.monotonic() + 120
    while b"ready" not in (tmp_path / "program.out").read_bytes():  # jax has a backend: a profile can be taken
        assert time.monotonic() < deadline and program.poll() is None, "the program never got ready"
        time.sleep(0.2)
    port, devtools_port = free_port(), free_port()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    served = Served(subprocess.Popen([PY, "-m", "jaxtop", "serve", "attach", str(program.pid), "--port", str(port)],
                                     env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path))
    try:
        url = served.url()
        with browser(chromium, tmp_path / "profile", devtools_port):

            async def drive():
                async with aiohttp.ClientSession() as http:
                    page = await first_page(http, devtools_port)
                    async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                        tools = DevTools(ws)
                        await tools.call("Page.enable")
                        await tools.call("Page.setDownloadBehavior", behavior="allow", downloadPath=str(downloads))
                        await tools.call("Page.navigate", url=url)
                        await asyncio.sleep(3.0)
                        await tools.click(640, 400)
                        await settle(tools, 20.0)
                        await tools.key("s")
                        deadline = time.monotonic() + 60
                        while time.monotonic() < deadline and not list(downloads.glob("*.prof")):
                            await asyncio.sleep(0.3)
                        await asyncio.sleep(2.0)  # nothing else follows

            asyncio.run(drive())
    finally:
        output = served.stop()
    names = sorted(p.name for p in downloads.iterdir())
    assert len(names) == 1 and names[0].startswith(f"jaxtop-memprof-{program.pid}-"), (names, output[-2000:])
    assert (downloads / names[0]).read_bytes()[:2] == b"\x1f\x8b"  # jax's gzipped pprof bytes
    assert not list(workdir.iterdir())  # written in the dashboard's directory, not the program's one
