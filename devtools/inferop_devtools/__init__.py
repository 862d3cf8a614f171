"""Tools for developing inferop, not part of the product: a local control plane for tests, benchmarks and trying
the operator and chart without a cluster (`inferop cluster up|down|status`).

Nothing in inferop, inferop_operator or inferop_export imports this package (an import-linter contract in
`make check`), so no image that ships the product carries it.
"""
