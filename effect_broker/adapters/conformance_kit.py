"""The conformance kit a user runs against their own sandbox target (issue 22, item 1).

``effect-broker contracts conform CONTRACT[@VERSION]`` builds the contract's real
adapter, as written, but points it at a ``FaultProxy`` (fault_proxy.py) in front of
the target (an http target, an MCP server over HTTP), or starts a stdio MCP server
behind ``stdio_fault_wrapper.py``. The target is not asked to cooperate: every check
reads the promise of the contract's safety class in the target's *own answers* - the
answers the proxy saw, including the ones it lost on purpose, and the target's lookup.

Checks (one row each; ``pass``, ``FAIL`` or ``n/a`` with the evidence):

``answers``             a plain request is answered as committed, with an external id
                        (a refused one must leave nothing the lookup finds)
``same_key_one_effect`` idempotent: one request delivered twice, then resent: three
                        requests under one key must name one effect
``lost_answer``         the answer is lost after the target committed: the adapter
                        says unknown, and the commit is found again (idempotent: a
                        resend answers the same id; reconcilable: the lookup finds it
                        within the settlement bound)
``slow_answer``         the same, when the answer comes after the attempt's limit
``never_arrived``       the connection is reset before the request reached the
                        target: the adapter does not claim a commit, and after the
                        settlement bound the lookup does not find it
``drift_refused``       idempotent: the same key with another payload is refused, and
                        the refused request left nothing (a resend of the original
                        still answers the original id)

The plan (how many requests) is known before anything is sent: ``plan()``.

A stdio server is started (or pinged) before each attempt and each lookup, outside the
attempt's limit (``McpAdapter.warm_up``): the limit times the call, as a worker's kept
server would see it, not a process start that takes seconds on a busy host. A check
whose request never reached the target (the server did not start within its
``connect_timeout``, the attempt was refused before anything was sent) proves nothing:
it FAILs as ``inconclusive: ...``, since an unproved promise is not a pass.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import mcp.types as types
from pydantic import ValidationError

from effect_broker.adapters.base import (
    DispatchRequest,
    DispatchResult,
    EffectAdapter,
    ProbeRequest,
    ProbeResult,
)
from effect_broker.adapters.conformance import make_effect_record
from effect_broker.adapters.fault_proxy import Answer, Exchange, FaultProxy, origin_of
from effect_broker.adapters.stdio_fault_wrapper import StdioFaults
from effect_broker.domain.canonical import parse_json_strict
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import (
    AdapterError,
    ConfigurationError,
    InvalidJsonError,
    OutcomeUnknownError,
    TerminalAdapterError,
)
from effect_broker.domain.keys import downstream_key as derive_downstream_key
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import ProbeStatus, SafetyClass

Outcome = Literal["pass", "FAIL", "n/a"]
_TENANT_ID = "conformance-kit"
# Obviously synthetic, so a key the kit sends is recognisable in the target's logs.
_TENANT_KEY = b"effect-broker-conformance-kit-32"
#: Extra time a lookup is given past the settlement bound (loopback and a busy host).
LOOKUP_GRACE = timedelta(milliseconds=500)

CHECKS: tuple[tuple[str, str], ...] = (
    ("answers", "a request is answered as committed, with an id"),
    ("same_key_one_effect", "same key three times -> one effect"),
    ("lost_answer", "answer lost after commit -> unknown, then found"),
    ("slow_answer", "answer past the attempt limit -> unknown, then found"),
    ("never_arrived", "reset before arrival -> lookup does not find it"),
    ("drift_refused", "same key, other payload -> refused, left nothing"),
)


@dataclass(frozen=True, slots=True)
class KitRow:
    """One check's result: its outcome and the target's evidence."""

    check: str
    promise: str
    outcome: Outcome
    evidence: str

    def as_dict(self) -> dict[str, str]:
        """JSON form."""
        return {
            "check": self.check,
            "promise": self.promise,
            "outcome": self.outcome,
            "evidence": self.evidence,
        }


@dataclass(frozen=True, slots=True)
class KitPlan:
    """What a run will send, said before anything is sent."""

    contract: str
    version: str
    safety: SafetyClass
    target: str
    #: Effect requests that reach the target at most (a twice-delivered one is 2).
    effect_requests: int
    #: Lookups at most (polling within the settlement bound).
    lookups: int

    def sentence(self) -> str:
        """The announcement printed before the run."""
        return (
            f"conform {self.contract}@{self.version} ({self.safety.value}): will send "
            f"at most {self.effect_requests} effect request(s) and "
            f"{self.lookups} lookup(s) to {self.target}, through a local fault proxy"
        )


class _Fail(Exception):
    """A broken promise, with the evidence as its message."""


def _inconclusive(why: str) -> _Fail:
    return _Fail(f"inconclusive: {why}; the promise is unproved (nothing to read)")


class _NotApplicable(Exception):
    """A check that does not apply, with the reason as its message."""


class LimitGate:
    """A send gate with a fixed total time limit from its creation (the kit's
    stand-in for a worker's attempt limit; ``slow_answer`` answers past it)."""

    def __init__(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds

    def check(self) -> None:
        """Never refuses: the kit holds no lease."""

    def remaining(self) -> float:
        """Seconds left of the limit."""
        return max(0.0, self._deadline - time.monotonic())


def _document(answer: Answer) -> dict[str, Any] | None:
    """The JSON object of an answer (a JSON body, or the JSON-RPC message with a
    result in an MCP server's event stream), or None."""
    body = answer.body
    if "text/event-stream" in answer.content_type:
        for line in body.decode("utf-8", "replace").splitlines():
            if line.startswith("data:"):
                try:
                    message = json.loads(line[5:].strip())
                except ValueError:
                    continue
                if isinstance(message, dict) and "result" in message:
                    return message
        return None
    try:
        document = parse_json_strict(body)
    except InvalidJsonError:
        return None
    return document if isinstance(document, dict) else None


def _calls_tool(method: str, body: bytes, tool: str) -> bool:
    """True for a JSON-RPC ``tools/call`` of ``tool`` (an MCP streamable HTTP POST)."""
    if method != "POST":
        return False
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(message, dict)
        and message.get("method") == "tools/call"
        and isinstance(message.get("params"), dict)
        and message["params"].get("name") == tool
    )


class ConformanceKit:
    """Runs the checks of one contract's class against its target, through proxies."""

    def __init__(
        self,
        contract: EffectContract,
        *,
        arguments: Mapping[str, object],
        drift_arguments: Mapping[str, object] | None = None,
        attempt_limit: float = 2.0,
        adapter_factory: Callable[[EffectContract], EffectAdapter] | None = None,
    ) -> None:
        if contract.adapter not in ("http", "mcp"):
            raise ConfigurationError(
                f"conform drives the http and mcp adapters; {contract.adapter!r} has "
                "no target to put a proxy in front of",
                contract=contract.name,
            )
        if contract.adapter == "mcp" and contract.upstream is None:
            raise ConfigurationError(
                'adapter = "mcp" needs [contract.upstream]', contract=contract.name
            )
        if attempt_limit <= 0:
            raise ConfigurationError("the attempt limit must be positive")
        self.contract = contract
        self.safety = contract.safety
        self.arguments = dict(arguments)
        self.drift_arguments = (
            dict(drift_arguments)
            if drift_arguments is not None
            else {**self.arguments, "conformance_drift": uuid.uuid4().hex[:8]}
        )
        self.attempt_limit = attempt_limit
        if adapter_factory is None:
            from effect_broker.adapters.registry import _adapter_class

            def adapter_factory(c: EffectContract) -> EffectAdapter:
                return _adapter_class(c.adapter)(c)

        self._factory = adapter_factory
        self.adapter: EffectAdapter | None = None
        self.proxies: list[FaultProxy | StdioFaults] = []
        self._effect_proxy: FaultProxy | StdioFaults | None = None
        #: True once a stdio server could not be started in all its tries.
        self._start_failed = False

    # --- what the run will do ----------------------------------------------------------

    @property
    def has_lookup(self) -> bool:
        """True when the contract names a lookup (a probe_url or a lookup_tool)."""
        if self.contract.adapter == "mcp":
            return bool(self.contract.upstream and self.contract.upstream.lookup_tool)
        return bool(self.contract.adapter_options.get("probe_url"))

    @property
    def stdio(self) -> bool:
        """True for an MCP server over stdio (faults by a wrapper, not a proxy)."""
        upstream = self.contract.upstream
        return (
            self.contract.adapter == "mcp" and upstream is not None and not upstream.url
        )

    @property
    def target(self) -> str:
        """The target's origin (never a path: it may carry a key or a token), or a
        stdio server's command."""
        if self.stdio:
            assert self.contract.upstream is not None
            return f"the stdio server {self.contract.upstream.where!r}"
        return origin_of(self._urls()[0])

    def _settlement(self) -> timedelta:
        return self.contract.settlement_bound or timedelta(0)

    def _poll_interval(self) -> float:
        return max(0.1, self._settlement().total_seconds() / 5)

    def _max_polls(self) -> int:
        window = (self._settlement() + LOOKUP_GRACE).total_seconds()
        return math.ceil(window / self._poll_interval()) + 1

    def applicable(self) -> dict[str, str | None]:
        """Each check's reason not to run (None when it runs)."""
        idem = self.safety is SafetyClass.IDEMPOTENT
        unsafe = self.safety is SafetyClass.UNSAFE
        return {
            "answers": None,
            "same_key_one_effect": None
            if idem
            else "only an idempotent target promises one effect per key",
            "lost_answer": None,
            "slow_answer": None,
            "never_arrived": (
                "an unsafe target has no lookup"
                if unsafe
                else None
                if self.has_lookup
                else "the contract names no lookup to ask"
            ),
            "drift_refused": None
            if idem
            else "only an idempotent target refuses a reused key",
        }

    def plan(self) -> KitPlan:
        """How many requests the run sends at most, per the checks that apply."""
        idem = self.safety is SafetyClass.IDEMPOTENT
        lookups_per_find = self._max_polls() if self.has_lookup else 0
        reasons = self.applicable()
        effect = lookups = 0
        for check, _ in CHECKS:
            if reasons[check] is not None:
                continue
            if check == "answers":
                effect += 1
                lookups += 1 if self.has_lookup else 0
            elif check == "same_key_one_effect" or check == "drift_refused":
                effect += 3
            elif check in ("lost_answer", "slow_answer"):
                effect += 2 if idem else 1
                if not idem and self.safety is not SafetyClass.UNSAFE:
                    lookups += lookups_per_find
            elif check == "never_arrived":
                lookups += 1
        return KitPlan(
            contract=self.contract.name,
            version=self.contract.version,
            safety=self.safety,
            target=self.target,
            effect_requests=effect,
            lookups=lookups,
        )

    # --- running -------------------------------------------------------------------

    def _urls(self) -> list[str]:
        if self.contract.adapter == "mcp":
            assert self.contract.upstream is not None
            assert self.contract.upstream.url is not None
            return [self.contract.upstream.url]
        options = self.contract.adapter_options
        urls = [str(options.get("url", ""))]
        if options.get("probe_url"):
            urls.append(str(options["probe_url"]))
        return urls

    def _is_effect(self, method: str, path: str, body: bytes) -> bool:
        if self.contract.adapter == "http":
            wanted = str(self.contract.adapter_options.get("method", "POST")).upper()
            return method == wanted and method != "GET"
        assert self.contract.upstream is not None
        return _calls_tool(method, body, self.contract.upstream.tool)

    def _is_lookup(self, method: str, path: str, body: bytes) -> bool:
        assert self.contract.upstream is not None
        lookup = self.contract.upstream.lookup_tool
        return lookup is not None and _calls_tool(method, body, lookup)

    @contextmanager
    def _wrapped(self) -> Iterator[EffectAdapter]:
        upstream = self.contract.upstream
        assert upstream is not None
        with tempfile.TemporaryDirectory(prefix="eb-conform-") as control:
            faults = StdioFaults(Path(control))
            self.proxies = [faults]
            self._effect_proxy = faults
            command = faults.wrap(upstream.command, upstream.tool, upstream.lookup_tool)
            contract = replace(self.contract, upstream=replace(upstream, command=command))
            adapter = self._factory(contract)
            try:
                yield adapter
            finally:
                close = getattr(adapter, "close", None)
                if callable(close):
                    close()
                faults.freeze()

    @contextmanager
    def _proxied(self) -> Iterator[EffectAdapter]:
        if self.stdio:
            with self._wrapped() as adapter:
                yield adapter
            return
        with ExitStack() as stack:
            by_origin: dict[str, FaultProxy] = {}
            for url in self._urls():
                origin = origin_of(url)
                if origin not in by_origin:
                    by_origin[origin] = stack.enter_context(
                        FaultProxy(
                            origin,
                            self._is_effect,
                            is_lookup=self._is_lookup
                            if self.contract.adapter == "mcp"
                            else None,
                        )
                    )
            self.proxies = list(by_origin.values())
            first = self._urls()[0]
            self._effect_proxy = by_origin[origin_of(first)]
            contract = self._rewritten(by_origin)
            adapter = self._factory(contract)
            close = getattr(adapter, "close", None)
            if callable(close):
                stack.callback(close)
            yield adapter

    def _rewritten(self, by_origin: Mapping[str, FaultProxy]) -> EffectContract:
        def through(url: str) -> str:
            return by_origin[origin_of(url)].rewrite(url)

        if self.contract.adapter == "mcp":
            assert self.contract.upstream is not None
            assert self.contract.upstream.url is not None
            upstream = replace(
                self.contract.upstream, url=through(self.contract.upstream.url)
            )
            return replace(self.contract, upstream=upstream)
        options = dict(self.contract.adapter_options)
        options["url"] = through(str(options["url"]))
        if options.get("probe_url"):
            options["probe_url"] = through(str(options["probe_url"]))
        return replace(self.contract, adapter_options=options)

    def run(self) -> list[KitRow]:
        """Every check, in order; one row each."""
        rows = []
        reasons = self.applicable()
        with self._proxied() as adapter:
            self.adapter = adapter
            for check, promise in CHECKS:
                reason = reasons[check]
                if reason is not None:
                    rows.append(KitRow(check, promise, "n/a", reason))
                    continue
                try:
                    evidence = getattr(self, f"check_{check}")()
                except _Fail as failure:
                    rows.append(KitRow(check, promise, "FAIL", str(failure)))
                except _NotApplicable as skip:
                    rows.append(KitRow(check, promise, "n/a", str(skip)))
                else:
                    rows.append(KitRow(check, promise, "pass", evidence))
                finally:
                    # A fault armed for a request that never reached the proxy must
                    # not fall on the next check's first request.
                    self._proxy.disarm()
        return rows

    def effect_requests_forwarded(self) -> int:
        """Effect requests that reached the target in the last run."""
        return sum(p.effect_requests_forwarded() for p in self.proxies)

    def lookups_forwarded(self) -> int:
        """Lookups (and any other request) that reached the target in the last run."""
        return sum(p.other_requests for p in self.proxies)

    # --- helpers -----------------------------------------------------------------------

    @property
    def _proxy(self) -> FaultProxy | StdioFaults:
        assert self._effect_proxy is not None
        return self._effect_proxy

    def _new_effect(self, arguments: Mapping[str, object] | None = None) -> EffectRecord:
        operation_key = f"conform:{uuid.uuid4().hex}"
        key = derive_downstream_key(_TENANT_KEY, _TENANT_ID, operation_key)
        return make_effect_record(
            self.contract,
            operation_key,
            arguments or self.arguments,
            key,
            tenant_id=_TENANT_ID,
        )

    def _dispatch(
        self, effect: EffectRecord, arguments: Mapping[str, object] | None = None
    ) -> DispatchResult:
        assert self.adapter is not None
        return self.adapter.dispatch(
            DispatchRequest(
                effect=effect,
                arguments=dict(arguments or self.arguments),
                attempt_id=str(uuid.uuid4()),
                contract=self.adapter.contract,
                gate=LimitGate(self.attempt_limit),
            )
        )

    def _ready(self) -> None:
        """Start (or ping) a stdio server before an attempt or a lookup, so its start
        is not spent from the attempt's limit; ``_Fail`` (inconclusive) when it does
        not start."""
        warm_up = getattr(self.adapter, "warm_up", None)
        if not callable(warm_up):
            return
        # Each try is bounded by connect_timeout and proved nothing was sent: the
        # broker would retry it up to retry_limit times, and so does the kit (a start
        # on a loaded host can overrun once). A server that used up its tries gets
        # one per later use: every check still says why, without the full wait.
        tries = 1 if self._start_failed else self.contract.retry_limit + 1
        for tried in range(1, tries + 1):
            try:
                warm_up()
            except AdapterError as exc:
                if tried < tries:
                    continue
                self._start_failed = True
                raise _inconclusive(
                    f"{exc} (tries: {tried}), before the check's request was sent"
                ) from exc
            self._start_failed = False
            return

    def _attempt(
        self, effect: EffectRecord, arguments: Mapping[str, object] | None = None
    ) -> DispatchResult | AdapterError:
        self._ready()
        try:
            return self._dispatch(effect, arguments)
        except AdapterError as exc:
            return exc

    def _reached(self, start: int, outcome: DispatchResult | AdapterError) -> Exchange:
        """The exchange of the attempt made after ``start`` exchanges; ``_Fail``
        (inconclusive) when it never reached the proxy."""
        exchanges = self._proxy.exchanges
        if len(exchanges) > start:
            return exchanges[start]
        raise _inconclusive(
            f"the request never reached the target (the adapter said "
            f"{self._said(outcome)})"
        )

    def _probe(self, effect: EffectRecord) -> ProbeResult:
        assert self.adapter is not None
        self._ready()
        return self.adapter.probe(
            ProbeRequest(
                effect=effect, arguments=self.arguments, contract=self.adapter.contract
            )
        )

    def _answer_id(self, answer: Answer) -> str | None:
        """The external id the target named in ``answer`` (None if it named none)."""
        if not 200 <= answer.status <= 299:
            return None
        document = _document(answer)
        if document is None:
            return None
        if self.contract.adapter == "mcp":
            from effect_broker.adapters.mcp_answers import external_id_of_rpc

            assert self.contract.upstream is not None
            return external_id_of_rpc(document, self.contract.upstream)
        from effect_broker.adapters.http_adapter import _external_id

        field = str(self.contract.adapter_options.get("external_id_field", "id"))
        return _external_id(document, field)

    def _ids(self, exchanges: list[Exchange]) -> list[str | None]:
        return [self._answer_id(a) for e in exchanges for a in e.answers]

    def _kind(self, answer: Answer) -> tuple[str, str | None]:
        """What an answer says: ``committed`` (with its id, if it names one),
        ``already`` (this key already took effect: ``already_done``) or ``error``."""
        if self.contract.adapter == "mcp":
            from effect_broker.adapters.mcp_answers import read_answer

            upstream = self.contract.upstream
            assert upstream is not None
            document = _document(answer) if 200 <= answer.status <= 299 else None
            if document is None:
                return "error", None
            try:
                result = types.CallToolResult.model_validate(document.get("result"))
            except ValidationError:
                return "error", None
            if upstream.answer is not None:
                read = read_answer(result, upstream.answer, upstream.external_id_field)
                if read.meaning == "already_done":
                    return "already", read.external_id
                if read.meaning == "committed" or (
                    read.meaning == "other" and not result.is_error
                ):
                    return "committed", read.external_id
                return "error", None
            if result.is_error:
                return "error", None
            from effect_broker.adapters.mcp_answers import external_id_of_rpc

            return "committed", external_id_of_rpc(document, upstream)
        if 200 <= answer.status <= 299 and _document(answer) is not None:
            return "committed", self._answer_id(answer)
        return "error", None

    @staticmethod
    def _said(outcome: DispatchResult | AdapterError) -> str:
        if isinstance(outcome, DispatchResult):
            return f"committed ({outcome.external_id})"
        return f"{type(outcome).__name__}: {outcome}"

    def _find(self, effect: EffectRecord, expected: str | None, since: float) -> str:
        """Poll the lookup until it finds ``effect`` (within the settlement bound
        from ``since``, plus a grace); the evidence, or ``_Fail``."""
        deadline = since + (self._settlement() + LOOKUP_GRACE).total_seconds()
        last: ProbeResult | None = None
        polls = 0
        while polls < self._max_polls():
            polls += 1
            last = self._probe(effect)
            if last.status is ProbeStatus.COMMITTED:
                took = time.monotonic() - since
                if expected is not None and last.external_id != expected:
                    raise _Fail(
                        f"the lookup found {last.external_id!r}, but the target "
                        f"answered the request with {expected!r}"
                    )
                return f"lookup found {last.external_id} after {took:.1f}s"
            if time.monotonic() >= deadline:
                break
            time.sleep(self._poll_interval())
        status = last.status.value if last else "nothing"
        bound = self._settlement().total_seconds()
        raise _Fail(
            f"the target committed {expected or 'the request'} but its lookup "
            f"answered {status} for {time.monotonic() - since:.1f}s "
            f"(settlement_bound {bound:g}s)"
        )

    # --- checks ------------------------------------------------------------------------

    def check_answers(self) -> str:
        """A plain request is answered as committed, with an external id."""
        effect = self._new_effect()
        outcome = self._attempt(effect)
        if isinstance(outcome, DispatchResult):
            if not outcome.external_id:
                return (
                    "answered committed, with no external id at "
                    f"'{self._external_id_field()}' (the effect is named by its key)"
                )
            return f"answered {outcome.external_id}"
        if isinstance(outcome, OutcomeUnknownError):
            raise _Fail(
                f"a plain request was answered {outcome}: the broker would hold every "
                "effect of this contract as unknown"
            )
        # Refused: it must have left nothing.
        if self.has_lookup:
            time.sleep(self._settlement().total_seconds())
            found = self._probe(effect)
            if found.status is ProbeStatus.COMMITTED:
                raise _Fail(
                    f"the adapter read the answer as refused ({outcome}), but the "
                    f"lookup finds {found.external_id}: the refused request left an "
                    "effect"
                )
        raise _Fail(f"a plain request was refused: {outcome}")

    def _external_id_field(self) -> str:
        if self.contract.adapter == "mcp":
            assert self.contract.upstream is not None
            return self.contract.upstream.external_id_field
        return str(self.contract.adapter_options.get("external_id_field", "id"))

    def check_same_key_one_effect(self) -> str:
        """One request delivered twice by the network, then resent by the broker."""
        effect = self._new_effect()
        start = len(self._proxy.exchanges)
        self._proxy.arm("twice")
        self._attempt(effect)
        self._attempt(effect)
        exchanges = self._proxy.exchanges[start:]
        kinds = [self._kind(a) for e in exchanges for a in e.answers]
        sent = sum(e.forwarded for e in exchanges)
        if sent < 2 or not kinds:
            # Fewer than two requests (or no answer) under the key test nothing: they
            # must not read as "made 1 effect".
            raise _inconclusive(
                f"{sent} request(s) under one key reached the target, with "
                f"{len(kinds)} answer(s)"
            )
        errors = [k for k in kinds if k[0] == "error"]
        if errors:
            raise _Fail(
                f"{len(errors)} of {sent} requests under one key were not answered as "
                "committed: "
                + "; ".join(f"HTTP {a.status}" for e in exchanges for a in e.answers)
            )
        distinct = sorted({i for kind, i in kinds if kind == "committed" and i})
        unnamed = sum(1 for kind, i in kinds if kind == "committed" and not i)
        if len(distinct) > 1:
            raise _Fail(
                f"{sent} requests under one key made {len(distinct)} effects "
                f"({', '.join(distinct)})"
            )
        if unnamed > 1 or (unnamed and distinct):
            raise _Fail(
                f"{sent} requests under one key were answered as "
                f"{unnamed + len(distinct)} new commits, naming no id: one effect "
                "cannot be proved"
            )
        already = sum(1 for kind, _ in kinds if kind == "already")
        name = distinct[0] if distinct else "named by its key"
        tail = f"; {already} answered already done" if already else ""
        return f"{sent} requests under one key made 1 effect ({name}){tail}"

    def _lost_then_found(self, fault: Literal["lose_answer", "slow"]) -> str:
        effect = self._new_effect()
        start = len(self._proxy.exchanges)
        self._proxy.arm(fault, hold=self.attempt_limit + 1.0)
        sent_at = time.monotonic()
        outcome = self._attempt(effect)
        exchange = self._reached(start, outcome)
        kinds = [self._kind(a) for a in exchange.answers]
        what = "lost" if fault == "lose_answer" else "held past the attempt limit"
        if not kinds or kinds[0][0] == "error":
            answers = ", ".join(f"HTTP {a.status}" for a in exchange.answers)
            raise _Fail(f"the target's answer named no effect ({answers or 'none'})")
        first = kinds[0][1]
        named = first or "(committed, no id)"
        if not isinstance(outcome, OutcomeUnknownError):
            raise _Fail(
                f"the target answered {named} ({what}), and the adapter said "
                f"{self._said(outcome)}: only unknown is honest"
            )
        if self.safety is SafetyClass.UNSAFE:
            return f"answer {named} {what}; the adapter said unknown"
        if self.safety is SafetyClass.IDEMPOTENT:
            resend = self._attempt(effect)
            if not isinstance(resend, DispatchResult):
                raise _Fail(
                    f"answer {named} {what}; the resend under the same key was "
                    f"{self._said(resend)}"
                )
            if "already_done" in resend.output:
                return (
                    f"answer {named} {what}; the adapter said unknown; resend: "
                    f"already done ({resend.output['already_done']})"
                )
            if first is None or resend.external_id != first:
                raise _Fail(
                    f"answer {named} {what}; the resend under the same key answered "
                    f"{resend.external_id or 'a new commit'}: 2 requests under one key "
                    "made 2 effects"
                )
            return f"answer {first} {what}; the adapter said unknown; resend: {first}"
        found = self._find(effect, first, sent_at)
        return f"answer {named} {what}; the adapter said unknown; {found}"

    def check_lost_answer(self) -> str:
        """The proxy loses the answer after the target committed."""
        return self._lost_then_found("lose_answer")

    def check_slow_answer(self) -> str:
        """The proxy holds the answer past the attempt's time limit."""
        return self._lost_then_found("slow")

    def check_never_arrived(self) -> str:
        """The connection is reset before the request reached the target."""
        effect = self._new_effect()
        start = len(self._proxy.exchanges)
        self._proxy.arm("reset")
        outcome = self._attempt(effect)
        exchange = self._reached(start, outcome)
        if exchange.forwarded:  # pragma: no cover - the proxy never forwards a reset
            raise _Fail("the proxy forwarded a request it was to reset")
        if isinstance(outcome, DispatchResult):
            raise _Fail(
                f"the request never reached the target, yet the adapter said "
                f"{self._said(outcome)}"
            )
        time.sleep((self._settlement() + LOOKUP_GRACE).total_seconds())
        probe = self._probe(effect)
        if probe.status is ProbeStatus.NOT_COMMITTED:
            return (
                f"reset before arrival (adapter: {type(outcome).__name__}); after the "
                "settlement bound the lookup answered not_committed"
            )
        if probe.status is ProbeStatus.COMMITTED:
            raise _Fail(
                f"a request that never reached the target was found by the lookup "
                f"({probe.external_id}): the lookup does not look up the key"
            )
        raise _Fail(
            f"after the settlement bound the lookup could not answer "
            f"({dict(probe.evidence or {})}) for a request that never arrived"
        )

    def check_drift_refused(self) -> str:
        """Same key, other payload: refused, and it left nothing."""
        effect = self._new_effect()
        first = self._attempt(effect)
        if not isinstance(first, DispatchResult):
            raise _Fail(f"the original request was {self._said(first)}")
        drifted = make_effect_record(
            self.contract,
            effect.operation_key,
            self.drift_arguments,
            effect.downstream_key,
            tenant_id=_TENANT_ID,
        )
        refused = self._attempt(drifted, self.drift_arguments)
        if not isinstance(refused, TerminalAdapterError):
            raise _Fail(
                f"the same key with another payload was {self._said(refused)}, not "
                "refused"
            )
        again = self._attempt(effect)
        same = isinstance(again, DispatchResult) and (
            "already_done" in again.output
            or (again.external_id is not None and again.external_id == first.external_id)
        )
        if not same:
            raise _Fail(
                f"after the refused drift, the original resent under its key was "
                f"{self._said(again)}, not {first.external_id}: the refusal left "
                "something"
            )
        return f"refused ({refused}); the original's key still names {first.external_id}"


def rows_passed(rows: list[KitRow]) -> bool:
    """True when no check failed."""
    return all(row.outcome != "FAIL" for row in rows)


__all__ = [
    "CHECKS",
    "ConformanceKit",
    "KitPlan",
    "KitRow",
    "LimitGate",
    "rows_passed",
]
