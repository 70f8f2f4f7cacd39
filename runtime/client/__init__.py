"""The client side: Client, Producer, Consumer, Transaction, the coordinator client, and the rpc
layer (ActorRef, one failure classification) that actors use to call each other too."""
