#!/usr/bin/env bash
# Build the native otel-training stack binaries (no Docker needed):
#   * an OpenTelemetry Collector, built with the Collector Builder (ocb) from
#     collector-config/builder-config.yaml;
#   * Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger) from its Go module.
#
# Binaries are cached outside the repo, keyed by version (and, for the
# collector, by a hash of the manifest), so a fresh clone reuses them and a
# rebuild is skipped when the binary is present:
#   ${OTEL_TRAINING_CACHE:-$HOME/.cache/otel-training}/bin/
#
# Usage: scripts/stack/build.sh [all|collector|jaeger|paths]
#   all        (default) build whatever is missing
#   collector  only the collector
#   jaeger     only Jaeger
#   paths      print the cached binary paths (KEY=path), build nothing
#
# Environment:
#   OTEL_TRAINING_CACHE   cache root (default ~/.cache/otel-training)
#   OTEL_TRAINING_JAEGER_MODULE_VERSION  override the Jaeger module version
#   GOPROXY               taken from `go env GOPROXY` with ",direct" removed
#
# Cold builds take several minutes each on 2 cores (see docs/pipeline.md).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
MANIFEST="$REPO/collector-config/builder-config.yaml"

CACHE="${OTEL_TRAINING_CACHE:-$HOME/.cache/otel-training}"
BIN_DIR="$CACHE/bin"
BUILD_DIR="$CACHE/build"
LOG_DIR="$CACHE/logs"

# Jaeger: the module has no /v2 suffix, so v2.x tags cannot be requested from
# the module proxy. Jaeger tags every release twice on the same commit
# (v1.X.0 and v2.Y.0); v1.76.0 is the commit of v2.13.0 (2025-12-03), the
# newest Jaeger release our module proxy serves. Its go.mod carries a
# `replace` directive, so `go install ...@version` refuses it; we build it
# from a tiny wrapper module that repeats the replace directives instead.
JAEGER_MODULE="github.com/jaegertracing/jaeger"
JAEGER_MODULE_VERSION="${OTEL_TRAINING_JAEGER_MODULE_VERSION:-v1.76.0}"
JAEGER_V2_VERSION="2.13.0"   # the v2 tag on the same commit; the docker image tag

log() { printf '[build.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[build.sh] ERROR: %s\n' "$*" >&2; exit 1; }

manifest_version() {
  # dist.version: the collector version every core/contrib module is pinned to.
  sed -n 's/^  version: *\([0-9][0-9.]*\) *$/\1/p' "$MANIFEST" | head -n1
}

manifest_hash() {
  sha256sum "$MANIFEST" | cut -c1-12
}

OTELCOL_VERSION="$(manifest_version)"
[ -n "$OTELCOL_VERSION" ] || die "could not read dist.version from $MANIFEST"
OTELCOL_BIN="$BIN_DIR/otelcol-training-$OTELCOL_VERSION-$(manifest_hash)"
JAEGER_BIN="$BIN_DIR/jaeger-$JAEGER_V2_VERSION-$JAEGER_MODULE_VERSION"
BUILDER_BIN="$CACHE/tools/builder-v$OTELCOL_VERSION/builder"

print_paths() {
  echo "OTELCOL_BIN=$OTELCOL_BIN"
  echo "JAEGER_BIN=$JAEGER_BIN"
  echo "OTELCOL_VERSION=$OTELCOL_VERSION"
  echo "JAEGER_VERSION=$JAEGER_V2_VERSION"
}

setup_go() {
  command -v go >/dev/null 2>&1 || die "go is not installed (needed to build the collector and Jaeger)"
  export GOTOOLCHAIN=local
  # Only the module proxy is reachable here: drop the ",direct" fallback so a
  # missing module fails fast instead of trying to clone from its origin.
  local proxy
  proxy="$(go env GOPROXY)"
  proxy="${proxy%,direct}"
  proxy="${proxy%|direct}"
  export GOPROXY="$proxy"
  local flags
  flags="$(go env GOFLAGS)"
  case " $flags " in
    *" -p="*) ;;
    *) flags="$flags -p=2" ;;
  esac
  case " $flags " in
    *" -buildvcs="*) ;;
    *) flags="$flags -buildvcs=false" ;;
  esac
  export GOFLAGS="${flags# }"
  log "go: $(go version | cut -d' ' -f3-)  GOFLAGS='$GOFLAGS' GOTOOLCHAIN=$GOTOOLCHAIN"
}

record_time() {
  # record_time WHAT SECONDS
  mkdir -p "$LOG_DIR"
  printf '%s\t%s\t%ss\t%s cores\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$1" "$2" "$(nproc)" >>"$LOG_DIR/build-times.tsv"
  log "$1 built in ${2}s (recorded in $LOG_DIR/build-times.tsv)"
}

with_lock() {
  # with_lock NAME: serialize builds of the same binary across concurrent runs
  # (parallel CI jobs, two test sessions); different binaries build in parallel.
  mkdir -p "$CACHE"
  local fd
  exec {fd}>"$CACHE/build-$1.lock"
  if ! flock -n "$fd"; then
    log "another build holds $CACHE/build-$1.lock; waiting for it"
    flock "$fd"
  fi
}

build_builder() {
  if [ -x "$BUILDER_BIN" ]; then
    log "builder v$OTELCOL_VERSION present: $BUILDER_BIN"
    return
  fi
  log "installing go.opentelemetry.io/collector/cmd/builder@v$OTELCOL_VERSION"
  mkdir -p "$(dirname "$BUILDER_BIN")"
  GOBIN="$(dirname "$BUILDER_BIN")" go install "go.opentelemetry.io/collector/cmd/builder@v$OTELCOL_VERSION" \
    || die "go install of the collector builder v$OTELCOL_VERSION failed"
}

build_collector() {
  if [ -x "$OTELCOL_BIN" ]; then
    log "collector present, skipping build: $OTELCOL_BIN"
    return
  fi
  with_lock collector
  if [ -x "$OTELCOL_BIN" ]; then
    log "collector was built by a concurrent run: $OTELCOL_BIN"
    return
  fi
  local start work
  start=$(date +%s)
  build_builder
  work="$BUILD_DIR/otelcol-$OTELCOL_VERSION-$(manifest_hash)"
  rm -rf "$work"
  mkdir -p "$work"
  cp "$MANIFEST" "$work/builder-config.yaml"
  log "building the collector from $MANIFEST in $work (several minutes on 2 cores)"
  (cd "$work" && "$BUILDER_BIN" --config builder-config.yaml --skip-strict-versioning=false) \
    || die "collector build failed (see the output above)"
  [ -x "$work/_build/otelcol-training" ] || die "builder finished but $work/_build/otelcol-training is missing"
  "$work/_build/otelcol-training" components >/dev/null || die "the built collector does not run"
  mkdir -p "$BIN_DIR"
  cp "$work/_build/otelcol-training" "$OTELCOL_BIN.tmp.$$"
  mv -f "$OTELCOL_BIN.tmp.$$" "$OTELCOL_BIN"
  rm -rf "$work"
  record_time "otelcol-training $OTELCOL_VERSION" "$(( $(date +%s) - start ))"
  log "collector: $OTELCOL_BIN"
}

build_jaeger() {
  if [ -x "$JAEGER_BIN" ]; then
    log "jaeger present, skipping build: $JAEGER_BIN"
    return
  fi
  with_lock jaeger
  if [ -x "$JAEGER_BIN" ]; then
    log "jaeger was built by a concurrent run: $JAEGER_BIN"
    return
  fi
  local start work gomod info srcdir
  start=$(date +%s)
  work="$BUILD_DIR/jaeger-$JAEGER_MODULE_VERSION"
  rm -rf "$work"
  mkdir -p "$work"
  log "building Jaeger v$JAEGER_V2_VERSION ($JAEGER_MODULE@$JAEGER_MODULE_VERSION) in $work (several minutes on 2 cores)"
  (
    cd "$work"
    go mod init otel-training.local/jaeger-build >/dev/null 2>&1
    info="$(go mod download -json "$JAEGER_MODULE@$JAEGER_MODULE_VERSION")" \
      || { echo "cannot download $JAEGER_MODULE@$JAEGER_MODULE_VERSION: $info" >&2; exit 1; }
    gomod="$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
    srcdir="$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
    [ -f "$gomod" ] && [ -f "$srcdir/go.sum" ] || { echo "cannot read go.mod/go.sum of $JAEGER_MODULE@$JAEGER_MODULE_VERSION" >&2; exit 1; }
    # Start from Jaeger's own go.sum: the wrapper resolves to the very same
    # module graph, and the checksum database is not reachable for every
    # dependency through our module proxy.
    cp "$srcdir/go.sum" go.sum
    chmod u+w go.sum
    # Repeat Jaeger's own non-local replace directives (single-line and block form).
    awk '
      /^replace[[:space:]]*\($/ { inblock=1; next }
      inblock && /^\)/ { inblock=0; next }
      inblock { print; next }
      /^replace[[:space:]]/ { sub(/^replace[[:space:]]+/, ""); print }
    ' "$gomod" | while read -r old arrow new ver _; do
      [ "$arrow" = "=>" ] || continue
      case "$new" in ./*|../*|/*) continue ;; esac
      echo "  replace $old => $new $ver" >&2
      go mod edit -replace "$old=$new@$ver"
    done
    go get "$JAEGER_MODULE/cmd/jaeger@$JAEGER_MODULE_VERSION"
    go build -trimpath -ldflags "-s -w" -o jaeger "$JAEGER_MODULE/cmd/jaeger"
  ) || die "jaeger build failed (see the output above)"
  "$work/jaeger" --help >/dev/null 2>&1 || die "the built jaeger binary does not run"
  mkdir -p "$BIN_DIR"
  cp "$work/jaeger" "$JAEGER_BIN.tmp.$$"
  mv -f "$JAEGER_BIN.tmp.$$" "$JAEGER_BIN"
  rm -rf "$work"
  record_time "jaeger $JAEGER_V2_VERSION ($JAEGER_MODULE_VERSION)" "$(( $(date +%s) - start ))"
  log "jaeger: $JAEGER_BIN"
}

what="${1:-all}"
case "$what" in
  paths) print_paths; exit 0 ;;
  all|collector|jaeger) ;;
  -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
  *) die "unknown target '$what' (all|collector|jaeger|paths)" ;;
esac

# Nothing to do: do not even require Go.
if { [ "$what" = jaeger ] || [ -x "$OTELCOL_BIN" ]; } && { [ "$what" = collector ] || [ -x "$JAEGER_BIN" ]; }; then
  log "all requested binaries are cached"
  print_paths
  exit 0
fi

setup_go
build_all() {
  # Both missing: build Jaeger in the background while the collector builds in
  # the foreground (downloads of one overlap the compilation of the other).
  if [ ! -x "$JAEGER_BIN" ] && [ ! -x "$OTELCOL_BIN" ]; then
    mkdir -p "$LOG_DIR"
    local jlog="$LOG_DIR/jaeger-build.log" jpid rc=0
    log "building Jaeger in the background, log: $jlog"
    ( build_jaeger ) >"$jlog" 2>&1 &
    jpid=$!
    build_collector || rc=$?
    if ! wait "$jpid"; then
      tail -n 40 "$jlog" >&2
      die "jaeger build failed (full log: $jlog)"
    fi
    log "jaeger build finished (log: $jlog)"
    [ "$rc" -eq 0 ] || exit "$rc"
  else
    build_collector
    build_jaeger
  fi
}

case "$what" in
  all) build_all ;;
  collector) build_collector ;;
  jaeger) build_jaeger ;;
esac
print_paths
