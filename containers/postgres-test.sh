#!/usr/bin/env bash
# A throwaway PostgreSQL server for phyfarm's store tests, from Debian's
# packages, listening on loopback only. Idempotent.
#
#   containers/postgres-test.sh start   # install if needed, start, print the URL
#   containers/postgres-test.sh url     # print the URL of the running server
#   containers/postgres-test.sh stop    # stop it (the cluster is kept for next time)
#   containers/postgres-test.sh wipe    # stop it and delete the cluster
#
# `make unit` runs `start`, passes the URL to `cargo test` as
# PHYFARM_TEST_POSTGRES and runs `stop` afterwards, pass or fail. Only the
# URL goes to stdout; progress goes to stderr as I:/E: lines.
#
# State lives in ${PHYFARM_CACHE:-$XDG_CACHE_HOME/phyfarm}/pg: the password
# (mode 600) and the port. The server's own files (cluster/, run/ for the
# unix socket, server.log) live there too, unless the server's user cannot
# reach that directory (as root, HOME is usually /root, mode 700): then they
# live in /tmp/phyfarm-pg-<hash>, said on stderr. As root the server runs as the `postgres` user (PostgreSQL refuses
# to run as root); otherwise as the caller.
set -euo pipefail

cache=${PHYFARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/phyfarm}
state="$cache/pg"
port_base=${PHYFARM_PG_PORT:-55432}
db=phyfarm_test
role=phyfarm

die() { echo "E: postgres-test: $*" >&2; exit 2; }
say() { echo "I: postgres-test: $*" >&2; }

as_server=()
if [ "$(id -u)" -eq 0 ]; then
  as_server=(runuser -u postgres --)
fi

bindir() {
  local d
  d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n1)
  [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

install_postgres() {
  bindir >/dev/null && return 0
  local sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "PostgreSQL is not installed and there is no sudo: apt-get install postgresql as root"
    sudo_cmd=(sudo)
  fi
  say "installing Debian's postgresql"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq || die "apt-get update failed: is the package mirror reachable?"
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends postgresql >/dev/null \
    || die "apt-get install postgresql failed"
  bindir >/dev/null || die "postgresql installed but no /usr/lib/postgresql/*/bin/initdb"
}

# The server's directory: the cache when the server's user can reach it.
server_dir() {
  if [ ${#as_server[@]} -eq 0 ] || "${as_server[@]}" test -x "$state" 2>/dev/null; then
    echo "$state"
  else
    echo "/tmp/phyfarm-pg-$(printf '%s' "$state" | sha256sum | cut -c1-12)"
  fi
}
cluster_dir() { echo "$(server_dir)/cluster"; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

url() {
  [ -f "$state/port" ] && [ -f "$state/password" ] || return 1
  printf 'postgresql://%s:%s@127.0.0.1:%s/%s\n' \
    "$role" "$(cat "$state/password")" "$(cat "$state/port")" "$db"
}

running() {
  local dir
  dir=$(cluster_dir)
  [ -f "$dir/PG_VERSION" ] && "${as_server[@]}" "$bin/pg_ctl" status -D "$dir" >/dev/null 2>&1
}

start() {
  install_postgres
  bin=$(bindir)
  mkdir -p "$state"
  chmod 755 "$state"
  local dir srv
  srv=$(server_dir)
  dir="$srv/cluster"
  if [ "$srv" != "$state" ]; then
    say "the postgres user cannot reach $state; the server's files live in $srv"
    mkdir -p "$srv"
    chmod 700 "$srv"
    chown postgres: "$srv"
  fi
  if running; then
    say "already running: $(url | sed 's/:[^:@]*@/:***@/')"
    url
    return 0
  fi
  local version
  version=$(basename "$(dirname "$bin")")
  if [ -f "$dir/PG_VERSION" ] && [ "$(cat "$dir/PG_VERSION")" != "$version" ]; then
    say "cluster $dir is from PostgreSQL $(cat "$dir/PG_VERSION"), not $version: recreating it"
    rm -rf "$dir"
  fi
  if [ -f "$dir/PG_VERSION" ] && [ ! -s "$state/password" ]; then
    say "cluster $dir has no password in $state: recreating it"
    rm -rf "$dir"
  fi
  if [ ! -f "$dir/PG_VERSION" ]; then
    say "initialising a PostgreSQL $version cluster in $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=\n' > "$state/password")
    local pwfile
    pwfile=$(mktemp)
    cp "$state/password" "$pwfile"
    if [ ${#as_server[@]} -gt 0 ]; then
      chown postgres: "$dir" "$pwfile"
    fi
    chmod 700 "$dir"
    "${as_server[@]}" "$bin/initdb" -D "$dir" -U postgres --pwfile="$pwfile" \
      --auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 \
      >"$state/initdb.log" 2>&1 || { rm -f "$pwfile"; die "initdb failed: see $state/initdb.log"; }
    rm -f "$pwfile"
    # Loopback only; connections from elsewhere are refused by pg_hba too.
    printf '%s\n' "local all all scram-sha-256" \
      "host all all 127.0.0.1/32 scram-sha-256" \
      "host all all ::1/128 scram-sha-256" | "${as_server[@]}" tee "$dir/pg_hba.conf" >/dev/null
  fi
  mkdir -p "$srv/run"
  touch "$srv/server.log"
  [ ${#as_server[@]} -eq 0 ] || chown postgres: "$srv/run" "$srv/server.log"
  local port=$port_base
  while ! port_free "$port"; do
    port=$((port + 1))
    [ "$port" -lt $((port_base + 100)) ] || die "no free port in $port_base..$((port_base + 99))"
  done
  echo "$port" > "$state/port"
  say "starting the server on 127.0.0.1:$port (log: $srv/server.log)"
  # A test server: durability off, loopback only, sockets in the cache.
  "${as_server[@]}" "$bin/pg_ctl" start -D "$dir" -w -t 60 -l "$srv/server.log" \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$srv/run \
        -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100" \
    >/dev/null || die "the server did not start: see $srv/server.log"
  local pw
  pw=$(cat "$state/password")
  # The test role may create schemas and roles in its own database, no more.
  PGPASSWORD=$pw "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres \
    -v role="$role" -v db="$db" -v pw="$pw" >/dev/null 2>"$state/setup.log" <<'SQL' \
    || die "creating the role and database failed: see $state/setup.log"
SELECT format('CREATE ROLE %I LOGIN CREATEROLE PASSWORD %L', :'role', :'pw')
  WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'role', :'pw') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'role')
  WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db') \gexec
SQL
  url
}

stop() {
  bin=$(bindir) || { say "PostgreSQL is not installed; nothing to stop"; return 0; }
  local dir
  dir=$(cluster_dir)
  if running; then
    "${as_server[@]}" "$bin/pg_ctl" stop -D "$dir" -m fast -w >/dev/null
    say "stopped the server in $dir"
  else
    say "no server running in $dir"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url)
    bin=$(bindir) || die "PostgreSQL is not installed"
    running || die "no server running: containers/postgres-test.sh start"
    url
    ;;
  wipe)
    stop
    rm -rf "$(server_dir)" "$state"
    say "deleted the cluster"
    ;;
  *)
    echo "usage: $0 start|url|stop|wipe" >&2
    exit 2
    ;;
esac
