"""Side-by-side measurements of replicaft, each against a baseline measured in the same run.

Run them with ``python -m benchmarks <name> [--quick]`` (see ``__main__.py``). Each benchmark
is one module exposing ``run(*, quick: bool) -> BenchmarkResult``; the runner stamps the
time and the machine onto the result and writes ``benchmarks/results/<name>.json``, from
which the docs site's figures page is built. Importing this package runs nothing and imports nothing heavy:
benchmark worker processes import it on every start.
"""
