#!/usr/bin/env bash
# `pip install .` (not editable) into a fresh venv outside the checkout, then load the
# shipped zoo model and run one analysis from there: proves the package carries its data.
# Dependencies are linked from the project venv (torch alone is 5.5 GB); interp itself
# comes only from the built wheel.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# setuptools reuses build/lib: a module removed since the last build would ship again from there
rm -rf "$ROOT/build"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/wheel" "$ROOT"
# the wheel ships the library alone: no experiment, training recipe, benchmark, tool or test module
"$PY" - "$WORK"/wheel/interp-*.whl <<'PYCODE'
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
modules = [n for n in names if n.endswith(".py")]
stray = [n for n in names if n.split("/")[0] in ("experiments", "tools", "benchmarks", "tests")
         or "/training/" in n or n.endswith(("sink_arms.py", "fused.py", ".c"))]
assert modules and all(n.startswith("interp/") for n in modules), f"modules outside interp/: {modules}"
assert not stray, f"the wheel carries experiment or build files: {stray}"
print(f"wheel: {len(modules)} modules, all under interp/, no experiments")
PYCODE
"$PY" -m venv --without-pip "$WORK/venv"
DEPS="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
SITE="$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$DEPS" > "$SITE/project-deps.pth"
"$PY" -m pip install -q --no-deps --target "$SITE" "$WORK"/wheel/interp-*.whl
cd "$WORK"
HF_HUB_OFFLINE=1 "$WORK/venv/bin/python" -I - "$WORK" <<'PYCODE'
import sys

import interp

assert interp.__file__.startswith(sys.argv[1]), f"interp imported from {interp.__file__}, not the installed wheel"
model = interp.load_model("digits-vit", device="cpu")
stats = interp.record_qkv(model, "digits", max_batches=2, progress=False)
origin = interp.origin_shift(model, stats)
assert len(origin) == 4 * 4 * 3 and origin.shift_ratio.notna().all()
print(f"installed interp {interp.__version__} from {interp.__file__}: digits-vit loaded, "
      f"origin shift over {stats.count(0)} patches, max shift ratio {origin.shift_ratio.max():.3f}")
PYCODE
