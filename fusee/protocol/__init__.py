"""The wire between workers, clients and `fusee server`: the frame codec (pure functions
over bytes) and the message types both sides share, msgspec only.

`frames.py` cuts streams into checked frames. The messages themselves, the handshake and
the asyncio protocol classes come with the server (its issue). The messages shards
already exchange, `fusee.journal.Msg` and `Ack`, are what the relay will carry; they live
in the journal because checkpoints hold the unacknowledged ones.
"""
