"""The chat turn: one module per stage, composed by `chat.run_turn` into a stream of typed events."""
