"""``agent run`` refuses at start what ``install-daemon`` refuses (issue 31, point 2).

Each case is the real CLI in a subprocess. A refused setting exits 2 before
anything starts, with a line naming the flag and what to do; a setting that
passes reaches the next step of a start, which on an unpaired home is exit 1
"not paired". ``install-daemon --print`` refuses the same settings with exit 2.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kits.paths import ROOT
from tests.kits.program import run_cli

REFUSED = 2
NOT_PAIRED = 1


def _run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli(tmp_path, "agent", "run", "--no-panel", *flags, cwd=ROOT)


def _refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == REFUSED, result
    err = result.stderr
    assert all(word in err for word in words), err
    assert "not paired" not in err  # refused before the start went on
    return err


def _git_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_a_program_not_on_the_path_is_refused(tmp_path: Path) -> None:
    _refused(_run(tmp_path, "--exec", "no-such-agent-prog -p"), "--exec", "no-such-agent-prog",
             "not on the PATH")


def test_the_program_after_assignments_is_the_one_checked(tmp_path: Path) -> None:
    _refused(_run(tmp_path, "--exec", "FOO=1 BAR=2 no-such-agent-prog"), "--exec",
             "no-such-agent-prog")


def test_a_program_on_the_path_passes(tmp_path: Path) -> None:
    result = _run(tmp_path, "--exec", "FOO=1 cat")
    assert result.returncode == NOT_PAIRED, result


def test_a_shell_builtin_passes(tmp_path: Path) -> None:
    # `export`, not `cd`: some systems ship `cd` as a program too (macOS's
    # /usr/bin/cd), which would pass without the builtin rule. Nothing on this PATH
    # is called `export`, so only that rule lets this line through.
    assert shutil.which("export") is None
    result = _run(tmp_path, "--exec", "export FOO=1 && cat")
    assert result.returncode == NOT_PAIRED, result


def test_an_interpreter_with_a_missing_script_is_refused(tmp_path: Path) -> None:
    _refused(_run(tmp_path, "--exec", f"{sys.executable} {tmp_path}/nope/agent.py"),
             "--exec", "agent.py", "no file")


def test_a_shell_running_code_on_the_line_passes(tmp_path: Path) -> None:
    # `-lc` is `-l -c`: what follows is code for the shell, not a script's name.
    result = _run(tmp_path, "--exec", "bash -lc 'cat'")
    assert result.returncode == NOT_PAIRED, result


def test_an_interpreter_with_its_script_passes(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text("print('hi')\n")
    result = _run(tmp_path, "--exec", f"{sys.executable} -u {script}")
    assert result.returncode == NOT_PAIRED, result


def test_a_workdir_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    _refused(_run(tmp_path, "--exec", "cat", "--workdir", "/proc/nope"), "--workdir",
             "/proc/nope", "cannot be made")


def test_a_workdir_that_can_be_made_is_not_left_behind_by_the_check(tmp_path: Path) -> None:
    # No pairing: the start stops after the check, which must not have made it.
    result = _run(tmp_path, "--exec", "cat", "--workdir", str(tmp_path / "a" / "b"))
    assert result.returncode == NOT_PAIRED, result
    assert not (tmp_path / "a").exists()


def test_a_missing_checkout_is_refused(tmp_path: Path) -> None:
    _refused(_run(tmp_path, "--exec", "cat", "--repos", str(tmp_path / "gone")), "--repos",
             "does not exist")


def test_a_folder_that_is_not_a_checkout_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    _refused(_run(tmp_path, "--exec", "cat", "--repos", str(tmp_path / "plain")), "--repos",
             "is not a git checkout", "git init")


def test_a_subfolder_of_a_checkout_is_refused_naming_its_top(tmp_path: Path) -> None:
    repo = _git_repo(tmp_path / "repo")
    (repo / "src").mkdir()
    err = _refused(_run(tmp_path, "--exec", "cat", "--repos", str(repo / "src")), "--repos",
                   "not its top level")
    assert f"name {repo}" in err


def test_a_checkout_passes(tmp_path: Path) -> None:
    repo = _git_repo(tmp_path / "repo")
    result = _run(tmp_path, "--exec", "cat", "--repos", str(repo))
    assert result.returncode == NOT_PAIRED, result


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--workdir", "/proc/nope"], "--workdir"),
        (["--exec", "FOO=1 no-such-agent-prog"], "--exec"),
    ],
    ids=["workdir", "exec"],
)
def test_install_daemon_print_checks_the_same(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    args = ["--exec", "cat", *flags]
    result = run_cli(tmp_path, "agent", "install-daemon", "--print", *args, cwd=ROOT)
    assert result.returncode == REFUSED, result
    assert result.stdout == ""
    assert named in result.stderr and "nothing was printed" in result.stderr
