# Sourced by the GPU scripts, from the repository root: the wheels in .whl/ (for a machine that
# cannot reach PyPI) installed to /tmp/site, both on PYTHONPATH with this checkout, and `section`.
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"

section() { echo; echo "=== $1 ($(date +%T))"; }
