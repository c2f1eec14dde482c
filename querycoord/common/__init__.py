"""The shared vocabulary at the bottom: errors and their status mapping, wire constants, request limits and
validation, partition states, the replica rule, protobuf helpers, metrics instruments and the engine's event
hooks, small asyncio helpers. It imports nothing else of querycoord, so every part may import it.
"""
