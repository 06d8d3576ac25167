"""Browser check of a report: load it in headless Chromium and read what a reader would see.

``python -m reports.browser REPORT.html [--screenshot OUT.png]`` prints a JSON verdict and exits 1
when the page logged console errors, raised exceptions, requested anything outside itself, or has
an image that did not decode (``naturalWidth == 0``).

Chromium is driven over the DevTools protocol with a minimal stdlib WebSocket client (RFC 6455
framing, client-masked, text frames), so nothing beyond Debian's ``chromium`` package is needed.
The browser runs with ``--headless --no-sandbox --disable-gpu --disable-background-networking
--disable-component-update --disable-sync --no-first-run`` and a fresh ``--user-data-dir``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from reports.errors import ReportError
import argparse

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage", "--hide-scrollbars")


def find_chromium() -> str | None:
    """Path of a Chromium binary (``/usr/bin/chromium`` first), or None."""
    for c in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(c)
        if p:
            return p
    return None


class _WebSocket:
    """The smallest RFC 6455 client DevTools needs: text frames out (masked), frames in."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        assert url.startswith("ws://"), url
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port or 80)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           f"Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ReportError("DevTools closed the WebSocket handshake")
            head += chunk
        head, _, self.buf = head.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise ReportError(f"DevTools refused the WebSocket: {head.splitlines()[0]!r}")

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ReportError("DevTools closed the WebSocket")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, text: str, opcode: int = 0x1) -> None:
        data = text.encode()
        n = len(data)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self) -> str:
        parts = []
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8), "big")
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            op = b0 & 0x0F
            if op == 0x9:                      # ping -> pong
                self.send(data.decode(errors="replace"), opcode=0xA)
                continue
            if op == 0x8:
                raise ReportError("DevTools closed the WebSocket")
            parts.append(data)
            if b0 & 0x80:
                return b"".join(parts).decode()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Browser:
    def __init__(self, chromium: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="mpmd-chromium-")
        self.proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={self.dir}", "--remote-debugging-port=0",
             "--remote-allow-origins=*", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.dir) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise ReportError("chromium did not open its DevTools port within 30 s")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        self.ws = _WebSocket(pages[0]["webSocketDebuggerUrl"])
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise ReportError(f"DevTools {method} failed: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise ReportError(f"chromium sent no {method} within {timeout:g} s")
            self.events.append(json.loads(self.ws.recv()))

    def close(self) -> None:
        if getattr(self, "ws", None):
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def check_page(html_path: str | Path, chromium: str | None = None) -> dict[str, Any]:
    """Load ``html_path`` and report console errors, exceptions, outside requests, images.

    Returns:
        ``{"console_errors": [...], "exceptions": [...], "external_requests": [...],
        "images": [{"alt", "naturalWidth", "naturalHeight"}], "ok": bool}``.

    Raises:
        ReportError: no chromium, or it did not start / load the page.
    """
    chromium = chromium or find_chromium()
    if not chromium:
        raise ReportError("chromium not found; install it: apt-get install -y chromium")
    url = Path(html_path).resolve().as_uri()
    b = _Browser(chromium)
    try:
        for domain in ("Page", "Runtime", "Log", "Network"):
            b.call(f"{domain}.enable")
        b.call("Page.navigate", url=url)
        b.wait_for("Page.loadEventFired")
        imgs = json.loads(b.call("Runtime.evaluate", returnByValue=True, expression=(
            "JSON.stringify(Array.from(document.images).map(i => ({alt: i.alt, "
            "naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight})))"))["result"]["value"])
        b.call("Runtime.evaluate", expression="1")   # flush late console events
    finally:
        b.close()
    errors, exceptions, external = [], [], []
    for e in b.events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errors.append(p["entry"].get("text", ""))
        elif m == "Runtime.exceptionThrown":
            exceptions.append(p.get("exceptionDetails", {}).get("text", ""))
        elif m == "Network.requestWillBeSent":
            u = p.get("request", {}).get("url", "")
            if not u.startswith(("data:", "file:", "about:")):
                external.append(u)
    ok = not errors and not exceptions and not external and bool(imgs) and all(
        i["naturalWidth"] > 0 for i in imgs)
    return {"console_errors": errors, "exceptions": exceptions, "external_requests": external,
            "images": imgs, "ok": ok}


def screenshot(html_path: str | Path, png_path: str | Path, size: tuple[int, int] = (1400, 1000),
               chromium: str | None = None) -> Path:
    """The first screen of ``html_path`` as a PNG, via ``chromium --screenshot``; returns
    ``png_path`` as given (relative stays relative, so messages name it as the user did).

    Raises:
        ReportError: no chromium, or it wrote no screenshot.
    """
    chromium = chromium or find_chromium()
    if not chromium:
        raise ReportError("chromium not found; install it: apt-get install -y chromium")
    out = Path(png_path).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mpmd-chromium-") as d:
        tmp = Path(d) / "shot.png"
        subprocess.run([chromium, *FLAGS, f"--user-data-dir={d}/profile", f"--screenshot={tmp}",
                        f"--window-size={size[0]},{size[1]}", Path(html_path).resolve().as_uri()],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)
        if not tmp.is_file():
            raise ReportError(f"chromium wrote no screenshot of {html_path}")
        shutil.move(str(tmp), out)
    return Path(png_path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html")
    ap.add_argument("--screenshot", default=None, help="also write the first screen as PNG here")
    a = ap.parse_args(argv)
    verdict = check_page(a.html)
    if a.screenshot:
        verdict["screenshot"] = str(screenshot(a.html, a.screenshot))
    print(json.dumps(verdict, indent=1))
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
