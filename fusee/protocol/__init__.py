"""The wire between workers, clients and `fusee server` (docs/FORMAT.md, *The wire*), the
part both sides share:

- `frames.py`: streams cut into checked frames (pure functions over bytes);
- `handshake.py`: the token exchange's messages and proofs (pure functions over bytes);
- `messages.py`: the frames' payloads, one msgspec struct per kind;
- `opening.py`: the connecting side's setup (token exchange, OPEN, WELCOME) as a state
  machine without I/O, which both of its drivers share:
- `connection.py`: framed connections over asyncio and the connecting side (workers and
  clients; the listening side is fusee_server/listener.py), and `pinger.py`: a worker's
  blocking ping connection, from a thread of its own;
- `address.py`: server addresses; `signature.py`: the invocation request's signature.

The messages shards exchange, `fusee.journal.Msg` and `Ack`, are what the relay carries;
they live in the journal because checkpoints hold the unacknowledged ones.
"""
