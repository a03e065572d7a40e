"""``grpokit serve-rewards``' settings (its CLI flags): limits, timeouts and TLS of the server in
:mod:`grpokit.rewards.serve`. Torch-free; :meth:`ServeOptions.check` names a bad value and its flag in one line."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from grpokit.rewards.contract import RewardError

MAX_BODY = 64 << 20
MAX_HEADER_BYTES = 64 << 10  # the request line and headers together; more gets 431
MAX_HEADERS = 100  # header lines of a request; more gets 431


@dataclass(frozen=True)
class ServeOptions:
    """serve-rewards' limits, timeouts and TLS (the CLI's flags)."""

    max_body: int = MAX_BODY  # bytes of a request body; a longer one gets 413 before it is read
    max_queue: int = 16  # requests admitted and waiting for their turn; one more gets 503 with Retry-After
    request_timeout: float = 60.0  # seconds to send a request's body once admitted; a slower client gets 408
    certfile: str | None = None  # PEM certificate (chain): serve HTTPS
    keyfile: str | None = None  # its PEM private key
    client_ca: str | None = None  # PEM CA bundle: require client certificates it signed (mutual TLS)
    header_timeout: float = 10.0  # seconds to send the request line and headers; then the connection is closed
    keep_alive_timeout: float = 30.0  # seconds an idle kept-alive connection stays open between requests
    max_connections: int = 4096  # open connections; one more is answered 503 and closed at once

    def check(self) -> None:
        if self.max_body < 1 or self.max_queue < 0 or self.request_timeout <= 0:
            raise RewardError("serve-rewards: --max-body >= 1, --max-queue >= 0 and --request-timeout > 0")
        if self.header_timeout <= 0 or self.keep_alive_timeout <= 0 or self.max_connections < 1:
            raise RewardError(
                "serve-rewards: --header-timeout > 0, --keep-alive-timeout > 0 and --max-connections >= 1"
            )
        if (self.certfile is None) != (self.keyfile is None):
            raise RewardError("serve-rewards: --certfile and --keyfile go together (the certificate and its key)")
        if self.client_ca is not None and self.certfile is None:
            raise RewardError(
                "serve-rewards: --client-ca needs --certfile and --keyfile (client certificates need TLS)"
            )

    def tls_context(self) -> ssl.SSLContext | None:
        if self.certfile is None:
            return None
        try:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.certfile, self.keyfile)
            if self.client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(self.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise RewardError(
                f"serve-rewards: cannot load --certfile {self.certfile} / --keyfile {self.keyfile} / --client-ca "
                f"{self.client_ca} ({exc}): give PEM files that exist and belong together"
            ) from None
        return context
