"""A reward served over HTTP: ``{url: http://HOST:PORT/PATH, format: grpokit | openrlhf | slime, ...}``.

Formats (request -> response; docs/rewards.md has examples):

- ``grpokit`` (``grpokit serve-rewards``): ``{"prompts": [...], "completions": [...], "columns": {name: [...]}}``
  -> ``{"rewards": [number | null], "errors"?: [str | null], "extra"?: {column: [...]}, "metrics"?: {name: [...]}}``;
  ``extra`` columns are stored as ``log_extra`` columns are, ``metrics`` logged as ``log_metric`` values;
- ``openrlhf`` (``--remote_rm_url``): ``{"query": [prompt + completion], "prompts": [...], "labels": [...]}``
  -> ``{"rewards": [...], "scores"?: [...], "extra_logs"?: {name: value | [values]}}``; extra_logs are logged as
  metrics (their mean);
- ``slime`` (``--rm-url``): one ``{"prompt", "response", "label"}`` per completion -> a number, or a dict read at
  ``reward_key``.

Labels (openrlhf, slime) come from ``label_column`` (default: the first of ``label``, ``answer``, ``solution`` the
row has). A batch is cut into requests of ``batch_size`` completions (default: one request per URL), sent
``concurrency`` at a time, spread over the URLs; a request that fails (a connection refused or reset, a timeout,
HTTP 429 or 5xx) is retried ``retries`` times with exponential backoff, each time on the next URL. A request that
still fails, or whose answer is not what the format promises, gives None and a stored error for its completions
(:meth:`~grpokit.rewards.contract.RewardLog.log_errors`): never an exception. ``<label>/latency_s`` (seconds per
answered request), ``<label>/request_errors`` and ``<label>/retries`` are logged each batch.

A hostile or broken server is handled by :mod:`grpokit.rewards.http_fetch`: ``timeout`` bounds each whole
exchange (not each read), answers are read up to ``max_answer_bytes`` (inflated included), redirects are not followed,
and a value that is not a finite number (NaN, infinity, a string) gives None and an error for its completion. A 429 or
503 with ``Retry-After`` is retried after that many seconds (at most ``timeout``). ``https://`` URLs are verified
against ``ca_bundle`` (default: the system's CAs); ``client_cert`` and ``client_key`` are sent for mutual TLS. A
token-like header (``Authorization``, ``*token*``, ``*key*``, ``*secret*``) sent over plain HTTP to an address that is
not loopback gets a one-line warning when the reward is built.

The reward runs on a thread of the trainer (``in_process``): it waits on the network, which releases the GIL, so
the runner's ``reward_timeout`` bounds it; set that above ``timeout x (retries + 1)``.
"""

from __future__ import annotations

import ipaddress
import json
import math
import numbers
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from grpokit.rewards.contract import text_of
from grpokit.rewards.http_fetch import ACCEPT_ENCODING, RETRY_STATUS, RequestFailed, post_json
from grpokit.rewards.registry import BUILTINS

__all__ = ["FORMATS", "RETRY_STATUS", "RemoteReward", "RequestFailed"]

FORMATS = ("grpokit", "openrlhf", "slime")
LABEL_COLUMNS = ("label", "answer", "solution")
SECRET_HEADER_WORDS = ("authorization", "token", "key", "secret", "cookie")


def _httpx():
    try:
        import httpx
    except ImportError as exc:
        raise ImportError(
            "remote rewards need httpx: pip install 'grpokit[remote]' (httpx comes with huggingface_hub too)"
        ) from exc
    return httpx


def _number(value: Any) -> tuple[float | None, str | None]:
    """A reward value from JSON: (a finite number or None, None), or (None, why) for anything else (NaN and
    infinity included)."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, f"the server answered {str(value)[:100]!r} where a number was expected"
    if not math.isfinite(float(value)):
        return None, f"the server answered {value} where a finite number was expected"
    return float(value), None


def _plain(value: Any) -> Any:
    """``value`` as JSON can carry it: other objects as their str, NaN and infinities (a dataset's missing values)
    as null, since JSON has no NaN and httpx refuses to send one."""
    return json.loads(json.dumps(value, default=str), parse_constant=lambda _: None)


def _mapping(value: Any) -> Mapping:
    """An optional object of an answer (``extra``, ``metrics``, ``extra_logs``); anything else is ignored."""
    return value if isinstance(value, Mapping) else {}


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _ssl_context(ca_bundle: str | None, client_cert: str | None, client_key: str | None):
    """The TLS context of https:// URLs: ``ca_bundle``'s CAs (else httpx's default), the client certificate if any."""
    import ssl

    try:
        if ca_bundle is None:
            context = _httpx().create_ssl_context()
        else:
            context = ssl.create_default_context(cafile=os.path.expanduser(ca_bundle))
        if client_cert is not None:
            context.load_cert_chain(os.path.expanduser(client_cert), client_key and os.path.expanduser(client_key))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"remote reward: cannot load ca_bundle {ca_bundle!r} / client_cert {client_cert!r} / client_key "
            f"{client_key!r} ({exc}): give PEM files that exist"
        ) from None
    return context


@BUILTINS.register("remote")
class RemoteReward:
    """A reward whose values come from HTTP servers (module docstring). ``url``: one URL or a list sharing the load;
    ``headers``: sent with every request (``${VAR}`` is read from the environment); ``label``: its name in the
    metrics (``rewards/<label>/mean``, ``<label>/latency_s``), ``remote`` by default."""

    in_process = True

    def __init__(
        self,
        url: str | Sequence[str],
        format: str = "grpokit",
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 4,
        batch_size: int | None = None,
        headers: Mapping[str, str] | None = None,
        reward_key: str = "reward",
        label_column: str | None = None,
        label: str = "remote",
        max_answer_bytes: int = 64 << 20,
        ca_bundle: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
    ):
        urls = [url] if isinstance(url, str) else list(url)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"remote reward: url must be http://HOST:PORT/PATH (or a list of them), got {url!r}")
        if format not in FORMATS:
            raise ValueError(f"remote reward: format must be one of {', '.join(FORMATS)}, got {format!r}")
        if timeout <= 0 or retries < 0 or concurrency < 1 or (batch_size is not None and batch_size < 1):
            raise ValueError("remote reward: timeout > 0, retries >= 0, concurrency >= 1 and batch_size >= 1 (or null)")
        if max_answer_bytes < 1:
            raise ValueError(f"remote reward: max_answer_bytes must be >= 1, got {max_answer_bytes}")
        if client_key is not None and client_cert is None:
            raise ValueError("remote reward: client_key needs client_cert (the certificate it belongs to)")
        self.urls, self.format, self.label = urls, format, label
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)
        self.concurrency, self.batch_size = int(concurrency), batch_size
        self.headers = {str(k): os.path.expandvars(str(v)) for k, v in (headers or {}).items()}
        self.reward_key, self.label_column = reward_key, label_column
        self.max_answer_bytes = int(max_answer_bytes)
        self.tls = (ca_bundle, client_cert, client_key)
        if any(self.tls):
            _ssl_context(*self.tls)  # a missing or unreadable file fails here, in one line, not at the first batch
        self._warn_plain_secrets()
        self._client = None
        self._lock = threading.Lock()
        self._next = 0  # the URL the next request starts on

    def _warn_plain_secrets(self) -> None:
        secret = next((h for h in self.headers if any(w in h.lower() for w in SECRET_HEADER_WORDS)), None)
        plain = next((u for u in self.urls if u.startswith("http://") and not _is_loopback(u)), None)
        if secret is not None and plain is not None:
            print(
                f"grpokit: warning: remote reward {self.label!r} sends its {secret} header over plain HTTP to "
                f"{urlsplit(plain).netloc}, readable by anyone on the network: use https:// (serve-rewards "
                "--certfile/--keyfile; ca_bundle: for a private CA)",
                file=sys.stderr,
            )

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                httpx = _httpx()
                self._client = httpx.Client(
                    timeout=self.timeout,
                    headers={"Accept-Encoding": ACCEPT_ENCODING, **self.headers},
                    verify=_ssl_context(*self.tls) if any(self.tls) else True,
                    follow_redirects=False,
                    # a connection per request: the watchdog (http_fetch) learns each request's socket as it opens
                    limits=httpx.Limits(max_keepalive_connections=0),
                )
            return self._client

    def __call__(self, prompts, completions, log_metric=None, log_extra=None, log_errors=None, **columns) -> list:
        n = len(completions)
        columns = {k: v for k, v in columns.items() if isinstance(v, list) and len(v) == n}
        if self.format == "slime":
            parts = [slice(i, i + 1) for i in range(n)]
        else:
            size = self.batch_size or max(1, math.ceil(n / len(self.urls)))
            parts = [slice(i, min(n, i + size)) for i in range(0, n, size)]
        with ThreadPoolExecutor(min(self.concurrency, len(parts) or 1)) as pool:
            answers = list(pool.map(lambda rows: self._request(rows, prompts, completions, columns), parts))
        values: list[float | None] = [None] * n
        errors: list[str | None] = [None] * n
        extra: dict[str, list] = {}
        metrics: dict[str, list[float]] = {}
        latencies, failed, retried = [], 0, 0
        for rows, (answer, error, latency, tries) in zip(parts, answers):
            retried += tries - 1
            if error is not None:
                failed += 1
                errors[rows] = [error] * (rows.stop - rows.start)
                continue
            latencies.append(latency)
            values[rows] = answer["rewards"]
            if answer.get("errors"):
                errors[rows] = answer["errors"]
            for i, why in enumerate(answer["value_errors"]):
                if why is not None:
                    errors[rows.start + i] = why
            for column, column_values in answer.get("extra", {}).items():
                extra.setdefault(column, [None] * n)[rows] = column_values
            for metric, metric_values in answer.get("metrics", {}).items():
                metrics.setdefault(metric, []).extend(metric_values)
        if log_metric is not None:
            if latencies:
                log_metric(f"{self.label}/latency_s", sum(latencies) / len(latencies))
            log_metric(f"{self.label}/request_errors", failed)
            log_metric(f"{self.label}/retries", retried)
            for metric, metric_values in metrics.items():
                for value in metric_values:
                    log_metric(metric, value)
        if log_extra is not None:
            for column, column_values in extra.items():
                log_extra(column, column_values)
        if log_errors is not None and any(e is not None for e in errors):
            log_errors([e if v is None else None for e, v in zip(errors, values)])
        return values

    def _request(self, rows: slice, prompts, completions, columns) -> tuple[dict | None, str | None, float, int]:
        """(answer, None, latency, tries) or (None, error, 0, tries) for the completions ``rows``."""
        body = self._body(rows, prompts, completions, columns)
        with self._lock:
            start, self._next = self._next, (self._next + 1) % len(self.urls)
        error = "no request was sent"
        for attempt in range(self.retries + 1):
            url = self.urls[(start + attempt) % len(self.urls)]
            began = time.monotonic()
            try:
                return (
                    self._parse(self._post(url, body), rows.stop - rows.start),
                    None,
                    time.monotonic() - began,
                    attempt + 1,
                )
            except RequestFailed as exc:
                error = f"{url}: {exc}"
                if not exc.retry:
                    return None, error, 0.0, attempt + 1
                wait = max(self.backoff * 2**attempt, min(exc.retry_after or 0.0, self.timeout))
            if attempt < self.retries and wait > 0:
                time.sleep(wait)
        return None, f"{error} (after {self.retries + 1} tries)", 0.0, self.retries + 1

    def _post(self, url: str, body: Any) -> Any:
        return post_json(self.client, url, body, self.timeout, self.max_answer_bytes)

    def _labels(self, columns: Mapping[str, list], rows: slice) -> list:
        column = self.label_column or next((c for c in LABEL_COLUMNS if c in columns), None)
        return [None] * (rows.stop - rows.start) if column is None else list(columns[column][rows])

    def _body(self, rows: slice, prompts, completions, columns) -> Any:
        ps = [text_of(p) for p in prompts[rows]]
        cs = [text_of(c) for c in completions[rows]]
        if self.format == "grpokit":
            return {
                "prompts": list(prompts[rows]),
                "completions": list(completions[rows]),
                "columns": _plain({k: v[rows] for k, v in columns.items()}),
            }
        labels = _plain(self._labels(columns, rows))
        if self.format == "openrlhf":
            return {"query": [p + c for p, c in zip(ps, cs)], "prompts": ps, "labels": labels}
        return {"prompt": ps[0], "response": cs[0], "label": labels[0]}

    def _parse(self, answer: Any, n: int) -> dict:
        """The answer as ``{"rewards": [n values], "errors"?, "extra"?, "metrics"?}``; RequestFailed if malformed."""
        if self.format == "slime":
            if isinstance(answer, Mapping):
                if self.reward_key not in answer:
                    raise RequestFailed(f"the answer has no {self.reward_key!r} key: {str(answer)[:200]}", retry=False)
                answer = answer[self.reward_key]
            value, why = _number(answer)
            return {"rewards": [value], "value_errors": [why]}
        if not isinstance(answer, Mapping) or not isinstance(answer.get("rewards"), list):
            raise RequestFailed(f"the answer has no 'rewards' list: {str(answer)[:200]}", retry=False)
        rewards = answer["rewards"]
        if len(rewards) != n:
            raise RequestFailed(f"the answer has {len(rewards)} rewards for {n} completions", retry=False)
        numbers_and_errors = [_number(v) for v in rewards]
        parsed: dict[str, Any] = {
            "rewards": [v for v, _ in numbers_and_errors],
            "value_errors": [why for _, why in numbers_and_errors],
        }
        if self.format == "openrlhf":
            logs = _mapping(answer.get("extra_logs"))
            parsed["metrics"] = {
                f"{self.label}/{k}": [
                    float(x) for x in (v if isinstance(v, list) else [v]) if isinstance(x, numbers.Real)
                ]
                for k, v in logs.items()
            }
            return parsed
        errors = answer.get("errors")
        if isinstance(errors, list) and len(errors) == n:
            parsed["errors"] = [None if e is None else str(e) for e in errors]
        extra = _mapping(answer.get("extra"))
        parsed["extra"] = {k: v for k, v in extra.items() if isinstance(v, list) and len(v) == n}
        metrics = _mapping(answer.get("metrics"))
        parsed["metrics"] = {
            k: [float(x) for x in v if isinstance(x, numbers.Real)] for k, v in metrics.items() if isinstance(v, list)
        }
        return parsed

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
