"""raytxn runtime: ids, errors, ledgers, state machines and the client API.

    import runtime as rt
    client = rt.connect()
"""

from runtime.client import Client, connect, shutdown
from runtime.consumer import ConsumerType, InitialPosition
from runtime.message import Message, MessageId
from runtime.transaction import Transaction

__all__ = ["Client", "ConsumerType", "InitialPosition", "Message", "MessageId", "Transaction", "connect",
           "shutdown"]
