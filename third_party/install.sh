#!/usr/bin/env bash
# Install what the benchmark's real peer systems need, from the registries only:
#   Debian: redis-server (Redis peer), libibverbs1 (loaded by Mooncake even for TCP)
#   PyPI:   LMCache 0.5.6 + CPU torch 2.13.0, Mooncake Store (non-CUDA), redis-py, h5py
# PDC cannot be installed here (it needs Mercury; see third_party/pdc/README.md).
#
# Usage: third_party/install.sh [VENV] [SYSTEM ...]
#   VENV     virtualenv to install into (default: <repo>/.venv; created if missing)
#   SYSTEM   any of lmcache mooncake redis hdf5 (default: all four)
# Idempotent: when everything is at its pinned version it only checks and exits (~1 s).
# Every pip install runs with -c third_party/constraints.txt, the resolved set tested
# together (numpy 2.2.6 is LMCache 0.5.6's ceiling; mpi4py and the rest of Cascade are
# fine with it), so all peers live in the project's one venv.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
venv="${1:-$repo/.venv}"
shift || true
systems=("$@")
[ ${#systems[@]} -eq 0 ] && systems=(lmcache mooncake redis hdf5)

for s in "${systems[@]}"; do
    case "$s" in lmcache|mooncake|redis|hdf5) ;; pdc)
        echo "install.sh: pdc cannot be installed from the registries (see third_party/pdc/README.md)" >&2
        exit 2 ;;
    *) echo "install.sh: unknown system '$s' (lmcache mooncake redis hdf5)" >&2; exit 2 ;;
    esac
done
wants() { local s; for s in "${systems[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# --- Debian packages ------------------------------------------------------------------
apt_pkgs=()
if wants redis && ! command -v redis-server >/dev/null 2>&1; then apt_pkgs+=(redis-server); fi
if wants mooncake && ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1'; then
    apt_pkgs+=(libibverbs1)
fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "install.sh: apt-get install ${apt_pkgs[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${apt_pkgs[@]}" >/dev/null
    # The adapter starts its own redis-server per run; a distribution service started by
    # the package (where systemd runs) is not ours to leave running.
    if [[ " ${apt_pkgs[*]} " == *" redis-server "* ]] && command -v systemctl >/dev/null 2>&1 \
        && systemctl is-active --quiet redis-server 2>/dev/null; then
        $sudo systemctl disable --now redis-server >/dev/null 2>&1 || true
    fi
fi

# --- Python packages ------------------------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then
    echo "install.sh: creating $venv"
    python3 -m venv "$venv"
fi
py="$venv/bin/python"

reqs=()
for s in "${systems[@]}"; do reqs+=(-r "$here/$s/requirements.txt"); done

# Already installed at the pinned versions? (importlib.metadata, no network)
check_pins() {
    "$py" - "$here" "${systems[@]}" <<'PYEOF'
import sys
from importlib import metadata
from pathlib import Path

root, systems = Path(sys.argv[1]), sys.argv[2:]
missing = []
for system in systems:
    for line in (root / system / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            found = None
        if found != version:
            missing.append(f"{line} (found {found})")
if missing:
    print("install.sh: to install: " + ", ".join(missing))
sys.exit(1 if missing else 0)
PYEOF
}

if check_pins; then
    echo "install.sh: peers already installed in $venv (${systems[*]})"
else
    # --prefer-binary: never build from source; torch's "+cpu" pin only resolves from
    # the machine's local wheel directory (pip find-links), never to PyPI's CUDA build.
    "$py" -m pip install --quiet --prefer-binary -c "$here/constraints.txt" "${reqs[@]}"
    check_pins
    smoke=1
fi

# Smoke check after an install: each peer imports (a broken wheel fails here, not in a
# benchmark). Set INSTALL_SH_CHECK=1 to run it on an up-to-date venv too.
[ "${smoke:-${INSTALL_SH_CHECK:-0}}" = "1" ] || exit 0
"$py" - "${systems[@]}" <<'PYEOF'
import os, sys
os.environ["LMCACHE_TRACK_USAGE"] = "false"
os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
mods = {"lmcache": "lmcache.v1.storage_backend.storage_manager", "mooncake": "mooncake.store",
        "redis": "redis", "hdf5": "h5py"}
import importlib
for system in sys.argv[1:]:
    importlib.import_module(mods[system])
print("install.sh: ok:", " ".join(sys.argv[1:]))
PYEOF
