"""HTTP sandbox service: a client for a remote sandbox and a small server around :class:`LocalSandbox`.

Wire protocol (JSON over HTTP, one program per request)::

    POST <sandbox_url>
    {"code": "<python source>", "stdin": "<text>", "timeout_s": 10.0}
    -> 200 {"status": "ok|runtime_error|timeout|killed|sandbox_error", "exit_code": 0,
            "stdout": "...", "stderr": "...", "wall_time_s": 0.07}

Run a server with ``python -m rlvr.sandbox.http --host 127.0.0.1 --port 8080`` (as root for the
full isolation of :mod:`rlvr.sandbox.local`).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rlvr.sandbox.config import SandboxConfig, SandboxResult
from rlvr.sandbox.local import LocalSandbox, SandboxJob
from rlvr.utils.errors import RewardError


class HttpSandboxClient:
    """Client of a sandbox service speaking the protocol in the module docstring.

    Args:
        url: endpoint that accepts the POST (e.g. ``http://127.0.0.1:8080/run``).
        wall_timeout_s: program time limit sent to the server.
        request_timeout_s: socket timeout of each HTTP request (should exceed ``wall_timeout_s``).
        retries: extra attempts after a connection error or a 5xx answer.
        max_concurrency: requests in flight at once in :meth:`run_many`.
    """

    def __init__(self, url: str, wall_timeout_s: float = 10.0, request_timeout_s: float = 30.0,
                 retries: int = 2, max_concurrency: int = 8) -> None:
        self.url, self.wall_timeout_s, self.request_timeout_s = url, wall_timeout_s, request_timeout_s
        self.retries, self.max_concurrency = retries, max_concurrency

    def run(self, code: str, stdin: str = "") -> SandboxResult:
        """Send one program; raises :class:`RewardError` when the service is unreachable or answers badly."""
        body = json.dumps({"code": code, "stdin": stdin, "timeout_s": self.wall_timeout_s}).encode()
        last_error = ""
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.request_timeout_s) as response:
                    return _result_from_json(json.loads(response.read()), self.url)
            except urllib.error.HTTPError as exc:
                last_error = f"HTTP {exc.code}: {exc.read()[:500]!r}"
                if exc.code < 500:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last_error = repr(exc)
            if attempt < self.retries:
                time.sleep(min(0.2 * 2**attempt, 2.0))
        raise RewardError(
            f"sandbox service {self.url} failed after {self.retries + 1} attempt(s): {last_error}; "
            "check that the service is running and reachable, or use the local sandbox (sandbox_url=None)"
        )

    def run_many(self, jobs: list[SandboxJob]) -> list[SandboxResult]:
        """Send several programs concurrently; results in order."""
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            return list(pool.map(lambda job: self.run(job.code, job.stdin), jobs))


def _result_from_json(payload: dict, url: str) -> SandboxResult:
    try:
        return SandboxResult(
            status=payload["status"], exit_code=payload.get("exit_code"), stdout=payload.get("stdout", ""),
            stderr=payload.get("stderr", ""), wall_time_s=float(payload.get("wall_time_s", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RewardError(f"sandbox service {url} returned a malformed answer {payload!r}: {exc}") from exc


def make_server(host: str, port: int, sandbox: LocalSandbox) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) that runs each POSTed program in ``sandbox``; at most
    ``sandbox.config.max_concurrency`` programs run at once, further requests wait their turn."""
    slots = threading.BoundedSemaphore(sandbox.config.max_concurrency)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            try:
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length))
                code, stdin = str(request["code"]), str(request.get("stdin", ""))
            except (KeyError, ValueError, TypeError) as exc:
                self._send(400, {"error": f"bad request: {exc!r}; send JSON with 'code' (and optional 'stdin')"})
                return
            with slots:
                result = sandbox.run(code, stdin)
            self._send(200, result.__dict__)

        def _send(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (silence per-request logs)
            return

    return ThreadingHTTPServer((host, port), Handler)


def start_background_server(sandbox: LocalSandbox, host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Start a server thread; returns the server (call ``shutdown()``) and its URL."""
    server = make_server(host, port, sandbox)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}/run"


def main() -> None:
    parser = argparse.ArgumentParser(description="rlvr code sandbox HTTP service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--timeout", type=float, default=10.0, help="wall-clock limit per program")
    args = parser.parse_args()
    sandbox = LocalSandbox(SandboxConfig(wall_timeout_s=args.timeout, cpu_seconds=int(args.timeout)))
    make_server(args.host, args.port, sandbox).serve_forever()


if __name__ == "__main__":
    main()
