"""What the project's Python scripts and benchmarks share: where things are, the test LAN's
names, child processes stopped by PID, and the small measurements several benchmarks take.

Imported by the scripts under scripts/ (fixtures, checks, release tools) and Benchmarks/; each
puts this directory on sys.path first:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # scripts/<role>/
    import lmxtools
"""
import os
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.path.join(REPO, "scripts", "testbed.sh")
TESTBED_ENV = "/run/lmx-testbed/env"


def script(role, name):
    """The path of scripts/<role>/<name> (role: fixtures, checks, release)."""
    return os.path.join(REPO, "scripts", role, name)


def fixture(name):
    return script("fixtures", name)


def release_bin():
    """Where the binaries are: LMX_BIN_DIR, else the release build."""
    return os.environ.get("LMX_BIN_DIR", os.path.join(REPO, ".build", "release"))


def testbed_env():
    """The test LAN's names (namespaces, addresses), as scripts/testbed.sh up wrote them."""
    with open(TESTBED_ENV) as f:
        return dict(line.split("=", 1) for line in f.read().split())


def in_namespace(env, host):
    """The command prefix that runs a command on test host `host` (h1, h2, …)."""
    return ["ip", "netns", "exec", env["LMX_TESTBED_%s_NS" % host.upper()]]


class Children:
    """Child processes started by a script, stopped by their PIDs (never by name) at the end."""

    def __init__(self):
        self.live = []

    def start(self, argv, **kw):
        process = subprocess.Popen(argv, **kw)
        self.live.append(process)
        return process

    def stop_all(self, grace=5):
        for process in self.live:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + grace
        for process in self.live:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.live = []


_say_lock = threading.Lock()


def say(line):
    """One whole line on stdout, flushed at once (tests read fixtures' output line by line)."""
    with _say_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def peak_rss_kib(argv):
    """Peak RSS of a command, through GNU time: a child forked from Python would count Python's
    own memory (the pre-exec address space) in its high-water mark."""
    out = subprocess.run(["/usr/bin/time", "-f", "%M", "--", *argv],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr
    return int(out.strip().splitlines()[-1])


def memory_kib(pid):
    """RSS, anonymous memory and PSS of a running process, KiB (/proc/PID/smaps_rollup)."""
    fields = {}
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1])
    return {"rss": fields.get("Rss", 0), "anon": fields.get("Anonymous", 0), "pss": fields.get("Pss", 0)}


def wait_http(url, timeout=15):
    """Whether `url` answers 2xx within `timeout` seconds (curl, so no proxy settings apply)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if subprocess.run(["curl", "-s", "-o", "/dev/null", "-f", url]).returncode == 0:
            return True
        time.sleep(0.1)
    return False
