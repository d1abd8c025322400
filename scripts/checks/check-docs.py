#!/usr/bin/env python3
"""Checks every link in the repository's Markdown files: relative links must name a file or
directory inside the repository, and #anchors a heading of the file they point to. Links to
the web are left alone. The README must also name every Debian package `make run` and `make test`
install (the lists in scripts/lib.sh), so a reader knows what lands on the machine. Exit 1 with
each broken link or unnamed package listed; `make test` runs it.

Usage: check-docs.py [REPO]
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SKIP = {".build", ".git", ".swiftpm", ".testbed"}
LINK = re.compile(r"(?<!\!)\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    heading = re.sub(r"`", "", heading.strip().lower())
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def anchors(path):
    found, counts = set(), {}
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"^#{1,6} (.*)$", line)
        if m:
            base = slug(m.group(1))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else "%s-%d" % (base, n))
    return found


def markdown_files():
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in SKIP and not d.startswith(".build")]
        for name in files:
            if name.endswith(".md"):
                yield os.path.join(directory, name)


def packages():
    """The Debian packages scripts/lib.sh installs (BUILD_PACKAGES, TEST_PACKAGES); none without it."""
    path = os.path.join(ROOT, "scripts", "lib.sh")
    if not os.path.exists(path):
        return []
    text = open(path, encoding="utf-8").read()
    names = []
    for m in re.finditer(r"^(?:BUILD|TEST)_PACKAGES\+?=\(([^)]*)\)", text, flags=re.M):
        for word in m.group(1).split():
            if not word.startswith('"$') and word not in names:
                names.append(word)
    return names


def main():
    broken = []
    readme = os.path.join(ROOT, "README.md")
    named = open(readme, encoding="utf-8").read() if os.path.exists(readme) else ""
    for package in packages():
        if "`%s`" % package not in named:
            broken.append("README.md: does not name the package `%s` that scripts/lib.sh installs" % package)
    count = 0
    for path in sorted(markdown_files()):
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # links in code blocks are examples
        for m in LINK.finditer(text):
            link = m.group(2) or m.group(3)
            if re.match(r"^[a-z]+:", link):
                continue
            count += 1
            where = os.path.relpath(path, ROOT)
            target, _, anchor = link.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
            if not (full == ROOT or full.startswith(ROOT + os.sep)):
                broken.append("%s: %s leaves the repository" % (where, link))
                continue
            if not os.path.exists(full):
                broken.append("%s: %s does not exist" % (where, link))
                continue
            if anchor and full.endswith(".md") and anchor not in anchors(full):
                broken.append("%s: %s has no heading #%s" % (where, link, anchor))
    for line in broken:
        print("check-docs: " + line, file=sys.stderr)
    if broken:
        return 1
    print("check-docs: %d links in the Markdown files resolve inside the repository" % count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
