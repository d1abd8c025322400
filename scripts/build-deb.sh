#!/usr/bin/env bash
# `make deb`: lmx-agent_<version>_<arch>.deb from a release build with the Swift runtime linked
# statically, packaged by debhelper (Packaging/debian: dh, dh_installsystemd, dh_installsysusers).
# Holds the multi-call binary (as lmx-agentd, with lmx-discover, lmx-pair and lmx-notify linked to
# it) and lmx-status, the system and user units (lmx-agentd, lmx-notify), a commented /etc/lmx/agent.json, man pages,
# bash/zsh/fish completions and the copyright file; Depends: is computed from the binaries by
# dh_shlibdeps. The package is written to the repository's top folder.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_NAME=make-deb
. scripts/lib.sh
command -v swift >/dev/null || export PATH="/opt/swift/usr/bin:$PATH"
umask 022

if [ "$(id -u)" -eq 0 ]; then
    install_packages "${BUILD_PACKAGES[@]}" dpkg-dev debhelper binutils
fi
command -v dh >/dev/null || die "debhelper is missing: sudo apt-get install debhelper"

release_build_setup
swift build "${RELEASE_BUILD[@]}"
BIN=$(swift build "${RELEASE_BUILD[@]}" --show-bin-path)
VERSION=$("$BIN/lmx-agent" agentd --version)
changelog_version=$(dpkg-parsechangelog -l Packaging/debian/changelog -S Version)
[ "$changelog_version" = "$VERSION" ] ||
    die "Packaging/debian/changelog is at $changelog_version but the binaries say $VERSION: add a changelog entry (dch -v $VERSION)"
ARCH=$(dpkg --print-architecture)
NAME="lmx-agent_${VERSION}_${ARCH}"

# A source tree for dpkg-buildpackage: debian/ copied, the rest linked from the repository.
WORK=.build-deb
SRC="$WORK/lmx-agent-$VERSION"
rm -rf "$WORK"
mkdir -p "$SRC"
cp -r Packaging/debian "$SRC/debian"
ln -s "$(pwd)/Packaging" "$SRC/Packaging"
ln -s "$(pwd)/examples" "$SRC/examples"
ln -s "$BIN" "$SRC/bin"
# -d: the Swift toolchain that built bin/ is not a Debian package (Build-Depends: cannot name it).
(cd "$SRC" && SOURCE_DATE_EPOCH=$(dpkg-parsechangelog -S Timestamp) \
    dpkg-buildpackage -b -d --no-sign >../dpkg-buildpackage.log 2>&1) ||
    die "dpkg-buildpackage failed; its output: $WORK/dpkg-buildpackage.log (last lines: $(tail -n 5 "$WORK/dpkg-buildpackage.log"))"
mv "$WORK/$NAME.deb" "$NAME.deb"
depends=$(dpkg-deb --field "$NAME.deb" Depends)
log "built $NAME.deb ($(du -h "$NAME.deb" | cut -f1)); Depends: $depends"
