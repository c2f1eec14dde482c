"""Stream management (model: TDengine's mnode stream manager).

Persisted, surviving a leader change: ``store`` (streams and snodes in etcd).
Pure: ``plan`` (the expected task set of a stream, shared by deployment and by
WATCH's completeness check so the two can never disagree).

The leader's runtime, rebuilt on every leadership, split by phase behind the
``manager.StreamManager`` facade:

* ``runtime``: the maps and counters the parts share, the per-stream and
  per-task records, and the actions several parts take (stop by error,
  redeploy one task);
* ``definitions``: stream definitions in memory (load, notifications, the
  checker's refresh against the store);
* ``claims``: which heartbeat sender is heard, which snode and vgroups it may
  speak for;
* ``heartbeat``: heartbeat intake, acting on each task report, level-triggered
  actions in the reply;
* ``adoption``: WATCH after a leader change, adopting running tasks;
* ``deploy``: planning queued streams and handing their tasks out;
* ``liveness``: the slotted health check, task silence, lost snodes, vgroups
  and nodes;
* ``checker``: each task against what its node last reported;
* ``show``: ShowStreams.

Around it: ``loops`` (the leader's stream-node session and tick observers).
The StreamMgmt gRPC service that fronts it is ``querycoord.serving.stream_service``:
a surface, which reaches the leadership as the QueryCoord service does, so
this engine imports nothing of the coordinator.
"""
