#!/usr/bin/env bash
# Installs Mneme's systemd units, binaries and reference configuration on one
# node. Idempotent: a second run with the same inputs changes nothing.
#
#   deploy/systemd/install.sh --node spark-1 [--config DIR] [--bin-dir DIR]
#                             [--prefix /usr/local] [--force-env] [--dry-run]
#
# What it does, in order:
#   1. creates the system user and group `mneme` (no login, home /var/lib/mneme);
#   2. creates /etc/mneme, /var/lib/mneme (the local copy goes in
#      /var/lib/mneme/local) and /var/cache/mneme;
#   3. installs mneme_engram_store, mneme_worker, mneme_coordinator and mneme
#      into PREFIX/bin (from --bin-dir: a flat directory or a Bazel output
#      tree such as bazel-bin);
#   4. installs the units and mneme.target into /etc/systemd/system (ExecStart
#      rewritten when --prefix is not /usr/local), and docs/DEPLOY.md into
#      PREFIX/share/doc/mneme;
#   5. installs the reference flagfiles and nccl.env from --config into
#      /etc/mneme (always: they are the release's configuration), and the
#      node's env files from --config/nodes/NODE only where none is installed
#      yet (they are this node's settings: edits are kept; --force-env
#      replaces them);
#   6. runs `systemctl daemon-reload` (only when systemd runs this machine and
#      DESTDIR is empty).
# It enables and starts nothing: see docs/DEPLOY.md for that.
#
# DESTDIR=/some/root installs under that directory instead of / (nothing
# outside it is touched: no user is created, no systemctl is run).
# --dry-run prints what would change and changes nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"

config="${repo}/deploy/config/spark-4x"
bin_dir=""
prefix="/usr/local"
node=""
force_env=0
dry_run=0
destdir="${DESTDIR:-}"
destdir="${destdir%/}"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

die() {
  echo "install.sh: error: $*" >&2
  exit 1
}

while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --config=*) config="${1#*=}"; shift ;;
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --bin-dir=*) bin_dir="${1#*=}"; shift ;;
    --prefix) prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --node) node="$2"; shift 2 ;;
    --node=*) node="${1#*=}"; shift ;;
    --force-env) force_env=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[ -n "${node}" ] || die "--node NAME is required (a directory of ${config}/nodes)"
[ -d "${config}" ] || die "--config ${config}: no such directory"
node_dir="${config}/nodes/${node}"
[ -d "${node_dir}" ] || die "--node ${node}: no ${node_dir}"
if [ -z "${bin_dir}" ] && [ -d "${repo}/bazel-bin" ]; then
  bin_dir="${repo}/bazel-bin"
fi
[ -n "${bin_dir}" ] || die "--bin-dir DIR is required (no bazel-bin here)"
[ -d "${bin_dir}" ] || die "--bin-dir ${bin_dir}: no such directory"

changed=0

say() {
  if [ "${dry_run}" -eq 1 ]; then
    echo "would $*"
  else
    echo "$*"
  fi
}

# The binary NAME in bin_dir, flat or in Bazel's layout.
find_binary() {
  local name="$1" candidate
  for candidate in "${bin_dir}/${name}" "${bin_dir}/services/engram/${name}" \
      "${bin_dir}/services/worker/${name}" \
      "${bin_dir}/services/coordinator/${name}" "${bin_dir}/tools/${name}"; do
    if [ -f "${candidate}" ] && [ -x "${candidate}" ]; then
      echo "${candidate}"
      return 0
    fi
  done
  die "${name} not found in ${bin_dir} (build it: see docs/DEPLOY.md)"
}

# make_dir PATH MODE [OWNER]
make_dir() {
  local path="${destdir}$1" mode="$2" owner="${3:-}"
  if [ ! -d "${path}" ]; then
    say "create directory ${path}"
    changed=1
    if [ "${dry_run}" -eq 0 ]; then
      install -d -m "${mode}" "${path}"
    fi
  fi
  # Under DESTDIR the user does not exist: ownership is the installer's.
  if [ -n "${owner}" ] && [ -z "${destdir}" ]; then
    if [ ! -d "${path}" ] || [ "$(stat -c %U:%G "${path}")" != "${owner}" ]; then
      say "chown ${owner} ${path}"
      changed=1
      [ "${dry_run}" -eq 1 ] || chown "${owner}" "${path}"
    fi
  fi
}

# install_file SRC DEST MODE: copies when DEST is missing or differs.
install_file() {
  local src="$1" dest="${destdir}$2" mode="$3"
  if [ -f "${dest}" ] && cmp -s "${src}" "${dest}" &&
      [ "$(stat -c %a "${dest}")" = "${mode}" ]; then
    return 0
  fi
  say "install ${dest}"
  changed=1
  if [ "${dry_run}" -eq 0 ]; then
    install -D -m "${mode}" "${src}" "${dest}"
  fi
}

# install_env SRC DEST: a node setting; kept when present unless --force-env.
install_env() {
  local src="$1" dest="${destdir}$2"
  if [ -f "${dest}" ] && [ "${force_env}" -eq 0 ]; then
    if ! cmp -s "${src}" "${dest}"; then
      echo "keep ${dest} (differs from ${src}; --force-env replaces it)"
    fi
    return 0
  fi
  install_file "${src}" "$2" 644
}

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

# 1. The user.
if [ -z "${destdir}" ]; then
  if ! getent group mneme >/dev/null; then
    say "create group mneme"
    changed=1
    [ "${dry_run}" -eq 1 ] || groupadd --system mneme
  fi
  if ! getent passwd mneme >/dev/null; then
    say "create user mneme"
    changed=1
    [ "${dry_run}" -eq 1 ] || useradd --system --gid mneme \
      --home-dir /var/lib/mneme --no-create-home \
      --shell /usr/sbin/nologin --comment "Mneme serving" mneme
  fi
else
  echo "DESTDIR set: not creating the user mneme"
fi

# 2. Directories.
make_dir /etc/mneme 755
make_dir /var/lib/mneme 750 mneme:mneme
make_dir /var/lib/mneme/local 750 mneme:mneme
make_dir /var/cache/mneme 750 mneme:mneme
make_dir "${prefix}/bin" 755
make_dir /etc/systemd/system 755

# 3. Binaries.
for name in mneme_engram_store mneme_worker mneme_coordinator mneme; do
  install_file "$(find_binary "${name}")" "${prefix}/bin/${name}" 755
done

# 4. Units and the guide.
for unit in mneme-engram-store.service mneme-worker.service \
    mneme-coordinator.service mneme.target; do
  sed -e "s#/usr/local/bin/#${prefix}/bin/#g" \
      -e "s#/usr/local/share/doc/#${prefix}/share/doc/#g" \
      "${here}/${unit}" > "${tmp}/${unit}"
  install_file "${tmp}/${unit}" "/etc/systemd/system/${unit}" 644
done
if [ -f "${repo}/docs/DEPLOY.md" ]; then
  install_file "${repo}/docs/DEPLOY.md" "${prefix}/share/doc/mneme/DEPLOY.md" 644
fi

# 5. Configuration.
for file in "${config}"/*.flags "${config}"/nccl.env; do
  install_file "${file}" "/etc/mneme/$(basename "${file}")" 644
done
for file in "${node_dir}"/*.env; do
  install_env "${file}" "/etc/mneme/$(basename "${file}")"
done

# 6. systemd.
if [ -z "${destdir}" ] && [ -d /run/systemd/system ]; then
  if [ "${changed}" -eq 1 ]; then
    say "run systemctl daemon-reload"
    [ "${dry_run}" -eq 1 ] || systemctl daemon-reload
  fi
else
  echo "systemd is not running this root: skipping systemctl daemon-reload"
fi

if [ "${changed}" -eq 0 ]; then
  echo "nothing to change"
fi
