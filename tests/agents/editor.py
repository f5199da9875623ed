"""A plain agent that edits its private checkouts as the request says.

The request is a list of words, each an action on every checkout in
$PROHOST_RUN_REPOS, in order: ``append:PATH`` adds a line to PATH, ``create:PATH``
writes a new file, ``delete:PATH`` removes one, ``move:OLD:NEW`` renames with git,
``binary:PATH`` writes bytes that are not text, ``ignore:PATTERN`` adds a line to
``.gitignore`` and ``unignore:PATTERN`` takes it out again, ``badname:PATH`` writes a file
whose name is PATH then the byte 0xff (not UTF-8), ``commit`` commits everything
tracked and staged (``git commit -a``); a move of a path a checkout does not have is
skipped there. It replies with what it did.
"""

import os
import subprocess
import sys

prompt = sys.stdin.read()
words = [word for line in prompt.splitlines() if line.startswith("> ")
         for word in line[2:].split()]
folder = os.environ.get("PROHOST_RUN_REPOS", "")
env = {name: value for name, value in os.environ.items() if not name.startswith("GIT_")}
env.update(GIT_AUTHOR_NAME="agent", GIT_AUTHOR_EMAIL="agent@example.com",
           GIT_COMMITTER_NAME="agent", GIT_COMMITTER_EMAIL="agent@example.com")
done = []
for name in sorted(os.listdir(folder)) if folder else []:
    checkout = os.path.join(folder, name)
    # Hidden entries are the harness's (the conversation's own repositories).
    if name.startswith(".") or not os.path.isdir(checkout):
        continue
    for word in words:
        action, _, rest = word.partition(":")
        path = os.path.join(checkout, rest.split(":")[0])
        if action == "append":
            with open(path, "a") as file:
                file.write("one more line\n")
        elif action == "create":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as file:
                file.write("new\nfile\n")
        elif action == "binary":
            with open(path, "wb") as file:
                file.write(b"\0\1\2\3")
        elif action == "badname":
            with open(os.fsencode(path) + b"\xff", "w") as file:
                file.write("a name that is not UTF-8\n")
        elif action == "ignore":  # ignore:PATTERN, a line added to .gitignore
            with open(os.path.join(checkout, ".gitignore"), "a") as file:
                file.write(rest + "\n")
        elif action == "unignore":  # unignore:PATTERN, its line taken out again
            ignore = os.path.join(checkout, ".gitignore")
            with open(ignore) as file:
                lines = [line for line in file if line.rstrip("\n") != rest]
            with open(ignore, "w") as file:
                file.writelines(lines)
        elif action == "delete":
            os.remove(path)
        elif action == "move":
            old, new = rest.split(":")
            if not os.path.exists(os.path.join(checkout, old)):
                continue  # not in this checkout
            subprocess.run(["git", "-C", checkout, "mv", old, new], env=env, check=True)
        elif action == "commit":
            subprocess.run(["git", "-C", checkout, "commit", "-qam", "agent work"], env=env,
                           check=True, stdout=subprocess.DEVNULL)
        else:
            continue
        done.append(f"{name}:{word}")
print(" ".join(done) or "nothing to do")
