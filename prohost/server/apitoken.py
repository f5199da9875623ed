"""The reference server's API token: who may submit, cancel and fault runs.

The people's API (``POST /v1/runs``, ``DELETE /v1/runs/<id>``, the fault hooks) was
open to every local process, a confined agent run included: a run could submit runs
into other conversations. Now each request that changes something must carry
``Authorization: Bearer <token>``, a token the server makes at each start and
writes to ``api-token`` in its state folder (the folder 0700, the file 0600).
``prohost send`` and ``prohost runs cancel`` read it from there; a confined run
cannot, because the state folder lies in ``$PROHOST_HOME``, which runs never see
(docs/security.md). The harness's own routes (``/v1/agent/…``) keep their
per-harness tokens (§1, §7, §10) and are not touched.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

from prohost.files import write_atomically

API_TOKEN_FILE = "api-token"
#: A token that says what it is, should one ever be pasted somewhere.
TOKEN_PREFIX = "phs_"


class TokenError(Exception):
    """The token cannot be read; the message says where and what to do."""


def api_token_path(state_dir: Path) -> Path:
    return state_dir / API_TOKEN_FILE


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def write_token(state_dir: Path, token: str) -> Path:
    """Write ``token`` to ``state_dir`` (made 0700 if missing), mode 0600, atomically:
    a reader never sees half a token. Raises OSError when it cannot."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = api_token_path(state_dir)
    write_atomically(path, (token + "\n").encode("ascii"), 0o600)
    return path


def read_token(state_dir: Path) -> str:
    """The token a server wrote to ``state_dir``. Raises :class:`TokenError`."""
    path = api_token_path(state_dir)
    try:
        text = path.read_text("ascii").strip()
    except FileNotFoundError:
        raise TokenError(
            f"there is no API token at {path}: no reference server has run with the "
            f"state folder {state_dir}; start one, or name the folder its banner names "
            "with --state"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise TokenError(f"cannot read the API token at {path}: {reason}") from None
    if not text.startswith(TOKEN_PREFIX) or any(c.isspace() for c in text):
        raise TokenError(f"{path} does not hold an API token; restart the server to "
                         "write a new one")
    return text


def token_matches(expected: str, given: str | None) -> bool:
    """Whether ``given`` is the token, compared in constant time."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("ascii"))

