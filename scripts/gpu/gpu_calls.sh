#!/bin/sh
# The device recipe: the GPU check in three short calls, each one command line for the device tool (run from
# the repository root; results under $OUT, which travels back; models and artifacts in temporary folders).
#
#   call 1, no wheels, nothing compiled (correctness, costs at the 7B shapes, host work, the draft program,
#           capture times; under 5 min on one H100):             sh scripts/gpu/gpu_calls.sh 1
#   call 2, the compiled draft, cold then warm from persisted artifacts (two children of at most 200 s):
#                                                                sh scripts/gpu/gpu_calls.sh 2
#   call z, the ZeroGPU call check (each call in a forked process: weights to the card, graphs captured in the
#           call, the page's decodes beside the target alone, at the 1.5B and 7B shapes; ~2 min):
#                                                                sh scripts/gpu/gpu_calls.sh z
#   call 3, the app through its own API on random weights at the embedded shapes, after the wheels
#           (python scripts/gpu/wheelhouse.py here first; carry each part, the last one with this call):
#                                                                sh scripts/gpu/gpu_calls.sh 3
#
# Extra arguments go to the call's script.  Smoke-tested here on CPU (tiny stand-ins):
#   DEVICE=cpu PYTHON=.venv/bin/python OUT=/tmp/gc sh scripts/gpu/gpu_calls.sh 1 --repeats 1 --new-tokens 16
set -e
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONUNBUFFERED=1
call=$1
shift
case "$call" in
1) exec $PY scripts/gpu/gpu_check.py --out "$OUT/call1" --device "$DEVICE" --preset no-compile "$@" ;;
2) exec $PY scripts/gpu/gpu_check.py --out "$OUT/call2" --device "$DEVICE" --preset compiled-draft --child-timeout 200 "$@" ;;
z) exec $PY scripts/gpu/zerogpu_call_check.py --out "$OUT/zerogpu" --device "$DEVICE" "$@" ;;
3)
  install=$(ls .whl/part*/install.sh 2>/dev/null | head -n 1)
  if [ -n "$install" ]; then sh "$install"; fi
  PYTHONPATH="$PWD/.pydeps${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONPATH
  exec $PY scripts/gpu/app_api_check.py --out "$OUT/call3" --device "$DEVICE" --make embedded --compile 0 \
      --repeats 2 "$@" ;;
*) echo "usage: sh scripts/gpu/gpu_calls.sh 1|2|3|z [arguments for the call's script]" >&2; exit 2 ;;
esac
