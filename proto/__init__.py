"""Protocol buffers of querycoord.

The ``*_pb2.py`` / ``*_pb2_grpc.py`` modules here are generated from the
``.proto`` sources beside them by ``scripts/gen_proto.py`` and committed;
``make test`` fails when they drift from the sources (see README).
"""
