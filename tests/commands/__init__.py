"""Tests of the command line: flags parsed into Options (options.py), the argparse
tree and its handlers (cli.py, cli_handlers.py), and each subcommand's front-end in
commands/ (agent run, pair, status, install-daemon, demo)."""
