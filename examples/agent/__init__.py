"""The demo agent (issue 10, item 7): a model loop that is a real MCP client of the
broker's server over stdio.

``providers`` holds the ``ModelProvider`` protocol and its three implementations
(``ScriptedProvider``, deterministic; ``OpenAIProvider`` and ``GrokProvider`` on the
official ``openai`` client). ``loop`` is the agent loop: it lists the broker's tools,
asks the model for the next step and delivers tool calls. ``demo`` is what
``effect-broker demo agent`` runs.

A model chooses *which* tool to call with *which* business arguments, nothing more:
the operation key, how often a call is delivered and when it is asked again are fixed
code in ``loop``, and the safety class is the contract's (the broker's), never the
model's.
"""
