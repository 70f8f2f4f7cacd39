"""A Kafka-protocol gateway: Kafka clients produce to and fetch from raytxn topics.

Layers, so each can be read and tested on its own:

* ``wire``: frames, request headers, the table of APIs and versions served, and the encodings,
  which are kafka-python's ``kafka.protocol`` messages (generated from Kafka's own JSON schemas).
* ``records``: Kafka record batches (``kafka.record``) to and from raytxn messages and entries.
* ``mapping``: names and ids: Kafka topics onto raytxn topics, Kafka producer ids onto raytxn
  producer names and sequences, raytxn transactions onto the producer ids of fetched batches,
  raytxn errors onto Kafka error codes.
* ``broker``: one handler per API, calling the partition actors.
* ``gateway``: the Ray actor running the asyncio TCP server, and ``start_gateway``.
"""
