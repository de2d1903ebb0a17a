#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, real-vLLM tests included.
# Arguments go to pytest as they are (bash scripts/test.sh tests/controller runs one folder).
# --fast first: the fast lane, no real vLLM engine and no image build, four test processes
# (most of the lane waits on sockets and child processes, not the CPU):
#   bash scripts/test.sh --fast            == -n 4 -m "not vllm and not images"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} TOKENIZERS_PARALLELISM=false
if [ "${1:-}" = "--fast" ]; then
  shift
  set -- -n 4 -m "not vllm and not images" "$@"
fi
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -eq 0 ]; then
  # The whole suite, in four parts; all of them run, and any failing fails the command.
  # 1. Modules marked `alone`, in a pytest process of their own: their premise is timing (the
  #    test process reads two engines' streams fast enough to pause them mid-way), and in one
  #    long process, after ~900 tests, its event loop was seen blocked 0.3 to 4.7 s at a time.
  # 2. The tests that start real engines or build images, in one process: they share the
  #    session's engines (tests/conftest.py), and two cores run two engines at a time at most.
  # 3. The rest in four processes (they mostly wait on sockets and child processes), but for
  # 4. the API fuzzing, in one process: its closing check needs to see every case it ran.
  rc=0
  fuzz=tests/controller/test_fuzz_api.py
  "${pytest[@]}" -m alone || rc=$?
  "${pytest[@]}" -m "not alone and (vllm or images)" || rc=$?
  "${pytest[@]}" -n 4 -m "not alone and not vllm and not images" --ignore "$fuzz" || rc=$?
  "${pytest[@]}" -m "not alone and not vllm and not images" "$fuzz" || rc=$?
  exit $rc
fi
exec "${pytest[@]}" "$@"
