# runyard Python base for machines without a registry: metadata on top of the Debian rootfs
# that scripts/platform-image.d/base makes with debootstrap and `docker import`s as
# ROOTFS_IMAGE (not a pullable image). Plays the role of python:3.11-slim for ./Dockerfile.
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE}
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
CMD ["python3"]
