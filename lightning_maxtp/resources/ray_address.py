"""Whether the Ray cluster an address names can be reached, asked in seconds, not minutes.

``ray.init`` at an address where nothing listens retries for minutes (Ray 2.60 was still
retrying when a 200 s timeout ended it), so ``maxtp pack --backend ray`` and
``BatchInferencePool(backend="ray")`` first open one TCP connection to the host and port the
address (or ``RAY_ADDRESS``) names, and a refusal or a 5 s silence is a ``ValueError`` that
names the address. Addresses that name no port (``auto``, ``local``) are left to Ray.
Importing this module does not import Ray.
"""

from __future__ import annotations

import os
import socket

__all__ = ["CONNECT_TIMEOUT_S", "check_ray_address", "endpoint"]

CONNECT_TIMEOUT_S = 5.0
"""How long a cluster's address may take to accept a connection before it is called wrong."""


def endpoint(address: str | None) -> tuple[str, int] | None:
    """The host and port ``address`` names.

    ``None`` for a local or discovered cluster (``None``, ``"auto"``, ``"local"``), or a form
    only Ray reads.
    """
    if address is None or address in ("auto", "local"):
        return None
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray_address(address: str | None) -> None:
    """Fail in seconds where nothing accepts a connection at ``address`` (else ``RAY_ADDRESS``).

    Raises:
        ValueError: Naming the address (and where it came from) and what to check.
    """
    name = "`address`"
    if address is None and os.environ.get("RAY_ADDRESS"):
        name, address = "RAY_ADDRESS", os.environ["RAY_ADDRESS"]
    where = endpoint(address)
    if where is None:
        return
    try:
        with socket.create_connection(where, timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        raise ValueError(
            f"{name} {address!r}: nothing accepts a connection at {where[0]}:{where[1]} "
            f"({err or 'timed out'}); check the head node's address and port (`ray status` on "
            f"it prints them), or {'unset it' if name == 'RAY_ADDRESS' else 'leave it out'} "
            "for a local Ray instance"
        ) from err
