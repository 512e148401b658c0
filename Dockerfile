# The broker's image: the API by default; the same image runs the worker, the
# reconciler, migrations and the demo target (docker-compose.yml). Not built in this
# project's CI machines (no Docker engine); the hosted workflow builds it.

# --- build: the wheel of this project and of everything it needs -------------------
FROM python:3.11.14-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY effect_broker ./effect_broker
COPY config ./config
COPY examples ./examples
# One top-level package: config/ and examples/ travel inside it (pyproject.toml).
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[stripe]"

# --- runtime: no compiler, no sources, not root -------------------------------------
FROM python:3.11.14-slim-bookworm
RUN useradd --create-home --uid 10001 broker
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels "effect-broker[stripe]" \
    && rm -rf /wheels
ENV EFFECT_BROKER_ENV=production \
    PYTHONUNBUFFERED=1 \
    EFFECT_BROKER_STATE_DIR=/home/broker \
    EFFECT_BROKER_STATIC_ROOT=/home/broker/static
# The admin's CSS and /docs' Swagger UI, gathered once at build time (WhiteNoise
# serves them). Throwaway settings: production refuses to start without them, and
# collectstatic contacts no database.
RUN DATABASE_URL=postgresql://build@localhost/unused \
    SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
    EFFECT_BROKER_MASTER_KEY="$(python -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')" \
    effect-broker collectstatic --noinput --verbosity 0
USER broker
WORKDIR /home/broker
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"
CMD ["effect-broker", "serve", "--host", "0.0.0.0", "--port", "8000"]
