"""Django app configuration."""

from django.apps import AppConfig


class EffectBrokerConfig(AppConfig):
    """The effect_broker Django app."""

    name = "effect_broker"
    verbose_name = "Effect broker"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Where a worker process boots (`effect-broker procrastinate worker` sets the
        # worker role before settings load): its metrics port, if one is configured,
        # and span export, if OTLP is configured. Both are no-ops elsewhere.
        from django.conf import settings
        from django.db.models.signals import post_migrate, pre_migrate

        from effect_broker.observability import tracing, worker_metrics
        from effect_broker.store import lock_waits

        # migrate runs without the sessions' statement and lock timeouts
        # (docs/explanation/workers.md); dispatch_uid: once, however many apps migrate.
        pre_migrate.connect(
            lock_waits.unbound_for_migrations, dispatch_uid="eb-unbound-migrations"
        )
        post_migrate.connect(
            lock_waits.rebound_after_migrations, dispatch_uid="eb-rebound-migrations"
        )

        worker_metrics.start_from_settings()
        tracing.configure_from_environment(
            f"effect-broker-{settings.EFFECT_BROKER_PROCESS_ROLE}"
        )
