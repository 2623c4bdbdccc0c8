#!/usr/bin/env bash
# Sets up a phyfarm runner host, idempotently: the host prerequisites
# (podman with runc, QEMU, the test venv: containers/host-setup.sh), the
# tools the workflows call (jq, gh, cargo), an acceleration and podman check
# with `phyfarm doctor`, and the GitHub Actions runner registered with the
# labels self-hosted,linux,x64,phyfarm. Safe to run again: what is done is
# skipped. Run as root on a disposable VM (see README.md beside this file).
#
# Usage:
#   setup-runner.sh --url https://github.com/OWNER/REPO \
#       --runner-tarball actions-runner-linux-x64-X.Y.Z.tar.gz --runner-sha256 HEX \
#       [--token-file FILE] [--name NAME] [--dir DIR] [--ephemeral] [--no-service]
#   setup-runner.sh --check-only        prerequisites and `phyfarm doctor` only
#
# The registration token is read from --token-file, else from the
# environment variable RUNNER_TOKEN; it is handed to config.sh through its
# environment (ACTIONS_RUNNER_INPUT_TOKEN), never on a command line, and
# never printed. The runner tarball is never downloaded here: fetch it from
# the actions/runner release page and pass the SHA-256 printed there.
set -euo pipefail
set +x # the token must never reach a trace

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)

url="" token_file="" name="$(hostname)-phyfarm" dir="/opt/actions-runner"
tarball="" sha256="" ephemeral=0 service=1 check_only=0
labels="phyfarm" # config.sh adds self-hosted, Linux and X64 itself

die() { echo "E: $*" >&2; exit 2; }
info() { echo "I: $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --url) url=${2:?}; shift 2 ;;
    --token-file) token_file=${2:?}; shift 2 ;;
    --name) name=${2:?}; shift 2 ;;
    --dir) dir=${2:?}; shift 2 ;;
    --runner-tarball) tarball=${2:?}; shift 2 ;;
    --runner-sha256) sha256=${2:?}; shift 2 ;;
    --ephemeral) ephemeral=1; shift ;;
    --no-service) service=0; shift ;;
    --check-only) check_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

[ "$(id -u)" -eq 0 ] || die "run as root: phyfarm drives rootful podman and QEMU"

# 1. Host prerequisites: podman, runc, mmdebstrap, QEMU, the Python venv.
bash "$top/containers/host-setup.sh"

# 2. What the workflows call besides phyfarm.
missing=()
for p in jq gh curl ca-certificates tar; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
command -v cargo >/dev/null 2>&1 || missing+=(cargo rustc)
if [ ${#missing[@]} -gt 0 ]; then
  info "installing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install ${missing[*]} failed"
fi

# 3. Can this host build and boot? podman/runc, QEMU, usable acceleration.
info "building phyfarm and running phyfarm doctor"
(cd "$top" && cargo build --quiet --locked -p phyfarm) || die "cannot build phyfarm"
if ! (cd "$top" && target/debug/phyfarm doctor); then
  die "phyfarm doctor found problems (above): fix them before registering this runner"
fi
[ "$check_only" -eq 1 ] && { info "host checks passed (--check-only: not registering)"; exit 0; }

# 4. The runner software, verified against the checksum of its release page.
[ -n "$url" ] || die "--url https://github.com/OWNER/REPO is required"
[[ $url =~ ^https://github\.com/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$ ]] || die "--url: not a GitHub repository or organisation URL"
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "--name: letters, digits, . _ - only"
if [ ! -x "$dir/config.sh" ]; then
  if [ -z "$tarball" ] || [ -z "$sha256" ]; then
    die "no runner in $dir: pass --runner-tarball FILE and --runner-sha256 HEX"
  fi
  [[ $sha256 =~ ^[0-9a-fA-F]{64}$ ]] || die "--runner-sha256: 64 hex digits"
  echo "${sha256,,}  $tarball" | sha256sum --check --quiet - || die "$tarball does not match --runner-sha256"
  mkdir -p "$dir"
  tar -xzf "$tarball" -C "$dir"
  info "runner unpacked into $dir"
else
  info "runner already installed in $dir"
fi

# 5. Registration, once.
if [ -f "$dir/.runner" ]; then
  info "runner already registered ($dir/.runner); to re-register: ./config.sh remove first"
else
  token=""
  if [ -n "$token_file" ]; then
    [ -r "$token_file" ] || die "--token-file $token_file: cannot read it"
    token=$(tr -d '[:space:]' < "$token_file")
  elif [ -n "${RUNNER_TOKEN:-}" ]; then
    token=$RUNNER_TOKEN
  fi
  unset RUNNER_TOKEN
  [ -n "$token" ] || die "no registration token: --token-file FILE or RUNNER_TOKEN"
  args=(--unattended --url "$url" --name "$name" --labels "$labels" --work _work --replace)
  [ "$ephemeral" -eq 1 ] && args+=(--ephemeral)
  info "registering runner $name at $url with labels self-hosted,linux,x64,$labels"
  (cd "$dir" && ACTIONS_RUNNER_INPUT_TOKEN="$token" RUNNER_ALLOW_RUNASROOT=1 ./config.sh "${args[@]}") ||
    die "runner registration failed (an expired token? they last one hour)"
  token=""
fi

# 6. Run it: a service for a long-lived runner; an ephemeral runner is
# started by whatever provisions the VM (./run.sh, one job, then the VM goes).
if [ "$ephemeral" -eq 1 ] || [ "$service" -eq 0 ]; then
  info "not installing a service: start it with (cd $dir && RUNNER_ALLOW_RUNASROOT=1 ./run.sh)"
elif [ -f "$dir/.service" ]; then
  info "runner service already installed ($(cat "$dir/.service"))"
else
  (cd "$dir" && ./svc.sh install root && ./svc.sh start) || die "cannot install the runner service"
fi
info "runner host ready: $name"
