"""The API fuzzing's closing checks: each server's fuzzing reached past validation, judged over every
case of that server the run made, in whichever process it ran.

A run whose update, broadcast and LoRA cases were all refused at the door (a 4xx for bad input)
would pass every check of every case while exercising no real operation. So a server's test file
names the operations that must answer at least one of their fuzzed cases with a 2xx (`require`),
every case is recorded (`record`, by `fuzzing.fuzz_case`), and at the end of the run one check per
server judges. A plugin, registered by tests/conftest.py (`pytest_plugins`), so that it is loaded in
every pytest process, the xdist controller included, whatever the arguments.

Where the verdict is given: in the one process that saw every case. Under pytest-xdist a server's
operations are spread over the workers in an order xdist does not promise, so no test in a worker
can know that it runs after every case of its server, or see the other workers' cases. Each worker
therefore hands its records to the controller in `config.workeroutput` (xdist's channel from worker
to controller, sent once the worker's session has finished, after every test of that worker), the
controller adds them up as each worker goes down (`pytest_testnodedown`), and it judges in its own
`pytest_sessionfinish`, which runs once every worker is down. A run without xdist judges its own
records at the same point. Neither assumes any order of tests (`-k`, `--lf`, `--ff` change it).

The verdict is reported as a test, `<the server's test file>::test_the_<server>_fuzzing_reached_past_validation`,
passed, or failed naming the operations that never got past validation and their counts; it counts
in the run's result, and a failed one fails the run (its exit status). A server gets a verdict when
at least one of its required operations was fuzzed in the run. The summary's "API fuzzing" section
gives the counts per server: cases, operations, how many answered 2xx, processes.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

_KEY = "rlcp_fuzz_api_reach"
# What this process saw; in the xdist controller, what every worker saw, added up. Plain data (dicts,
# lists, str, int), as execnet sends it:
#   require: {server: {"file": absolute path, "operations": [label, ...]}}
#   cases: {server: {operation label: [cases, cases answered 2xx]}}
#   processes: {server: how many processes ran its cases}
_RECORDS: dict[str, dict[str, Any]] = {"require": {}, "cases": {}, "processes": {}}


def require(server: str, file: str, operations: set[str]) -> None:
    """By the end of the run, each of `operations` (labels, `POST /v1/rl/pause`) of `server` that was
    fuzzed answered a 2xx at least once. `file` is the test file the verdict is reported under."""
    _RECORDS["require"][server] = {"file": os.path.abspath(file), "operations": sorted(operations)}


def record(server: str, operation: str, reached: bool) -> None:
    """One case of `server`'s `operation` answered; `reached`: with a 2xx, past validation."""
    counts = _RECORDS["cases"].setdefault(server, {}).setdefault(operation, [0, 0])
    counts[0] += 1
    counts[1] += int(reached)
    _RECORDS["processes"][server] = 1


def _add(theirs: dict[str, dict[str, Any]]) -> None:
    _RECORDS["require"].update(theirs["require"])
    for server, operations in theirs["cases"].items():
        ours = _RECORDS["cases"].setdefault(server, {})
        for operation, (cases, reached) in operations.items():
            counts = ours.setdefault(operation, [0, 0])
            counts[0] += cases
            counts[1] += reached
    for server, processes in theirs["processes"].items():
        _RECORDS["processes"][server] = _RECORDS["processes"].get(server, 0) + processes


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without xdist (`-p no:xdist`)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """In the xdist controller, a worker is down: add up what it recorded (nothing if it crashed
    before sending it; its crash fails the run on its own)."""
    theirs = getattr(node, "workeroutput", {}).get(_KEY)
    if theirs:
        _add(theirs)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workeroutput"):  # an xdist worker: hand the records over, the controller judges
        config.workeroutput[_KEY] = _RECORDS
        return
    for server in sorted(_RECORDS["require"]):
        report = _verdict(config, server)
        if report is None:
            continue
        config.hook.pytest_runtest_logreport(report=report)
        if report.failed and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _verdict(config: pytest.Config, server: str) -> pytest.TestReport | None:
    required = _RECORDS["require"][server]
    cases = _RECORDS["cases"].get(server, {})
    fuzzed = [op for op in required["operations"] if op in cases]
    if not fuzzed:
        return None
    never = [op for op in fuzzed if cases[op][1] == 0]
    path = os.path.relpath(required["file"], config.rootpath)
    name = f"test_the_{server}_fuzzing_reached_past_validation"
    longrepr = None
    if never:
        longrepr = (
            f"The {server}'s fuzzing never got past validation on {len(never)} of the {len(fuzzed)} operations "
            "that must answer at least one fuzzed case with a 2xx:\n"
            + "".join(f"  {op}: {cases[op][0]} cases, none answered 2xx\n" for op in never)
            + f"(over {sum(c for c, _ in cases.values())} cases of the {server} in "
            f"{_RECORDS['processes'][server]} process(es))"
        )
    return pytest.TestReport(
        nodeid=f"{path}::{name}",
        location=(path, None, name),
        keywords={name: 1, "fuzz": 1},
        outcome="failed" if never else "passed",
        longrepr=longrepr,
        when="call",
    )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workeroutput") or not _RECORDS["cases"]:
        return
    terminalreporter.section("API fuzzing", sep="-")
    for server, operations in sorted(_RECORDS["cases"].items()):
        cases = sum(c for c, _ in operations.values())
        reached = sum(r for _, r in operations.values())
        terminalreporter.line(
            f"{server}: {cases} cases over {len(operations)} operations, {reached} answered 2xx, "
            f"in {_RECORDS['processes'][server]} process(es)"
        )
