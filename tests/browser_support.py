"""A real browser for tests of web pages: Debian's headless Chromium, driven over its DevTools protocol.

The protocol lets a test read what the page's scripts made of it, which `--dump-dom` cannot: text inside
shadow roots (where Bokeh draws its widgets), a library's in-page state, and the page changing by itself
while it stays open. Chromium is installed on demand (`stack.provision.install_chromium`)."""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from tornado.websocket import WebSocketClientConnection, websocket_connect

from stack.provision import install_chromium
from support import wait_for

# Every text node of the page, shadow roots included, as one string.
PAGE_TEXT_JS = """(() => {
  const parts = [];
  const walk = (node) => {
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) parts.push(child.textContent);
      else walk(child);
    }
  };
  walk(document.body);
  return parts.join(" ");
})()"""


class Chromium:
    """One headless Chromium with one page, at `url`; `close()` ends it (also when the test fails)."""

    def __init__(self, url: str, profile_dir: Path, window: tuple[int, int] = (1440, 1000)) -> None:
        binary = install_chromium()
        profile_dir.mkdir(parents=True, exist_ok=True)
        port_file = profile_dir / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)  # a former run's, naming a port no Chromium listens on
        self._log = (profile_dir / "chromium.log").open("wb")
        # Port 0: Chromium picks a free one and writes it to DevToolsActivePort in its profile.
        self.process = subprocess.Popen(
            [binary, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--no-default-browser-check",
             "--hide-scrollbars", f"--user-data-dir={profile_dir}", "--remote-debugging-port=0",
             f"--window-size={window[0]},{window[1]}", url], stdout=self._log, stderr=subprocess.STDOUT,
            # Its singleton socket folder goes to the temporary dir, and stays when Chromium is ended: the profile's.
            env={**os.environ, "TMPDIR": str(profile_dir)})
        self._loop = asyncio.new_event_loop()
        self._ids = itertools.count(1)
        self._socket: WebSocketClientConnection | None = None
        try:
            wait_for(lambda: self.process.poll() is not None or port_file.exists() and port_file.read_text().strip(),
                     30, "Chromium's DevTools port")
            assert self.process.poll() is None, f"Chromium exited: {(profile_dir / 'chromium.log').read_text()[-2000:]}"
            port = int(port_file.read_text().split()[0])
            page = wait_for(lambda: self._page_target(port), 30, "Chromium's page")
            self._socket = self._loop.run_until_complete(self._connect(page["webSocketDebuggerUrl"]))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _page_target(port: int) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
                return next((target for target in json.load(response) if target.get("type") == "page"), None)
        except OSError:  # not listening yet
            return None

    @staticmethod
    async def _connect(url: str) -> WebSocketClientConnection:
        # Inside the loop: tornado binds the connection to the loop that runs when it is made.
        return await websocket_connect(url, max_message_size=256 * 2**20)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command and its result (events arriving meanwhile are passed over)."""
        return self._loop.run_until_complete(asyncio.wait_for(self._call(method, params), 60))

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self._socket is not None
        message_id = next(self._ids)
        await self._socket.write_message(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            text = await self._socket.read_message()
            assert text is not None, "Chromium closed the DevTools connection"
            answer = json.loads(text)
            if answer.get("id") == message_id:
                assert "error" not in answer, f"{method}: {answer['error']}"
                return answer["result"]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, f"{expression[:80]}...: {result['exceptionDetails']}"
        return result["result"].get("value")

    def text(self) -> str:
        """What the page shows as text, shadow roots included."""
        return self.evaluate(PAGE_TEXT_JS)

    def screenshot(self, path: Path) -> Path:
        """The whole page, beyond the window's height, as a PNG."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._loop.close()
        self._log.close()
