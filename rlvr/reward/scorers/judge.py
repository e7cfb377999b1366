"""LLM-as-a-judge scoring: prompt template, judge back-ends (local transformers model or an
OpenAI-compatible HTTP endpoint) and a robust parser of the judge's verdict (Zheng et al., 2023,
"Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena", arXiv:2306.05685).

Score parsing (:func:`parse_judge_score`), first rule that applies wins, result in [0, 1]:

1. a JSON object with a ``score`` / ``rating`` / ``grade`` key (e.g. ``{"score": 3}``);
2. ``[[8]]`` (MT-Bench style);
3. ``score: 7/10``, ``Rating: 0.7``, ``grade = 4 out of 5`` (the last such label in the text);
4. a bare fraction ``7/10`` or ``7 out of 10`` (the last one);
5. a verdict word (the last one): yes / correct / right / true / pass -> 1.0;
   no / incorrect / not correct / wrong / false / fail -> 0.0.

Normalisation of a number ``v``: ``X/Y`` and ``X out of Y`` give ``X / Y``; ``N%`` gives ``N / 100``;
a bare number with a decimal point in [0, 1] (``0.7``, ``1.0``) is taken as already normalised;
any other bare number is divided by ``scale_max`` (default 10). A value outside [0, 1] after
normalisation, or text where no rule applies, gives ``None`` ("doesn't apply").
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import torch

from rlvr.utils.errors import RewardError

_NUM = r"(-?\d+(?:\.\d+)?)"
_LABEL = re.compile(rf"\b(?:score|rating|grade)\b\s*[:=]?\s*{_NUM}\s*(%|/\s*{_NUM}|out\s+of\s+{_NUM})?", re.IGNORECASE)
_FRACTION = re.compile(rf"{_NUM}\s*(?:/|out\s+of)\s*{_NUM}", re.IGNORECASE)
_VERDICT = re.compile(r"\b(not\s+correct|incorrect|wrong|false|fail(?:ed)?|no|correct|right|true|pass(?:ed)?|yes)\b", re.IGNORECASE)
_POSITIVE = {"correct", "right", "true", "pass", "passed", "yes"}


def _normalise(value: float, denominator: float | None, percent: bool, raw: str, scale_max: float) -> float | None:
    if percent:
        result = value / 100.0
    elif denominator is not None:
        result = value / denominator if denominator > 0 else -1.0
    elif "." in raw and 0.0 <= value <= 1.0:
        result = value
    else:
        result = value / scale_max
    return result if 0.0 <= result <= 1.0 else None


def _from_json(text: str, scale_max: float) -> float | None:
    for match in re.finditer(r"\{[^{}]*\}", text):
        try:
            obj = json.loads(match.group(0))
        except json.JSONDecodeError:
            continue
        for key in ("score", "rating", "grade"):
            value = obj.get(key) if isinstance(obj, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return _normalise(float(value), None, False, json.dumps(value), scale_max)
            if isinstance(value, str) and value.strip():
                return parse_judge_score(value, scale_max)
    return None


def parse_judge_score(text: str, scale_max: float = 10.0) -> float | None:
    """The judge's score in [0, 1], or None when none can be read (rules in the module docstring)."""
    found = _from_json(text, scale_max)
    if found is not None:
        return found
    brackets = re.findall(rf"\[\[\s*{_NUM}\s*\]\]", text)
    if brackets:
        return _normalise(float(brackets[-1]), None, False, brackets[-1], scale_max)
    labels = _LABEL.findall(text)
    if labels:
        raw, suffix, over, out_of = labels[-1]
        denominator = over or out_of
        return _normalise(float(raw), float(denominator) if denominator else None, suffix == "%", raw, scale_max)
    fractions = _FRACTION.findall(text)
    if fractions:
        num, den = fractions[-1]
        return _normalise(float(num), float(den), False, num, scale_max)
    verdicts = _VERDICT.findall(text)
    if verdicts:
        return 1.0 if verdicts[-1].lower() in _POSITIVE else 0.0
    return None


def format_judge_prompt(template: str, question: str, response: str, reference: str) -> str:
    """Fill ``{question}``, ``{response}`` and ``{reference}`` into ``template``."""
    try:
        return template.format(question=question, response=response, reference=reference)
    except (KeyError, IndexError) as exc:
        raise RewardError(
            f"judge prompt template has an unknown placeholder {exc}; use only {{question}}, {{response}}, "
            "{{reference}} and double other braces ({{{{ }}}})"
        ) from exc


RETRY_BACKOFF_CAP_S = 30.0
"""Longest wait between two attempts of a judge request."""
RETRIED_STATUSES = frozenset({408, 429})
"""4xx statuses that are retried (a time-out or too many requests); other 4xx are the request's fault."""


class HttpJudge:
    """Judge behind an OpenAI-compatible ``/v1/chat/completions`` endpoint (any server, or a vLLM
    replica that rlvr starts).

    Every request has a time limit (``timeout_s``); a request that times out, cannot connect, or
    gets a 5xx, 408 or 429 answer is sent again up to ``max_retries`` times, waiting
    ``retry_backoff_s * 2**attempt`` seconds (at most 30) in between; any other 4xx fails at once.
    At most ``max_concurrency`` requests of this judge are in flight at any time, over all calls of
    :meth:`generate` (one pool of threads per judge). ``stats`` counts ``requests``, ``retries`` and
    ``failures`` so far.

    Args:
        base_url: API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: model name sent in the request.
        api_key_env: environment variable holding the bearer token (empty: no Authorization header).
        timeout_s: time limit of each HTTP request.
        max_tokens: completion length limit.
        max_concurrency: requests in flight at once.
        max_retries: attempts after the first one.
        retry_backoff_s: first wait before a retry.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str = "", timeout_s: float = 60.0,
                 max_tokens: int = 256, max_concurrency: int = 8, max_retries: int = 3,
                 retry_backoff_s: float = 1.0) -> None:
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0 or retry_backoff_s < 0:
            raise RewardError(f"judge {base_url}: max_concurrency must be >= 1, max_retries >= 0, timeout_s > 0 and "
                              f"retry_backoff_s >= 0; got {max_concurrency}, {max_retries}, {timeout_s}, {retry_backoff_s}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout_s, self.max_tokens, self.max_concurrency = model, timeout_s, max_tokens, max_concurrency
        self.max_retries, self.retry_backoff_s = max_retries, retry_backoff_s
        self.api_key = os.environ.get(api_key_env, "") if api_key_env else ""
        self.stats = {"requests": 0, "retries": 0, "failures": 0}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="rlvr-judge")

    def _count(self, name: str) -> None:
        with self._lock:
            self.stats[name] += 1

    def _request(self, prompt: str) -> str:
        """One attempt; raises ``_Retry`` for what is worth another attempt."""
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": self.max_tokens, "temperature": 0.0}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
            if exc.code >= 500 or exc.code in RETRIED_STATUSES:
                raise _Retry(detail) from None
            raise RewardError(f"judge endpoint {self.url} refused the request ({detail}); check the model name "
                              "and the API key") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            timed_out = isinstance(reason, TimeoutError) or "timed out" in str(reason)
            raise _Retry(f"no answer within {self.timeout_s:g} s" if timed_out else f"{reason!r}") from None
        try:
            return str(payload["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError) as exc:
            raise RewardError(f"judge endpoint {self.url} returned an answer without choices[0].message.content: "
                              f"{exc!r}") from exc

    def _complete(self, prompt: str) -> str:
        """The completion of one prompt, with retries (see the class docstring)."""
        self._count("requests")
        for attempt in range(self.max_retries + 1):
            try:
                return self._request(prompt)
            except _Retry as retry:
                last = retry
                if attempt < self.max_retries:
                    self._count("retries")
                    time.sleep(min(self.retry_backoff_s * 2 ** attempt, RETRY_BACKOFF_CAP_S))
        self._count("failures")
        raise RewardError(f"judge endpoint {self.url} failed {self.max_retries + 1} time(s), the last: {last}; check "
                          "that the server is up, or raise request_timeout_s / max_retries")

    def generate(self, prompts: list[str]) -> list[str]:
        """One completion per prompt, at most ``max_concurrency`` requests in flight."""
        return list(self._pool.map(self._complete, prompts))

    def close(self) -> None:
        """Stop the request threads (after the requests in flight)."""
        self._pool.shutdown(wait=True)


class _Retry(Exception):
    """An attempt that failed in a way another attempt may not (time limit, connection, 5xx, 408, 429)."""


class LocalJudge:
    """Judge run with a local transformers causal LM (greedy decoding, batched, left padding).

    Args:
        model: a loaded causal LM (e.g. from :func:`rlvr.utils.model.load_causal_lm`).
        tokenizer: its tokenizer; the chat template is applied when it has one.
        max_new_tokens: completion length limit.
        batch_size: prompts per ``generate`` call.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int = 128, batch_size: int = 8) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size

    def _render(self, prompt: str) -> str:
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True)
        return prompt

    @torch.no_grad()
    def generate(self, prompts: list[str]) -> list[str]:
        """One greedy completion per prompt (special tokens removed)."""
        outputs: list[str] = []
        side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "left"
        try:
            for start in range(0, len(prompts), self.batch_size):
                chunk = [self._render(p) for p in prompts[start:start + self.batch_size]]
                enc = self.tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
                enc = enc.to(self.model.device)
                generated = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                                pad_token_id=self.tokenizer.pad_token_id)
                new_tokens = generated[:, enc["input_ids"].shape[1]:]
                outputs.extend(self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
        finally:
            self.tokenizer.padding_side = side
        return outputs
