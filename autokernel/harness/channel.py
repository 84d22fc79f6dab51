"""The harness child's result, signed with a key the kernel's code never sees.

The parent makes a fresh random key for every bench and hands it to the child through a pipe (never
the command line, the environment or a file). The child reads it before it imports the kernel file,
keeps it only in the harness's own frame, and signs the result with HMAC-SHA256. The parent accepts a
result only with a valid signature: a kernel that writes the result file itself and exits, or edits the
one the harness wrote, is caught however well it finds the path.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets

KEY_BYTES = 32


class ForgedResult(Exception):
    """The result file is not one the harness signed with this bench's key."""


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def key_pipe(key: bytes) -> int:
    """The read end of a pipe that holds the key (the write end is closed): pass it to the child."""
    read_end, write_end = os.pipe()
    os.write(write_end, key)
    os.close(write_end)
    return read_end


def read_key(fd: int) -> bytes:
    """In the child, before the kernel is imported: the key, and the pipe closed."""
    try:
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise ValueError(f"the result key pipe gave {len(key)} bytes, not {KEY_BYTES}")
    return key


def _mac(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def write(path: str, result: dict, key: bytes | None) -> None:
    """The result as JSON, with its signature when there is a key (a harness run by hand has none)."""
    payload = json.dumps(result, indent=1, default=str)
    with open(path, "w") as f:
        json.dump({"payload": payload, "mac": _mac(key, payload) if key else None}, f)


def read(path: str, key: bytes) -> dict:
    """The result the harness signed; ForgedResult for anything else."""
    try:
        with open(path) as f:
            envelope = json.load(f)
        payload, mac = envelope["payload"], envelope["mac"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ForgedResult(f"the result file is not the harness's ({type(e).__name__})") from None
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, payload)):
        raise ForgedResult("the result file does not carry the harness's signature")
    return json.loads(payload)
