"""A Kafka-protocol gateway: Kafka clients produce to and fetch from raytxn topics, in consumer
groups and transactions too.

Layers, so each can be read and tested on its own:

* ``wire``: frames, request headers, the table of APIs and versions served, and the encodings,
  which are kafka-python's ``kafka.protocol`` messages (generated from Kafka's own JSON schemas).
* ``records``: Kafka record batches (``kafka.record``) to and from raytxn messages and entries.
* ``mapping``: names and ids: Kafka topics onto raytxn topics, Kafka producer ids onto raytxn
  producer names and sequences, raytxn transactions onto the producer ids of fetched batches,
  Kafka group ids onto raytxn subscriptions, raytxn errors onto Kafka error codes.
* ``transactions``: Kafka transactions on raytxn transactions (the gateway's transaction
  coordinator; AddOffsetsToTxn's groups and the subscriptions their offsets register).
* ``groups``: the consumer-group state machine (Kafka's GroupMetadata), pure, in memory.
* ``broker``: the handlers of Metadata, FindCoordinator, ListOffsets, Produce, Fetch and the
  transaction APIs, calling the partition actors.
* ``group_membership``: JoinGroup, SyncGroup, Heartbeat and LeaveGroup on ``groups``.
* ``group_offsets``: OffsetCommit, OffsetFetch, AddOffsetsToTxn and TxnOffsetCommit on the raytxn
  subscription named after the group (plain cursor moves, or acks in the Kafka transaction).
* ``group_admin``: ListGroups, DescribeGroups and DeleteGroups (groups are members in memory and
  committed offsets in subscriptions).
* ``sasl``: SASL PLAIN and OAUTHBEARER messages carrying raytxn tokens (pure).
* ``security``: a connection's session, the refusal answers, the listener's TLS context.
* ``authentication``: SaslHandshake and SaslAuthenticate (the engine verifies the token).
* ``authorization``: the checks, as the connection's principal, of requests no actor sees whole.
* ``gateway``: the Ray actor running the asyncio TCP server, and ``start_gateway``.
"""

# kafka-python (the wire encodings) and cramjam (record compression) come with the `kafka` extra:
# without them the gateway stops here with MissingExtra naming it, not deep in a module.
from raytxn.extras import require_extra

require_extra("kafka")
