#!/usr/bin/env bash
# Builds a minimal Debian bookworm base image from Debian's packages with debootstrap and imports it
# into podman's store as localhost/debian:bookworm (or $BASE_IMAGE), for building pagewise's image
# where no registry is reachable. Does nothing when the image exists. Needs root, debootstrap and
# podman.
set -euo pipefail
image="${BASE_IMAGE:-localhost/debian:bookworm}"
if podman image exists "$image"; then
  echo "$image: present"
  exit 0
fi
# The mirror this machine's apt already uses (deb822 sources first, then the one-line format).
mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2> /dev/null | head -n1 || true)
if [ -z "$mirror" ]; then
  mirror=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2> /dev/null || true)
fi
mirror="${mirror:-http://deb.debian.org/debian}"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$mirror" > /dev/null
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar --numeric-owner -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' - "$image" > /dev/null
echo "$image: built from $mirror"
