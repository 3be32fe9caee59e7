"""Waiting on a descriptor numbered past 1024: a long-running server (``sandforge serve``) gets there, and
``select`` refuses such descriptors (``ValueError: filedescriptor out of range``)."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator

import pytest

from sandforge.sandbox.channel import wait_fd, wait_writable

HIGH = 1500


@pytest.fixture
def high_pipe() -> Iterator[tuple[int, int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH + 1:
        pytest.skip(f"the hard descriptor limit ({hard}) is below {HIGH + 2}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 2), hard))
    r, w = os.pipe()
    os.dup2(r, HIGH)
    os.dup2(w, HIGH + 1)
    os.close(r)
    os.close(w)
    try:
        yield HIGH, HIGH + 1
    finally:
        os.close(HIGH)
        os.close(HIGH + 1)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_descriptor_past_1024_is_waited_on(high_pipe: tuple[int, int]) -> None:
    r, w = high_pipe
    assert not wait_fd(r, 0)  # nothing to read yet
    assert wait_fd(w, 0, write=True)
    os.write(w, b"x")
    assert wait_fd(r, 1.0)
    wait_writable(w, time.monotonic() + 1.0)
