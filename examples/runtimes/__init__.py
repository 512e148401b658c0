"""Recipes: one order charged through the broker from DBOS, LangGraph, Celery and
Temporal (docs/how-to/runtime-*.md). Each imports its runtime; the effect_broker
package imports none of them."""
