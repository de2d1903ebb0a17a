"""The one harness shared by the tests, the benchmarks and the local demo.

Each module is one concern, importable by `tests/`, `bench/` and `rlcp/localfleet/` alike (nothing here
imports any of them):

- `processes`: `python -m rlcp.agent` / `python -m rlcp.controlplane` as child processes (spawn with a
  config file and a ready file, stop, kill the group, read the log);
- `servers`: servers that write no ready file (stock `vllm serve`, SGLang, Dynamo), ready by an HTTP probe;
- `supervisor`: children started again when they exit, as a kubelet would;
- `procfs`: a process's CPU time and a controller daemon's processes, read from /proc;
- `raycluster`: a real Ray head on loopback; `ports`: the block of free ports it binds, and who listens where;
- `simfleet`: real agents on SimEngine on loopback, in this process or in host processes;
- `checkpoints`: weights, adapters and models made on the spot;
- `faults`: fault rules, applied by an aiohttp middleware or by a loopback HTTP proxy;
- `controller`: an in-process controller for tests, its settings, and readiness over HTTP;
- `fleet_state`: a fleet state written by hand, for a gateway (or Envoy's endpoints) with no controller behind it;
- `waiting`: bounded waits with a deadline and a message;
- `http`: one HTTP call with a deadline, and free loopback ports;
- `figures`: measurements recorded by tests under `bench/out/`.
"""
