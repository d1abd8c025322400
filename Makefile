# lmx-agent. `make run` sets up and runs; `make test` sets up the test LAN and runs every test.
SWIFT ?= swift

.PHONY: all build release run test unit bench deb docs docs-check demo testbed-up testbed-down clean

all: build

build:
	$(SWIFT) build

release:
	$(SWIFT) build -c release --static-swift-stdlib

# Installs what is missing, builds, makes sure avahi-daemon runs, then runs lmx-agentd
# in the foreground (extra daemon arguments: make run ARGS="--endpoint https://…").
run:
	scripts/run.sh $(ARGS)

# Needs root: installs packages, starts D-Bus, avahi-daemons and namespace hosts, tears them down.
test:
	scripts/run-tests.sh

# Core unit tests only: no daemon, no root.
unit:
	$(SWIFT) test --filter 'LMXCoreTests|LMXStoreTests'

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

# Discovery, failover to the WAN and return to the LAN, live, in a private network namespace (root).
demo:
	examples/demo.sh

testbed-up:
	scripts/testbed.sh up

testbed-down:
	scripts/testbed.sh down

clean:
	$(SWIFT) package clean
