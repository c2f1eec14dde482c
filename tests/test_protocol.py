"""The wire contract is stated once (``querycoord.common.protocol``) and everyone speaks it."""

from __future__ import annotations

import pytest

from proto import querycoord_pb2, querynode_pb2
from querycoord.common import protocol
from querycoord.stream import store as stream_store


@pytest.mark.parametrize("text, leader", [
    ("this coordinator (a:1) is not the leader; the leader is at 127.0.0.1:5051", "127.0.0.1:5051"),
    ("not leader (the leader is at host:7), retry", "host:7"),
    ("the leader is at h:1; retry shortly", "h:1"),
    ("the leader is at h:2, retry", "h:2"),
    ("this coordinator (a:1) is not the leader; no leader is elected yet", None),
    ("", None),
    (None, None),
])
def test_the_leader_named_in_a_redirect_is_parsed_back(text: str | None, leader: str | None) -> None:
    assert protocol.parse_leader(text) == leader


def test_what_a_standby_writes_is_what_clients_parse() -> None:
    message = f"this coordinator (a:1) is not the leader; {protocol.leader_is_at('10.0.0.2:19531')}"
    assert protocol.parse_leader(message) == "10.0.0.2:19531"


def test_names_match_the_generated_protocol_and_the_stores() -> None:
    assert protocol.QUERYCOORD_SERVICE == querycoord_pb2.DESCRIPTOR.services_by_name["QueryCoord"].full_name
    methods = {m.name for m in querynode_pb2.DESCRIPTOR.services_by_name["QueryNode"].methods}
    assert protocol.MUTATING_METHODS <= methods
    # The stream store (the leader's) and the stream nodes read snodes under the same prefix.
    assert stream_store.SNODES_PREFIX == protocol.SNODES_PREFIX
