"""The serving surface of a coordinator process: its gRPC services (QueryCoord, StreamMgmt, health with
CheckHealth and Explain), the gate every call passes (leader? else where the leader is), standby reads, the
bounds on heavy reads, the HTTP endpoints and metrics collectors, and the process that wires them. Services reach
the leadership through the gate, never by reaching into the engine.
"""
