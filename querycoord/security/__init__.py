"""Who may call what: mutual TLS and bearer tokens on gRPC channels, the principals file and its reload, the
method-to-role table, and the bounds on what an unauthenticated caller may hold.
"""
