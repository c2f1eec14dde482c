"""Reference workers (query node, stream node) for the demo, drills, benchmarks and tests.

Nothing is imported here on purpose: ``python -m querycoord.nodes.querynode``
must not find its module already imported by the package (runpy warns and
the module would exist twice).
"""
