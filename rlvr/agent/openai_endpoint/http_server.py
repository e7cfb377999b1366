"""The HTTP side of rlvr's OpenAI-compatible endpoint (standard library ``http.server``).

Routes, under a per-sample base URL ``http://host:port/sessions/<id>/v1`` (what the agent's client
gets as ``base_url``): ``POST .../chat/completions`` and ``GET .../models``. Every request is
checked before anything else: the API key when one is set (401), the body size (413 over
``max_request_bytes``, 411 without a length), JSON (400), the session (404). Errors are answered in
the OpenAI format (``{"error": {"message", "type", "code"}}``) and never stop the server: one bad
request fails alone.
"""

from __future__ import annotations

import hmac
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlvr.agent.openai_endpoint.session import RequestError

__all__ = ["EndpointServer"]

_ROUTE = re.compile(r"^/sessions/(?P<session>[A-Za-z0-9_-]+)/v1/(?P<route>chat/completions|models)/?$")

Handler = Callable[[str, str, Any], dict]
"""``handle(session_id, route, body) -> answer``; raises :class:`RequestError` to refuse."""


class EndpointServer:
    """A threaded HTTP server in front of a handler (see the module docstring).

    Args:
        host, port: where to listen (port 0: a free one; see :attr:`port`).
        api_key: required as ``Authorization: Bearer <key>`` (None: no key).
        max_request_bytes: larger bodies are refused.
        handle: the request handler.
    """

    def __init__(self, host: str, port: int, api_key: str | None, max_request_bytes: int, handle: Handler) -> None:
        endpoint = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                return None

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                endpoint._serve(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                endpoint._serve(self, "POST")

        self.api_key, self.max_request_bytes, self.handle = api_key, int(max_request_bytes), handle
        self.httpd = ThreadingHTTPServer((host, int(port)), RequestHandler)
        self.httpd.daemon_threads = True
        self.host, self.port = host, int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="rlvr-openai-endpoint", daemon=True)
        self._thread.start()

    def base_url(self, session_id: str) -> str:
        return f"http://{self.host}:{self.port}/sessions/{session_id}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()

    # ------------------------------------------------------------------ one request
    def _serve(self, request: BaseHTTPRequestHandler, method: str) -> None:
        try:
            answer = self._answer(request, method)
        except RequestError as err:
            self._reply(request, err.status, {"error": {"message": str(err), "type": "invalid_request_error",
                                                        "code": err.status}})
        except Exception as err:  # noqa: BLE001 - one failing request must not stop the endpoint
            self._reply(request, 500, {"error": {"message": f"{type(err).__name__}: {err}", "type": "server_error",
                                                 "code": 500}})
        else:
            self._reply(request, 200, answer)

    def _answer(self, request: BaseHTTPRequestHandler, method: str) -> dict:
        if self.api_key is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                request.close_connection = True
                raise RequestError("missing or wrong API key: send 'Authorization: Bearer <key>'", 401)
        match = _ROUTE.match(request.path)
        if match is None:
            raise RequestError(f"no route {method} {request.path}; the endpoint serves "
                               "/sessions/<id>/v1/chat/completions and /sessions/<id>/v1/models", 404)
        body = self._body(request) if method == "POST" else None
        if (method == "POST") != (match["route"] == "chat/completions"):
            raise RequestError(f"{method} is not allowed on {request.path}", 405)
        return self.handle(match["session"], match["route"], body)

    def _body(self, request: BaseHTTPRequestHandler) -> Any:
        length = request.headers.get("Content-Length")
        if length is None or not length.isdigit():
            request.close_connection = True
            raise RequestError("the request needs a Content-Length header", 411)
        if int(length) > self.max_request_bytes:
            request.close_connection = True  # the body is not read: the connection cannot be reused
            raise RequestError(f"the request body has {length} bytes, more than the endpoint accepts "
                               f"({self.max_request_bytes}, rollout.agent.openai.max_request_bytes)", 413)
        raw = request.rfile.read(int(length))
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RequestError(f"the request body is not valid JSON: {err}") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    @staticmethod
    def _reply(request: BaseHTTPRequestHandler, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        try:
            request.send_response(status)
            request.send_header("Content-Type", "application/json")
            request.send_header("Content-Length", str(len(data)))
            if request.close_connection:
                request.send_header("Connection", "close")
            request.end_headers()
            request.wfile.write(data)
        except OSError:  # the client went away; nothing to answer
            request.close_connection = True
