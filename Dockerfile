# ksi container image.
#
# NOT exercised by the tests or CI: this machine has no Docker engine, so this file has never been
# built here. It is kept small and plain on purpose; check it by hand after changing it:
#
#   docker build -t ksi .
#   docker run --rm -p 9192-9200:9192-9200 -p 9404:9404 \
#       -v "$PWD/ksi.toml:/etc/ksi/ksi.toml:ro" ksi
#
# The config is mounted, not baked in: start from examples/ksi.toml, and inside a container set
# proxy.listen = "0.0.0.0:9192", proxy.advertised_host to the name clients use to reach the container,
# and metrics.listen = "0.0.0.0:9404". An SQLite catalog belongs under /var/lib/ksi (mount a volume).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# .dockerignore keeps the context to the package sources and pyproject.toml
COPY . /src
RUN pip install /src \
 && rm -rf /src \
 && useradd --system --uid 10001 --home-dir /var/lib/ksi --create-home ksi \
 && mkdir -p /etc/ksi

USER ksi
WORKDIR /var/lib/ksi

# 9192: bootstrap (proxy.listen); 9193-9200: one port per upstream broker (proxy.broker_port_base
# upwards); 9404: Prometheus /metrics (metrics.listen)
EXPOSE 9192-9200 9404

ENTRYPOINT ["ksi"]
CMD ["serve", "--config", "/etc/ksi/ksi.toml"]
