#!/usr/bin/env bash
# Installs the Debian packages the tests start for real: PostgreSQL, PgBouncer
# (transaction pooling is what users run), pgbench (the benchmark baseline),
# libfaketime (the clock-skew tests run PostgreSQL with a clock hours off),
# Patroni and HAProxy (test/hapg: a highly available PostgreSQL that fails
# over), Prometheus with promtool (the metrics and alert tests), and zsh and
# fish (the CLI's completion scripts load in each shell they are for). Does
# nothing when everything is present.
set -euo pipefail

missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
ls /usr/lib/postgresql/*/bin/pgbench >/dev/null 2>&1 || missing+=(postgresql-client)
{ command -v pgbouncer || test -x /usr/sbin/pgbouncer; } >/dev/null 2>&1 || missing+=(pgbouncer)
ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing+=(libfaketime)
{ command -v patroni || test -x /usr/bin/patroni; } >/dev/null 2>&1 || missing+=(patroni)
{ command -v haproxy || test -x /usr/sbin/haproxy; } >/dev/null 2>&1 || missing+=(haproxy)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || missing+=(prometheus)
command -v zsh >/dev/null 2>&1 || missing+=(zsh)
command -v fish >/dev/null 2>&1 || missing+=(fish)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing Debian packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "need root to run: apt-get install -y ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq || true
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
