#!/usr/bin/env bash
# jaxtop on a TPU machine that has jax and libtpu but no network.
#
#   tools/tpu/run.sh wheels DIR
#       Here, where pip can reach a package index: jaxtop (`pip wheel --no-deps`
#       of this working tree) and its dependencies as CPython 3.11 manylinux
#       x86_64 wheels (`pip download --only-binary=:all: --no-deps`), into DIR.
#
#   tools/tpu/run.sh chip --wheels DIR --results DIR [--prefix DIR] [--python PY]
#                         [--steps LIST] [--dry-run]
#       On the TPU machine, from a copy of this checkout: installs the wheels
#       into a prefix (`pip install --no-index --no-deps --target`), appends it
#       to PYTHONPATH (the machine's own jax stays first: no jax is installed
#       there), then runs each step with a timeout, writing its output under
#       the results directory:
#         cost    tests/tpu/cost.py at 10,000 and 50,000 live arrays (cost.json, cost.txt)
#         tests   pytest tests/tpu with a TPU required (pytest.txt, pytest.xml);
#                 its cost test checks cost.json instead of measuring again
#         demo    jaxtop demo --headless --json (demo.json, demo.md, demo.err)
#         freeblock  benchmarks/largest_free_block.py: is the allocator's largest
#                 free block a bound on one request (freeblock.json); it decides
#                 whether jaxtop may show fragmentation on TPU
#         record  fresh recordings for tests/fixtures/tpu/ (recordings/)
#         screens the dashboard at 120x40 and 80x24 and `jaxtop snapshot`,
#                 attached to the training loop (screens.txt)
#         sites   implicit transfers per line of the training loop, jaxtop's
#                 against JAX's own guard (tools/tpu/compare_sites.py; sites.txt)
#         advice  each demo strategy in the variant that misses it and the one
#                 that applies it (tests/targets/advice_demo.py at the demo's
#                 chip sizes), and the loop that misses six strategies with its
#                 clean twin, each recorded under `jaxtop run --log` and judged
#                 by `jaxtop advise --json` (advice/NAME.jsonl.gz, NAME.json);
#                 ADVICE_RUNS picks some (e.g. "runahead-off runahead-on miss")
#         sitescost  benchmarks/transfer_sites.py on the chip: what tying each
#                 transfer to its line costs, beside JAX's own logging
#                 (sitescost.txt, sitescost.json)
#       summary.txt lists each step's exit status and time; the script exits
#       non-zero when any step failed.
#
# Only one process at a time may open the chip: the steps run one after the
# other, and nothing else should hold the chip meanwhile. docs/accelerators.md
# has the whole procedure and the figures measured so far.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The dependencies of jaxtop and of its chip tests. Pure-Python and binary
# wheels alike are fetched for the chip's interpreter (CPython 3.11, x86_64
# Linux), not for the one running this script.
DEPS=(textual rich markdown-it-py mdurl mdit-py-plugins linkify-it-py uc-micro-py pygments platformdirs
      psutil nvidia-ml-py orjson msgspec isal typing-extensions pyte wcwidth
      pytest pluggy iniconfig packaging pytest-timeout pytest-asyncio)
CHIP_PYTHON_VERSION=3.11
ALL_STEPS=cost,tests,demo,freeblock,record,screens,sites,sitescost,advice

# Seconds each step may take before it is stopped (its partial output kept).
: "${COST_TIMEOUT:=2400}"
: "${TESTS_TIMEOUT:=2400}"
: "${DEMO_TIMEOUT:=900}"
: "${RECORD_TIMEOUT:=600}"
# Seconds of loop each advice run records, and the window it is judged over
# (its newest part: the start-up and the first compiles stay out of it).
: "${ADVICE_LOOP_S:=15}"
: "${ADVICE_WINDOW_S:=12}"
: "${ADVICE_RUNS:=placement-off placement-on donation-off donation-on inplace-off inplace-on batching-off batching-on
  jit-off jit-on guard-log guard-disallow checkpointing-off checkpointing-on fragmentation-off fragmentation-on
  runahead-off runahead-on miss clean}"
# What the cost step measures (tests/tpu/cost.py's options).
: "${COST_ARGS:=--sizes 10000,50000 --rounds 2}"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

die() {
  echo "tools/tpu/run.sh: $*" >&2
  exit 2
}

# -- here: the wheels ---------------------------------------------------------------------------

build_wheels() {
  local out=$1 py=${PYTHON:-}
  if [ -z "$py" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then py=$REPO/.venv/bin/python; else py=python3; fi
  fi
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  # A copy of the working tree (tracked and new files, nothing ignored):
  # setuptools would otherwise reuse a stale build/ beside the sources, and
  # the wheel must hold what the tests copied to the chip were written for.
  TREE=$(mktemp -d "${TMPDIR:-/tmp}/jaxtop-wheel-src.XXXXXX")
  trap 'rm -rf "$TREE"' EXIT
  local tree=$TREE
  if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - 2>/dev/null) | tar -xf - -C "$tree"
  else
    (cd "$REPO" && tar --exclude=.venv --exclude=build --exclude='*.egg-info' --exclude=__pycache__ -cf - .) | tar -xf - -C "$tree"
  fi
  "$py" -m pip wheel --no-deps "$tree" -w "$out"
  # Each dependency at the version this interpreter has, the one the tests
  # ran with here; the index's newest where that version has no wheel for
  # the chip (or it is not installed here).
  local dep pinned
  for dep in "${DEPS[@]}"; do
    pinned=$("$py" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$dep" 2>/dev/null) || pinned=""
    if [ -n "$pinned" ] && download "$py" "$out" "$dep==$pinned"; then
      continue
    fi
    [ -z "$pinned" ] || echo "note: no CPython $CHIP_PYTHON_VERSION manylinux wheel of $dep==$pinned; taking the index's newest"
    download "$py" "$out" "$dep" || die "wheels: no wheel of $dep for CPython $CHIP_PYTHON_VERSION on x86_64 Linux"
  done
  echo "wheels for the chip (CPython $CHIP_PYTHON_VERSION, x86_64) in $out:"
  ls -1 "$out"
}

download() {
  "$1" -m pip download --quiet --only-binary=:all: --python-version "$CHIP_PYTHON_VERSION" --implementation cp \
    --platform manylinux_2_17_x86_64 --no-deps -d "$2" "$3" 2>/dev/null
}

# -- on the chip ---------------------------------------------------------------------------------

DRY_RUN=0
FAILED=()

# screens PY: the dashboard as a user reads it on the chip. The training loop
# runs on the TPU under `jaxtop run`; once its agent answers, dashboards
# attach from other processes (on CPU: only one process may open the chip) in
# pseudo-terminals of 120x40 and 80x24 (tools/tpu/screen.py), and
# `jaxtop snapshot` prints its text. The screens go to stdout.
screens() {
  local py=$1 pid i
  JAX_PLATFORMS=tpu "$py" -P -m jaxtop run "$REPO/tests/tpu/targets/train.py" --seconds 45 --width 4096 --layers 8 \
    --batch 512 >"$RESULTS/screens-train.txt" 2>&1 &
  pid=$!
  for i in $(seq 60); do
    JAX_PLATFORMS=cpu "$py" -P -m jaxtop snapshot --timeout 1 "$pid" >/dev/null 2>&1 && break
    sleep 0.5
  done
  sleep 8  # past the first steps: run-ahead builds up
  JAX_PLATFORMS=cpu "$py" -P "$REPO/tools/tpu/screen.py" 120 40 10 k:J 3 k:esc k:H 4 -- \
    "$py" -P -m jaxtop attach "$pid" >"$RESULTS/screens-120x40.txt" 2>&1 &
  JAX_PLATFORMS=cpu "$py" -P "$REPO/tools/tpu/screen.py" 80 24 10 -- \
    "$py" -P -m jaxtop attach "$pid" >"$RESULTS/screens-80x24.txt" 2>&1 &
  sleep 6
  echo "=== jaxtop snapshot $pid (text)"
  JAX_PLATFORMS=cpu "$py" -P -m jaxtop snapshot "$pid" || echo "snapshot: exit $?"
  wait
  for f in "$RESULTS"/screens-*.txt; do echo "=== $f"; cat "$f"; done
}

# run_step NAME TIMEOUT OUTFILE COMMAND...: one step, its stdout and stderr
# into OUTFILE (stderr apart when ERRFILE is set), its status in the summary.
run_step() {
  local name=$1 limit=$2 out=$3
  shift 3
  if [ "$DRY_RUN" = 1 ]; then
    printf 'would run [%s, %ss] (cd %q && %s) > %q\n' "$name" "$limit" "$WORK" "$(printf '%q ' "$@")" "$out"
    return 0
  fi
  local started rc=0
  started=$(date +%s)
  echo "--- $name: $(printf '%q ' "$@")"
  if [ -n "${ERRFILE:-}" ]; then
    (cd "$WORK" && timeout --kill-after=30 "$limit" "$@") >"$out" 2>"$ERRFILE" || rc=$?
  else
    (cd "$WORK" && timeout --kill-after=30 "$limit" "$@") >"$out" 2>&1 || rc=$?
  fi
  local took=$(( $(date +%s) - started ))
  local what="ok"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then what="TIMED OUT after ${limit}s"; elif [ "$rc" != 0 ]; then what="FAILED"; fi
  printf '%-8s exit %-3s %5ss  %s\n' "$name" "$rc" "$took" "$what" | tee -a "$RESULTS/summary.txt"
  [ "$rc" = 0 ] || FAILED+=("$name")
}

wants() {
  case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac
}

chip() {
  local wheels="" prefix="" py=python3
  RESULTS=""
  STEPS=$ALL_STEPS
  while [ $# -gt 0 ]; do
    case $1 in
      --wheels) wheels=${2:?}; shift 2 ;;
      --results) RESULTS=${2:?}; shift 2 ;;
      --prefix) prefix=${2:?}; shift 2 ;;
      --python) py=${2:?}; shift 2 ;;
      --steps) STEPS=${2:?}; shift 2 ;;
      --dry-run) DRY_RUN=1; shift ;;
      *) die "chip: unknown argument $1 (see --help)" ;;
    esac
  done
  if [ -z "$wheels" ] || [ -z "$RESULTS" ]; then die "chip: --wheels DIR and --results DIR are needed"; fi
  [ -d "$wheels" ] || die "chip: no wheels directory $wheels (make it with: tools/tpu/run.sh wheels DIR)"
  compgen -G "$wheels/jaxtop-*.whl" >/dev/null || die "chip: no jaxtop wheel in $wheels"
  local step
  for step in ${STEPS//,/ }; do
    case ",$ALL_STEPS," in *",$step,"*) ;; *) die "chip: unknown step $step (steps: $ALL_STEPS)" ;; esac
  done
  command -v timeout >/dev/null || die "chip: the timeout command (coreutils) is needed"
  mkdir -p "$RESULTS"
  RESULTS=$(cd "$RESULTS" && pwd)
  wheels=$(cd "$wheels" && pwd)
  prefix=${prefix:-$RESULTS/prefix}
  WORK=$RESULTS/work
  mkdir -p "$WORK" "$RESULTS/recordings"

  local version
  version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$version" = "$CHIP_PYTHON_VERSION" ] || die "chip: $py is Python $version; the wheels are for $CHIP_PYTHON_VERSION"
  # jax is the machine's: imported here, not opened (no jax.devices()).
  local jax_version
  jax_version=$("$py" -c 'import jax; print(jax.__version__)') || die "chip: $py cannot import jax"

  if [ "$DRY_RUN" = 1 ]; then
    echo "would install: $py -m pip install --no-index --no-deps --upgrade --target $prefix $wheels/*.whl"
  else
    "$py" -m pip install --no-index --no-deps --upgrade --target "$prefix" "$wheels"/*.whl >"$RESULTS/install.log" 2>&1 \
      || { tail -20 "$RESULTS/install.log" >&2; die "chip: installing the wheels failed (install.log)"; }
  fi
  # Appended, so that whatever PYTHONPATH already gives (the machine's jax)
  # comes first; no jax or libtpu is in the prefix for it to shadow.
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$prefix"
  # python -P: neither the working directory nor a script's directory goes
  # first on sys.path, so this checkout's sources (a jaxtop without its
  # probes, which setuptools maps from probes/) never shadow the wheel.
  local where
  if [ "$DRY_RUN" = 1 ]; then
    where="(dry run: jaxtop from $prefix)"
  else
    where=$(cd "$WORK" && "$py" -P -c 'import jax, jaxtop, jaxtop.probes; print("jaxtop", jaxtop.__version__, jaxtop.__file__); print("jax", jax.__version__, jax.__file__)')
    case $where in *"$prefix/jaxtop/"*) ;; *) die "chip: jaxtop is not imported from $prefix: $where" ;; esac
  fi
  : >"$RESULTS/summary.txt"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -a)"
    echo "python: $py ($version)"
    echo "jax (the machine's): $jax_version"
    echo "libtpu: $("$py" -c 'from importlib.metadata import version; print(version("libtpu"))' 2>/dev/null || echo 'n/a')"
    echo "PYTHONPATH: $PYTHONPATH"
    echo "$where"
    echo "wheels:"
    ls -1 "$wheels"
    echo "checkout: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo 'not a git checkout')"
  } >"$RESULTS/env.txt"

  # JAX_PLATFORMS=tpu in every step: a chip that cannot be opened fails the
  # step instead of jax falling back to CPU and the results passing for the chip's.
  if wants cost; then
    # shellcheck disable=SC2086  # COST_ARGS is a list of options
    run_step cost "$COST_TIMEOUT" "$RESULTS/cost.txt" \
      env JAX_PLATFORMS=tpu "$py" -P "$REPO/tests/tpu/cost.py" $COST_ARGS --json-out "$RESULTS/cost.json"
  fi
  if wants tests; then
    run_step tests "$TESTS_TIMEOUT" "$RESULTS/pytest.txt" \
      env JAXTOP_REQUIRE_TPU=1 JAXTOP_TPU_COST_JSON="$RESULTS/cost.json" \
      "$py" -P -m pytest "$REPO/tests/tpu" --rootdir "$REPO" -c "$REPO/pyproject.toml" -p no:cacheprovider \
      -v -rs --junitxml "$RESULTS/pytest.xml"
  fi
  if wants demo; then
    ERRFILE=$RESULTS/demo.err run_step demo "$DEMO_TIMEOUT" "$RESULTS/demo.json" \
      env JAX_PLATFORMS=tpu "$py" -P -m jaxtop demo --headless --json
    if [ "$DRY_RUN" = 0 ] && [ -s "$RESULTS/demo.json" ]; then
      (cd "$WORK" && "$py" -P -m jaxtop.demo.headless --markdown) <"$RESULTS/demo.json" >"$RESULTS/demo.md" \
        2>>"$RESULTS/demo.err" || true
    fi
  fi
  if wants freeblock; then
    ERRFILE=$RESULTS/freeblock.err run_step freeblock "$DEMO_TIMEOUT" "$RESULTS/freeblock.json" \
      env JAX_PLATFORMS=tpu "$py" -P "$REPO/benchmarks/largest_free_block.py"
  fi
  if wants record; then
    # The chip tests' training loop for 40 s, recorded as `jaxtop run --log`
    # records it; and the census of a program that fills the chip.
    run_step record "$RECORD_TIMEOUT" "$RESULTS/recordings/training-loop.txt" \
      env JAX_PLATFORMS=tpu "$py" -P -m jaxtop run --log "$RESULTS/recordings/training-loop.jsonl.gz" \
      "$REPO/tests/tpu/targets/train.py" --seconds 40 --width 4096 --layers 8 --batch 512
    ERRFILE=$RESULTS/recordings/oom-census.txt run_step record-oom "$RECORD_TIMEOUT" "$RESULTS/recordings/fill.out" \
      env JAX_PLATFORMS=tpu JAXTOP_OOM_DIR="$RESULTS/recordings" "$py" -P -m jaxtop run "$REPO/tests/tpu/targets/fill.py" 1073741824
    # The program is meant to die of the OOM (exit 1): the census is what counts.
    if [ "$DRY_RUN" = 0 ] && compgen -G "$RESULTS/recordings/jaxtop-oom-*.json" >/dev/null; then
      local i
      for i in "${!FAILED[@]}"; do [ "${FAILED[$i]}" = record-oom ] && unset 'FAILED[i]'; done
      echo "record-oom: the census is in recordings/ (the program's exit 1 is its OOM)" | tee -a "$RESULTS/summary.txt"
    fi
  fi
  if wants sites; then
    # Which line made each implicit transfer, on the chip: the training loop
    # under jaxtop, then under tests/transfer_oracle.py (JAX's own guard, line
    # by line), compared.
    local args=("$REPO/tests/tpu/targets/train.py" --steps 200 --width 1024 --layers 4 --batch 256)
    run_step sites-run "$RECORD_TIMEOUT" "$RESULTS/sites-run.txt" \
      env JAX_PLATFORMS=tpu "$py" -P -m jaxtop run --log "$RESULTS/sites.jsonl" "${args[@]}"
    run_step sites-oracle "$RECORD_TIMEOUT" "$RESULTS/sites-oracle.txt" \
      env JAX_PLATFORMS=tpu "$py" -P "$REPO/tests/transfer_oracle.py" --table --json-out "$RESULTS/sites-oracle.json" \
      "${args[@]}"
    run_step sites "$RECORD_TIMEOUT" "$RESULTS/sites.txt" \
      "$py" -P "$REPO/tools/tpu/compare_sites.py" "$RESULTS/sites.jsonl" "$RESULTS/sites-oracle.json"
  fi
  if wants sitescost; then
    run_step sitescost "$COST_TIMEOUT" "$RESULTS/sitescost.txt" \
      "$py" -P "$REPO/benchmarks/transfer_sites.py" --platform tpu ${SITESCOST_ARGS:-} --json-out "$RESULTS/sitescost.json"
  fi
  if wants screens; then
    run_step screens "$RECORD_TIMEOUT" "$RESULTS/screens.txt" bash "$REPO/tools/tpu/run.sh" screens-step "$py" "$RESULTS"
  fi
  if wants advice; then
    mkdir -p "$RESULTS/advice"
    local run target
    for run in $ADVICE_RUNS; do
      case $run in
        miss|clean) target=("$REPO/tests/targets/advice_$run.py" "$ADVICE_LOOP_S") ;;
        *-*) target=("$REPO/tests/targets/advice_demo.py" "${run%%-*}" "${run#*-}" "$ADVICE_LOOP_S" full) ;;
        *) die "chip: advice run $run is neither miss, clean nor STRATEGY-VARIANT" ;;
      esac
      run_step "advice-$run" "$RECORD_TIMEOUT" "$RESULTS/advice/$run.txt" \
        env JAX_PLATFORMS=tpu "$py" -P -m jaxtop run --log "$RESULTS/advice/$run.jsonl.gz" "${target[@]}"
      # Judged on CPU (the chip is the next run's), while the next run records.
      [ "$DRY_RUN" = 1 ] || (cd "$WORK" && JAX_PLATFORMS=cpu "$py" -P -m jaxtop advise --json \
        --window "$ADVICE_WINDOW_S" "$RESULTS/advice/$run.jsonl.gz" >"$RESULTS/advice/$run.json" \
        2>"$RESULTS/advice/$run.advise.err") &
    done
    wait
  fi
  if [ "$DRY_RUN" = 1 ]; then
    return 0
  fi
  echo "results in $RESULTS:"
  cat "$RESULTS/summary.txt"
  if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "failed: ${FAILED[*]}"
    return 1
  fi
}

case ${1:-} in
  wheels) [ $# -eq 2 ] || die "usage: tools/tpu/run.sh wheels DIR"; build_wheels "$2" ;;
  chip) shift; chip "$@" ;;
  screens-step) [ $# -eq 3 ] || die "usage (run by chip): tools/tpu/run.sh screens-step PY RESULTS"; RESULTS=$3; screens "$2" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
