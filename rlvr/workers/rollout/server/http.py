"""A small JSON-over-HTTP client for the inference servers: every call has a time limit, and every
failure says which replica, which stage and which samples it was about.

Standard library only (``http.client``): the trainer's Python needs no HTTP package, and a server
engine's calls are few and large (one generate request per sample, a handful of weight-sync calls).
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rlvr.utils.errors import RlvrError

__all__ = ["ReplicaError", "ReplicaUnavailable", "ReplicaRequestError", "Endpoint", "call_json"]


class ReplicaError(RlvrError):
    """A call to an inference server replica failed; the message names the replica, stage and samples."""

    def __init__(self, replica: str, stage: str, detail: str, what: str = "") -> None:
        self.replica, self.stage, self.detail, self.what = replica, stage, detail, what
        about = f" ({what})" if what else ""
        super().__init__(f"rollout server {replica}, stage '{stage}'{about}: {detail}")


class ReplicaUnavailable(ReplicaError):
    """The replica did not answer (connection refused or reset, time limit, server error 5xx): the
    request may be sent to another replica."""


class ReplicaRequestError(ReplicaError):
    """The replica refused the request (4xx): sending it elsewhere would not help."""


@dataclass(frozen=True)
class Endpoint:
    """Where one replica listens.

    Attributes:
        name: how errors name it (``replica 0 (http://127.0.0.1:8100)``).
        url: ``http://host:port`` (a path prefix is kept).
        api_key: sent as ``Authorization: Bearer <key>`` (None: no header).
    """

    name: str
    url: str
    api_key: str | None = None

    def parts(self) -> tuple[str, int, str]:
        split = urlsplit(self.url)
        if split.scheme != "http" or not split.hostname:
            raise ValueError(f"server url {self.url!r} must look like http://host:port")
        return split.hostname, split.port or 80, split.path.rstrip("/")


def call_json(endpoint: Endpoint, method: str, path: str, payload: Any | None, timeout_s: float, stage: str,
              what: str = "") -> Any:
    """``method path`` with a JSON body; the decoded JSON answer (None for an empty body).

    Args:
        endpoint: the replica.
        method: ``GET`` or ``POST``.
        path: e.g. ``/inference/v1/generate``.
        payload: JSON-serialisable body (None: no body).
        timeout_s: time limit of the connection and of each read.
        stage: what the call is for (``generate``, ``reload_weights``, ``health``): named in errors.
        what: the samples or version it is about, named in errors.

    Raises:
        ReplicaUnavailable: no answer, a time limit, or a 5xx status.
        ReplicaRequestError: a 4xx status (the server's message is quoted).
    """
    host, port, prefix = endpoint.parts()
    body = None if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request(method, prefix + path, body=body, headers=headers)
        response = connection.getresponse()
        status, data = response.status, response.read()
    except (TimeoutError, socket.timeout):
        raise ReplicaUnavailable(endpoint.name, stage, f"no answer within {timeout_s:g} s", what) from None
    except (ConnectionError, OSError, http.client.HTTPException) as err:
        raise ReplicaUnavailable(endpoint.name, stage, f"{type(err).__name__}: {err}", what) from None
    finally:
        connection.close()
    text = data.decode(errors="replace")
    if status >= 500:
        raise ReplicaUnavailable(endpoint.name, stage, f"HTTP {status}: {text[:500]}", what)
    if status >= 400:
        raise ReplicaRequestError(endpoint.name, stage, f"HTTP {status} for {method} {path}: {text[:500]}", what)
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
