# lmx-agent. `make run` sets up and runs; `make test` sets up the test LAN and runs every test.
SWIFT ?= swift

.PHONY: all build release run test unit bench deb docs docs-check format lint demo testbed-up testbed-down clean install uninstall

all: build

build:
	$(SWIFT) build

# The release build with scripts/lib.sh's RELEASE_BUILD, the one list of its flags (static Swift
# runtime, lld, DT_RELR, no exports, function sections placed by Packaging/lmx-agent-hot.ld,
# lmx-status a static PIE); `make run`, `make deb` and the benchmarks use the same.
release:
	bash -c '. scripts/lib.sh && release_build_setup && $(SWIFT) build "$${RELEASE_BUILD[@]}" && link_commands .build/release'

# Installs what is missing, builds, makes sure avahi-daemon runs, then runs lmx-agentd
# in the foreground (extra daemon arguments: make run ARGS="--endpoint https://…").
run:
	scripts/run.sh $(ARGS)

# Needs root: installs packages, starts D-Bus, avahi-daemons and namespace hosts, tears them down.
test:
	scripts/run-tests.sh

# Fast in-process tests only: no daemon, no test LAN (root for the netlink test's namespace).
unit:
	$(SWIFT) test --filter 'LMXCoreTests|LMXStoreTests|LMXAgentTests|LMXDiscoveryTests|LMXCommandTests'

bench:
	scripts/bench.sh

# lmx-agent_<version>_<arch>.deb from a release build (root installs dpkg-dev if missing).
deb:
	scripts/build-deb.sh

# Regenerate the man pages and completions in Packaging/ from the argument parsers; docs-check
# fails when the checked-in ones differ (make test runs it).
docs:
	scripts/gen-docs.sh

docs-check:
	scripts/gen-docs.sh --check

# The Swift in .swift-format's style (swift-format from the toolchain): `format` rewrites it,
# `lint` checks it (make test runs the check), and ruff checks the Python.
format:
	$(SWIFT) format --in-place --recursive --parallel Sources Tests Package.swift

lint:
	$(SWIFT) format lint --strict --recursive --parallel Sources Tests Package.swift
	.build-testbed/venv/bin/ruff check scripts Benchmarks examples

# Discovery, failover to the WAN and return to the LAN, live, in a private network namespace (root).
demo:
	examples/demo.sh

testbed-up:
	scripts/testbed.sh up

testbed-down:
	scripts/testbed.sh down

clean:
	$(SWIFT) package clean

# `make install` (after `make release`): the commands, man pages, completions and both systemd
# units (the system one runs as the user `lmx`, which must exist; the user one for
# `systemctl --user`). PREFIX=/usr/local by default; DESTDIR for staging.
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR = $(PREFIX)/bin
RELEASE_BIN = .build/release
COMMANDS = lmx-agentd lmx-status lmx-discover lmx-pair lmx-notify

install:
	@test -x $(RELEASE_BIN)/lmx-agent || { echo "make install: no release build: run 'make release' first" >&2; exit 1; }
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PREFIX)/share/man/man1 \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions \
		$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d $(DESTDIR)$(PREFIX)/lib/systemd/system \
		$(DESTDIR)$(PREFIX)/lib/systemd/user $(DESTDIR)$(PREFIX)/lib/sysusers.d $(DESTDIR)$(PREFIX)/share/doc/lmx-agent
	# One multi-call binary as lmx-agentd, lmx-discover, lmx-pair and lmx-notify as links to it; lmx-status
	# stays a small binary of its own (it starts faster alone).
	install -m 0755 $(RELEASE_BIN)/lmx-agent $(DESTDIR)$(BINDIR)/lmx-agentd
	install -m 0755 $(RELEASE_BIN)/lmx-status $(DESTDIR)$(BINDIR)/lmx-status
	ln -sf lmx-agentd $(DESTDIR)$(BINDIR)/lmx-discover
	ln -sf lmx-agentd $(DESTDIR)$(BINDIR)/lmx-pair
	ln -sf lmx-agentd $(DESTDIR)$(BINDIR)/lmx-notify
	for c in $(COMMANDS); do \
		install -m 0644 Packaging/man/$$c.1 $(DESTDIR)$(PREFIX)/share/man/man1/$$c.1 && \
		install -m 0644 Packaging/completions/bash/$$c $(DESTDIR)$(PREFIX)/share/bash-completion/completions/$$c && \
		install -m 0644 Packaging/completions/zsh/_$$c $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_$$c && \
		install -m 0644 Packaging/completions/fish/$$c.fish $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/$$c.fish || exit 1; \
	done
	sed 's|^ExecStart=/usr/bin/|ExecStart=$(BINDIR)/|' Packaging/systemd/lmx-agentd.service > $(DESTDIR)$(PREFIX)/lib/systemd/system/lmx-agentd.service
	sed 's|@BINDIR@|$(BINDIR)|' Packaging/systemd/user/lmx-agentd.service > $(DESTDIR)$(PREFIX)/lib/systemd/user/lmx-agentd.service
	sed 's|@BINDIR@|$(BINDIR)|' Packaging/systemd/user/lmx-notify.service > $(DESTDIR)$(PREFIX)/lib/systemd/user/lmx-notify.service
	chmod 0644 $(DESTDIR)$(PREFIX)/lib/systemd/system/lmx-agentd.service $(DESTDIR)$(PREFIX)/lib/systemd/user/lmx-agentd.service \
		$(DESTDIR)$(PREFIX)/lib/systemd/user/lmx-notify.service
	install -m 0644 examples/agent.json $(DESTDIR)$(PREFIX)/share/doc/lmx-agent/agent.json
	install -m 0644 Packaging/debian/lmx-agent.sysusers $(DESTDIR)$(PREFIX)/lib/sysusers.d/lmx-agent.conf

uninstall:
	for c in $(COMMANDS); do \
		rm -f $(DESTDIR)$(BINDIR)/$$c $(DESTDIR)$(PREFIX)/share/man/man1/$$c.1 \
			$(DESTDIR)$(PREFIX)/share/bash-completion/completions/$$c $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_$$c \
			$(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/$$c.fish; \
	done
	rm -f $(DESTDIR)$(PREFIX)/lib/systemd/system/lmx-agentd.service $(DESTDIR)$(PREFIX)/lib/systemd/user/lmx-agentd.service \
		$(DESTDIR)$(PREFIX)/lib/systemd/user/lmx-notify.service \
		$(DESTDIR)$(PREFIX)/lib/sysusers.d/lmx-agent.conf
	rm -rf $(DESTDIR)$(PREFIX)/share/doc/lmx-agent

