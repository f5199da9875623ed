"""``--max-cost USD`` (docs/protocol.md §12): parsed strictly, refused with exit 2 and one
line, and carried by ``install-daemon`` into the service's command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prohost.commands.service import harness_arguments
from prohost.options import OptionError, parse_max_cost
from tests.kits.daemon import install_env, parse_run
from tests.kits.program import run_cli

pytestmark = pytest.mark.protocol("§12")


@pytest.mark.parametrize(("raw", "dollars"), [
    ("2", 2.0), ("2.50", 2.5), ("$0.75", 0.75), (" .5 ", 0.5), ("0.0001", 0.0001),
    ("10000", 10_000.0),
])
def test_plain_dollar_amounts_are_accepted(raw: str, dollars: float) -> None:
    assert parse_max_cost(raw) == dollars


@pytest.mark.parametrize("raw", [
    "0", "0.0", "-1", "10000.01", "1e3", "nan", "inf", "1,5", "2 USD", "", "$", "1.23456",
    "0x10", "١", "2.5.1",
])
def test_anything_else_is_refused_on_one_line_with_exit_2(tmp_path: Path, raw: str) -> None:
    with pytest.raises(OptionError, match=r"--max-cost must be a dollar amount above 0"):
        parse_max_cost(raw)
    done = run_cli(tmp_path, "agent", "run", "--max-cost", raw)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(f"(got {raw!r})")
    assert not (tmp_path / "home").exists()


@given(st.text(max_size=12))
def test_whatever_is_typed_it_is_a_budget_or_a_clear_error(raw: str) -> None:
    try:
        value = parse_max_cost(raw)
    except OptionError as exc:
        assert "--max-cost" in str(exc)
    else:
        assert 0 < value <= 10_000


@pytest.mark.parametrize("raw", ["2.5", "0.0001", "$1234.5678", "10000"])
def test_a_service_is_installed_with_the_same_budget(tmp_path: Path, raw: str) -> None:
    env = install_env(tmp_path)
    options = parse_run(["agent", "run", "--brain", "claude", "--max-cost", raw], env,
                        tmp_path)
    args = harness_arguments(options)
    assert "--max-cost" in args
    assert parse_run(args, env, tmp_path / "elsewhere") == options


def test_help_explains_the_flag(tmp_path: Path) -> None:
    done = run_cli(tmp_path, "agent", "run", "--help")
    assert "--max-cost USD" in done.stdout and "budget" in " ".join(done.stdout.split())


@pytest.mark.parametrize(("flags", "brain"), [
    (["--exec", "codex exec"], "codex"),
    (["--exec", "my-agent --go"], "plain"),
    (["--brain", "plain", "--exec", "claude -p"], "plain"),
])
@pytest.mark.parametrize("command", ["run", "install-daemon"])
def test_a_brain_that_cannot_bound_its_cost_refuses_it_at_start(
    tmp_path: Path, flags: list[str], brain: str, command: str,
) -> None:
    done = run_cli(tmp_path, "agent", command, *flags, "--max-cost", "2")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert f"--max-cost cannot be used with the {brain} brain" in last
    assert not (tmp_path / "home").exists()
