"""Which check kinds run: ``querycoord.common.checker_activation``, named here too for the checker's modules.

The switches live in ``common`` because their readers (``querycoord status``, ``meta verify``) must not import the
checker to read one etcd key: importing any module of this package imports the whole checker (its ``__init__``).
"""

from querycoord.common.checker_activation import (
    ACTIVATION_KEY,
    BALANCE,
    CHANNELS,
    CHECK_KINDS,
    KINDS_BY_NAME,
    RELEASES,
    REPLICAS,
    SEGMENTS,
    CheckerSwitches,
    CheckKind,
    Off,
    activation_record,
    decode,
    encode,
    kind_of,
    read_activation,
    warning_for,
)

__all__ = ["ACTIVATION_KEY", "BALANCE", "CHANNELS", "CHECK_KINDS", "KINDS_BY_NAME", "RELEASES", "REPLICAS",
           "SEGMENTS", "CheckKind", "CheckerSwitches", "Off", "activation_record", "decode", "encode", "kind_of",
           "read_activation", "warning_for"]
