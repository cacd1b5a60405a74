#!/usr/bin/env bash
# promtool for the alert-rule tests (tests/unit/test_alert_rules.py), without installing or
# starting Prometheus: `apt-get download` Debian's `prometheus` package (no root needed) and take
# only usr/bin/promtool out of it (dpkg-deb), into TARGET (default .venv/bin/promtool).
# Idempotent: nothing to do when TARGET already runs. A promtool already on PATH is linked instead.
set -euo pipefail
TARGET=${1:-.venv/bin/promtool}

if [ -x "$TARGET" ] && "$TARGET" --version >/dev/null 2>&1; then
    exit 0
fi
mkdir -p "$(dirname "$TARGET")"

if found=$(command -v promtool 2>/dev/null) && [ "$(realpath "$found")" != "$(realpath -m "$TARGET")" ]; then
    ln -sf "$found" "$TARGET"
    echo "promtool: linked $found -> $TARGET"
    exit 0
fi

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    echo "promtool: no apt-get/dpkg-deb here (not Debian?): put a promtool (Prometheus 2.x) on PATH" \
         "and run this again, or copy it to $TARGET" >&2
    exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
apt_opts=()
# as root apt drops to the _apt user, who cannot write into a private temp dir (only a warning)
[ "$(id -u)" = 0 ] && apt_opts=(-o APT::Sandbox::User=root)
download() { (cd "$tmp" && apt-get "${apt_opts[@]}" -q download prometheus >/dev/null); }
if ! download; then
    if [ "$(id -u)" = 0 ]; then          # a fresh image may have no package lists yet
        apt-get -q update >/dev/null && download
    else
        echo "promtool: 'apt-get download prometheus' failed; run 'sudo apt-get update' and retry" >&2
        exit 1
    fi
fi
deb=$(echo "$tmp"/prometheus_*.deb)
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" ./usr/bin/promtool
install -m 0755 "$tmp/usr/bin/promtool" "$TARGET"
echo "promtool: $("$TARGET" --version 2>&1 | head -1) -> $TARGET"
