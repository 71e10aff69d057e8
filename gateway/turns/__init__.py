"""Chat turns: gate, call the worker's /chat_stream, relay its events as they arrive, persist the finished turn.

The worker is read by a background task that feeds a queue; the browser's response drains that queue. So a
browser that goes away stops only the draining: the turn is still read to its end and stored
(docs/design/ARCHITECTURE.md, principle 2). One turn per chat at a time: the chat row carries a lock (`turn_started_at`), which holds across
gateway replicas because it lives in the shared database.

The turn is written ahead (gateway/lifecycle.py): both messages are stored before the worker is called, the
answer so far is saved while it streams, and a heartbeat tells other replicas the turn is alive. A stop (from any
replica) closes the worker stream, which closes the worker's generator and the model call. Anyone may rejoin a
running turn (`GET /api/chats/{id}/stream`): from the owner's memory, or from another replica's database saves.

routes.py (the turn routes), plan.py (gate, worker request, lock and write-ahead), relay.py (reading the
worker's stream, the periodic and final saves), stored.py (the turn's rows: final save, failure, read back),
title.py (naming a new chat), rejoin.py (following a running turn), state.py (a turn in memory).
"""
