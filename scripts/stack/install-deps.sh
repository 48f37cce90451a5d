#!/usr/bin/env bash
# Install Prometheus and Alertmanager from Debian's packages, if missing.
#
#   prometheus              -> /usr/bin/prometheus, /usr/bin/promtool   (2.42.0 on bookworm)
#   prometheus-alertmanager -> /usr/bin/prometheus-alertmanager         (0.25.0 on bookworm)
#
# The native stack (scripts/stack/stack.py) starts its own instances on free
# loopback ports; the packaged system services must not run, or they would hold
# the default ports 9090/9093. Debian's maintainer scripts start services via
# invoke-rc.d, which asks /usr/sbin/policy-rc.d: when that file does not exist
# we create a "deny everything" one for the duration of the install and remove
# it afterwards. (Without systemd as PID 1 nothing would start anyway.)
#
# Not root and packages missing: print what to run and exit 0, so that a
# developer machine without sudo still gets a clear message instead of a
# failure here (the tests then skip or fail with their own message).
set -euo pipefail

log() { printf '[install-deps.sh] %s\n' "$*" >&2; }

missing=()
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)

if [ "${#missing[@]}" -eq 0 ]; then
  log "prometheus, promtool and alertmanager are installed:"
  log "  $(prometheus --version 2>&1 | head -n1)"
  log "  $( (prometheus-alertmanager --version 2>&1 || alertmanager --version 2>&1) | head -n1)"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  log "missing: ${missing[*]}; not root, so not installing them."
  log "install them with:  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}"
  exit 0
fi

command -v apt-get >/dev/null 2>&1 || { log "ERROR: missing ${missing[*]} and no apt-get on this machine"; exit 1; }

created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\n# temporary, created by otel-training install-deps.sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

log "installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"

# If a packaged service got started anyway (a real systemd), stop it: it would
# sit on 9090/9093 and confuse anyone pointing a browser at the defaults.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  for svc in prometheus prometheus-alertmanager; do
    if systemctl is-active --quiet "$svc" 2>/dev/null; then
      log "stopping and disabling the packaged $svc service"
      systemctl disable --now "$svc" || true
    fi
  done
fi

log "installed: $(prometheus --version 2>&1 | head -n1)"
log "installed: $(prometheus-alertmanager --version 2>&1 | head -n1)"
