"""Stream management (model: TDengine's mnode stream manager).

``store``: streams and snodes persisted in etcd (the only stream state that
survives a leader change). ``plan``: the expected task set of a stream, pure
functions shared by deployment and by WATCH's completeness check so the two
can never disagree.
"""
