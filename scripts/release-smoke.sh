#!/usr/bin/env bash
# Release smoke test (issue 22): build the sdist and the wheel of this checkout, install the WHEEL into a
# clean venv outside the checkout, and run it as a user would: `kvgeom --version`, `python -m kvgeom` (the
# bundled default), `kvgeom check preset:seed-hybrid`, and the LICENSE in the wheel's dist-info.
#
# Usage: scripts/release-smoke.sh [PYTHON]   (PYTHON: one that has `build`, e.g. .ci/run's venv; else a
# throwaway venv gets it). Robust: pip retries and timeouts, each network step retried three times.
# Cheap: about 30 s with a warm pip cache. Leaves nothing behind (a temp folder, removed on exit).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_PY=${1:-python3}
unset PYTHONPATH
export PIP_RETRIES=5 PIP_TIMEOUT=60 PIP_DISABLE_PIP_VERSION_CHECK=1   # also read by build's own pip calls
PIP_OPTS=(--quiet)

retry() {
    local n
    for n in 1 2 3; do
        "$@" && return 0
        echo "release-smoke: attempt $n of: $* failed; retrying in $((n * 10)) s" >&2
        sleep $((n * 10))
    done
    return 1
}
fail() { echo "release-smoke: FAILED: $*" >&2; exit 1; }

start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvgeom-release.XXXXXX")
trap 'rm -rf "$work"' EXIT

if ! "$BUILD_PY" -m build --version >/dev/null 2>&1; then
    python3 -m venv "$work/build-venv"
    retry "$work/build-venv/bin/python" -m pip install "${PIP_OPTS[@]}" "build>=1.2"
    BUILD_PY=$work/build-venv/bin/python
fi
# sdist first, then the wheel built from that sdist (python -m build's default): the sdist must build.
retry "$BUILD_PY" -m build --outdir "$work/dist" "$ROOT" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; fail "build"; }
# The license metadata is PEP 639's (no setuptools deprecation about it); other deprecations are shown, not fatal.
if grep -q -E "project\.license|License classifiers are deprecated" "$work/build.log"; then
    grep -E -A3 "project\.license|License classifiers" "$work/build.log" >&2; fail "license metadata deprecated"
fi
grep -i -A3 "deprecat" "$work/build.log" >&2 || true
wheels=("$work"/dist/kvgeom-*-py3-none-any.whl)
sdists=("$work"/dist/kvgeom-*.tar.gz)
[[ ${#wheels[@]} -eq 1 && -f ${wheels[0]} && ${#sdists[@]} -eq 1 && -f ${sdists[0]} ]] || fail "expected one sdist and one wheel"
version=$(basename "${wheels[0]}" | cut -d- -f2)

# A clean venv without its own pip (ensurepip alone takes ~10 s); the build Python's pip installs into it.
python3 -m venv --without-pip "$work/venv"
retry "$BUILD_PY" -m pip --python "$work/venv/bin/python" install "${PIP_OPTS[@]}" "${wheels[0]}"

cd "$work"   # not the checkout: kvgeom must come from the installed wheel
PY=$work/venv/bin/python
where=$("$PY" -c 'import kvgeom; print(kvgeom.__file__)')
[[ $where == "$work/venv/"* ]] || fail "kvgeom imported from $where, not from the installed wheel"
got=$("$work/venv/bin/kvgeom" --version)
[[ $got == "kvgeom $version" ]] || fail "kvgeom --version printed '$got', expected 'kvgeom $version'"
"$PY" -m kvgeom >"$work/default.txt" || fail "python -m kvgeom"
grep -q "kvgeom geometry of the bundled default" "$work/default.txt" || fail "python -m kvgeom did not explain the default"
"$work/venv/bin/kvgeom" check preset:seed-hybrid || fail "kvgeom check preset:seed-hybrid"
"$PY" - <<'PY' || fail "LICENSE or license metadata missing from the wheel's dist-info"
import importlib.metadata as md
dist = md.distribution("kvgeom")
[lic] = [f for f in dist.files if f.parent.name == "licenses" and f.name == "LICENSE"]
assert "Apache License" in lic.read_text() and "Version 2.0, January 2004" in lic.read_text()
assert dist.metadata["License-Expression"] == "Apache-2.0", dist.metadata["License-Expression"]
PY
echo "release smoke: kvgeom $version sdist + wheel built, wheel installed in a clean venv and run: ok ($(( $(date +%s) - start )) s)"
