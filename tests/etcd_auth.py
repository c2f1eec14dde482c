"""Turn on etcd's user/password authentication the way etcd requires it.

The implementation moved to ``meta.ops.etcd_roles`` (which ``querycoord etcd
roles`` uses to create the least-privilege users and then enable auth); the
tests keep importing ``enable_auth`` from here.
"""

from __future__ import annotations

from meta.ops.etcd_roles import ROOT, enable_auth

__all__ = ["ROOT", "enable_auth"]
