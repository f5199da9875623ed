"""The one place that lists the usual secret stores, per-user caches and device files.

The harness builds every run's :class:`~.policy.Policy` from these lists (plus the
run's own places and ``--allow-write``/``--allow-read``), so a new entry here reaches
every run, and the docs can point at one list. What a run may write of the CLIs'
and tools' own state is the harness's, never the person's: caches through
:data:`CACHE_VARIABLES`, each ACP agent's folders (:data:`AGENT_FOLDERS`) through
folders of the harness's bound where the agent looks for them.
"""

from __future__ import annotations

from pathlib import Path

#: Secret stores under the home folder (relative to ``$HOME``), hidden from every run
#: unless ``--allow-read`` names one.
SECRETS: tuple[str, ...] = (
    ".ssh",  # SSH private keys and known hosts: push access to every remote
    ".aws",  # AWS credentials and SSO caches
    ".gnupg",  # GPG private keys (signing, pass, sops)
    ".netrc",  # passwords for curl, git over HTTP, ftp
    ".git-credentials",  # git's store helper: plain-text HTTP tokens
    ".config/gh",  # GitHub CLI's OAuth token
    ".config/hub",  # hub's GitHub token
    ".config/glab-cli",  # GitLab CLI's token
    ".kube",  # Kubernetes cluster credentials
    ".docker/config.json",  # registry auth tokens (the rest of ~/.docker stays readable)
    ".config/gcloud",  # Google Cloud credentials and access tokens
    ".azure",  # Azure CLI tokens
    ".pgpass",  # PostgreSQL passwords
    ".my.cnf",  # MySQL client passwords
    # npm keeps registry tokens (`//registry.npmjs.org/:_authToken=`) in ~/.npmrc; a
    # public `npm install` does not need it, a private registry does: name it with
    # --allow-read. Hidden, because a publish token is a supply-chain key.
    ".npmrc",
    ".pypirc",  # PyPI upload tokens
    ".cargo/credentials.toml",  # crates.io publish token
    ".cargo/credentials",  # the same, older name
    ".gem/credentials",  # RubyGems push key
    ".config/hcloud",  # Hetzner Cloud token
    ".terraform.d/credentials.tfrc.json",  # Terraform Cloud tokens
    ".vault-token",  # HashiCorp Vault token
    ".password-store",  # pass(1)'s encrypted store
    ".local/share/keyrings",  # GNOME keyring files
)

#: Where a run's tools keep their caches: each tool's usual variable, and the folder
#: it names under the harness's own cache folder (``$PROHOST_HOME/cache``), which
#: every confined run may write. Never the person's ``~/.cache``, ``~/.npm``, …: a
#: run that could write those could leave a poisoned wheel, crate or build output
#: for the person's own next build, unconfined (issue 36, attack 10). The person's
#: caches stay readable, no longer writable; the price is that a run's first
#: install downloads everything once more (docs/security.md).
CACHE_VARIABLES: dict[str, str] = {
    "XDG_CACHE_HOME": "xdg",  # pip, pre-commit, node-gyp, ms-playwright, go-build…
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "npm_config_cache": "npm",  # npm's _cacache and logs
    "npm_config_store_dir": "pnpm-store",  # pnpm's content-addressable store
    "YARN_CACHE_FOLDER": "yarn",  # yarn 1 and berry's global cache
    "BUN_INSTALL_CACHE_DIR": "bun",
    "DENO_DIR": "deno",
    "GOCACHE": "go-build",
    "GOMODCACHE": "go-mod",
    # CARGO_HOME holds cargo's registry and git checkouts, and also its config.toml,
    # credentials.toml and bin/: pointed at the harness's own folder, a run's cargo
    # reads none of the person's config (copy it there if it needs a mirror) and
    # never sees the publish token; tools on PATH (~/.cargo/bin, rustup's proxies
    # with ~/.rustup, read-only) still run.
    "CARGO_HOME": "cargo",
    # The same for Gradle: caches, wrapper distributions, and gradle.properties
    # (which may hold repository passwords: the person's is not read).
    "GRADLE_USER_HOME": "gradle",
    "NUGET_PACKAGES": "nuget",
    "COURSIER_CACHE": "coursier",
}
#: Maven has no variable for its local repository: ``-Dmaven.repo.local`` is added
#: to ``MAVEN_OPTS`` (the folder under the cache folder).
MAVEN_REPOSITORY = "m2"

#: Device files (absolute) every run may write: what a shell and its tools expect.
DEVICES: tuple[str, ...] = (
    "/dev/null",  # `> /dev/null`, the universal sink
    "/dev/zero",  # dd, mmap of zero pages
    "/dev/full",  # tests of write errors
    "/dev/random",  # writing mixes entropy in; some tools open it read-write
    "/dev/urandom",  # the same
    "/dev/tty",  # the controlling terminal (ssh/gpg prompts; none in a daemon)
    "/dev/ptmx",  # opening a new pseudo-terminal (expect, script, node-pty)
    "/dev/pts",  # the pseudo-terminals themselves
    "/dev/shm",  # POSIX shared memory and semaphores (Python multiprocessing, Chrome)
    # Not /dev/fd (/dev/stdout, bash's <(…)): it is a link into /proc/self, which
    # resolves to the harness's own /proc entry here; reopening an inherited pipe
    # through it needs no grant (Landlock does not check pipes), a terminal is /dev/pts.
)


def secrets(home: Path) -> tuple[Path, ...]:
    """:data:`SECRETS` under ``home``."""
    return tuple(home / name for name in SECRETS)


def devices() -> tuple[Path, ...]:
    """:data:`DEVICES` as paths."""
    return tuple(Path(name) for name in DEVICES)


#: Each ACP agent's own folders under the home (prohost.execline.acp_agent names the
#: agent): its settings, sessions and logs live there, and it will not start when it
#: cannot write them. A confined run of that agent writes folders of the harness's
#: own instead (``$PROHOST_HOME/agents/<agent>/<the same relative path>``): the upper
#: folders of overlays of the person's own, seen at these paths (``Policy.overlays``:
#: the person's settings and login are read), or bound there where the person has
#: none (``Policy.mounts``); the person's own are never written (issue 36, attacks 3
#: and 10). Claude Code's and Codex's
#: folders, which an account chooses, are in prohost.engine.accounts.logins.
AGENT_FOLDERS: dict[str, tuple[str, ...]] = {
    "gemini": (".gemini",),
    "qwen": (".qwen",),
    "opencode": (".local/share/opencode", ".config/opencode", ".local/state/opencode",
                 ".cache/opencode"),
    "goose": (".config/goose", ".local/share/goose", ".local/state/goose"),
    "copilot": (".copilot",),
    "cursor": (".cursor",),
    "kimi": (".kimi",),
}
