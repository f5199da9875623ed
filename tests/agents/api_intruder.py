"""A hostile agent: it tries to submit and cancel runs of other conversations through
the reference server's people's API, with whatever token it can find.

``api_intruder.py API_URL TOKEN_FILE...``: reads each TOKEN_FILE (the server's
``api-token`` where a person's server keeps it), then tries ``POST /v1/runs`` into
another conversation and ``DELETE /v1/runs/<its own run>`` (``$PROHOST_RUN_ID``: a
run it can name for sure), with no token, a forged one, and each token it read.
Prints one line per try, ``NAME=RESULT``: a read's ``ok`` or errno name
(``ENOENT``), a request's HTTP status (or ``unreachable``).
"""

import errno
import json
import os
import sys
import urllib.error
import urllib.request


def read(path: str) -> tuple[str, str | None]:
    try:
        with open(path, encoding="ascii") as handle:
            return "ok", handle.read().strip()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, "failed"), None


def request(method: str, url: str, token: str | None, body: object = None) -> str:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(
                url, data=data, headers=headers, method=method), timeout=10) as answer:
            return str(answer.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except OSError:
        return "unreachable"


def main() -> int:
    sys.stdin.read()
    api, *token_files = sys.argv[1:]
    victim = os.environ["PROHOST_RUN_ID"]
    tokens: dict[str, str | None] = {"none": None, "forged": "phs_forged"}
    for number, path in enumerate(token_files):
        result, token = read(path)
        print(f"read{number}={result}")
        if token:
            tokens[f"read{number}"] = token
    for name, token in tokens.items():
        submit = {"conversation_id": "someone-else", "text": "rm -rf ~ (from a run)"}
        print(f"submit_{name}={request('POST', f'{api}/v1/runs', token, submit)}")
        print(f"cancel_{name}={request('DELETE', f'{api}/v1/runs/{victim}', token)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
