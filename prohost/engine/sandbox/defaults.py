"""The one place that lists the usual secret stores, per-user caches and device files.

The harness builds every run's :class:`~.policy.Policy` from these lists (plus the
run's own places and ``--allow-write``/``--allow-read``), so a new entry here reaches
every run, and the docs can point at one list.
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

#: Per-user caches (relative to ``$HOME``) every run may write: package managers and
#: build tools fail or re-download everything without them, and none holds a secret.
CACHES: tuple[str, ...] = (
    ".cache",  # XDG cache: pip, uv, pre-commit, go-build, node-gyp, ms-playwright, …
    ".npm",  # npm's content-addressed cache (_cacache) and logs
    ".cargo/registry",  # crates downloaded by cargo (not ~/.cargo/bin: that is code on PATH)
    ".cargo/git",  # git dependencies checked out by cargo
    # ~/.rustup is left read-only: it holds the toolchains themselves (code every later
    # run executes); a run that needs another toolchain is a person's decision.
    ".local/share/pnpm",  # pnpm's content-addressable store
    ".yarn",  # yarn's cache (v1 berry-less installs keep it here)
    "go/pkg/mod",  # Go module cache (files are read-only by design, writes are new modules)
    ".gradle",  # Gradle's caches and wrapper distributions
    ".m2",  # Maven's local repository (settings.xml can hold passwords: see SECRETS if so)
    ".ivy2",  # sbt/ivy cache
    ".nuget/packages",  # .NET packages
    ".bun/install/cache",  # bun's package cache
    ".deno",  # Deno's module cache
)

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


def caches(home: Path) -> tuple[Path, ...]:
    """:data:`CACHES` under ``home``."""
    return tuple(home / name for name in CACHES)


def devices() -> tuple[Path, ...]:
    """:data:`DEVICES` as paths."""
    return tuple(Path(name) for name in DEVICES)


#: Each ACP agent's own folders under the home (prohost.execline.acp_agent names the
#: agent), granted writable to a confined run of that agent: its settings, sessions
#: and logs live there, and it will not start when it cannot write them. (Claude
#: Code's and Codex's folders, which an account can move, are chosen in
#: prohost.engine.run.confine.agent_folders.) XDG locations, as these CLIs use them.
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
