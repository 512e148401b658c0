"""The only code that writes ledger tables: reserve, fenced transitions, attempts,
receipts and events. Reads that must be tenant-scoped live here too."""

from effect_broker.store.ledger import (
    AttemptOutcome,
    NewIntent,
    ReceiptData,
    close_attempt,
    insert_receipt,
    record_stale_write,
    reserve,
    start_attempt,
    touch,
    transition,
)
from effect_broker.store.reads import (
    get_effect,
    list_effects,
    load_arguments,
    load_effect_for_worker,
    load_events,
    verify_event_chain,
)

__all__ = [
    "AttemptOutcome",
    "NewIntent",
    "ReceiptData",
    "close_attempt",
    "get_effect",
    "insert_receipt",
    "list_effects",
    "load_arguments",
    "load_effect_for_worker",
    "load_events",
    "record_stale_write",
    "reserve",
    "start_attempt",
    "touch",
    "transition",
    "verify_event_chain",
]
