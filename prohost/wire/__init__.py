"""The wire: what the server and the harness say to each other (docs/protocol.md).

Messages (:mod:`.protocol`), the ``agent.run`` body (:mod:`.runs`), delivery
signatures (:mod:`.signature`) and the ack decision (:mod:`.intake`). Pure: no I/O.
"""
