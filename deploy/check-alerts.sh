#!/usr/bin/env bash
# Checks the Prometheus alerting rules (deploy/alerts.yml) and runs their unit tests
# (deploy/alerts_test.yml) with promtool, and checks the compose stack's Prometheus config that
# loads them (deploy/prometheus.yml). Run by deploy/compose-test.sh (CI).
#
# promtool comes from Debian's `prometheus` package: installed here when missing (as root, or
# through sudo), quietly; a machine without apt-get or promtool is a failure, never a skip.
set -euo pipefail
DEPLOY="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fail() { echo "check-alerts: FAIL: $*" >&2; exit 1; }

if ! command -v promtool >/dev/null; then
    command -v apt-get >/dev/null || fail "promtool not found and no apt-get to install it (Debian package 'prometheus')"
    SUDO=()
    [[ $(id -u) -eq 0 ]] || SUDO=(sudo -n)
    export DEBIAN_FRONTEND=noninteractive
    echo "check-alerts: installing promtool (apt-get install prometheus)"
    log="$(mktemp)"
    { "${SUDO[@]}" apt-get update -qq && "${SUDO[@]}" apt-get install -y -qq --no-install-recommends prometheus; } \
        >"$log" 2>&1 || { cat "$log" >&2; fail "apt-get install prometheus failed"; }
    rm -f "$log"
    command -v promtool >/dev/null || fail "the prometheus package installed no promtool"
fi
promtool check rules "$DEPLOY/alerts.yml"
promtool test rules "$DEPLOY/alerts_test.yml"
promtool check config "$DEPLOY/prometheus.yml"
