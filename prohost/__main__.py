"""`python -m prohost` is the `prohost` command."""

import sys

if sys.argv[1:3] == ["agent", "run"]:
    # Before the imports below (a few hundred ms): from the first moment on, a
    # SIGINT/SIGTERM is remembered and obeyed per §9, never fatal (prohost.engine.signals).
    from prohost.engine import signals

    signals.install()

from prohost.cli import main

raise SystemExit(main())
