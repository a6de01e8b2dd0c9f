# Shared by the device batch scripts (scripts/device-batch-*.sh, scripts/gpu-evidence.sh): source it
# after setting `parts` (the parts asked for) and `out` (the output folder).
#   want PART        true when PART (or "all") was asked for
#   step LIMIT CMD…  run CMD under a time limit, logged with its exit code; `kd` stands for python3 -m cli
#   pick_goldens DEST NAME…  a fresh folder DEST with goldens/NAME.kdtr for each NAME (op/case)
#   install_wheels   the wheels of scripts/fetch-device-wheels.sh (carried in .whl/) into /tmp/site,
#                    prepended to PYTHONPATH; the device reaches no package index
export PYTHONPATH=. PYTHONUNBUFFERED=1 KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-cache}
want() { [[ " $parts " == *" $1 "* || " $parts " == *" all "* ]]; }
step() { local limit=$1; shift; echo "== [$(date +%T)] ${KDTREE_GPU:+KDTREE_GPU=$KDTREE_GPU }$*"
         if [ "$1" = kd ]; then shift; set -- python3 -m cli "$@"; fi; timeout "$limit" "$@"; echo "== exit $?"; }
pick_goldens() { local dest=$1 f; shift; rm -rf "$dest"
  for f in "$@"; do mkdir -p "$dest/$(dirname "$f")" && cp "goldens/$f.kdtr" "$dest/$f.kdtr"; done; }
install_wheels() {
  if ! ls .whl/*.whl >/dev/null 2>&1; then echo "== no wheels in .whl/ (scripts/fetch-device-wheels.sh, carry .whl)"; return 0; fi
  step 180 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:.
  step 60 python3 -c "import importlib.metadata as m; print({n: m.version(n) for n in ('sglang', 'sgl-flash-mla', 'nvidia-ml-py')})"
}
