#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, real-vLLM tests included.
# Arguments go to pytest as they are (bash scripts/test.sh tests/controller runs one folder).
# --fast first: the fast lane, no real vLLM engine and no image build, four test processes
# (most of the lane waits on sockets and child processes, not the CPU):
#   bash scripts/test.sh --fast            == -n 4 -m "not vllm and not sglang and not images"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} TOKENIZERS_PARALLELISM=false
if [ "${1:-}" = "--fast" ]; then
  shift
  set -- -n 4 -m "not vllm and not sglang and not images" "$@"
fi
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -eq 0 ]; then
  # The whole suite, in two parts side by side; all of them run, and any failing fails the command.
  # 1. The engine part: the tests that start real engines (vLLM, SGLang), in one process: they
  #    share the session's engines (tests/conftest.py), and two cores run two engines at a time at
  #    most. It runs the tests marked `alone` first, with nothing beside it: their premise is timing
  #    (the test process reads two engines' streams fast enough to pause them mid-way). When they
  #    are done the process touches $RLCP_ALONE_DONE (tests/conftest.py), and the session agents
  #    they started serve the engine tests that follow.
  # 2. From then on, beside it (it keeps about a third of the two cores busy: it mostly waits for
  #    engines to start and for rollouts to end), the rest in two processes (they mostly wait on
  #    sockets and child processes; the image builds are among them, on one of the two), then the
  #    API fuzzing in two processes side by side: the controller's cases with its closing check,
  #    and the rest (the agent's with its check, the gateway's, the runs without a token). Each
  #    check needs every case of its server in its own process, which pytest-xdist cannot promise
  #    here (test_fuzz_api.py), so two plain pytest runs; beside four other test processes it
  #    failed, so it waits for them.
  rc=0
  fuzz=tests/controller/test_fuzz_api.py
  fuzz_controller="test_fuzz_controller and not without_token or test_the_controller_fuzzing"
  rest="not alone and not vllm and not sglang"
  logs=$(mktemp -d)
  export RLCP_ALONE_DONE="$logs/alone-done"
  "${pytest[@]}" -m "alone or vllm or sglang" --durations=25 &
  engines=$!
  (
    # Until the `alone` tests are done (or the engine part ended without saying so).
    while [ ! -e "$RLCP_ALONE_DONE" ] && kill -0 "$engines" 2>/dev/null; do sleep 1; done
    brc=0
    "${pytest[@]}" -n 2 --dist loadgroup -m "$rest" --ignore "$fuzz" --durations=10 >"$logs/rest" 2>&1 || brc=$?
    "${pytest[@]}" -m "$rest" "$fuzz" -k "not ($fuzz_controller)" >"$logs/fuzz-rest" 2>&1 &
    "${pytest[@]}" -m "$rest" "$fuzz" -k "$fuzz_controller" >"$logs/fuzz-controller" 2>&1 || brc=$?
    wait $! || brc=$?
    exit $brc
  ) &
  background=$!
  wait "$engines" || rc=$?
  wait "$background" || rc=$?
  for part in rest fuzz-controller fuzz-rest; do
    echo "=== $part"
    cat "$logs/$part"
  done
  rm -rf "$logs"
  exit $rc
fi
exec "${pytest[@]}" "$@"
