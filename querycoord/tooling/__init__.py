"""Tooling shared by ``querycoord up``, the demo and the drills: how their coordinators are started."""
