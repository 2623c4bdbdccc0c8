#!/usr/bin/env bash
# Installs what phyfarm needs on the host, idempotently: podman with runc,
# mmdebstrap, QEMU, PostgreSQL (for the store tests), and the Python test
# tools. Safe to run again; it only installs what is missing. Needs root (or
# sudo) for apt.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/.." && pwd)

apt_packages=(
  podman runc mmdebstrap uidmap fuse-overlayfs
  qemu-system-x86 qemu-utils
  # udev: virtme-ng (bench/boot-vs-vng.sh) boots the host's root filesystem
  # and its guest init needs udevd to name the virtio ports of --exec.
  udev
  busybox-static cpio
  iproute2 ethtool iperf3
  # The host-side link partner pings the guest (pytest-tests/farm/test_replug.py).
  iputils-ping
  git make gcc pkg-config
  python3 python3-venv
  postgresql
  # The mailing-list path (phyfarm watch, pytest-tests/mail): a public-inbox
  # archive and git send-email.
  public-inbox git-email
  chromium fonts-dejavu-core
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "E: not root and no sudo: run as root" >&2; exit 2; }
  sudo_cmd=(sudo)
fi

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "I: installing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq || { echo "E: apt-get update failed: is the package mirror reachable?" >&2; exit 2; }
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { echo "E: apt-get install ${missing[*]} failed" >&2; exit 2; }
else
  echo "I: Debian packages already installed" >&2
fi

# The user QEMU drops to (-runas) when phyfarm runs as root: the guest runs
# an untrusted kernel, so the QEMU process that runs it owns nothing.
if [ "$(id -u)" -eq 0 ] && ! id phyfarm-qemu >/dev/null 2>&1; then
  echo "I: creating the system user phyfarm-qemu (QEMU drops to it)" >&2
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin phyfarm-qemu
fi
if [ "$(id -u)" -eq 0 ] && getent group kvm >/dev/null; then
  id -nG phyfarm-qemu | grep -qw kvm || usermod -aG kvm phyfarm-qemu
fi

# Python tools for the test harness, in a venv under the cache directory so the
# system Python stays untouched.
cache=${PHYFARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/phyfarm}
venv="$cache/venv"
if [ ! -x "$venv/bin/python" ]; then
  echo "I: creating Python venv $venv" >&2
  mkdir -p "$cache"
  python3 -m venv "$venv"
fi
req="$top/pytest-tests/requirements.txt"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "I: installing Python packages from $req" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi

# Rust lint components for CI (cargo fmt, clippy), when rustup is the toolchain.
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt >/dev/null 2>&1 || true
fi
echo "I: host prerequisites ready (venv: $venv)" >&2
