"""HTTP to a running ``vllm serve`` (``vllm_mode: server``): every way a request can fail is one error line.

:class:`ServerClient` sends JSON requests to the server's routes with one timeout, ``vllm_server_timeout``: no
request waits longer than that for the server to answer (httpx's connect, read and write timeouts), so a server
that is unreachable, dies or hangs ends the run with :class:`VLLMServerError`, whose one line names the URL, the
route and the timeout (TRL #6796: a weight sync that hung with no error). ``wait_ready`` polls ``/health`` until
the server answers 200, for at most the same timeout (a server still loading its model).

Every request carries the server's key (``Authorization: Bearer KEY``; ``vllm_server_api_key``, ``VLLM_API_KEY``
or a loopback server's key file: :func:`grpokit.rollout.vllm.keys.client_key`); HTTP 401 ends the run in one line
naming ``vllm_server_api_key`` and where the key sent came from, or that none was.
"""

from __future__ import annotations

import time
from typing import Any

SERVE_HINT = "start one with `grpokit vllm-serve MODEL` (docs/vllm.md) or set vllm_server_base_url"


class VLLMServerError(RuntimeError):
    """The vLLM server failed a request (unreachable, dead, too slow, an HTTP error): one line naming the URL,
    the route and the timeout."""


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ServerClient:
    """JSON requests to ``base_url`` (no trailing slash), each bounded by ``timeout`` seconds, with ``api_key`` (None:
    none sent; ``key_source``: where it came from, or why there is none, for the 401 line)."""

    def __init__(self, base_url: str, timeout: float, api_key: str | None = None, key_source: str = ""):
        import httpx

        self.url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.key_source = key_source
        self._has_key = api_key is not None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        # trust_env=False: a proxy from the environment must not stand between the learner and its server
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout), headers=headers, trust_env=False)

    def error(self, route: str, what: str) -> VLLMServerError:
        return VLLMServerError(
            f"vLLM server {self.url}: {route} {what} (vllm_server_timeout={self.timeout:g} s); {SERVE_HINT}."
        )

    def unauthorized(self, route: str) -> VLLMServerError:
        sent = "the key sent" if self._has_key else "no key was sent"
        sent += f" ({self.key_source}) is not its key" if self._has_key else f" ({self.key_source})"
        return VLLMServerError(
            f"vLLM server {self.url}: {route} answered HTTP 401: {sent}; set vllm_server_api_key (or VLLM_API_KEY) "
            "to the key the server was started with (docs/vllm.md, 'The server's key')."
        )

    def request(self, method: str, route: str, json: Any = None, params: dict | None = None) -> Any:
        """The JSON answer of ``method route`` (None when the body is empty); VLLMServerError otherwise."""
        import httpx

        try:
            response = self._http.request(method, self.url + route, json=json, params=params)
        except httpx.TimeoutException:
            raise self.error(
                route, f"did not answer within {self.timeout:g} s: the server hangs or is overloaded"
            ) from None
        except httpx.HTTPError as exc:  # refused, reset, closed mid-answer: not running, or died
            raise self.error(route, f"failed: {_one_line(type(exc).__name__ + ': ' + str(exc))}") from None
        if response.status_code == 401:
            raise self.unauthorized(route)
        if response.status_code != 200:
            raise self.error(route, f"answered HTTP {response.status_code}: {_one_line(response.text)}")
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise self.error(route, f"answered with no JSON: {_one_line(response.text)}") from None

    def wait_ready(self, poll_s: float = 0.5) -> None:
        """Return once ``GET /health`` answers 200; VLLMServerError when it has not within the timeout."""
        import httpx

        deadline = time.monotonic() + self.timeout
        last = "no answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.error("/health", f"not ready within {self.timeout:g} s (last: {last})")
            try:
                response = self._http.get(self.url + "/health", timeout=max(min(left, 10.0), 0.1))
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = _one_line(type(exc).__name__ + ": " + str(exc), 120)
            time.sleep(min(poll_s, max(deadline - time.monotonic(), 0)))

    def close(self) -> None:
        self._http.close()
