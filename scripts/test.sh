#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, real-vLLM tests included.
# Arguments go to pytest as they are (bash scripts/test.sh tests/controlplane/gateway runs one folder).
# --fast first: the fast lane, no real vLLM engine and no image build, four test processes
# (most of the lane waits on sockets and child processes, not the CPU):
#   bash scripts/test.sh --fast            == -n 4 -m "not vllm and not sglang and not images"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} TOKENIZERS_PARALLELISM=false
# Bytecode is written (into __pycache__, which git ignores) even where the machine says not to
# (PYTHONDONTWRITEBYTECODE, set on ours): the run starts ~250 Python processes, and without it
# each compiled again what it imported of rlcp/ and tests/ (the installed packages are compiled
# at install): a controller process 2.8 -> 1.2 CPU-s to start, each pytest process's collection
# ~12 CPU-s more, its assertion rewriting included.
unset PYTHONDONTWRITEBYTECODE
if [ "${1:-}" = "--fast" ]; then
  shift
  set -- -n 4 -m "not vllm and not sglang and not images" "$@"
fi
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -eq 0 ]; then
  # The whole suite, in three parts; all of them run, and any failing fails the command.
  # 1. The tests that start real engines (vLLM, SGLang, Dynamo), in one process: they share the
  #    session's engines (tests/conftest.py), and two cores run two engines at a time at most.
  #    Beside it, in the background (the two cores are busy from end to end either way; the
  #    engine part in two processes was no faster, and ran at a load of 27):
  # 2. the rest in two processes (they mostly wait on sockets and child processes; the image
  #    builds are among them, on one of the two), then the API fuzzing (tests/fuzz/api) in two
  #    processes of its own, with xdist's plain `--dist load`: schemathesis' items share one node
  #    id per test function, and the rest's `--dist loadgroup` would run one operation of each and
  #    drop the others. Its closing checks add up the cases of both workers (tests/fuzz/api/reach.py).
  #    Beside four other test processes it failed, so it waits for the rest.
  # 3. Then, still beside the engine part's last modules, the tests of stock `vllm serve`
  #    (tests/controlplane/workers/flavors/vllm_serve), in a pytest process of their own: they
  #    start two engines of their own and share none with the engine part, and there the two
  #    chains take about as long. (Their pause tests, like every test that pauses requests in
  #    flight, hold those requests until the pause has landed: rlcp/harness/hold.py.)
  rc=0
  fuzz_api=tests/fuzz/api
  rest="not vllm and not sglang"
  own_servers=tests/controlplane/workers/flavors/vllm_serve
  # The parts that start engines leave the API fuzzing out of their collection (no test of it
  # starts one; building its schemathesis items costs every collecting process ~5 CPU-s).
  logs=$(mktemp -d)
  (
    brc=0
    "${pytest[@]}" -n 2 --dist loadgroup -m "$rest" --ignore "$fuzz_api" --durations=10 >"$logs/rest" 2>&1 || brc=$?
    "${pytest[@]}" -n 2 --dist load -m "$rest" "$fuzz_api" >"$logs/fuzz-api" 2>&1 || brc=$?
    "${pytest[@]}" "$own_servers" --durations=5 >"$logs/vllm-serve" 2>&1 || brc=$?
    exit $brc
  ) &
  background=$!
  "${pytest[@]}" -m "vllm or sglang" --ignore "$fuzz_api" --ignore "$own_servers" --durations=25 || rc=$?
  wait "$background" || rc=$?
  for part in rest fuzz-api vllm-serve; do
    echo "=== $part"
    cat "$logs/$part"
  done
  rm -rf "$logs"
  exit $rc
fi
exec "${pytest[@]}" "$@"
