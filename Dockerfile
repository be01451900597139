# The runyard platform image: one image, three services (runyard api | worker | reaper) plus
# the one-shot `runyard migrate` and `runyard keys create`.
#
#   With a registry:  docker build -t runyard/runyard:latest .     (or: docker compose build)
#   Without one:      scripts/platform-image   (same file; BASE = a Python 3.11 rootfs made
#                     from Debian packages, BUILD_BASE = that base + a wheelhouse built on
#                     the host with PIP_NO_INDEX/PIP_FIND_LINKS set, so no network is used)
#
# Two stages: `build` makes /opt/venv (pip install of this project and its dependencies);
# the runtime stage copies only that venv onto a clean BASE, so no sources, wheels, caches or
# build tools end up in the image. BASE must provide python3 with the venv module at the
# same path in both stages (a venv refers to its interpreter by absolute path).
ARG BASE=python:3.11-slim
ARG BUILD_BASE=${BASE}

FROM ${BUILD_BASE} AS build
LABEL io.runyard.stage=build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The dependencies first, in a layer of their own (cached until pyproject.toml or the SDK
# changes); runyard-client, the Python SDK the CLI uses, comes from this repository ...
COPY pyproject.toml README.md ./
COPY sdk/python ./sdk/python
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        >/tmp/requirements.txt \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install ./sdk/python -r /tmp/requirements.txt
# ... then the project itself.
COPY runyard ./runyard
COPY api ./api
COPY worker ./worker
COPY reaper ./reaper
COPY migrations ./migrations
RUN /opt/venv/bin/pip install . \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/runyard --help >/dev/null

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    RUNYARD_TOOLS_FILE=/app/tools/tools.toml RUNYARD_API_HOST=0.0.0.0
# uid 10001, no login, no home of its own: the API, the reaper and migrate run as this user.
# The worker needs the Docker socket; compose.yaml runs it as root (see there).
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /app \
        --shell /usr/sbin/nologin runyard
WORKDIR /app
COPY --from=build /opt/venv /opt/venv
COPY alembic.ini ./
COPY tools/tools.toml ./tools/tools.toml
# The sources of the example built tools (contexts are relative to the tools file).
COPY tools/examples ./tools/examples
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["runyard"]
CMD ["api"]
