"""Metrics and traces of the broker (docs/observability.md).

- ``metrics``: the domain counters and histograms, counted where the work happens;
- ``collectors``: the ledger gauges (unknown count and age) read at scrape time;
- ``instrumentation``: the few hooks the services call (one or two lines each);
- ``tracing``: OpenTelemetry spans, carried from submit to the worker via the ledger;
- ``endpoint``: the API's ``/metrics``; ``worker_metrics``: a worker's own port;
- ``http_metrics`` / ``database``: django-prometheus's HTTP and query metrics.

This package imports nothing from Django at import time, so ``config.settings`` may
read its settings helpers (``settings_values``).
"""
