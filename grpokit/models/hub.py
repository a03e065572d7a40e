"""Loading from the Hugging Face Hub: within seconds, or a message that says why not.

``from_pretrained`` of a hub id on a machine that cannot reach the hub retries for about a minute (huggingface_hub's
backoff) before it gives up, and its message then suggests HF_HUB_OFFLINE whether or not it is set. Here a hub id
is first checked with one request to the hub (:data:`PROBE_SECONDS` at most, proxies and HF_ENDPOINT honoured, once
per process): when the hub cannot be reached, the files come from the local cache or the load fails at once, and
the message says which of the two situations it is: HF_HUB_OFFLINE set (nothing is downloaded) or the hub out of
reach. A local folder never touches the network.

Imports nothing from grpokit, so any layer may use it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The hub's answer to one request (any status counts: it was reached) must come within this many seconds.
PROBE_SECONDS = 5.0
_TRUE = {"1", "on", "yes", "true"}


def offline() -> bool:
    """Whether HF_HUB_OFFLINE (or transformers' TRANSFORMERS_OFFLINE) is set: nothing is downloaded."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


def cache_folder() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


@functools.cache
def _unreachable(url: str) -> str | None:
    """None when ``url`` answers one HEAD request within :data:`PROBE_SECONDS`, else the reason it did not. The
    request runs on a daemon thread: the name lookup before it has no timeout of its own, and a resolver that hangs
    must cost no more than the request."""
    from huggingface_hub.utils import get_session

    outcome: list[str | None] = []

    def probe() -> None:
        try:
            get_session().head(url, timeout=PROBE_SECONDS, follow_redirects=False)
            outcome.append(None)
        except Exception as exc:  # DNS, refused, timeout, proxy, TLS: every way of not reaching it
            cause = exc.__cause__ or exc.__context__
            text = str(exc).strip() or (str(cause).strip() if cause else "") or type(exc).__name__
            outcome.append(text.splitlines()[0])

    thread = threading.Thread(target=probe, name="grpokit-hub-probe", daemon=True)
    thread.start()
    thread.join(PROBE_SECONDS + 1.0)
    return outcome[0] if outcome else f"no answer within {PROBE_SECONDS:g} s"


def unreachable() -> str | None:
    """Why the hub (HF_ENDPOINT) cannot be reached, or None when it can (asked once per process and endpoint)."""
    return _unreachable(endpoint())


def from_pretrained(cls: Any, source: str, what: str, **kwargs: Any) -> Any:
    """``cls.from_pretrained(source, **kwargs)``, failing fast (module docstring) with a FileNotFoundError whose
    one line names ``what`` (e.g. "model"), ``source`` and the cause: a folder that is not a model, a hub id that
    does not exist, HF_HUB_OFFLINE with the files not in the cache, or a hub out of reach."""
    if Path(source).exists():  # a local folder or file: the network plays no part
        return _load(cls, source, what, "check the path, or give a model folder or a hub id", **kwargs)
    if offline():
        return _load(
            cls,
            source,
            what,
            f"HF_HUB_OFFLINE is set, so nothing is downloaded, and it is not in the local cache ({cache_folder()}); "
            "unset HF_HUB_OFFLINE to download it, or give a local folder",
            cause=False,
            **kwargs,
        )
    reason = unreachable()
    if reason is None:
        return _load(cls, source, what, "check the hub id, or download it and give the local folder", **kwargs)
    with _offline_mode():  # from the cache only (transformers' adapter lookup ignores local_files_only)
        loaded = _load(
            cls,
            source,
            what,
            f"the hub ({endpoint()}) cannot be reached ({reason}) and it is not in the local cache "
            f"({cache_folder()}); download it where the hub can be reached and give its local folder, or fix the "
            "connection (HF_ENDPOINT, HTTPS_PROXY)",
            cause=False,
            **kwargs,
        )
    warnings.warn(
        f"grpokit: the hub ({endpoint()}) cannot be reached ({reason}); loaded the {what} {source!r} from the local "
        "cache (HF_HUB_OFFLINE=1 skips this check)",
        stacklevel=3,
    )
    return loaded


@contextlib.contextmanager
def _offline_mode():
    """huggingface_hub's offline mode (what HF_HUB_OFFLINE sets when it is imported) for the block: every request
    fails at once instead of after a minute of retries, and files come from the cache."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def _load(cls: Any, source: str, what: str, fix: str, cause: bool = True, **kwargs: Any) -> Any:
    """``cls.from_pretrained``; a failure is a FileNotFoundError naming ``what``, ``source``, transformers' first
    line (``cause``: when it says something the ``fix`` does not) and ``fix``."""
    try:
        return cls.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:  # ValueError: a folder whose config.json is missing or has no model_type
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        said = f" ({first})" if cause else ""
        raise FileNotFoundError(f"cannot load the {what} {source!r}{said}; {fix}.") from None


# What a run folder holds besides a saved model: never uploaded by push_folder.
RUN_FILES = ["checkpoints/**", "final/**", "eval/**", "rollouts.sqlite*", "metrics.jsonl", "report.html", "*.tmp"]


@dataclass(frozen=True)
class HubSpec:
    """Where ``push_to_hub`` uploads (TRL's ``hub_model_id``: None = the output folder's name, ``hub_token``,
    ``hub_private_repo``, ``hub_revision``)."""

    model_id: str | None = None
    token: str | None = None
    private: bool = False
    revision: str | None = None


def push_folder(
    folder: Path,
    repo: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "End of training",
    revision: str | None = None,
):
    """Upload ``folder`` (a saved model) to the Hub repo ``repo``, created if needed, without a run's own files
    (:data:`RUN_FILES`): TRL's ``trainer.push_to_hub()``. Returns huggingface_hub's commit info. Offline mode, a hub
    out of reach (found within seconds, as for loading), a missing token or a refusal is a ``ConnectionError`` of one
    line naming the repo, the cause and where the model is."""

    def failed(cause: str) -> ConnectionError:
        return ConnectionError(
            f"push_to_hub: could not upload to the Hub repo {repo!r} ({cause}); the model is saved in {folder}, "
            f"upload it later with `hf upload {repo} {folder}`."
        )

    if offline():
        raise failed("HF_HUB_OFFLINE is set")
    reason = unreachable()
    if reason is not None:
        raise failed(f"the hub is out of reach: {reason}")
    try:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        repo_id = api.create_repo(repo, private=private, exist_ok=True).repo_id
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message=commit_message,
            revision=revision,
            ignore_patterns=RUN_FILES,
        )
    except Exception as exc:  # unauthorised, refused ...: one line, the model stays on disk
        text = str(exc).strip()
        raise failed(f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no message'}") from None
