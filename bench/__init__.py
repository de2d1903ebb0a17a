"""Benchmarks of the control plane (docs/performance.md). Each module is one command,
`python -m bench.<name>`, that prints a table, writes JSON to bench/out/ and a PNG plot."""
