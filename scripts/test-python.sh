#!/usr/bin/env bash
# The Python suite: builds (or reuses) the Python environment (scripts/python-env.sh), installs
# the package from this tree into it (the extension with warnings as errors), and runs pytest
# over python/tests, the vLLM tests included (python/tests/vllm). Extra arguments go to
# pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/python-env.sh)
"$python" -m pip install --disable-pip-version-check -q --no-build-isolation \
  -C cmake.define.PA_WERROR=ON -C build-dir=build-python .
PAGEDATTN_VLLM_TESTS=required "$python" -m pytest -q "$@"
