"""The Django project that hosts the effect_broker app."""
