"""effect-broker: a correctness boundary for side-effecting tool calls.

The public Python surface is small on purpose: submit a request, read an effect. See
docs/explanation/guarantees.md for the guarantees each safety class can and cannot give.
"""

__version__ = "0.1.0"
