"""Query nodes as the coordinator sees them: liveness from sessions, fenced clients, allocation."""
