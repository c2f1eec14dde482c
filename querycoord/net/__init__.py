"""What every process uses to talk: the gRPC client that follows the leader, the HTTP server that runs every
probe on the event loop, who may see a coordinator's pages, and the probes a node answers.
"""
