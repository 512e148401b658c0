"""The send-gate window bench measures to the last byte of the request (issue 19,
item 4b): a body that arrives late is a late request, so the window the README
publishes ends at the last byte, not the first."""

from __future__ import annotations

from examples.bench.gate_window import measure


def test_the_window_is_measured_to_the_first_and_to_the_last_byte() -> None:
    # Given a real HttpAdapter sending 20 charges to a loopback server in another
    # process, the gate recording each check
    first, last = measure(20)

    # Then every request has both windows, the last byte never before the first,
    # and both after the gate's last check
    assert len(first) == len(last) == 20
    assert all(0 < f <= lb for f, lb in zip(first, last, strict=True))
