"""The command front-ends: one thin module per subcommand of ``prohost``.

Each parses nothing itself (that is :mod:`prohost.cli` and :mod:`prohost.options`)
and holds no engine logic: it loads what the command needs, calls the engine, and
turns its errors into one line and an exit status.
"""
