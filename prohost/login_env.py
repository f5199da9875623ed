"""The agent CLIs' login and endpoint variables: which ones the service carries from
the installing shell, and which of them are secrets (masked in ``--print`` and in
the harness's log).

A service manager does not inherit the installing shell, so a person who logs in
with ``CLAUDE_CODE_OAUTH_TOKEN`` (``claude setup-token``), an API key, a gateway or
a cloud provider would find every run of the service "not logged in". The lists are
explicit names from the vendors' documentation, not prefixes: ``CLAUDE_CODE_`` and
``CODEX_`` also hold the session markers each CLI sets in its own children
(``CLAUDE_CODE_SESSION_ID``, ``CODEX_THREAD_ID``…), which an install run from inside
an agent's shell would freeze into the unit; ``AWS_`` holds short-lived STS values.
Anything else: ``install-daemon --pass-env NAME``.

Sources (checked 2026-08), abbreviated below:
  CC-ENV  https://code.claude.com/docs/en/env-vars
  CC-AUTH https://code.claude.com/docs/en/authentication
  CC-BR   https://code.claude.com/docs/en/amazon-bedrock
  CC-VX   https://code.claude.com/docs/en/google-vertex-ai
  CC-MF   https://code.claude.com/docs/en/microsoft-foundry
  CC-NET  https://code.claude.com/docs/en/network-config
  WIF     https://platform.claude.com/docs/en/manage-claude/wif-reference
  CX-ENV  https://developers.openai.com/codex/environment-variables
  CX-AUTH https://developers.openai.com/codex/auth (and /codex/noninteractive)
  CX-BR   https://developers.openai.com/codex/amazon-bedrock
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from prohost.logfile import MASK

#: Claude Code's logins, by precedence (CC-AUTH): cloud provider > ANTHROPIC_AUTH_TOKEN
#: > ANTHROPIC_API_KEY > apiKeyHelper > CLAUDE_CODE_OAUTH_TOKEN > profile/WIF > /login.
CLAUDE_LOGIN = (
    "CLAUDE_CODE_OAUTH_TOKEN",          # `claude setup-token`, the headless login (CC-AUTH)
    "CLAUDE_CODE_OAUTH_REFRESH_TOKEN",  # CC-ENV
    "CLAUDE_CODE_OAUTH_SCOPES",         # CC-ENV
    "ANTHROPIC_API_KEY",                # CC-ENV; in -p it wins over a subscription (CC-AUTH)
    "ANTHROPIC_AUTH_TOKEN",             # gateway bearer token (CC-ENV)
    "ANTHROPIC_BASE_URL",               # CC-ENV
    "ANTHROPIC_CUSTOM_HEADERS",         # often gateway auth (CC-ENV)
    "ANTHROPIC_BETAS",                  # CC-ENV
    "CLAUDE_CODE_API_KEY_HELPER_TTL_MS",  # CC-ENV
    "CLAUDE_CONFIG_DIR",                # where .credentials.json lives on Linux (CC-AUTH)
    # Model pins, often needed with a provider or gateway (CC-ENV, CC-BR, CC-VX).
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    # Profiles and workload identity federation (CC-AUTH, WIF).
    "ANTHROPIC_PROFILE",
    "ANTHROPIC_CONFIG_DIR",
    "ANTHROPIC_FEDERATION_RULE_ID",
    "ANTHROPIC_ORGANIZATION_ID",
    "ANTHROPIC_SERVICE_ACCOUNT_ID",
    "ANTHROPIC_WORKSPACE_ID",
    "ANTHROPIC_IDENTITY_TOKEN_FILE",
    "ANTHROPIC_IDENTITY_TOKEN",
)
#: Amazon Bedrock, Mantle and Claude Platform on AWS (CC-BR, CC-ENV); Codex's Bedrock
#: provider reads the same AWS names (CX-BR).
CLOUD_AWS = (
    "CLAUDE_CODE_USE_BEDROCK",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_BEARER_TOKEN_BEDROCK",
    "ANTHROPIC_BEDROCK_BASE_URL",
    "ANTHROPIC_BEDROCK_REGION_PREFIX",
    "ANTHROPIC_BEDROCK_SERVICE_TIER",
    "ANTHROPIC_SMALL_FAST_MODEL_AWS_REGION",
    "CLAUDE_CODE_SKIP_BEDROCK_AUTH",
    "CLAUDE_CODE_USE_MANTLE",
    "ANTHROPIC_BEDROCK_MANTLE_BASE_URL",
    "CLAUDE_CODE_SKIP_MANTLE_AUTH",
    "CLAUDE_CODE_AWS_CHAIN_RESOLVE_TIMEOUT_MS",
    "CLAUDE_CODE_SKIP_AWS_CRED_CACHE",
    "CLAUDE_CODE_USE_ANTHROPIC_AWS",
    "ANTHROPIC_AWS_BASE_URL",
    "ANTHROPIC_AWS_WORKSPACE_ID",
    "CLAUDE_CODE_SKIP_ANTHROPIC_AWS_AUTH",
    "ANTHROPIC_AWS_API_KEY",
)
#: Static AWS keys (CC-BR option B): carried only without AWS_SESSION_TOKEN. With one,
#: they are temporary STS credentials that stop working hours after the install.
AWS_STATIC_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
#: Never copied, only warned about: it expires (CC-BR option B).
AWS_SESSION_TOKEN = "AWS_SESSION_TOKEN"
#: Google Vertex (CC-VX, CC-ENV) and Microsoft Foundry (CC-MF).
CLOUD_OTHER = (
    "CLAUDE_CODE_USE_VERTEX",
    "CLOUD_ML_REGION",
    "ANTHROPIC_VERTEX_PROJECT_ID",
    "GCLOUD_PROJECT",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_APPLICATION_CREDENTIALS",  # a path; the file it names is the secret
    "ANTHROPIC_VERTEX_BASE_URL",
    "CLAUDE_CODE_SKIP_VERTEX_AUTH",
    "CLAUDE_CODE_USE_FOUNDRY",
    "ANTHROPIC_FOUNDRY_RESOURCE",
    "ANTHROPIC_FOUNDRY_BASE_URL",
    "CLAUDE_CODE_SKIP_FOUNDRY_AUTH",
    "ANTHROPIC_FOUNDRY_API_KEY",
    "ANTHROPIC_FOUNDRY_AUTH_TOKEN",
)
#: Per-model Vertex regions: a prefix, because each new model adds a name (CC-VX).
CARRIED_PREFIXES = ("VERTEX_REGION_CLAUDE_",)
#: Codex (CX-ENV, CX-AUTH). CODEX_API_KEY is supported by `codex exec` only, which is
#: what prohost runs. OPENAI_API_KEY is no login for the built-in provider but is
#: read by a config `env_key`; OPENAI_BASE_URL only by older versions.
CODEX_LOGIN = (
    "CODEX_API_KEY",
    "CODEX_ACCESS_TOKEN",
    "CODEX_HOME",  # where auth.json lives
    "CODEX_SQLITE_HOME",
    "CODEX_CA_CERTIFICATE",
    "CODEX_OSS_BASE_URL",
    "CODEX_OSS_PORT",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORGANIZATION",
    "OPENAI_PROJECT",
    "OPENAI_FEDERATION_RULE_ID",
    "OPENAI_IDENTITY_TOKEN_FILE",
    "OPENAI_WORKLOAD_IDENTITY_CONTEXT",
)
#: Proxies and trust stores, read by both CLIs (CC-NET, CX-ENV); a lowercase proxy
#: name is checked before the uppercase one.
NETWORK = (
    "HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY",
    "https_proxy", "http_proxy", "all_proxy", "no_proxy",
    "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE",
    "CLAUDE_CODE_CERT_STORE", "CLAUDE_CODE_CLIENT_CERT", "CLAUDE_CODE_CLIENT_KEY",
    "CLAUDE_CODE_CLIENT_KEY_PASSPHRASE",
)
CARRIED = (*CLAUDE_LOGIN, *CLOUD_AWS, *AWS_STATIC_KEYS, *CLOUD_OTHER, *CODEX_LOGIN, *NETWORK)

#: Whole values that are credentials (the notes' "mask the whole value" list).
SECRET_NAMES = frozenset({
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_REFRESH_TOKEN", "ANTHROPIC_CUSTOM_HEADERS", "ANTHROPIC_IDENTITY_TOKEN",
    "ANTHROPIC_FOUNDRY_API_KEY", "ANTHROPIC_FOUNDRY_AUTH_TOKEN", "ANTHROPIC_AWS_API_KEY",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK", "AWS_ACCESS_KEY_ID",
    "CLAUDE_CODE_CLIENT_KEY_PASSPHRASE", "CODEX_API_KEY", "CODEX_ACCESS_TOKEN", "OPENAI_API_KEY",
    "OPENAI_WORKLOAD_IDENTITY_CONTEXT",
})
#: The backstop for names not listed (a --pass-env one, a new vendor variable). Not a
#: bare _TOKEN: ANTHROPIC_IDENTITY_TOKEN_FILE is a path.
_SECRET_SUFFIX = re.compile(
    r"(_API_KEY|_AUTH_TOKEN|_ACCESS_TOKEN|_OAUTH_TOKEN|_REFRESH_TOKEN|_IDENTITY_TOKEN|_SECRET"
    r"|_SECRET_ACCESS_KEY|_SECRET_KEY|_PASSWORD|_PASSPHRASE|_SESSION_TOKEN|_BEARER_TOKEN\w*)$",
    re.IGNORECASE,
)
#: ``scheme://user:password@host``: a proxy or base URL may carry a login.
_USERINFO = re.compile(r"(?<=://)[^/@\s]+(?=@)")
#: The service names its ``--pass-env`` variables here, so the harness masks them too.
SECRET_VARS_ENV = "PROHOST_SECRET_VARS"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_secret(name: str) -> bool:
    """Whether ``name``'s whole value is a credential."""
    return name in SECRET_NAMES or _SECRET_SUFFIX.search(name) is not None


def carried(env: Mapping[str, str]) -> dict[str, str]:
    """The login and endpoint variables of ``env`` a service should carry (set, non-empty)."""
    temporary_keys = bool(env.get(AWS_SESSION_TOKEN))
    names = [name for name in CARRIED if not (temporary_keys and name in AWS_STATIC_KEYS)]
    names += sorted(name for name in env if name.startswith(CARRIED_PREFIXES))
    return {name: env[name] for name in names if env.get(name)}


def masked(name: str, value: str, *, secret: bool = False) -> str:
    """``value`` fit to show: all of it masked for a secret, the login part of a URL
    otherwise."""
    if secret or is_secret(name):
        return MASK
    return _USERINFO.sub(MASK, value)


def secret_values(env: Mapping[str, str], extra_names: Iterable[str] = ()) -> list[str]:
    """The texts a log must never show: secret variables' values, the login part of
    any URL value, and the values of ``extra_names`` (given with --pass-env)."""
    extra = set(extra_names)
    found: list[str] = []
    for name, value in env.items():
        if name in extra or is_secret(name):
            found.append(value)
        elif "://" in value:
            found += _USERINFO.findall(value)
    # A value this short is no credential, and masking it would garble every line.
    return [value for value in found if len(value.strip()) >= 6]


def log_secrets(env: Mapping[str, str]) -> list[str]:
    """:func:`secret_values` of the harness's own environment, for its log's redaction."""
    return secret_values(env, env.get(SECRET_VARS_ENV, "").split(","))


def subscription_login(env: Mapping[str, str]) -> bool:
    """Whether ``claude /login`` left a login in a file (Linux; macOS keeps it in the
    Keychain, which this does not read)."""
    folder = env.get("CLAUDE_CONFIG_DIR") or str(Path(env.get("HOME") or Path.home()) / ".claude")
    return (Path(folder) / ".credentials.json").is_file()


def check_pass_env(names: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """``--pass-env`` names, each checked: a variable name, not prohost's own, set."""
    checked: list[str] = []
    for name in names:
        if not _NAME.fullmatch(name):
            raise ValueError(f"--pass-env takes a variable's name, like MY_API_KEY (got {name!r})")
        if name.startswith("PROHOST_"):
            raise ValueError(
                f"--pass-env {name}: prohost's own variables are not passed; the service "
                "reads its token and secret from $PROHOST_HOME/credentials.json"
            )
        if not env.get(name):
            raise ValueError(f"--pass-env {name}: it is not set in this shell; set it, then "
                             "run the install again")
        if name not in checked:
            checked.append(name)
    return checked


def login_notes(environment: Mapping[str, str], env: Mapping[str, str],
                *, subscription_login: bool) -> list[str]:
    """What the installing person should know about the logins the service gets."""
    notes = []
    if environment.get("ANTHROPIC_API_KEY") and (
        environment.get("CLAUDE_CODE_OAUTH_TOKEN") or subscription_login
    ):
        # CC-AUTH: in print mode (-p, what prohost runs) the API key always wins.
        login = ("CLAUDE_CODE_OAUTH_TOKEN" if environment.get("CLAUDE_CODE_OAUTH_TOKEN")
                 else "your claude /login subscription")
        notes.append(
            f"ANTHROPIC_API_KEY is set as well as {login}: claude -p uses the API key "
            "(billed per token), not the subscription; unset ANTHROPIC_API_KEY and "
            "install again to use the subscription"
        )
    if env.get(AWS_SESSION_TOKEN) and AWS_SESSION_TOKEN not in environment:
        notes.append(
            "AWS_SESSION_TOKEN (and the temporary AWS keys with it) is not copied: it "
            "expires, and the service would fail once it has; use AWS_PROFILE (SSO or "
            "credential_process), or --pass-env each of them if you really mean to"
        )
    return notes
