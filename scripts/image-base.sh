#!/usr/bin/env bash
# The image store scripts/build-images.sh builds into, and a Python base image made on this
# machine, for building where no container registry is reachable (CI here).
#
#   bash scripts/image-base.sh      # prints the base image's name: localhost/rlcp-base:bookworm-py3-<hash>
#   source scripts/image-base.sh    # defines rlcp_buildah, rlcp_ensure_tools, rlcp_local_base
#
# The base: a Debian 12 root filesystem made from the Debian mirror with mmdebstrap (minbase:
# apt, dpkg, coreutils, passwd, ...; merged /usr; no docs, man pages or locales) plus python3
# (3.11), python3-venv and ca-certificates, committed as a local image. It stands in for
# `python:3.11-slim-bookworm`: the same Debian release and the same kind of contents, with
# Debian's Python instead of one built from source. The Containerfiles take it as BASE_IMAGE.
#
# The store: $RLCP_IMAGE_STORE, default $RLCP_IMAGE_CACHE/storage-<driver> with the overlay
# driver where the kernel mounts overlayfs, else vfs (STORAGE_DRIVER=... chooses);
# RLCP_IMAGE_STORE=system uses buildah's configured store (the one podman shows).
#
# Cached, so that reruns take a second: the root filesystem tarball under $RLCP_IMAGE_CACHE
# (/var/cache/rlcp-images) and the image in the store. Needs root; installs buildah and
# mmdebstrap (Debian packages) when they are missing. RLCP_DEBIAN_MIRROR
# (http://deb.debian.org/debian) and RLCP_DEBIAN_SECURITY_MIRROR choose the mirrors.

RLCP_IMAGE_CACHE=${RLCP_IMAGE_CACHE:-/var/cache/rlcp-images}

_rlcp_log() { echo "image-base: $*" >&2; }

# overlay when this kernel mounts it here (fast: no copy per layer), else vfs (copies, works anywhere).
_rlcp_storage_driver() {
  if [ -n "${STORAGE_DRIVER:-}" ]; then echo "$STORAGE_DRIVER"; return; fi
  local probe ok=vfs
  probe=$(mktemp -d "${TMPDIR:-/tmp}/rlcp-overlay-probe.XXXXXX")
  mkdir "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
  if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
      "$probe/merged" 2>/dev/null; then
    umount "$probe/merged" && ok=overlay
  fi
  rm -rf "$probe"
  echo "$ok"
}

if [ -z "${RLCP_IMAGE_STORE:-}" ]; then
  RLCP_STORAGE_DRIVER=$(_rlcp_storage_driver)
  RLCP_IMAGE_STORE=$RLCP_IMAGE_CACHE/storage-$RLCP_STORAGE_DRIVER
else
  RLCP_STORAGE_DRIVER=${RLCP_STORAGE_DRIVER:-$(_rlcp_storage_driver)}
fi
export RLCP_IMAGE_CACHE RLCP_IMAGE_STORE RLCP_STORAGE_DRIVER

# buildah on the store above.
rlcp_buildah() {
  if [ "$RLCP_IMAGE_STORE" = system ]; then
    buildah "$@"
  else
    buildah --root "$RLCP_IMAGE_STORE" --runroot "${RLCP_IMAGE_RUNROOT:-/run/rlcp-images$RLCP_IMAGE_STORE}" \
      --storage-driver "$RLCP_STORAGE_DRIVER" "$@"
  fi
}

# Install the Debian packages that provide the missing commands (buildah, mmdebstrap).
rlcp_ensure_tools() {
  local missing=() tool
  for tool in "$@"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    _rlcp_log "FAILED: needs ${missing[*]} (Debian packages) and root to install them"
    return 1
  fi
  _rlcp_log "installing ${missing[*]} (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# Make the base image (or find it made) and print its name.
rlcp_local_base() {
  local suite=bookworm packages=python3,python3-venv,ca-certificates,passwd
  local mirror=${RLCP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  local security=${RLCP_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
  # Trimmed like Debian's -slim images: what no program reads at run time.
  local dpkg_opts=(
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
  )
  rlcp_ensure_tools buildah mmdebstrap || return 1
  [ "$(id -u)" = 0 ] || { _rlcp_log "FAILED: needs root (mmdebstrap)"; return 1; }

  # The name carries a hash of what goes in: a change here makes a new image.
  local key name tarball start ctr mnt
  key=$(printf '%s\n' "$suite" "$mirror" "$packages" "${dpkg_opts[@]}" merged-usr minbase v1 | sha256sum | cut -c1-12)
  name="localhost/rlcp-base:$suite-py3-$key"
  if rlcp_buildah inspect --type image "$name" >/dev/null 2>&1; then
    _rlcp_log "$name: in the image store"
    echo "$name"
    return 0
  fi

  mkdir -p "$RLCP_IMAGE_CACHE"
  tarball="$RLCP_IMAGE_CACHE/base-$suite-$key.tar"
  if [ ! -s "$tarball" ]; then
    _rlcp_log "building the root filesystem (mmdebstrap $suite, about 30 s)"
    start=$SECONDS
    if ! mmdebstrap --variant=minbase --mode=root --format=tar \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --include="$packages" "${dpkg_opts[@]}" --aptopt='Acquire::Languages "none"' \
        "$suite" "$tarball.partial" \
        "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main" \
        >"$RLCP_IMAGE_CACHE/mmdebstrap.log" 2>&1; then
      tail -n 30 "$RLCP_IMAGE_CACHE/mmdebstrap.log" >&2
      rm -rf "$tarball.partial"
      _rlcp_log "FAILED: mmdebstrap (log: $RLCP_IMAGE_CACHE/mmdebstrap.log)"
      return 1
    fi
    mv "$tarball.partial" "$tarball"
    _rlcp_log "root filesystem: $(du -m "$tarball" | cut -f1) MB in $((SECONDS - start)) s ($tarball)"
  fi

  _rlcp_log "importing $tarball as $name"
  ctr=$(rlcp_buildah from --pull=never scratch) || return 1
  if mnt=$(rlcp_buildah mount "$ctr") \
      && tar -C "$mnt" --numeric-owner -xpf "$tarball" --exclude='./dev/*' \
      && rlcp_buildah umount "$ctr" >/dev/null \
      && rlcp_buildah config --os linux --arch "$(dpkg --print-architecture)" \
           --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
           --cmd /bin/bash --label "org.opencontainers.image.description=Debian $suite and python3 (scripts/image-base.sh)" \
           "$ctr" \
      && rlcp_buildah commit --quiet --rm "$ctr" "$name" >/dev/null; then
    _rlcp_log "$name: made"
    echo "$name"
  else
    rlcp_buildah rm "$ctr" >/dev/null 2>&1
    _rlcp_log "FAILED: importing the root filesystem"
    return 1
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  cd "$(dirname "$0")/.."
  rlcp_local_base
fi
