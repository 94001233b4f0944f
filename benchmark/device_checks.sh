#!/usr/bin/env bash
# The checks that need a real GPU, in one call: run from the repository root on a machine
# with an NVIDIA GPU, cupy and a CUDA build of torch (the build machines have neither):
#
#   WHEELS=DIR bash benchmark/device_checks.sh OUT_DIR
#
# 1. installs blake3 and ml_dtypes from the wheels in $WHEELS when set (offline:
#    pip install --no-index), for machines without a package index;
# 2. builds the compiled modules (cascade/_ids.c, cascade/buffers/_hostcopy.c,
#    cascade/tiers/_recordread.c, cascade/tiers/_firstfit.c) with the machine's gcc;
# 3. runs `pytest -m gpu` (tests/gpu, the tier contract on a cupy slab, device_io on the
#    GPU; junit in OUT_DIR/gpu_junit.xml) and the compiled modules' tests;
# 4. runs `python -m benchmark.suite --workloads device_io --reps 3` (the suite refuses a
#    tree whose tracked files differ from HEAD unless ALLOW_DIRTY=1).
#
# OUT_DIR gets build.log (build, tests, device), the suite's folder, and all of it in one
# OUT_DIR/device_checks.tgz (for lenders that hand back few files). Copy the suite's folder
# to benchmark/results/device/ with build.log and gpu_junit.xml beside it. Exit status:
# the first step that failed, else 0.
set -u
out=${1:?usage: WHEELS=DIR bash benchmark/device_checks.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
fail() { [ "$status" -ne 0 ] || status=$1; }
log="$out/build.log"
{
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown), $(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) tracked files differ from it"
    nvidia-smi -L 2>&1 | head -4
    $py --version 2>&1
} > "$log"

if [ -n "${WHEELS:-}" ]; then
    $py -m pip install -q --no-index --no-deps --find-links "$WHEELS" blake3 ml-dtypes >> "$log" 2>&1 || fail 2
fi
includes=$($py-config --includes 2>/dev/null || $py -c 'import sysconfig; print("-I" + sysconfig.get_paths()["include"])')
suffix=$($py -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
built=0
for src in cascade/_ids.c cascade/buffers/_hostcopy.c cascade/tiers/_recordread.c cascade/tiers/_firstfit.c; do
    gcc -O3 -shared -fPIC -pthread $includes "$src" -o "${src%.c}$suffix" >> "$log" 2>&1 || built=1
done
echo "build rc=$built" >> "$log"
$py -c "import sys; from cascade import identity; from cascade.buffers import hostcopy; from cascade.tiers import record_io, slab
ok = identity.COMPILED_ID_CHECK and hostcopy.COMPILED and record_io.COMPILED and slab.FirstFit is not None; print('COMPILED', ok); sys.exit(not ok)" >> "$log" 2>&1 || fail 3

$py -m pytest -q -p no:cacheprovider -m gpu tests/gpu tests/test_tiers.py tests/test_device_io_workload.py \
    --junitxml="$out/gpu_junit.xml" > "$out/gpu_tests.log" 2>&1 || fail 4
echo "pytest -m gpu: $(tail -1 "$out/gpu_tests.log")" >> "$log"
grep -q " passed" "$out/gpu_tests.log" || { echo "no gpu test ran: is there a GPU, cupy and CUDA torch?" >> "$log"; fail 4; }
$py -m pytest -q -p no:cacheprovider tests/test_hostcopy.py tests/test_splitcopy.py tests/test_recordread.py tests/test_slab_alloc.py \
    > "$out/hostcopy_tests.log" 2>&1 || fail 5
echo "tests/test_hostcopy.py tests/test_splitcopy.py tests/test_recordread.py tests/test_slab_alloc.py: $(tail -1 "$out/hostcopy_tests.log")" >> "$log"

dirty=()
[ "${ALLOW_DIRTY:-0}" = 1 ] && dirty=(--allow-dirty)
$py -m benchmark.suite --workloads device_io --reps 3 "${dirty[@]}" --out "$out/suites" > "$out/suite.log" 2>&1 || fail 6
tr '\r' '\n' < "$out/suite.log" | tail -3 >> "$log"

tar czf "$out.tgz" -C "$out" . 2>> "$log" && mv "$out.tgz" "$out/device_checks.tgz" || fail 7
cat "$log"
exit "$status"
