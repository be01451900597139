# The BUILD_BASE of ./Dockerfile's build stage on machines without a registry
# (scripts/platform-image): the Python base plus a wheelhouse of runyard's dependencies,
# built on the host by `pip wheel`, and pip told to use only that wheelhouse. Only the build
# stage uses it: the runtime stage starts again from the plain base, so no wheel ships.
ARG BASE
FROM ${BASE}
COPY wheels /wheels
ENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels
