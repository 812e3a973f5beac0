# The costline CLI and worker as an image; docker-compose.yml runs it beside Kafka and Redis.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY . /src
RUN pip install /src \
    && rm -rf /src \
    && useradd --system --create-home --home-dir /var/lib/costline --uid 10001 costline

# The worker keeps its local table data in the working directory.
WORKDIR /var/lib/costline
USER costline
EXPOSE 6066

HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=4 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('COSTLINE_WEB_PORT', '6066') + '/healthz', timeout=4)"]

ENTRYPOINT ["costline"]
CMD ["worker"]
