#!/usr/bin/env bash
# `make deb`: lmx-agent_<version>_<arch>.deb from a release build with the Swift runtime linked
# statically. Holds the four commands, the systemd unit, a commented /etc/lmx/agent.json, man
# pages, bash/zsh/fish completions and the copyright file; Depends: is computed from the binaries
# by dpkg-shlibdeps. The package is written to the repository's top folder.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_NAME=make-deb
. scripts/lib.sh
command -v swift >/dev/null || export PATH="/opt/swift/usr/bin:$PATH"
umask 022

if [ "$(id -u)" -eq 0 ]; then
    install_packages "${BUILD_PACKAGES[@]}" dpkg-dev binutils
fi
command -v dpkg-shlibdeps >/dev/null || die "dpkg-shlibdeps is missing: sudo apt-get install dpkg-dev"

COMMANDS=(lmx-agentd lmx-status lmx-discover lmx-pair)
swift build -c release --static-swift-stdlib
BIN=$(swift build -c release --static-swift-stdlib --show-bin-path)
VERSION=$("$BIN/lmx-agentd" --version)
ARCH=$(dpkg --print-architecture)
NAME="lmx-agent_${VERSION}_${ARCH}"
WORK=.build-deb
ROOT="$WORK/$NAME"
rm -rf "$ROOT"
mkdir -p "$ROOT/DEBIAN" "$ROOT/usr/bin" "$ROOT/usr/lib/systemd/system" "$ROOT/etc/lmx" \
    "$ROOT/usr/share/man/man1" "$ROOT/usr/share/doc/lmx-agent" \
    "$ROOT/usr/share/bash-completion/completions" "$ROOT/usr/share/zsh/vendor-completions" \
    "$ROOT/usr/share/fish/vendor_completions.d"

for cmd in "${COMMANDS[@]}"; do
    install -m 0755 "$BIN/$cmd" "$ROOT/usr/bin/$cmd"
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$ROOT/usr/bin/$cmd"
    gzip -9n < "Packaging/man/$cmd.1" > "$ROOT/usr/share/man/man1/$cmd.1.gz"
    # bash-completion sources these files: no #! line.
    sed '1{/^#!/d}' "Packaging/completions/bash/$cmd" > "$ROOT/usr/share/bash-completion/completions/$cmd"
    install -m 0644 "Packaging/completions/zsh/_$cmd" "$ROOT/usr/share/zsh/vendor-completions/_$cmd"
    install -m 0644 "Packaging/completions/fish/$cmd.fish" "$ROOT/usr/share/fish/vendor_completions.d/$cmd.fish"
done
install -m 0644 Packaging/systemd/lmx-agentd.service "$ROOT/usr/lib/systemd/system/lmx-agentd.service"
# The per-user unit (systemctl --user enable --now lmx-agentd), not enabled by the package.
mkdir -p "$ROOT/usr/lib/systemd/user"
sed 's|@BINDIR@|/usr/bin|' Packaging/systemd/user/lmx-agentd.service > "$ROOT/usr/lib/systemd/user/lmx-agentd.service"
chmod 0644 "$ROOT/usr/lib/systemd/user/lmx-agentd.service"
install -m 0644 examples/agent.json "$ROOT/etc/lmx/agent.json"
install -m 0644 Packaging/debian/copyright "$ROOT/usr/share/doc/lmx-agent/copyright"
mkdir -p "$ROOT/usr/share/lintian/overrides"
install -m 0644 Packaging/debian/lintian-overrides "$ROOT/usr/share/lintian/overrides/lmx-agent"
gzip -9n < Packaging/debian/changelog > "$ROOT/usr/share/doc/lmx-agent/changelog.gz"
for script in postinst prerm postrm; do
    install -m 0755 "Packaging/debian/$script" "$ROOT/DEBIAN/$script"
done
echo /etc/lmx/agent.json > "$ROOT/DEBIAN/conffiles"

# The shared libraries the binaries need, as package dependencies (dpkg-shlibdeps reads the
# package name from a debian/control of its own).
shlib="$WORK/shlibdeps"
rm -rf "$shlib"; mkdir -p "$shlib/debian"
printf 'Source: lmx-agent\n\nPackage: lmx-agent\nArchitecture: any\n' > "$shlib/debian/control"
depends=$(cd "$shlib" && dpkg-shlibdeps -O "${COMMANDS[@]/#/../$NAME/usr/bin/}" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || die "dpkg-shlibdeps found no dependencies"

size=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$size/" -e "s/@DEPENDS@/$depends/" \
    Packaging/debian/control.in > "$ROOT/DEBIAN/control"
(cd "$ROOT" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' | sort -z | xargs -0 md5sum) \
    > "$ROOT/DEBIAN/md5sums"
chmod 0644 "$ROOT/DEBIAN/md5sums" "$ROOT/DEBIAN/control" "$ROOT/DEBIAN/conffiles"

dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$NAME.deb" >/dev/null
log "built $NAME.deb ($(du -h "$NAME.deb" | cut -f1)); Depends: $depends, adduser, avahi-daemon"
