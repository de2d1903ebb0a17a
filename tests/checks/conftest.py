"""Checks over the source tree rather than behaviour: the import architecture (who may import
whom), ruff's lint, and the type checker (mypy, strict over the product and the benchmarks). They
read files and run tools; none starts a process of the product."""
