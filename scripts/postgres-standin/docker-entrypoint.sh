#!/bin/sh
# Entry point of the runyard Postgres stand-in image (scripts/postgres-standin/build).
# Honours the official postgres image's variables: POSTGRES_USER (default postgres),
# POSTGRES_PASSWORD (required unless POSTGRES_HOST_AUTH_METHOD=trust), POSTGRES_DB
# (default: the user), POSTGRES_HOST_AUTH_METHOD (default scram-sha-256),
# POSTGRES_INITDB_ARGS, PGDATA (default /var/lib/postgresql/data). Not supported:
# /docker-entrypoint-initdb.d, *_FILE secrets.
# The cluster is UTF8 with locale C (a minbase rootfs has no other locales), listens on
# '*':5432, requires a password for every TCP connection, trusts the unix socket, logs to
# stderr like the official image ("database system is ready to accept connections") and
# runs as the postgres user.
set -eu

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

# `docker run IMAGE -c foo=bar` means `postgres -c foo=bar`, as in the official image.
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
    set -- postgres "$@"
fi

if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chmod 00700 "$PGDATA" || true
    chmod 03775 /var/run/postgresql || true
    if [ "$(stat -c %U "$PGDATA")" != postgres ]; then
        chown -R postgres:postgres "$PGDATA"
    fi
    chown postgres:postgres /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_USER:=postgres}"
    : "${POSTGRES_DB:=$POSTGRES_USER}"
    : "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
        cat >&2 <<'MSG'
Error: Database is uninitialized and superuser password is not specified.
       You must specify POSTGRES_PASSWORD to a non-empty value for the
       superuser. For example, "-e POSTGRES_PASSWORD=password" on "docker run".
MSG
        exit 1
    fi
    mkdir -p "$PGDATA"
    chmod 00700 "$PGDATA" || true

    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    # shellcheck disable=SC2086  # POSTGRES_INITDB_ARGS is word-split on purpose, as upstream
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" -E UTF8 --locale=C \
        --auth-local=trust --auth-host="$POSTGRES_HOST_AUTH_METHOD" \
        ${POSTGRES_INITDB_ARGS:-} -D "$PGDATA"
    rm -f "$pwfile"

    printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
    cat >>"$PGDATA/postgresql.conf" <<'CONF'

# runyard stand-in
listen_addresses = '*'
jit = off
CONF

    if [ "$POSTGRES_DB" != postgres ]; then
        db=$(printf '%s' "$POSTGRES_DB" | sed 's/"/""/g')
        echo "CREATE DATABASE \"$db\";" \
            | postgres --single -D "$PGDATA" -c listen_addresses='' -c jit=off postgres >/dev/null
        echo "CREATE DATABASE"
    fi
    echo
    echo 'PostgreSQL init process complete; ready for start up.'
    echo
fi

exec "$@"
