"""A Ray address is checked in seconds: what it names, and the error where nothing answers."""

from __future__ import annotations

import socket

import pytest

from lightning_maxtp.resources.ray_address import check_ray_address, endpoint
from tests.helpers.ray_local import closed_port


@pytest.mark.parametrize(
    ("address", "where"),
    [(None, None), ("auto", None), ("local", None), ("head:6379", ("head", 6379)),
     ("ray://10.0.0.5:10001", ("10.0.0.5", 10001)), ("[::1]:6379", ("::1", 6379)),
     ("head", None), ("head:port", None), (":6379", None)],
)  # fmt: skip
def test_the_endpoint_an_address_names(address: str | None, where: tuple[str, int] | None) -> None:
    assert endpoint(address) == where


def test_an_address_where_nothing_listens_is_named_with_what_to_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = closed_port()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ValueError, match=rf"`address` 'ray://127.0.0.1:{port}': nothing accepts"):
        check_ray_address(f"ray://127.0.0.1:{port}")
    check_ray_address(None)  # no address, no RAY_ADDRESS: a local instance, nothing to check
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ValueError, match=rf"RAY_ADDRESS '127.0.0.1:{port}': .*or unset it for"):
        check_ray_address(None)
    with socket.socket() as server:  # something listens: no error
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_ray_address(f"127.0.0.1:{server.getsockname()[1]}")
