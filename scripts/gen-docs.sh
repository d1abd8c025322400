#!/usr/bin/env bash
# Man pages and shell completions, generated from the commands' own argument parsers:
# man pages with swift-argument-parser's generate-manual plugin, completions with each
# command's --generate-completion-script. The results are checked in under Packaging/.
#
#   scripts/gen-docs.sh           regenerate Packaging/man and Packaging/completions
#   scripts/gen-docs.sh --check   regenerate into a scratch folder and fail if anything differs
#                                 (run by `make test`, so the files never drift from the code)
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_NAME=gen-docs
. scripts/lib.sh
command -v swift >/dev/null || export PATH="/opt/swift/usr/bin:$PATH"

COMMANDS=(lmx-agentd lmx-status lmx-discover lmx-pair lmx-notify)
# The date the pages carry: the current release's (the generator would put today's).
MAN_DATE="November 22, 2026"
check=no
[ "${1:-}" = --check ] && check=yes

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/man" "$out/completions/bash" "$out/completions/zsh" "$out/completions/fish"

# The debug build is enough: the text comes from the parsers, not from the optimiser.
# Each page from the command as installed (the multi-call binary through its link), by
# swift-argument-parser's generate-manual tool.
swift build >/dev/null
swift build --product generate-manual >/dev/null
bin=$(swift build --show-bin-path)
link_commands "$bin"
mkdir -p "$out/pages"
for cmd in "${COMMANDS[@]}"; do
    "$bin/generate-manual" "$bin/$cmd" --authors "lmx-agent developers" -o "$out/pages" >/dev/null
    page="$out/pages/$cmd.1"
    [ -f "$page" ] || die "generate-manual made no page for $cmd"
    # The generator writes its run date (replaced by a fixed one, so the check is stable) and
    # blank lines between paragraphs, which mdoc spells .Pp.
    sed -e "s/^\.Dd .*/.Dd $MAN_DATE/" -e 's/^$/.Pp/' "$page" > "$out/$cmd.generated"
    # Real EXIT STATUS, ENVIRONMENT and FILES sections (hand-written, Packaging/man-sections).
    python3 scripts/release/man-sections.py "$cmd" "$out/$cmd.generated" "Packaging/man-sections/$cmd.mdoc" > "$out/man/$cmd.1"
    rm "$out/$cmd.generated"
    "$bin/$cmd" --generate-completion-script bash > "$out/completions/bash/$cmd"
    "$bin/$cmd" --generate-completion-script zsh > "$out/completions/zsh/_$cmd"
    "$bin/$cmd" --generate-completion-script fish > "$out/completions/fish/$cmd.fish"
done

if [ "$check" = yes ]; then
    if ! diff -ru Packaging/man "$out/man" >&2 || ! diff -ru Packaging/completions "$out/completions" >&2; then
        die "the man pages or completions in Packaging/ differ from what the code generates: run scripts/gen-docs.sh and commit the result"
    fi
    log "man pages and completions match the code"
else
    rm -rf Packaging/man Packaging/completions
    cp -r "$out/man" Packaging/man
    cp -r "$out/completions" Packaging/completions
    log "wrote Packaging/man and Packaging/completions"
fi
