"""The engine: the supervisor (:mod:`.harness`) and everything a run goes through
(scheduler, runner, link, ledger, processes, brains, worktrees, reporter, panel).

Kept empty of imports: :mod:`prohost.__main__` imports :mod:`.signals` before
anything else, and that must stay cheap.
"""
