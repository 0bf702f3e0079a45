"""A one-node SLURM cluster on this machine, for the cluster tests and `nox -s cluster`.

Debian's slurm-wlm and munge are installed with apt-get when absent (as root). `LocalSlurm.start` then
starts munged, slurmctld and slurmd, in that order, in the foreground as child processes (their pids are
ours), from tests/cluster/slurm.conf with fresh ports, a fresh state folder and a private munge socket and
key: nothing in /etc is touched and a second session on the same machine gets its own cluster. `stop` ends
exactly those pids. Clients (sbatch, squeue, scancel, srun) find the cluster through SLURM_CONF (`env`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.helpers.apt import Unavailable, apt_install

CONF_TEMPLATE = Path(__file__).with_name("slurm.conf")
PROGRAMS = ("sbatch", "squeue", "scancel", "srun", "sinfo", "slurmctld", "slurmd", "munged")
PACKAGES = ("slurm-wlm", "munge")
DAEMON_DIRS = ("/usr/sbin", "/sbin")  # slurmctld, slurmd and munged live in sbin, often not on a user's PATH



def which(program: str) -> str | None:
    return shutil.which(program) or shutil.which(program, path=os.pathsep.join(DAEMON_DIRS))


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if which(p) is None]


def why_not_here() -> str | None:
    """None when this machine can run a local cluster (possibly after installing it), else the reason."""
    if not hasattr(os, "geteuid") or not Path("/proc").is_dir():
        return "a local SLURM cluster needs Linux"
    if os.geteuid() != 0:
        return "a local SLURM cluster needs root (slurmd starts jobs as their user; SlurmUser=root)"
    if missing_programs() and shutil.which("apt-get") is None:
        return (f"SLURM is not installed ({', '.join(missing_programs())} missing) and there is no apt-get "
                f"to install {' '.join(PACKAGES)}")
    return None


def ensure_installed(log=print) -> float:
    """apt-get install slurm-wlm munge when a program is missing; the seconds it took (0 when nothing to do)."""
    reason = why_not_here()
    if reason:
        raise Unavailable(reason)
    if not missing_programs():
        return 0.0
    took = apt_install(PACKAGES, log, why=f"missing: {', '.join(missing_programs())}")
    if missing_programs():
        raise Unavailable(f"after apt-get install {' '.join(PACKAGES)}, still missing: {', '.join(missing_programs())}")
    return took


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    """RealMemory a bit under the machine's (slurmd drains a node that reports less than configured)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(int(line.split()[1]) / 1024 * 0.9)
    raise Unavailable("cannot read MemTotal from /proc/meminfo")


class LocalSlurm:
    """One controller, one node (this host), partition `debug`. Use as a context manager or start/stop."""

    def __init__(self, state_dir: Path):
        self.state = Path(state_dir)
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.state / "slurm.conf"
        self.munge_socket = self.state / "munge" / "munge.socket"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.cpus = os.cpu_count() or 1
        self.mem_mb = _memory_mb()

    @property
    def env(self) -> dict[str, str]:
        """What a client needs (sbatch, squeue, srun): the config, which names the munge socket."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self, timeout_s: float = 60) -> LocalSlurm:
        for sub in ("ctld", "d", "munge"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        self._write_conf()
        try:
            self._start_munged()
            self._spawn("slurmctld", [which("slurmctld"), "-D", "-f", str(self.conf)])
            self._wait_for(lambda: self._ok(["sinfo", "-h"]), timeout_s, "slurmctld to answer")
            self._spawn("slurmd", [which("slurmd"), "-D", "-f", str(self.conf), "-N", self.host])
            self._wait_for(lambda: self._node_state() in ("idle", "mixed", "alloc"), timeout_s, "the node to be idle")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """End the daemons started here, by their pids, newest first (slurmd, slurmctld, munged)."""
        while self.procs:
            name, proc = self.procs.pop()
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs}

    def run(self, *cmd: str, **kwargs) -> subprocess.CompletedProcess:
        """A client command (sbatch, squeue, scancel, srun ...) against this cluster."""
        env = {**os.environ, **kwargs.pop("env", {}), **self.env}
        return subprocess.run(list(cmd), env=env, capture_output=True, text=True, **kwargs)

    # -- internals -------------------------------------------------------------------------------------------

    def _write_conf(self) -> None:
        text = CONF_TEMPLATE.read_text().format(
            host=self.host, ctld_port=_free_port(), slurmd_port=_free_port(), munge_socket=self.munge_socket,
            state=self.state, cpus=self.cpus, mem_mb=self.mem_mb)
        self.conf.write_text(text)

    def _start_munged(self) -> None:
        key = self.state / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge_dir = self.state / "munge"
        munge_dir.chmod(0o700)
        self._spawn("munged", [which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={munge_dir / 'munged.pid'}",
                               f"--log-file={munge_dir / 'munged.log'}", f"--seed-file={munge_dir / 'munged.seed'}"])
        self._wait_for(self.munge_socket.exists, 30, "munged's socket")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.state / f"{name}.out", "wb")  # noqa: SIM115 (the daemon owns it for its life)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **self.env}, start_new_session=True)
        self.procs.append((name, proc))

    def _ok(self, cmd: list[str]) -> bool:
        return self.run(*cmd, timeout=10).returncode == 0

    def _node_state(self) -> str:
        out = self.run("sinfo", "-h", "-n", self.host, "-o", "%t", timeout=10)
        return out.stdout.strip().rstrip("*~#") if out.returncode == 0 else ""

    def _wait_for(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for {what}: "
                                       f"{self._tail(name)}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}: {self._tail(self.procs[-1][0])}")

    def _tail(self, name: str) -> str:
        for path in (self.state / f"{name}.out", self.state / f"{name}.log"):
            if path.is_file() and path.read_text(errors="replace").strip():
                return " | ".join(path.read_text(errors="replace").strip().splitlines()[-5:])
        return "(no log)"


def main(argv: list[str] | None = None) -> None:
    """`python -m tests.cluster.local_slurm STATE_DIR`: start the cluster, say how to reach it, and stop it
    (by its pids) on Ctrl-C or SIGTERM."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("state_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        took = ensure_installed()
        if took:
            print(f"installed {' '.join(PACKAGES)} in {took:.0f} s", flush=True)
        t0 = time.perf_counter()
        cluster = LocalSlurm(args.state_dir).start()
    except (Unavailable, RuntimeError) as why:
        raise SystemExit(f"error: no local SLURM cluster: {why}") from None
    pids = ", ".join(f"{name} {pid}" for name, pid in cluster.pids().items())
    print(f"one-node SLURM cluster up in {time.perf_counter() - t0:.1f} s ({pids}); in another shell:\n"
          f"  export SLURM_CONF={cluster.conf}\nCtrl-C stops the daemons.", flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (`&`)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print("stopped", flush=True)


if __name__ == "__main__":
    main()
