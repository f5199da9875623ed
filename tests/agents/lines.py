"""Prints short lines around a 9 MiB line and ends with an unterminated 5 MiB one."""

import sys

out = sys.stdout.buffer
out.write(b"first\n")
out.write(b"y" * (9 * 1024 * 1024) + b"\n")
out.write(b"second\n")
out.write(b"z" * (5 * 1024 * 1024))
