"""Django app configuration."""

from django.apps import AppConfig


class EffectBrokerConfig(AppConfig):
    """The effect_broker Django app."""

    name = "effect_broker"
    verbose_name = "Effect broker"
    default_auto_field = "django.db.models.BigAutoField"
