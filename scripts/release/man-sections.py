#!/usr/bin/env python3
"""Finishes a generated man page: real EXIT STATUS, ENVIRONMENT, FILES and SEE ALSO sections
from Packaging/man-sections/CMD.mdoc in place of the generator's generic `.Ex -std`, and, for a
command without subcommands, no `subcommand` in the synopsis and no `help` subcommand entry
(the generator adds both to every command).

Usage: man-sections.py CMD PAGE SECTIONS > OUT
"""
import sys

cmd, page, sections = sys.argv[1:4]
has_subcommands = cmd == "lmx-pair"
lines = open(page).read().split("\n")
out = []
i = 0
while i < len(lines):
    line = lines[i]
    if not has_subcommands and line == ".Ar subcommand":
        i += 1
        continue
    if not has_subcommands and line == ".It Em help":
        # Skip the entry and its nested list, through the matching .El.
        depth = 0
        i += 1
        while i < len(lines):
            if lines[i].startswith(".Bl"):
                depth += 1
            elif lines[i] == ".El":
                depth -= 1
                if depth == 0:
                    i += 1
                    break
            i += 1
        continue
    if line == '.Sh "EXIT STATUS"' and i + 1 < len(lines) and lines[i + 1] == ".Ex -std":
        out.extend(open(sections).read().rstrip("\n").split("\n"))
        i += 2
        continue
    out.append(line)
    i += 1
sys.stdout.write("\n".join(out))
