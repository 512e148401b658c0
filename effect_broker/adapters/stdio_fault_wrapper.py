"""The conformance kit's fault layer for a stdio MCP server (issue 22, item 1).

A stdio upstream has no socket to put a proxy on, so ``contracts conform`` starts the
server through this wrapper instead: the adapter starts ``python -m
effect_broker.adapters.stdio_fault_wrapper --control DIR --tool T [--lookup-tool L] --
COMMAND ARGS...``, which starts the real server and relays JSON-RPC lines both ways.
For a ``tools/call`` of ``T`` it plays the fault armed in ``DIR/next`` (written by
``StdioFaults.arm``, taken once by renaming it):

* ``lose_answer`` - forward; when the answer comes, record it, then end the session
  (the adapter sees the connection close after ``tools/call`` was written);
* ``reset`` - end the session without forwarding: a request that never arrived;
* ``slow`` - forward, record the answer, and hold it ``hold`` seconds;
* ``twice`` - forward, then forward the same call again under another JSON-RPC id,
  and answer with the second answer.

Every ``tools/call`` of ``T`` is an exchange in ``DIR/exchanges.jsonl``, written when
it arrives and again as it is forwarded and answered (its ``id`` names it: the last
line wins, the first gives its place), with the answers the server gave (the
evidence): a call forwarded whose answer never came is still counted, as the HTTP
proxy counts it. A call of ``L`` is one line in ``DIR/lookups``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from effect_broker.adapters.fault_proxy import FAULTS, Answer, Exchange, Fault


class StdioFaults:
    """The kit's side: arm faults, read the exchanges (``FaultProxy``'s interface)."""

    def __init__(self, control: Path) -> None:
        self.control = control
        control.mkdir(parents=True, exist_ok=True)
        self._frozen: tuple[list[Exchange], int] | None = None

    def freeze(self) -> None:
        """Keep what was recorded in memory (before the control directory goes)."""
        self._frozen = (self.exchanges, self.other_requests)

    def wrap(
        self, command: tuple[str, ...], tool: str, lookup_tool: str | None
    ) -> tuple[str, ...]:
        """The command that starts ``command`` behind the wrapper."""
        lookup = ("--lookup-tool", lookup_tool) if lookup_tool else ()
        return (
            sys.executable,
            "-m",
            "effect_broker.adapters.stdio_fault_wrapper",
            "--control",
            str(self.control),
            "--tool",
            tool,
            *lookup,
            "--",
            *command,
        )

    def arm(self, fault: Fault, *, hold: float = 0.0) -> None:
        """Play ``fault`` on the next ``tools/call`` of the tool."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        tmp = self.control / f"next.{uuid.uuid4().hex}"
        tmp.write_text(json.dumps({"fault": fault, "hold": hold}), encoding="utf-8")
        os.replace(tmp, self.control / "next")

    def disarm(self) -> None:
        """Drop the fault not yet played (its ``tools/call`` never came)."""
        (self.control / "next").unlink(missing_ok=True)

    @property
    def exchanges(self) -> list[Exchange]:
        """Every recorded ``tools/call`` of the tool, in order."""
        if self._frozen is not None:
            return list(self._frozen[0])
        path = self.control / "exchanges.jsonl"
        if not path.exists():
            return []
        # A restarted server runs behind a new wrapper process, appending to the same
        # file: exchanges are named by a random id, in the order they first arrived.
        latest: dict[str, dict[str, Any]] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            latest[row["id"]] = row  # written in order: the last line is the newest
        return [
            Exchange(
                row["fault"],
                row["forwarded"],
                [
                    Answer(200, "application/json", json.dumps(a).encode())
                    for a in row["answers"]
                ],
            )
            for row in latest.values()
        ]

    def effect_requests_forwarded(self) -> int:
        """Calls of the tool that reached the server (a twice-delivered one is 2)."""
        return sum(exchange.forwarded for exchange in self.exchanges)

    @property
    def other_requests(self) -> int:
        """Calls of the lookup tool."""
        if self._frozen is not None:
            return self._frozen[1]
        path = self.control / "lookups"
        return len(path.read_text().splitlines()) if path.exists() else 0


# --- the wrapper process ---------------------------------------------------------------


class _Relay:
    def __init__(self, args: argparse.Namespace) -> None:
        self.control = Path(args.control)
        self.tool = args.tool
        self.lookup_tool = args.lookup_tool
        self.child = subprocess.Popen(
            args.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self.out_lock = threading.Lock()
        self.pending: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        #: Guards ``pending`` and the exchanges file: an exchange's lines are written
        #: under it, in the order its state changed.
        self.lock = threading.Lock()

    def take_fault(self) -> tuple[Fault | None, float]:
        taken = self.control / f"taken.{os.getpid()}.{uuid.uuid4().hex}"
        try:
            os.replace(self.control / "next", taken)
        except FileNotFoundError:
            return None, 0.0
        armed = json.loads(taken.read_text(encoding="utf-8"))
        taken.unlink()
        return armed["fault"], float(armed.get("hold", 0.0))

    def record_locked(self, state: dict[str, Any]) -> None:
        """Write the exchange's state as it is now (caller holds ``lock``)."""
        line = json.dumps(
            {
                "id": state["id"],
                "fault": state["fault"],
                "forwarded": state["forwarded"],
                "answers": state["answers"],
            }
        )
        with (self.control / "exchanges.jsonl").open("a") as handle:
            handle.write(line + "\n")

    def to_client(self, message: dict[str, Any]) -> None:
        with self.out_lock:
            sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
            sys.stdout.buffer.flush()

    def to_server(self, message: dict[str, Any]) -> None:
        assert self.child.stdin is not None
        self.child.stdin.write(json.dumps(message).encode() + b"\n")
        self.child.stdin.flush()

    def end(self) -> None:
        self.child.kill()
        os._exit(0)  # the client sees its session's pipe close

    def from_client(self) -> None:
        for raw in sys.stdin.buffer:
            if not raw.strip():
                continue
            message = json.loads(raw)
            params = message.get("params") if isinstance(message, dict) else None
            name = params.get("name") if isinstance(params, dict) else None
            if message.get("method") == "tools/call" and name == self.lookup_tool:
                with (self.control / "lookups").open("a") as handle:
                    handle.write("1\n")
            if message.get("method") == "tools/call" and name == self.tool:
                fault, hold = self.take_fault()
                state: dict[str, Any] = {
                    "id": uuid.uuid4().hex,
                    "fault": fault,
                    "hold": hold,
                    "forwarded": 0 if fault == "reset" else 1,
                    "answers": [],
                }
                with self.lock:
                    # Counted as forwarded before the write, as the HTTP proxy does.
                    self.record_locked(state)
                    if fault == "reset":
                        self.end()
                    self.pending[str(message["id"])] = (message, state)
            self.to_server(message)
        self.child.terminate()

    def from_server(self) -> None:
        assert self.child.stdout is not None
        for raw in self.child.stdout:
            if not raw.strip():
                continue
            message = json.loads(raw)
            key = str(message.get("id")) if isinstance(message, dict) else ""
            with self.lock:
                entry = self.pending.pop(key, None)
            if entry is None:
                self.to_client(message)
                continue
            request, state = entry
            again: dict[str, Any] | None = None
            with self.lock:
                state["answers"].append(message)
                if state["fault"] == "twice" and len(state["answers"]) == 1:
                    again = {**request, "id": f"eb-twice-{uuid.uuid4().hex}"}
                    self.pending[str(again["id"])] = (request, state)
                    state["forwarded"] = 2
                self.record_locked(state)
            if again is not None:
                self.to_server(again)
                continue
            if state["fault"] == "lose_answer":
                self.end()
            if state["fault"] == "slow":
                time.sleep(state["hold"])
            self.to_client({**message, "id": request["id"]})
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    """Relay until either side closes."""
    parser = argparse.ArgumentParser(prog="stdio_fault_wrapper")
    parser.add_argument("--control", required=True)
    parser.add_argument("--tool", required=True)
    parser.add_argument("--lookup-tool")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    relay = _Relay(args)
    threading.Thread(target=relay.from_server, daemon=True).start()
    relay.from_client()
    relay.child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
