"""An agent that prints far more than the harness keeps: MIB MiB on each stream.

stdout is one endless line of "r"; stderr is many short lines, the last one
"flood done".
"""

import sys

mib = int(sys.argv[1])
block = 1024 * 1024
out = b"r" * block
err = (b"e" * 1023 + b"\n") * 1024
for _ in range(mib):
    sys.stdout.buffer.write(out)
    sys.stderr.buffer.write(err)
sys.stdout.buffer.flush()
sys.stderr.buffer.write(b"flood done\n")
