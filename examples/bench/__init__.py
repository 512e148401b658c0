"""``effect-broker bench``: the broker's overhead and scale, side by side with its floors
(a bare durable INSERT, a bare procrastinate job) and what users write today (a
hand-rolled Django idempotency table, agent-ledger), measured in one run on one server.
See docs/benchmarks.md.
"""
