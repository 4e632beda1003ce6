"""The wire between workers, clients and `fusee server`: the frame codec (pure functions
over bytes) and the message types both sides share, msgspec only.

Empty until the server lands (its issue fills it). The messages shards already exchange,
`fusee.journal.Msg` and `Ack`, are what the relay will carry; they live in the journal
because checkpoints hold the unacknowledged ones.
"""
