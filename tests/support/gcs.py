"""gcp-storage-emulator (a real Cloud Storage JSON API server) on a free loopback port, with one bucket; and a
Google service account's key file for the Vertex stand-in (tests/fakes/stubs_vertex.py) to issue tokens to."""

from __future__ import annotations

import contextlib
import json
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


def service_account_key(directory: Path) -> tuple[str, Path]:
    """A new RSA key: (its private PEM, the path of its public PEM, which the Vertex stand-in checks JWTs with)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = directory / "service-account.pub.pem"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def service_account_json(private_key: str, token_uri: str, project: str) -> str:
    """A service account's key file, as the IAM console writes it, its `token_uri` the stand-in's (google-auth
    pins an `authorized_user` file's token endpoint to Google's, so that kind cannot be pointed at a stand-in)."""
    return json.dumps({"type": "service_account", "project_id": project, "private_key_id": "stand-in",
                       "private_key": private_key, "client_email": f"batchyard@{project}.iam.gserviceaccount.com",
                       "client_id": "1", "token_uri": token_uri})
