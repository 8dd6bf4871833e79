#!/usr/bin/env python3
"""Host side of testbed/run: runs QEMU and talks to the guest.

The guest has three serial ports, each a file chardev in --workdir:
  console.log  (ttyS0) kernel console + /init's control lines (markers)
  stdout.chan  (ttyS1) the command's stdout, raw (binary-safe)
  stderr.chan  (ttyS2) the command's stderr, raw
Control lines from /init (on ttyS0):
  @@HETCRYPT:H@@ <text>     header line -> printed as "testbed: <text>"
  @@HETCRYPT:START@@        the command starts now
  @@HETCRYPT:EXIT:<n>@@     the command exited with status n
The command itself may print @@HETCRYPT:UNPLUG@@ (stdout or stderr); with
--unplug-on-marker we then hot-unplug device crypto0 over QMP.

Exit status: the command's; 124 on timeout; 125 when the guest or QEMU failed
(panic, no exit marker, QEMU error).
"""
import argparse
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

EXIT_TIMEOUT = 124
EXIT_TESTBED = 125
UNPLUG_MARKER = b"@@HETCRYPT:UNPLUG@@"
DEVICE_ID = "crypto0"
KERNEL_TROUBLE = re.compile(
    r"Kernel panic|BUG:|Oops|general protection fault|WARNING:|Call Trace|RIP:|"
    r"segfault|Attempted to kill init|hung_task|blocked for more than|soft lockup|rcu_.*stall"
)
# Expected console lines, never worth showing: power-off, and the
# virtio-crypto RSA self-test failure (QEMU's builtin backend has no raw RSA).
BENIGN = re.compile(
    r"reboot: Power down|ACPI: PM: Preparing to enter system sleep state S5|"
    r"alg: akcipher: .*(encrypt test failed|virtio-crypto-rsa)"
)
BENIGN_QEMU = re.compile(r"RSA with raw padding is not supported")
OOPS = re.compile(r"BUG:|Oops|general protection fault|Attempted to kill init")
CONTROL = re.compile(r"@@HETCRYPT:(H@@ ?(?P<h>.*)|(?P<start>START)@@|EXIT:(?P<exit>\d+)@@)")

_out_lock = threading.Lock()


class Output:
    """Where "testbed:" lines go; serialised with the raw guest streams."""

    def __init__(self, log_stderr):
        self.meta = sys.stderr.buffer if log_stderr else sys.stdout.buffer

    def raw(self, stream, data):
        with _out_lock:
            stream.write(data)
            stream.flush()

    def say(self, text, stream=None):
        line = ("testbed: %s\n" % text).encode("utf-8", "replace")
        self.raw(stream or self.meta, line)

    def warn(self, text):
        self.say(text, sys.stderr.buffer)


class Tail:
    """Reads what QEMU appends to a file chardev."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY)

    def read(self):
        chunks = []
        while True:
            b = os.read(self.fd, 1 << 16)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)


class MarkerScanner:
    """Finds a marker in a byte stream across read boundaries."""

    def __init__(self, marker):
        self.marker = marker
        self.carry = b""

    def feed(self, data):
        buf = self.carry + data
        found = self.marker in buf
        self.carry = buf[-(len(self.marker) - 1):]
        return found


def _pdeathsig():
    # QEMU dies with us, whatever kills us.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Unplugger(threading.Thread):
    """Connects to QMP early; on trigger sends device_del and waits for DEVICE_DELETED."""

    def __init__(self, sock_path, out):
        super().__init__(daemon=True)
        self.sock_path = sock_path
        self.out = out
        self.trigger = threading.Event()
        self.triggered_at = None

    def fire(self):
        if not self.trigger.is_set():
            self.triggered_at = time.monotonic()
            self.trigger.set()

    def run(self):
        try:
            self._run()
        except Exception as e:  # report, never crash the runner
            self.out.warn("unplug: QMP error: %s" % e)

    def _run(self):
        deadline = time.monotonic() + 30
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        while True:
            try:
                s.connect(self.sock_path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("cannot connect to QMP socket")
                time.sleep(0.05)
        f = s.makefile("rwb", buffering=0)

        def send(obj):
            f.write(json.dumps(obj).encode() + b"\n")

        def recv():
            line = f.readline()
            if not line:
                raise RuntimeError("QMP connection closed (QEMU exited) before DEVICE_DELETED")
            return json.loads(line)

        greeting = recv()
        if "QMP" not in greeting:
            raise RuntimeError("unexpected QMP greeting %r" % greeting)
        send({"execute": "qmp_capabilities"})
        while "return" not in recv():
            pass
        self.trigger.wait()
        send({"execute": "device_del", "arguments": {"id": DEVICE_ID}})
        s.settimeout(30)
        try:
            while True:
                msg = recv()
                if "error" in msg:
                    self.out.warn("unplug: device_del failed: %s" % msg["error"].get("desc", msg))
                    return
                if msg.get("event") == "DEVICE_DELETED" and msg.get("data", {}).get("device") == DEVICE_ID:
                    ms = (time.monotonic() - self.triggered_at) * 1000
                    self.out.say("unplugged %s (%.0f ms after the marker)" % (DEVICE_ID, ms))
                    return
        except socket.timeout:
            self.out.warn("unplug: no DEVICE_DELETED for %s within 30 s" % DEVICE_ID)


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit("usage: vm.py [options] -- qemu-system-x86_64 ...")
    i = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--unplug-on-marker", action="store_true")
    ap.add_argument("--log-stderr", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    opts = ap.parse_args(argv[:i])
    qemu_argv = argv[i + 1:]

    out = Output(opts.log_stderr)
    wd = opts.workdir
    qemu_log = open(os.path.join(wd, "qemu.log"), "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        qemu_argv, stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=subprocess.STDOUT,
        preexec_fn=_pdeathsig,
    )

    def on_signal(signum, _frame):
        proc.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    console = Tail(os.path.join(wd, "console.log"))
    chan_out = Tail(os.path.join(wd, "stdout.chan"))
    chan_err = Tail(os.path.join(wd, "stderr.chan"))
    scan_out = MarkerScanner(UNPLUG_MARKER)
    scan_err = MarkerScanner(UNPLUG_MARKER)

    unplugger = None
    if opts.unplug_on_marker:
        unplugger = Unplugger(os.path.join(wd, "qmp.sock"), out)
        unplugger.start()

    state = {"started": None, "exit": None, "partial": b"", "trouble": False}
    recent = []  # last console lines, for post-mortems

    def console_line(raw):
        line = raw.decode("utf-8", "replace").replace("\r", "").rstrip("\n")
        m = CONTROL.search(line)
        if m:
            if m.group("h") is not None:
                out.say(m.group("h"))
            elif m.group("start"):
                state["started"] = time.monotonic()
                out.say("guest ready in %.1f s, running the command" % (state["started"] - t0))
            else:
                state["exit"] = int(m.group("exit"))
            return
        if BENIGN.search(line):
            return
        recent.append(line)
        del recent[:-80]
        trouble = KERNEL_TROUBLE.search(line)
        if trouble:
            state["trouble"] = True
        if opts.verbose or state["started"] or trouble or state["trouble"]:
            out.say("kernel: " + line, sys.stderr.buffer)

    def pump():
        got = False
        data = console.read()
        if data:
            got = True
            buf = state["partial"] + data
            lines = buf.split(b"\n")
            state["partial"] = lines.pop()
            for ln in lines:
                console_line(ln)
        for tail, scan, stream in ((chan_out, scan_out, sys.stdout.buffer), (chan_err, scan_err, sys.stderr.buffer)):
            data = tail.read()
            if data:
                got = True
                out.raw(stream, data)
                if unplugger and scan.feed(data):
                    unplugger.fire()
        return got

    deadline = t0 + opts.timeout
    exit_seen_at = None
    timed_out = False
    while True:
        got = pump()
        if proc.poll() is not None:
            pump()
            if state["partial"]:
                console_line(state["partial"])
                state["partial"] = b""
            break
        now = time.monotonic()
        if state["exit"] is not None and exit_seen_at is None:
            exit_seen_at = now
        if exit_seen_at is not None and now - exit_seen_at > 15:
            out.warn("guest did not power off 15 s after the command exited; killing QEMU")
            proc.kill()
            continue
        if now > deadline:
            timed_out = True
            proc.kill()
            proc.wait()
            pump()
            break
        if not got:
            time.sleep(0.01)

    if unplugger and unplugger.trigger.is_set():
        # QEMU has gone: the DEVICE_DELETED event, if sent, is in the socket.
        unplugger.join(2)
    total = time.monotonic() - t0
    qemu_log.close()
    qemu_msgs = [
        ln for ln in open(os.path.join(wd, "qemu.log"), "rb").read().decode("utf-8", "replace").splitlines()
        if ln.strip() and not BENIGN_QEMU.search(ln)
    ]

    def post_mortem():
        if recent and not state["trouble"]:
            out.warn("last guest console lines:")
            for ln in recent[-40:]:
                out.warn("  | " + ln)
        if qemu_msgs:
            out.warn("QEMU said:")
            for ln in qemu_msgs[-20:]:
                out.warn("  | " + ln)

    if timed_out:
        out.warn("TIMEOUT: the command did not finish within %d s; QEMU killed" % opts.timeout)
        post_mortem()
        return EXIT_TIMEOUT
    if state["exit"] is not None:
        cmd_s = (exit_seen_at or time.monotonic()) - (state["started"] or t0)
        out.say("exit status %d (command %.1f s, total %.1f s)" % (state["exit"], cmd_s, total))
        return state["exit"]
    panic = [ln for ln in recent if "Kernel panic" in ln]
    if panic:
        oops = [ln for ln in recent if OOPS.search(ln)]
        out.warn("FAILED: guest kernel panic%s: %s" % (
            " after an oops (%s)" % oops[0].split("] ", 1)[-1] if oops else "",
            panic[-1].split("] ", 1)[-1]))
        if not state["trouble"]:
            post_mortem()
        return EXIT_TESTBED
    elif state["started"] is None:
        out.warn("FAILED: guest did not boot to the command (QEMU exit %d)" % proc.returncode)
    else:
        out.warn("FAILED: guest stopped without an exit marker (QEMU exit %d)" % proc.returncode)
    post_mortem()
    return EXIT_TESTBED


if __name__ == "__main__":
    sys.exit(main())
