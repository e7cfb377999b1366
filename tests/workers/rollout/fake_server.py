"""A stand-in for vLLM's OpenAI server with the routes the server engine uses (standard library only),
so that routing, retries, restarts, weight syncs and version checks are tested in the default suite.

Usage: ``python fake_server.py --port P [--api-key K] [--die-after N] [--ignore-versions] [--delay S]``.
Generation is a pure function of the prompt, the weights and the seed: token ``i`` of the output is
``(sum(prompt) + seed + 7 * i + weights) % 50 + 10`` where ``weights`` is the rounded sum of
``model.norm.weight`` in the folder last reloaded (0 at start); its log-prob is ``-(token / 100)``. A token id
listed in ``stop_token_ids`` ends the output (kept). Every request is appended to ``requests.jsonl``
beside the ``--log`` file, with the port, so tests can see which replica served what.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def weights_number(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return int(round(float(f.get_tensor("model.norm.weight").sum())))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--die-after", type=int, default=0, help="exit after this many generate requests (0: never)")
    parser.add_argument("--ignore-versions", action="store_true", help="keep reporting version 0 (a stale replica)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each generate request takes")
    parser.add_argument("--record", required=True, help="file the requests are appended to")
    args = parser.parse_args()
    state = {"weights": 0, "version": "0", "generated": 0, "paused": False}
    record = Path(args.record)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            return None

        def _send(self, status: int, payload) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            if args.api_key and self.headers.get("Authorization") != f"Bearer {args.api_key}":
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send(200, {})
            else:
                self._send(404, {"error": "no route"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
            with record.open("a") as f:
                f.write(json.dumps({"port": args.port, "path": self.path, "body": body}) + "\n")
            if self.path == "/inference/v1/generate":
                self._generate(body)
            elif self.path == "/collective_rpc":
                state["weights"] = weights_number(Path(body["kwargs"]["weights_path"]) / "model.safetensors")
                self._send(200, {"results": [None]})
            elif self.path == "/update_weight_version":
                if not args.ignore_versions:
                    state["version"] = body["new_version"]
                self._send(200, {"success": True})
            elif self.path in ("/pause", "/resume", "/reset_prefix_cache"):
                state["paused"] = self.path == "/pause"
                self._send(200, {"status": "ok"})
            else:
                self._send(404, {"error": "no route"})

        def _generate(self, body) -> None:
            state["generated"] += 1
            if args.die_after and state["generated"] > args.die_after:
                os._exit(3)
            time.sleep(args.delay)
            params = body["sampling_params"]
            base = sum(body["token_ids"]) + int(params.get("seed") or 0) + state["weights"]
            tokens = []
            for i in range(int(params["max_tokens"])):
                tokens.append((base + 7 * i) % 50 + 10)
                if tokens[-1] in (params.get("stop_token_ids") or []):
                    break
            content = [{"token_id": t, "logprob": -t / 100} for t in tokens]
            spans = [{"version": state["version"], "start": 0, "end": len(tokens)}]
            self._send(200, {"choices": [{"index": 0, "token_ids": tokens, "logprobs": {"content": content},
                                          "weight_versions": spans, "finish_reason": "stop"}]})

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
