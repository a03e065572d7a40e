"""Where ``grpokit serve-rewards`` gets its shared token: ``$GRPOKIT_REWARD_TOKEN`` or a file (``--token-file``),
never the command line, where every local user can read it (``ps``, /proc/PID/cmdline).

``--token`` is refused with one line naming both ways. A token file readable by others than its owner gets a
one-line warning (the token still works: a shared CI secret mount may be so).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping

from grpokit.rewards.contract import RewardError

TOKEN_ENV = "GRPOKIT_REWARD_TOKEN"
ON_COMMAND_LINE = (
    f"serve-rewards: --token puts the token on the command line, where every local user can read it (ps); set "
    f"${TOKEN_ENV} or pass --token-file FILE (a file readable by you only) instead"
)


def served_token(token_file: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The token: the first line of ``token_file`` (surrounding whitespace stripped), else ``$GRPOKIT_REWARD_TOKEN``;
    None when neither is given. Both, an unreadable or an empty file raise :class:`RewardError` with one line."""
    environ = os.environ if environ is None else environ
    from_env = environ.get(TOKEN_ENV) or None
    if token_file is None:
        return from_env.strip() if from_env else None
    if from_env:
        raise RewardError(f"serve-rewards: both ${TOKEN_ENV} and --token-file give a token: keep one")
    try:
        with open(token_file, encoding="utf-8") as file:
            mode = os.fstat(file.fileno()).st_mode
            token = file.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise RewardError(f"serve-rewards: cannot read --token-file {token_file} ({exc})") from None
    if not token:
        raise RewardError(f"serve-rewards: --token-file {token_file} is empty: write the token on its first line")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(
            f"grpokit: warning: --token-file {token_file} can be read by other users (mode {stat.S_IMODE(mode):o}); "
            f"chmod 600 {token_file}",
            file=sys.stderr,
        )
    return token
