"""The API key of a vLLM server started by ``grpokit vllm-serve``, and where a trainer finds it.

The server requires the key on every route but ``/health`` (:mod:`grpokit.rollout.vllm.serve_auth`). Without one
given (``--api-key`` or ``VLLM_API_KEY``), ``grpokit vllm-serve`` makes one (:func:`new_key`); on a loopback
address it writes the key, given or made, to :func:`key_path` (``$XDG_RUNTIME_DIR/grpokit/vllm-keys/loopback-PORT``,
else ``~/.cache/grpokit/vllm-keys/loopback-PORT``): a file of mode 0600 in a folder of mode 0700, written whole
(a temporary file renamed over it). A trainer of the same user on the same machine, given no key and a loopback
URL, reads it there (:func:`client_key`). Loopback addresses share one name (``loopback``): a server on
``--host 127.0.0.1`` is found by a trainer of ``http://localhost:PORT``.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import stat
from pathlib import Path
from urllib.parse import urlsplit

ENV = "VLLM_API_KEY"  # vLLM's own variable (vllm/envs.py)
DEFAULT_PORT = 8000  # vllm serve's


def is_loopback(host: str | None) -> bool:
    """``host`` (an address or ``localhost``, brackets allowed) is this machine's loopback only."""
    host = (host or "").strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def reaches_this_machine(host: str | None) -> bool:
    """A URL's ``host`` connects to this machine's loopback: a loopback address, or the unspecified ``0.0.0.0`` /
    ``::`` (Linux connects those to the local host; TRL's default vllm_server_host is ``0.0.0.0``)."""
    return is_loopback(host) or (host or "").strip("[]") in ("0.0.0.0", "::")


def key_dir(environ: dict | None = None) -> Path:
    """The folder of the key files: ``$XDG_RUNTIME_DIR/grpokit/vllm-keys`` (a per-user tmpfs, emptied at logout)
    where that is an existing folder, else ``~/.cache/grpokit/vllm-keys``."""
    environ = os.environ if environ is None else environ
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "grpokit" / "vllm-keys"
    return Path(os.path.expanduser("~")) / ".cache" / "grpokit" / "vllm-keys"


def key_path(port: int, environ: dict | None = None) -> Path:
    """The key file of the loopback server on ``port``."""
    return key_dir(environ) / f"loopback-{int(port)}"


def new_key() -> str:
    """A fresh key: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def _private_dir(folder: Path) -> None:
    """Create ``folder`` (and its parents) with mode 0700; an existing one must be this user's, and is set to 0700."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(f"{folder} belongs to another user (uid {info.st_uid}); remove it or set XDG_RUNTIME_DIR")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(folder, 0o700)


def write_key(path: Path, key: str) -> Path:
    """Write ``key`` to ``path`` whole: a temporary file of mode 0600 in the same 0700 folder, renamed over it."""
    path = Path(path)
    _private_dir(path.parent)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def read_key(path: Path) -> str | None:
    """The key in ``path``; None when there is no such file, or it is not this user's own private file (another
    user's, a link, readable by others: not a key this user's server wrote)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077 or not stat.S_ISREG(info.st_mode):
            return None
        return f.read().strip() or None


def url_port(url: str) -> int | None:
    """The port of ``url`` (its scheme's default when absent); None unless it reaches this machine's loopback."""
    parts = urlsplit(url)
    if not reaches_this_machine(parts.hostname):
        return None
    return parts.port or (443 if parts.scheme == "https" else 80)


def client_key(configured: str | None, url: str, environ: dict | None = None) -> tuple[str | None, str]:
    """(the key a trainer sends to ``url``, where it came from): ``configured`` (vllm_server_api_key), else
    ``VLLM_API_KEY``, else, for a loopback URL, the key file of its port; (None, why none) otherwise."""
    environ = os.environ if environ is None else environ
    if configured:
        return configured, "vllm_server_api_key"
    if environ.get(ENV):
        return environ[ENV], ENV
    port = url_port(url)
    if port is None:
        return None, "no vllm_server_api_key or VLLM_API_KEY was set (a key file is read for loopback URLs only)"
    path = key_path(port, environ)
    key = read_key(path)
    return (key, f"the key file {path}") if key else (None, f"no vllm_server_api_key, VLLM_API_KEY or key file {path}")
