#!/usr/bin/env bash
# Sets up a phyfarm runner host, idempotently: the host prerequisites
# (podman with runc, QEMU, the test venv: containers/host-setup.sh), the
# tools the workflows call (jq, gh, cargo), an acceleration and podman check
# with `phyfarm doctor`, and the GitHub Actions runner registered with the
# labels self-hosted,linux,x64,phyfarm (pull-request jobs) or, with
# --trusted, phyfarm-trusted (verdicts, Pages, recording results: a separate
# runner group that runs no pull-request job). Safe to run again: what is
# done is skipped. Run as root on a disposable VM (see README.md beside this
# file); the runner itself runs as the unprivileged user phyfarm-runner.
#
# As GitHub's hardening guide asks, a runner is ephemeral by default: it
# takes one job and deregisters, and whatever provisions the VM destroys it
# afterwards. --persistent registers a long-lived runner and installs a
# service; it is refused when the repository is public (checked through
# the GitHub API, unauthenticated).
#
# Usage:
#   setup-runner.sh --url https://github.com/OWNER/REPO \
#       --runner-tarball actions-runner-linux-x64-X.Y.Z.tar.gz --runner-sha256 HEX \
#       [--token-file FILE] [--name NAME] [--dir DIR] [--runner-group GROUP] \
#       [--trusted --repo REPO --admin-token-file FILE] [--persistent [--no-service]]
#   setup-runner.sh --check-only        prerequisites and `phyfarm doctor` only
#   setup-runner.sh --policy-only ...   the checks of step 0 (role, group, public
#                                       repository) for these arguments, then exit
#
# A trusted runner holds the store's credential, so nothing a pull request
# runs may reach it, and labels alone do not ensure that (a workflow file
# edited by a pull request picks any label). --trusted is therefore refused
# unless it registers at an organisation (--url https://github.com/ORG) into
# a runner group of its own (--runner-group, not "Default"), which the
# organisation restricts to the default branch's verdicts.yml and
# pull-request-report.yml (README.md beside this file). The group's settings
# are read through the GitHub API with --admin-token-file (a token that may
# read the organisation's runner groups: admin:org, or a fine-grained one
# with "Self-hosted runners: read") and the registration is refused unless
# the group is not the default, is visible to --repo alone, and is
# restricted to that repository's verdicts.yml and pull-request-report.yml
# on a branch. The token goes to curl on its standard input, never on a
# command line, and is never printed. And a host keeps one
# role for good: the role is written to /etc/phyfarm-runner-role
# ($PHYFARM_RUNNER_ROLE_FILE) at registration, and a trusted runner is
# refused on a host that has run pull-request jobs, and the other way round.
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
tarball="" sha256="" ephemeral=1 service=1 check_only=0 policy_only=0
labels="phyfarm" # config.sh adds self-hosted, Linux and X64 itself
runner_user="phyfarm-runner"
group="" repo="" admin_token_file=""
role="pull-request"
role_file=${PHYFARM_RUNNER_ROLE_FILE:-/etc/phyfarm-runner-role}

die() { echo "E: $*" >&2; exit 2; }
info() { echo "I: $*" >&2; }

# GET an API path of api.github.com with the admin token (read from FILE,
# checked by check_group, handed to curl on its standard input).
gh_api() { # FILE PATH
  local tok
  tok=$(tr -d '[:space:]' < "$1")
  curl -fsS --max-time 20 --config - "https://api.github.com$2" <<<"header = \"Authorization: Bearer $tok\"
header = \"Accept: application/vnd.github+json\"
header = \"X-GitHub-Api-Version: 2022-11-28\""
}

# The trusted runners' group as the organisation configured it: refused
# unless only REPO's default-branch verdicts and recording workflows can use it.
check_group() { # ORG REPO GROUP TOKEN_FILE
  local org=$1 repo=$2 group=$3 tf=$4 groups g id repos want bad
  [ -r "$tf" ] || die "--admin-token-file $tf: cannot read it"
  [[ $(tr -d '[:space:]' < "$tf") =~ ^[A-Za-z0-9_]{20,255}$ ]] || die "--admin-token-file $tf: not a GitHub token"
  groups=$(gh_api "$tf" "/orgs/$org/actions/runner-groups?per_page=100") ||
    die "cannot read $org's runner groups (GET /orgs/$org/actions/runner-groups): does the token have admin:org?"
  g=$(jq -c --arg n "$group" 'first(.runner_groups[]? | select(.name == $n)) // empty' <<<"$groups" 2>/dev/null) || g=""
  [ -n "$g" ] || die "runner group '$group': not among $org's runner groups"
  [ "$(jq -r '.default' <<<"$g")" = "false" ] ||
    die "runner group '$group' is $org's default group: every repository may use it"
  [ "$(jq -r '.visibility' <<<"$g")" = "selected" ] ||
    die "runner group '$group': visibility $(jq -r '.visibility' <<<"$g"), not \"selected\": give it $org/$repo only"
  [ "$(jq -r '.restricted_to_workflows' <<<"$g")" = "true" ] ||
    die "runner group '$group' is not restricted to selected workflows: restrict it to $org/$repo's verdicts.yml and pull-request-report.yml on the default branch"
  want="$org/$repo/.github/workflows/"
  bad=$(jq -r --arg p "$want" '
    if (.selected_workflows | type) != "array" or (.selected_workflows | length) == 0 then "(none)"
    else .selected_workflows[] | select(
      (type != "string") or (startswith($p) | not) or
      (.[($p | length):] | test("^(verdicts|pull-request-report)\\.yml@refs/heads/[A-Za-z0-9._/-]+$") | not))
    end' <<<"$g")
  [ -z "$bad" ] ||
    die "runner group '$group' may run workflows other than $want{verdicts,pull-request-report}.yml@refs/heads/BRANCH: $(tr '\n' ' ' <<<"$bad")"
  id=$(jq -r '.id' <<<"$g")
  [[ $id =~ ^[0-9]{1,12}$ ]] || die "runner group '$group': no id in the API's answer"
  repos=$(gh_api "$tf" "/orgs/$org/actions/runner-groups/$id/repositories?per_page=100") ||
    die "cannot read the repositories of runner group '$group' (GET /orgs/$org/actions/runner-groups/$id/repositories)"
  bad=$(jq -r --arg r "$org/$repo" '[.repositories[]?.full_name] | if . == [$r] then empty elif length == 0 then "no repository" else join(", ") end' <<<"$repos" 2>/dev/null) ||
    bad="(unreadable)"
  [ -z "$bad" ] ||
    die "runner group '$group' is open to $bad, not to $org/$repo alone"
  info "runner group '$group': $org/$repo only, restricted to its verdicts and recording workflows"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --url) url=${2:?}; shift 2 ;;
    --token-file) token_file=${2:?}; shift 2 ;;
    --name) name=${2:?}; shift 2 ;;
    --dir) dir=${2:?}; shift 2 ;;
    --runner-tarball) tarball=${2:?}; shift 2 ;;
    --runner-sha256) sha256=${2:?}; shift 2 ;;
    --ephemeral) ephemeral=1; shift ;;
    --persistent) ephemeral=0; shift ;;
    --trusted) labels="phyfarm-trusted"; role="trusted"; shift ;;
    --runner-group) group=${2:?}; shift 2 ;;
    --repo) repo=${2:?}; shift 2 ;;
    --admin-token-file) admin_token_file=${2:?}; shift 2 ;;
    --no-service) service=0; shift ;;
    --check-only) check_only=1; shift ;;
    --policy-only) policy_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

[ "$(id -u)" -eq 0 ] || die "run as root: it installs packages and creates the runner's user"

# 0. Policy first, before anything is installed. A trusted runner is reached
# only through an organisation's runner group of its own, on a host that
# never ran pull-request jobs.
if [ "$check_only" -eq 0 ]; then
  if [ -e "$role_file" ]; then
    had=$(head -c 64 "$role_file" | tr -dc 'a-z-')
    [ "$had" = "$role" ] ||
      die "this host already runs a ${had:-unknown} runner ($role_file): trusted and pull-request runners never share a host (a pull-request job could read what the trusted runner holds); use a fresh VM"
  fi
  if [ -n "$group" ]; then
    [[ $group =~ ^[A-Za-z0-9][A-Za-z0-9\ _.-]{0,63}$ ]] || die "--runner-group: letters, digits, space . _ - only"
  fi
  if [ "$role" = "trusted" ]; then
    [[ $url =~ ^https://github\.com/[A-Za-z0-9_.-]+$ ]] ||
      die "--trusted needs --url https://github.com/ORG: runner groups are an organisation's, and a repository's own runners share one pool with its pull-request jobs, told apart by labels a pull request can change"
    [ -n "$group" ] ||
      die "--trusted needs --runner-group GROUP: a group of its own, restricted to the default branch's verdicts.yml and pull-request-report.yml (see README.md beside this script)"
    [ "${group,,}" != "default" ] ||
      die "--runner-group Default: every repository's jobs may use the Default group; give the trusted runners a group of their own"
    [[ $repo =~ ^[A-Za-z0-9_.-]{1,100}$ ]] ||
      die "--trusted needs --repo REPO: the repository (of the organisation) whose verdicts.yml and pull-request-report.yml the group runs"
    [ -n "$admin_token_file" ] ||
      die "--trusted needs --admin-token-file FILE: a token that may read $url's runner groups (admin:org, or fine-grained \"Self-hosted runners: read\"), to check the group before registering"
    check_group "${url#https://github.com/}" "$repo" "$group" "$admin_token_file"
  fi
fi

# A persistent runner keeps whatever one job leaves for the next, so a
# public repository (where anyone can open a pull request) gets ephemeral
# runners only.
if [ "$ephemeral" -eq 0 ] && [ "$check_only" -eq 0 ]; then
  [[ $url =~ ^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)$ ]] ||
    die "--persistent needs --url https://github.com/OWNER/REPO (a repository, to check it is private)"
  meta=$(curl -fsS --max-time 20 "https://api.github.com/repos/${BASH_REMATCH[1]}/${BASH_REMATCH[2]}" 2>/dev/null) ||
    die "--persistent: cannot tell whether ${BASH_REMATCH[1]}/${BASH_REMATCH[2]} is public (the API answered nothing, or 404 for a private repository without a token); use an ephemeral runner"
  private=$(jq -r '.private' <<<"$meta" 2>/dev/null || echo unknown)
  [ "$private" = "true" ] ||
    die "persistent runners are refused for public repositories (${BASH_REMATCH[1]}/${BASH_REMATCH[2]} is public): register an ephemeral runner (the default)"
fi

if [ "$policy_only" -eq 1 ]; then
  info "policy: a $role runner for $url may be registered on this host"
  exit 0
fi

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

# 5. The runner's own user: not root, in the kvm group for /dev/kvm, with
# no sudo. phyfarm runs rootless podman as this user (container root is this
# user on the host) and QEMU as this user.
if ! id "$runner_user" >/dev/null 2>&1; then
  useradd --system --create-home --home-dir "/home/$runner_user" --shell /bin/bash "$runner_user"
  info "created user $runner_user"
fi
getent group kvm >/dev/null && usermod -aG kvm "$runner_user"
grep -q "^$runner_user:" /etc/subuid || usermod --add-subuids 1000000-1065535 "$runner_user"
grep -q "^$runner_user:" /etc/subgid || usermod --add-subgids 1000000-1065535 "$runner_user"
chown -R "$runner_user:" "$dir"
# The runner user's own venv and podman storage (packages are in place now).
runuser -u "$runner_user" -- env HOME="/home/$runner_user" bash "$top/containers/host-setup.sh" ||
  die "host-setup.sh as $runner_user failed"

# 6. Registration, once, as the runner's user.
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
  [ -n "$group" ] && args+=(--runnergroup "$group")
  info "registering runner $name at $url with labels self-hosted,linux,x64,$labels"
  (cd "$dir" && ACTIONS_RUNNER_INPUT_TOKEN="$token" runuser -u "$runner_user" -- ./config.sh "${args[@]}") ||
    die "runner registration failed (an expired token? they last one hour)"
  token=""
  echo "$role" > "$role_file"
  info "this host is a $role runner host from now on ($role_file)"
fi

# 7. Run it: an ephemeral runner is started by whatever provisions the VM
# (./run.sh as the runner's user, one job, then the VM goes); a persistent
# one (private repositories only) gets a service running as that user.
if [ "$ephemeral" -eq 1 ] || [ "$service" -eq 0 ]; then
  info "not installing a service: start it with (cd $dir && runuser -u $runner_user -- ./run.sh)"
elif [ -f "$dir/.service" ]; then
  info "runner service already installed ($(cat "$dir/.service"))"
else
  (cd "$dir" && ./svc.sh install "$runner_user" && ./svc.sh start) || die "cannot install the runner service"
fi
info "runner host ready: $name"
