"""gcp-storage-emulator (a real Cloud Storage JSON API server) on a free loopback port, with one bucket."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.services import _stop, _tail
from tests.support.waiting import free_port

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy


class GcsEmulator:
    def __init__(self, bucket: str = "batchyard-vertex") -> None:
        self.port = free_port()
        self.bucket = bucket
        fd, name = tempfile.mkstemp(prefix="gcs-", suffix=".log")
        self.log_path = Path(name)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(self.port),
             "--in-memory", "--default-bucket", bucket],
            stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=dict(os.environ))
        os.close(fd)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> GcsEmulator:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                self.object_names()
                return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gcp-storage-emulator did not start:\n{_tail(self.log_path)}")
            time.sleep(0.1)

    def _get(self, path: str) -> Any:
        import json

        with _OPENER.open(self.url + path, timeout=5) as reply:
            return json.loads(reply.read() or b"{}")

    def object_names(self) -> list[str]:
        """The names of every object in the bucket."""
        listing = self._get(f"/storage/v1/b/{urllib.parse.quote(self.bucket)}/o")
        return [str(item["name"]) for item in listing.get("items") or []]

    def close(self) -> None:
        _stop(self.process)
        with contextlib.suppress(OSError):
            self.log_path.unlink()
