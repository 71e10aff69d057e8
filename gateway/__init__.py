"""The gateway: accounts, chats, the layer-1 gate, durable turns and index management in front of the worker."""
