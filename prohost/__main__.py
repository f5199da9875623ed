"""`python -m prohost` is the `prohost` command."""

from prohost.cli import main

raise SystemExit(main())
