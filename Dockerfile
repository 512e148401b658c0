# Production image: broker API (uvicorn) by default; the same image runs workers.
# Not built in this project's CI (its machines have no Docker engine); see README.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY effect_broker ./effect_broker
COPY config ./config
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 broker
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/* && rm -rf /wheels
USER broker
WORKDIR /home/broker
ENV DJANGO_SETTINGS_MODULE=config.settings \
    EFFECT_BROKER_ENV=production \
    PYTHONUNBUFFERED=1
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz').status == 200 else 1)"
CMD ["uvicorn", "config.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
