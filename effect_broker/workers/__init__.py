"""Running procrastinate workers so that they outlive the database (issue 11).

``supervision`` keeps one procrastinate worker running in this process: when the worker
stops without being asked to (procrastinate stops it when its listener cannot
reconnect, procrastinate #1116), it waits with backoff until the database answers and
runs it again. The management commands ``worker`` and ``reconciler`` are its CLI.
"""
