"""A served teacher (``teacher_server_url``): a server that returns the log-probs of given token ids.

The protocol is vLLM's OpenAI completions route with prompt log-probs, so `grpokit vllm-serve TEACHER` (or any
``vllm serve``) is a teacher as it is:

    GET  /v1/models        -> {"data": [{"id": NAME}, ...]}        (once, at the start: the server is up)
    POST /v1/completions   {"model": NAME, "prompt": [[ids of prompt + completion], ...], "max_tokens": 1,
                            "temperature": 1.0, "prompt_logprobs": 0}
                           -> {"choices": [{"index": i, "prompt_logprobs": [null, {"<id>": {"logprob": x}}, ...]}]}

Entry j of a choice's ``prompt_logprobs`` holds the log-prob of the sequence's token j given the tokens before it
(``prompt_logprobs: 0`` asks for that token alone); the completion's tokens are the entries after the prompt's. The
teacher scores at temperature 1: vLLM's prompt log-probs ignore the request's temperature (vLLM #5592), so another
``teacher_temperature`` is refused with a served teacher rather than silently not applied.

Every request carries the server's key (``teacher_server_api_key``, else ``VLLM_API_KEY``, else for a loopback URL
the key file a ``grpokit vllm-serve`` wrote for its port: :func:`grpokit.rollout.vllm.keys.client_key`); HTTP 401
ends the run in one line naming ``teacher_server_api_key``. Every request is bounded by ``teacher_server_timeout``
(connect, read, write); a server that is gone, dies or hangs ends the run with one :class:`TeacherServerError` line
naming the URL.
"""

from __future__ import annotations

import torch

from grpokit.rollout.vllm.http import VLLMServerError


class TeacherServerError(VLLMServerError):
    """The teacher server failed a request: one line naming the URL, the route and the timeout."""


class ServedTeacher:
    """The teacher at ``url``, each request bounded by ``timeout`` seconds."""

    def __init__(self, url: str, temperature: float, timeout: float, api_key: str | None = None):
        import httpx

        from grpokit.rollout.vllm.keys import client_key

        if temperature != 1.0:
            raise TeacherServerError(
                f"teacher_temperature={temperature} with teacher_server_url: a server's prompt log-probs are at "
                "temperature 1 (vLLM #5592); use a local teacher (teacher_model_name_or_path) or teacher_temperature 1."
            )
        self.url, self.timeout, self.where = url.rstrip("/"), float(timeout), "server"
        key, self.key_source = client_key(api_key, self.url)
        self._has_key = key is not None
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        # trust_env=False: no proxy from the environment between the learner and its teacher; no redirects followed
        self._http = httpx.Client(
            timeout=httpx.Timeout(self.timeout), headers=headers, trust_env=False, follow_redirects=False
        )
        models = self._request("GET", "/v1/models").get("data") or []
        if not models or "id" not in models[0]:
            raise self._error("/v1/models", "named no model")
        self.model = models[0]["id"]

    def _error(self, route: str, what: str) -> TeacherServerError:
        return TeacherServerError(
            f"teacher server {self.url}: {route} {what} (teacher_server_timeout={self.timeout:g} s); start one with "
            "`grpokit vllm-serve TEACHER` or fix teacher_server_url."
        )

    def _unauthorized(self, route: str) -> TeacherServerError:
        source = self.key_source.replace("vllm_server_api_key", "teacher_server_api_key")
        sent = f"the key sent ({source}) is not its key" if self._has_key else f"no key was sent ({source})"
        return TeacherServerError(
            f"teacher server {self.url}: {route} answered HTTP 401: {sent}; set teacher_server_api_key (or "
            "VLLM_API_KEY) to the key the teacher server was started with (docs/distillation.md)."
        )

    def _request(self, method: str, route: str, json=None) -> dict:
        import httpx

        try:
            response = self._http.request(method, self.url + route, json=json)
        except httpx.TimeoutException:
            raise self._error(route, f"did not answer within {self.timeout:g} s: the server hangs") from None
        except httpx.HTTPError as exc:  # refused, reset, closed mid-answer: not running, or died
            raise self._error(route, f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
        if response.status_code == 401:
            raise self._unauthorized(route)
        if response.status_code != 200:
            raise self._error(route, f"answered HTTP {response.status_code}: {' '.join(response.text.split())[:200]}")
        try:
            return response.json()
        except ValueError:
            raise self._error(route, "answered something that is not JSON") from None

    def logprobs(self, rollouts, pad_token_id: int) -> torch.Tensor:
        """[N, T] float32: the server's log-prob of each sampled token (0 past each completion)."""
        lengths = rollouts.completion_lengths.tolist()
        ids = rollouts.completion_ids.tolist()
        groups = rollouts.group_index.tolist()
        sequences = [list(rollouts.prompt_ids[g]) + ids[i][:n] for i, (g, n) in enumerate(zip(groups, lengths))]
        body = {"model": self.model, "prompt": sequences, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        choices = self._request("POST", "/v1/completions", body).get("choices") or []
        if len(choices) != len(sequences):
            raise self._error("/v1/completions", f"answered {len(choices)} choices for {len(sequences)} sequences")
        out = torch.zeros(rollouts.completion_ids.shape, dtype=torch.float32)
        for choice in choices:
            i = int(choice.get("index", 0))
            start = len(rollouts.prompt_ids[groups[i]])
            entries = choice.get("prompt_logprobs") or []
            for t in range(lengths[i]):
                entry = entries[start + t] if start + t < len(entries) else None
                token = str(ids[i][t])
                if not entry or token not in entry:
                    raise self._error("/v1/completions", f"gave no prompt log-prob for token {t} of sequence {i}")
                value = entry[token]
                out[i, t] = float(value["logprob"] if isinstance(value, dict) else value)
        return out
