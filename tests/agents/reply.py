"""A plain agent: reads the prompt, prints a fixed reply, optionally fails.

reply.py [--prompt-to FILE] [--no-read] [--stderr LINE]... [--exit CODE] [--times N] TEXT
"""

import argparse
import sys

parser = argparse.ArgumentParser()
parser.add_argument("text")
parser.add_argument("--prompt-to")
parser.add_argument("--no-read", action="store_true", help="exit without reading stdin")
parser.add_argument("--stderr", action="append", default=[])
parser.add_argument("--exit", type=int, default=0)
parser.add_argument("--times", type=int, default=1, help="print TEXT this many times")
args = parser.parse_args()

if not args.no_read:
    prompt = sys.stdin.buffer.read()
    if args.prompt_to:
        with open(args.prompt_to, "wb") as file:
            file.write(prompt)
for line in args.stderr:
    sys.stderr.write(line + "\n")
sys.stdout.write(args.text * args.times)
sys.exit(args.exit)
